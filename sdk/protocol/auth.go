package protocol

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"strings"
	"sync"
	"sync/atomic"
)

// Signature schemes, the prefix of a Sig.
const (
	// schemeTrainer signs what only a trainer may say (commands, desired states, peer
	// grants): Ed25519 with the trainer key, "ed25519:<key id>:<base64 signature>".
	schemeTrainer = "ed25519"
	// schemeServer signs what a server says about itself (heartbeats, acks): HMAC-SHA256
	// with that server's own key, "hmac:<key id>:<hex>"; the key id names the trainer key
	// the server key was derived under.
	schemeServer = "hmac"
)

// ServerKeyType is the "type" of an issued server key file.
const ServerKeyType = "rollout-server-key"

// Auth is what one party holds to sign and verify fleet messages. There are two
// authorities: the trainer key signs commands, desired states and peer grants (Ed25519, so
// a server holding only the public key cannot sign them), and each server's own key signs
// that server's heartbeats and acks (HMAC with a key derived from the fleet secret for that
// server id, so a server can speak only for itself).
//
// A trainer holds the fleet secret: it derives the trainer key from it and every server's
// key on demand. A server holds either the fleet secret too (shared-secret mode: simple,
// but a compromised server can then sign anything) or an issued server key (IssueServerKey):
// its own key and the trusted trainer public keys, nothing that signs for others. A nil or
// empty Auth signs nothing and accepts anything (an unsigned fleet).
//
// Key ids (the first 8 bytes of the SHA-256 of a trainer public key, in hex) make rotation
// possible without downtime: an Auth verifies with every secret and trusted key it holds,
// and signs with the first.
type Auth struct {
	secrets  [][]byte                     // fleet secrets, the signing one first
	trainers []ed25519.PrivateKey         // derived from secrets, same order
	trusted  map[string]ed25519.PublicKey // key id -> trainer public key
	order    []string                     // trusted key ids, the signing one first
	server   *serverKey                   // an issued key (keyed servers)
	derived  sync.Map                     // fleet, id, key id -> derived server key (*serverKey)
	// lastDerived is the derived key used last: a server holding the fleet secret derives
	// only its own, for every command it checks and every ack it signs.
	lastDerived atomic.Pointer[serverKey]
}

type serverKey struct {
	fleet, id, kid string
	key            *keyedMAC
}

// is reports whether s (nil: no key) is the key of server id of fleet under key id kid.
func (s *serverKey) is(fleet, id, kid string) bool {
	return s != nil && s.fleet == fleet && s.id == id && s.kid == kid
}

// keyedMAC is one server's key with a pool of HMAC-SHA256 states keyed with it. An HMAC
// that has produced a sum resets to its keyed state without hashing the key again, so a MAC
// from the pool costs two block compressions and no allocation: every command and every ack
// pays one per server, the trainer one per target.
type keyedMAC struct {
	key  []byte
	pool sync.Pool // hash.Hash
}

func newKeyedMAC(key []byte) *keyedMAC {
	k := &keyedMAC{key: key}
	k.pool.New = func() any { return hmac.New(sha256.New, key) }
	return k
}

// sum appends the HMAC of a followed by b to dst.
func (k *keyedMAC) sum(dst, a, b []byte) []byte {
	h := k.pool.Get().(hash.Hash)
	h.Reset()
	h.Write(a)
	h.Write(b)
	dst = h.Sum(dst)
	k.pool.Put(h)
	return dst
}

// NewAuth returns the Auth of a fleet-secret holder: secrets[0] signs, every one verifies
// (a trainer keeps its previous secret while servers are re-issued keys). No secret (or
// only empty ones) is an unsigned Auth.
func NewAuth(secrets ...[]byte) (*Auth, error) {
	for _, s := range secrets {
		if err := CheckSecret(s); err != nil {
			return nil, err
		}
	}
	return newAuth(secrets), nil
}

func newAuth(secrets [][]byte) *Auth {
	a := &Auth{trusted: map[string]ed25519.PublicKey{}}
	for _, s := range secrets {
		if len(s) == 0 {
			continue
		}
		priv := trainerKey(s)
		pub := priv.Public().(ed25519.PublicKey)
		kid := KeyID(pub)
		if _, dup := a.trusted[kid]; dup {
			continue
		}
		a.secrets = append(a.secrets, s)
		a.trainers = append(a.trainers, priv)
		a.trusted[kid] = pub
		a.order = append(a.order, kid)
	}
	return a
}

// Untrusting returns an Auth that counts as signed but holds no key: it signs nothing and
// every signature fails against it (the Auth of a configuration error, so that it fails
// closed).
func Untrusting() *Auth {
	return &Auth{trusted: map[string]ed25519.PublicKey{"": nil}}
}

// SecretAuth is NewAuth(secret) for callers whose configuration was validated elsewhere:
// a secret NewAuth refuses gives Untrusting, so a configuration error fails closed.
func SecretAuth(secret []byte) *Auth {
	a, err := NewAuth(secret)
	if err != nil {
		return Untrusting()
	}
	return a
}

// authOf is the Auth of one secret for the []byte-secret methods. It does not check the
// secret's length (callers that take a secret from users check it once, with CheckSecret):
// a short one still signs, and verifies only what it signed.
func authOf(secret []byte) *Auth { return newAuth([][]byte{secret}) }

// trainerKey derives the trainer's Ed25519 key from a fleet secret.
func trainerKey(secret []byte) ed25519.PrivateKey {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte("rollout.trainer-key"))
	return ed25519.NewKeyFromSeed(h.Sum(nil))
}

// serverMACKey derives server id's key under a fleet secret.
func serverMACKey(secret []byte, fleet, id string) []byte {
	var c canon
	c.str("rollout.server-key")
	c.str(fleet)
	c.str(id)
	h := hmac.New(sha256.New, secret)
	h.Write(c.b.Bytes())
	return h.Sum(nil)
}

// KeyID names a trainer public key: the first 8 bytes of its SHA-256, in hex.
func KeyID(pub ed25519.PublicKey) string {
	s := sha256.Sum256(pub)
	return hex.EncodeToString(s[:8])
}

// Signed reports whether a signs and checks anything.
func (a *Auth) Signed() bool { return a != nil && (len(a.trusted) > 0 || a.server != nil) }

// CanSignCommands reports whether a holds a trainer key (a fleet secret).
func (a *Auth) CanSignCommands() bool { return a != nil && len(a.trainers) > 0 }

// KeyID is the id of the trainer key a signs with, or that its server key was issued
// under ("" when unsigned).
func (a *Auth) KeyID() string {
	switch {
	case a == nil:
		return ""
	case len(a.order) > 0 && a.server == nil:
		return a.order[0]
	case a.server != nil:
		return a.server.kid
	}
	return ""
}

// TrustedKeys lists the trusted trainer public keys as "ed25519:<key id>:<base64>", the
// signing one first.
func (a *Auth) TrustedKeys() []string {
	if a == nil {
		return nil
	}
	out := make([]string, 0, len(a.order))
	for _, kid := range a.order {
		out = append(out, schemeTrainer+":"+kid+":"+base64.RawURLEncoding.EncodeToString(a.trusted[kid]))
	}
	return out
}

// serverKeyFile is the JSON of an issued server key.
type serverKeyFile struct {
	Type     string   `json:"type"`
	Fleet    string   `json:"fleet"`
	ServerID string   `json:"server_id"`
	KeyID    string   `json:"key_id"`
	Key      string   `json:"key"`
	Trusted  []string `json:"trusted"`
}

// IssueServerKey returns the key file of server id of fleet: its own key (derived under the
// signing secret) and the trainer public keys a trusts. A server started with it can verify
// commands and desired states and sign its own heartbeats and acks, nothing more.
func (a *Auth) IssueServerKey(fleet, id string) ([]byte, error) {
	if !a.CanSignCommands() {
		return nil, fmt.Errorf("%w: issuing a server key needs the fleet secret", ErrInvalid)
	}
	if fleet == "" || id == "" {
		return nil, fmt.Errorf("%w: issuing a server key needs a fleet and a server id", ErrInvalid)
	}
	f := serverKeyFile{Type: ServerKeyType, Fleet: fleet, ServerID: id, KeyID: a.order[0],
		Key: hex.EncodeToString(serverMACKey(a.secrets[0], fleet, id)), Trusted: a.TrustedKeys()}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// ParseServerKey reads an issued server key file.
func ParseServerKey(b []byte) (*Auth, error) {
	var f serverKeyFile
	if err := strict(bytes.TrimSpace(b), &f); err != nil {
		return nil, fmt.Errorf("server key: %w", err)
	}
	if f.Type != ServerKeyType || f.Fleet == "" || f.ServerID == "" || f.KeyID == "" {
		return nil, fmt.Errorf("%w: server key: want type %q with fleet, server_id and key_id", ErrInvalid, ServerKeyType)
	}
	key, err := hex.DecodeString(f.Key)
	if err != nil || len(key) != sha256.Size {
		return nil, fmt.Errorf("%w: server key: key is not 64 hex digits", ErrInvalid)
	}
	a, err := TrustKeys(f.Trusted...)
	if err != nil {
		return nil, err
	}
	if _, ok := a.trusted[f.KeyID]; !ok {
		return nil, fmt.Errorf("%w: server key: issued under key %s, which it does not trust", ErrInvalid, f.KeyID)
	}
	a.server = &serverKey{fleet: f.Fleet, id: f.ServerID, kid: f.KeyID, key: newKeyedMAC(key)}
	return a, nil
}

// ServerID is the server id an issued key speaks for ("" for other Auths).
func (a *Auth) ServerID() string {
	if a == nil || a.server == nil {
		return ""
	}
	return a.server.id
}

// TrustKeys returns an Auth that verifies trainer signatures with the given public keys
// ("ed25519:<key id>:<base64>", as TrustedKeys prints them) and signs nothing.
func TrustKeys(keys ...string) (*Auth, error) {
	a := &Auth{trusted: map[string]ed25519.PublicKey{}}
	for _, k := range keys {
		k = strings.TrimSpace(k)
		if k == "" {
			continue
		}
		parts := strings.Split(k, ":")
		if len(parts) != 3 || parts[0] != schemeTrainer {
			return nil, fmt.Errorf("%w: trusted key %q: want ed25519:<key id>:<base64>", ErrInvalid, k)
		}
		pub, err := base64.RawURLEncoding.DecodeString(parts[2])
		if err != nil || len(pub) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("%w: trusted key %q: not a base64 Ed25519 public key", ErrInvalid, k)
		}
		if kid := KeyID(pub); kid != parts[1] {
			return nil, fmt.Errorf("%w: trusted key %q: key id %s does not match the key (%s)", ErrInvalid, k, parts[1], kid)
		}
		if _, dup := a.trusted[parts[1]]; !dup {
			a.trusted[parts[1]] = pub
			a.order = append(a.order, parts[1])
		}
	}
	return a, nil
}

// signTrainer signs canonical bytes with the trainer key ("" when a holds none).
func (a *Auth) signTrainer(canonical []byte) string {
	if !a.CanSignCommands() {
		return ""
	}
	sig := ed25519.Sign(a.trainers[0], canonical)
	return schemeTrainer + ":" + a.order[0] + ":" + base64.RawURLEncoding.EncodeToString(sig)
}

// verifyTrainer checks a trainer signature against the trusted keys (anything passes when
// a is unsigned).
func (a *Auth) verifyTrainer(canonical []byte, sig string) error {
	if !a.Signed() {
		return nil
	}
	if sig == "" {
		return ErrUnsigned
	}
	parts := strings.SplitN(sig, ":", 3)
	if len(parts) != 3 || parts[0] != schemeTrainer {
		return fmt.Errorf("%w: not a trainer signature", ErrBadSignature)
	}
	pub, ok := a.trusted[parts[1]]
	if !ok {
		return fmt.Errorf("%w: signed with key %s, which is not trusted", ErrBadSignature, parts[1])
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || !ed25519.Verify(pub, canonical, raw) {
		return ErrBadSignature
	}
	return nil
}

// macKey returns the key server id of fleet signs with under trainer key kid, and whether
// a can know it: from a secret with that key id, or its own issued key.
func (a *Auth) macKey(fleet, id, kid string) (*keyedMAC, bool) {
	if a == nil {
		return nil, false
	}
	if s := a.server; s.is(fleet, id, kid) {
		return s.key, true
	}
	if s := a.lastDerived.Load(); s.is(fleet, id, kid) {
		return s.key, true
	}
	for i, k := range a.order {
		if k == kid && i < len(a.secrets) {
			ck := derivedKey{fleet, id, kid}
			v, ok := a.derived.Load(ck)
			if !ok {
				// One per server and key id: bounded by the fleet. Copies of the strings,
				// which may be substrings of a whole message.
				fleet, id, kid := strings.Clone(fleet), strings.Clone(id), strings.Clone(kid)
				v, _ = a.derived.LoadOrStore(derivedKey{fleet, id, kid},
					&serverKey{fleet: fleet, id: id, kid: kid, key: newKeyedMAC(serverMACKey(a.secrets[i], fleet, id))})
			}
			sk := v.(*serverKey)
			a.lastDerived.Store(sk)
			return sk.key, true
		}
	}
	return nil, false
}

type derivedKey struct{ fleet, id, kid string }

// signServer signs canonical bytes as server id of fleet ("" when a cannot).
func (a *Auth) signServer(fleet, id string, canonical []byte) string {
	if !a.Signed() {
		return ""
	}
	kid := a.KeyID()
	key, ok := a.macKey(fleet, id, kid)
	if !ok {
		return ""
	}
	var buf [sha256.Size]byte
	return schemeServer + ":" + kid + ":" + hex.EncodeToString(key.sum(buf[:0], canonical, nil))
}

// macBytes is the length of a command MAC: 96 bits, forgeable only online, one guess per
// message, within the command's lifetime.
const macBytes = 12

// macChars is a MAC's length in unpadded base64: 12 bytes are 16 characters, so every
// target's MACs start on a character boundary and can be decoded alone.
const macChars = macBytes * 4 / 3

// commandMACs authenticates a command to each target: the HMAC of canonical under the
// target's key (domain-separated from its own messages), truncated to macBytes, under every
// secret a holds, so during a rotation a server issued under either key can check it.
func (a *Auth) commandMACs(fleet string, targets []string, canonical []byte) string {
	buf := make([]byte, 0, len(targets)*len(a.secrets)*macBytes)
	digest := sha256.Sum256(canonical)
	for _, id := range targets {
		for _, kid := range a.order[:len(a.secrets)] {
			key, _ := a.macKey(fleet, id, kid)
			buf = cmdMAC(buf, key, &digest)
		}
	}
	return strings.Join(a.order[:len(a.secrets)], ",") + ":" + base64.RawURLEncoding.EncodeToString(buf)
}

// cmdMAC is one target's MAC of a command, over the SHA-256 digest of its canonical bytes:
// a command to n targets hashes its (n-proportional) canonical bytes once, not n times.
// It appends the MAC to dst.
func cmdMAC(dst []byte, key *keyedMAC, digest *[sha256.Size]byte) []byte {
	var buf [sha256.Size]byte
	return append(dst, key.sum(buf[:0], cmdMACDomain, digest[:])[:macBytes]...)
}

// cmdMACDomain separates command MACs from what a server signs with the same key.
var cmdMACDomain = []byte("rollout.command-mac")

// verifyCommandMAC checks the MACs of target i (of n) for server id: every key id listed
// that a can derive (its own issued key, or a secret) must match, and at least one must.
func (a *Auth) verifyCommandMAC(fleet, id string, i, n int, canonical []byte, macs string) error {
	kids, b64, ok := strings.Cut(macs, ":")
	if !ok {
		return fmt.Errorf("%w: malformed command MACs", ErrBadSignature)
	}
	k := strings.Count(kids, ",") + 1
	// A MAC is 12 bytes, 16 base64 characters: only this server's are decoded.
	if len(b64) != n*k*macChars {
		return fmt.Errorf("%w: malformed command MACs", ErrBadSignature)
	}
	checked := 0
	digest := sha256.Sum256(canonical)
	for j := 0; kids != ""; j++ {
		var kid string
		kid, kids, _ = strings.Cut(kids, ",")
		key, ok := a.macKey(fleet, id, kid)
		if !ok {
			continue
		}
		off := (i*k + j) * macChars
		var got, want [macBytes]byte
		if m, err := base64.RawURLEncoding.Decode(got[:], []byte(b64[off:off+macChars])); err != nil || m != macBytes {
			return fmt.Errorf("%w: malformed command MACs", ErrBadSignature)
		}
		if !hmac.Equal(got[:], cmdMAC(want[:0], key, &digest)) {
			return ErrBadSignature
		}
		checked++
	}
	if checked == 0 {
		return fmt.Errorf("%w: no command MAC under a key this server holds", ErrBadSignature)
	}
	return nil
}

// errOtherServer is why a server with an issued key cannot check another server's message.
var errOtherServer = errors.New("only a trainer (the fleet secret) can check another server's signature")

// verifyServer checks that canonical bytes were signed by server id of fleet.
func (a *Auth) verifyServer(fleet, id string, canonical []byte, sig string) error {
	if !a.Signed() {
		return nil
	}
	if sig == "" {
		return ErrUnsigned
	}
	parts := strings.SplitN(sig, ":", 3)
	if len(parts) != 3 || parts[0] != schemeServer {
		return fmt.Errorf("%w: not a server signature", ErrBadSignature)
	}
	key, ok := a.macKey(fleet, id, parts[1])
	if !ok {
		if a.CanSignCommands() {
			return fmt.Errorf("%w: signed under key %s, which is not this fleet's", ErrBadSignature, parts[1])
		}
		return fmt.Errorf("%w: %w", ErrBadSignature, errOtherServer)
	}
	got, err := hex.DecodeString(parts[2])
	if err != nil {
		return ErrBadSignature
	}
	var want [sha256.Size]byte
	if !hmac.Equal(got, key.sum(want[:0], canonical, nil)) {
		return ErrBadSignature
	}
	return nil
}
