package protocol

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Version is the wire version every message carries in its V field.
const Version = 1

// MaxMessageBytes bounds every encoded message; larger ones are rejected unread.
const MaxMessageBytes = 64 << 10

// MinSecretBytes is the shortest fleet secret accepted: HMAC-SHA256 with fewer than 32 bytes
// of key is weaker than the hash it is built on.
const MinSecretBytes = 32

// Errors callers branch on. A Verify or Decode error wraps exactly one of them.
var (
	ErrMalformed    = errors.New("protocol: malformed message")
	ErrTooLarge     = errors.New("protocol: message too large")
	ErrVersion      = errors.New("protocol: unsupported wire version")
	ErrUnsigned     = errors.New("protocol: unsigned message")
	ErrBadSignature = errors.New("protocol: bad signature")
	ErrExpired      = errors.New("protocol: command past its deadline")
	ErrWrongFleet   = errors.New("protocol: command for another fleet")
	ErrShortSecret  = errors.New("protocol: fleet secret shorter than 32 bytes")
	ErrInvalid      = errors.New("protocol: invalid value")
)

// Kind names a command.
type Kind string

// Commands. Commit runs a server's whole cut (pause → sleep → swap → wake → resume) as one
// command, so an update costs two round trips (stage, commit) rather than one per phase.
const (
	KindPause  Kind = "pause"
	KindResume Kind = "resume"
	KindSleep  Kind = "sleep"
	KindWake   Kind = "wake"
	KindReset  Kind = "reset"
	KindStage  Kind = "stage"
	KindCommit Kind = "commit"
	KindAbort  Kind = "abort"
)

// Kinds lists every command kind.
func Kinds() []Kind {
	return []Kind{KindPause, KindResume, KindSleep, KindWake, KindReset, KindStage, KindCommit, KindAbort}
}

// Valid reports whether k is a known kind.
func (k Kind) Valid() bool { return slices.Contains(Kinds(), k) }

// Pause modes, as the engine's.
const (
	ModeAbort = "abort"
	ModeWait  = "wait"
	ModeKeep  = "keep"
)

func validMode(m string) bool { return m == ModeAbort || m == ModeWait || m == ModeKeep }

// Wake-up tags.
const (
	TagWeights = "weights"
	TagKVCache = "kv_cache"
)

// WeightsRef names one version of the weights: where servers fetch it and its SHA-256 digest
// (as `rollout weights digest` prints it).
type WeightsRef struct {
	Version int64  `json:"version"`
	URI     string `json:"uri"`
	SHA256  string `json:"sha256,omitempty"`
}

// Validate checks a ref a server could act on.
func (r WeightsRef) Validate() error {
	if r.Version <= 0 {
		return fmt.Errorf("%w: weights version must be > 0 (got %d)", ErrInvalid, r.Version)
	}
	if r.URI == "" {
		return fmt.Errorf("%w: weights uri is empty", ErrInvalid)
	}
	if r.SHA256 != "" {
		if b, err := hex.DecodeString(r.SHA256); err != nil || len(b) != sha256.Size {
			return fmt.Errorf("%w: sha256 %q is not 64 hex digits", ErrInvalid, r.SHA256)
		}
	}
	return nil
}

// Pause stops scheduling; with ClearCache it then resets the prefix cache and the connector.
type Pause struct {
	Mode       string `json:"mode"`
	ClearCache bool   `json:"clear_cache"`
}

// Resume lets scheduling continue.
type Resume struct{}

// Sleep pauses (with Mode when not paused already) and releases memory: level 1 the KV
// cache, level 2 also the weights.
type Sleep struct {
	Level int    `json:"level"`
	Mode  string `json:"mode,omitempty"`
}

// Wake restores what Tags name (empty: everything).
type Wake struct {
	Tags []string `json:"tags,omitempty"`
}

// Reset resets the prefix cache; ResetExternal also the offloaded KV, ResetRunning preempts
// running requests so nothing stays in use.
type Reset struct {
	ResetExternal bool `json:"reset_external"`
	ResetRunning  bool `json:"reset_running"`
}

// Stage fetches, verifies and stages Weights while the server keeps serving.
type Stage struct {
	Weights WeightsRef `json:"weights"`
	// Sources assigns each target (by server id) the fleet member it fetches Weights from
	// first (a peer's /weights/ route); a target without an entry, or whose source fails,
	// fetches from Weights.URI (the origin). The receiving server checks that its source is a
	// member of the fleet (a verified heartbeat advertising a peer URL) before it connects.
	Sources map[string]string `json:"sources,omitempty"`
	// Grant is the trainer's peer token for Weights (PeerToken): servers present it to
	// their sources, which check it with the trainer's public key. A server with an issued
	// key cannot make one, so it comes with the command.
	Grant string `json:"grant,omitempty"`
}

// Commit swaps in the staged Version: pause(Mode, ClearCache) → sleep(SleepLevel, when > 0)
// → swap → wake → resume, in one command.
type Commit struct {
	Version    int64  `json:"version"`
	Mode       string `json:"mode"`
	ClearCache bool   `json:"clear_cache"`
	SleepLevel int    `json:"sleep_level"`
	// SHA256 is the digest of the checkpoint Version must be: a server whose staged set came
	// from another checkpoint refuses the commit (code conflict). Required in a commit
	// command; ignored in a desired state's plan, whose Weights carry it.
	SHA256 string `json:"sha256,omitempty"`
}

// Abort finishes the named requests (empty: all) with finish reason abort.
type Abort struct {
	RequestIDs []string `json:"request_ids,omitempty"`
}

// Validate checks each command's fields.
func (p Pause) Validate() error {
	if !validMode(p.Mode) {
		return fmt.Errorf("%w: pause mode %q: want abort, wait or keep", ErrInvalid, p.Mode)
	}
	return nil
}

// Validate checks the sleep level and mode.
func (s Sleep) Validate() error {
	if s.Level < 0 || s.Level > 2 {
		return fmt.Errorf("%w: sleep level %d: want 0, 1 or 2", ErrInvalid, s.Level)
	}
	if s.Mode != "" && !validMode(s.Mode) {
		return fmt.Errorf("%w: sleep mode %q: want abort, wait or keep", ErrInvalid, s.Mode)
	}
	return nil
}

// Validate checks the wake tags.
func (w Wake) Validate() error {
	for _, t := range w.Tags {
		if t != TagWeights && t != TagKVCache {
			return fmt.Errorf("%w: wake tag %q: want weights or kv_cache", ErrInvalid, t)
		}
	}
	return nil
}

// Validate checks the ref and the source assignment (no empty ids, no server its own source).
// A stage must carry the checkpoint's digest: a version number names one checkpoint only
// together with it, and a server compares digests, not numbers, to decide whether what it
// staged or serves is what the fleet asked for.
func (s Stage) Validate() error {
	if err := s.Weights.Validate(); err != nil {
		return err
	}
	if s.Weights.SHA256 == "" {
		return fmt.Errorf("%w: stage of version %d without a sha256: a fleet version names a checkpoint only with its digest", ErrInvalid, s.Weights.Version)
	}
	for target, src := range s.Sources {
		if target == "" || src == "" || target == src {
			return fmt.Errorf("%w: stage source %q for target %q", ErrInvalid, src, target)
		}
	}
	return nil
}

// Validate checks the commit's version, mode and level.
func (c Commit) Validate() error {
	if c.Version <= 0 {
		return fmt.Errorf("%w: commit version must be > 0 (got %d)", ErrInvalid, c.Version)
	}
	if !validMode(c.Mode) {
		return fmt.Errorf("%w: commit mode %q: want abort, wait or keep", ErrInvalid, c.Mode)
	}
	if c.SleepLevel < 0 || c.SleepLevel > 2 {
		return fmt.Errorf("%w: commit sleep level %d: want 0, 1 or 2", ErrInvalid, c.SleepLevel)
	}
	if !validDigest(c.SHA256) {
		return fmt.Errorf("%w: commit of version %d needs the checkpoint's sha256 (64 hex digits, got %q)", ErrInvalid, c.Version, c.SHA256)
	}
	return nil
}

func validDigest(s string) bool {
	b, err := hex.DecodeString(s)
	return err == nil && len(b) == sha256.Size
}

// Envelope is one signed command. Body holds the JSON of the command Kind names.
type Envelope struct {
	V     int    `json:"v"`
	ID    string `json:"id"`
	Fleet string `json:"fleet"`
	// Targets are the server ids the command is for; empty means every server.
	Targets []string `json:"targets,omitempty"`
	// IssuedAt and Deadline are Unix milliseconds; a server drops a command past its deadline.
	IssuedAt int64 `json:"issued_at"`
	Deadline int64 `json:"deadline"`
	// Trace is the W3C trace context (traceparent, tracestate) of the caller's span.
	Trace map[string]string `json:"trace,omitempty"`
	Kind  Kind              `json:"kind"`
	Body  json.RawMessage   `json:"body"`
	// Epoch is the desired-state epoch the sender wrote or read before publishing (0:
	// unknown). A server whose desired state is older reads it again before it acts, and a
	// fleet-wide pause, resume, sleep or wake that the desired state has since superseded
	// changes nothing (its ack says superseded): the desired state is the authority on run
	// state, the command only its prompt notification.
	Epoch int64 `json:"epoch,omitempty"`
	// FleetWide marks a pause, resume, sleep or wake the sender recorded in the desired state
	// (at Epoch) for the whole fleet, whatever Targets lists (the servers it waits acks
	// from). A server judges it against the desired state; one without it is aimed at the
	// servers it names alone, and a pause or sleep of that kind holds a server until a
	// resume or wake.
	FleetWide bool `json:"fleet_wide,omitempty"`
	// Desired, when set, is the signed desired-state record (as written to its key) the
	// sender wrote for this command, so a server need not read the key before acting. It
	// is verified on its own, like the key's value.
	Desired json.RawMessage `json:"desired,omitempty"`
	// MACs authenticate the command to each target: an HMAC with that server's own key,
	// which only a trainer and that server can compute, truncated to 12 bytes, for each
	// target in Targets' order and each trainer key id listed, as "<key id>[,<key id>]:
	// <base64url of the concatenated MACs>". One HMAC a server checks costs a microsecond
	// where an Ed25519 check costs a hundred, and one string decodes faster than a map. A
	// server can forge a command only to itself. Commands to more than MaxMACTargets
	// servers, or to every server (no Targets), carry the trainer's Ed25519 Sig instead.
	MACs string `json:"macs,omitempty"`
	// Sig is the hex HMAC-SHA256 of Canonical with the fleet secret; empty when unsigned.
	Sig string `json:"sig,omitempty"`
}

// NewID returns a random 128-bit command id.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	return hex.EncodeToString(b[:])
}

// NewEnvelope builds an unsigned envelope for cmd, which must be one of the command types.
func NewEnvelope(fleet string, targets []string, cmd any, now time.Time, timeout time.Duration) (*Envelope, error) {
	kind, err := kindOf(cmd)
	if err != nil {
		return nil, err
	}
	if v, ok := cmd.(interface{ Validate() error }); ok {
		if err := v.Validate(); err != nil {
			return nil, err
		}
	}
	if fleet == "" {
		return nil, fmt.Errorf("%w: empty fleet name", ErrInvalid)
	}
	if timeout <= 0 {
		return nil, fmt.Errorf("%w: timeout must be > 0", ErrInvalid)
	}
	body, err := json.Marshal(cmd)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return &Envelope{V: Version, ID: NewID(), Fleet: fleet, Targets: slices.Clone(targets),
		IssuedAt: now.UnixMilli(), Deadline: now.Add(timeout).UnixMilli(), Kind: kind, Body: body}, nil
}

func kindOf(cmd any) (Kind, error) {
	switch cmd.(type) {
	case Pause, *Pause:
		return KindPause, nil
	case Resume, *Resume:
		return KindResume, nil
	case Sleep, *Sleep:
		return KindSleep, nil
	case Wake, *Wake:
		return KindWake, nil
	case Reset, *Reset:
		return KindReset, nil
	case Stage, *Stage:
		return KindStage, nil
	case Commit, *Commit:
		return KindCommit, nil
	case Abort, *Abort:
		return KindAbort, nil
	}
	return "", fmt.Errorf("%w: %T is not a command", ErrInvalid, cmd)
}

// Command strictly decodes Body into the command type Kind names and validates it.
func (e *Envelope) Command() (any, error) {
	var cmd interface{ Validate() error }
	switch e.Kind {
	case KindPause:
		cmd = &Pause{}
	case KindResume:
		cmd = &Resume{}
	case KindSleep:
		cmd = &Sleep{}
	case KindWake:
		cmd = &Wake{}
	case KindReset:
		cmd = &Reset{}
	case KindStage:
		cmd = &Stage{}
	case KindCommit:
		cmd = &Commit{}
	case KindAbort:
		cmd = &Abort{}
	default:
		return nil, fmt.Errorf("%w: unknown command kind %q", ErrMalformed, e.Kind)
	}
	// An empty object (resume, wake, reset, abort: sent to every server at every step)
	// decodes to the zero command without the decoder.
	if string(e.Body) != "{}" {
		if err := strict(e.Body, cmd); err != nil {
			return nil, fmt.Errorf("%s body: %w", e.Kind, err)
		}
	}
	if err := cmd.Validate(); err != nil {
		return nil, err
	}
	return deref(cmd), nil
}

func deref(cmd any) any {
	switch c := cmd.(type) {
	case *Pause:
		return *c
	case *Resume:
		return *c
	case *Sleep:
		return *c
	case *Wake:
		return *c
	case *Reset:
		return *c
	case *Stage:
		return *c
	case *Commit:
		return *c
	case *Abort:
		return *c
	}
	return cmd
}

// Validate methods for the commands with nothing to check, so every command has one.
func (Resume) Validate() error { return nil }

// Validate accepts every reset.
func (Reset) Validate() error { return nil }

// Validate accepts every abort.
func (Abort) Validate() error { return nil }

// ForServer reports whether the envelope targets server id.
func (e *Envelope) ForServer(id string) bool {
	return len(e.Targets) == 0 || slices.Contains(e.Targets, id)
}

// Canonical is what Sig signs: every field but Sig, length-prefixed, in a fixed order, with
// Targets sorted and Body in canonical JSON (sorted keys, no whitespace).
func (e *Envelope) Canonical() []byte {
	var c canon
	// Sized up front: every server of a command builds these bytes, and growing the buffer
	// target by target was most of the cost of checking a command to a large fleet.
	n := 160 + len(e.ID) + len(e.Fleet) + len(e.Kind) + len(e.Body) + len(e.Desired) + 4*len(e.Targets)
	for _, t := range e.Targets {
		n += len(t)
	}
	for k, v := range e.Trace {
		n += 8 + len(k) + len(v)
	}
	c.b.Grow(n)
	c.str("rollout.command")
	c.int(int64(e.V))
	c.str(e.ID)
	c.str(e.Fleet)
	c.strs(sortedTargets(e.Targets))
	c.int(e.IssuedAt)
	c.int(e.Deadline)
	c.strMap(e.Trace)
	c.str(string(e.Kind))
	c.bytes(canonicalJSON(e.Body))
	if e.Epoch != 0 || e.FleetWide || len(e.Desired) > 0 { // absent, the bytes are those of envelopes written before the fields
		c.str("epoch")
		c.int(e.Epoch)
		c.bool(e.FleetWide)
		c.bytes(e.Desired)
	}
	return c.b.Bytes()
}

// Sign sets Sig with the trainer key derived from secret.
func (e *Envelope) Sign(secret []byte) { e.SignWith(authOf(secret)) }

// MaxMACTargets is the most targets a command carries per-server MACs for; above it the
// command is signed once with the trainer key (the MACs would outgrow MaxMessageBytes).
const MaxMACTargets = 256

// SignWith authenticates the envelope with a's trainer secret: a MAC per target when it
// names 1 to MaxMACTargets of them, else the trainer key's signature (nothing when a holds
// no secret).
func (e *Envelope) SignWith(a *Auth) {
	e.Sig, e.MACs = "", ""
	if !a.CanSignCommands() {
		return
	}
	canonical := e.Canonical()
	if n := len(e.Targets); n > 0 && n <= MaxMACTargets {
		e.MACs = a.commandMACs(e.Fleet, sortedTargets(e.Targets), canonical)
		return
	}
	e.Sig = a.signTrainer(canonical)
}

// Verify checks, in order: wire version, fleet, signature (when secret is set; with an empty
// secret any signature is ignored), and the deadline against now. The ID must be checked for
// replay by the caller, who keeps the ids it has seen until their deadlines pass. A receiver
// that allows for clock skew passes now minus the allowance (VerifySkew).
func (e *Envelope) Verify(secret []byte, fleet string, now time.Time) error {
	return e.VerifyWith(authOf(secret), fleet, now)
}

// VerifyWith is Verify with the keys a holds (an unsigned a checks no signature): the
// trainer signature, or, without one, every MAC (which needs the fleet secret).
func (e *Envelope) VerifyWith(a *Auth, fleet string, now time.Time) error {
	return e.VerifyFor(a, fleet, "", now)
}

// VerifyFor is VerifyWith for the server that received it: its MAC when the envelope
// carries one for it, else the trainer signature.
func (e *Envelope) VerifyFor(a *Auth, fleet, serverID string, now time.Time) error {
	if e.V != Version {
		return fmt.Errorf("%w: v=%d, want %d", ErrVersion, e.V, Version)
	}
	if e.ID == "" || !e.Kind.Valid() {
		return fmt.Errorf("%w: missing id or unknown kind %q", ErrMalformed, e.Kind)
	}
	if e.Fleet != fleet {
		return fmt.Errorf("%w: %q, this is %q", ErrWrongFleet, e.Fleet, fleet)
	}
	if err := e.verifyAuth(a, serverID); err != nil {
		return err
	}
	if now.UnixMilli() > e.Deadline {
		return fmt.Errorf("%w: deadline %s", ErrExpired, time.UnixMilli(e.Deadline).UTC().Format(time.RFC3339Nano))
	}
	return nil
}

func (e *Envelope) verifyAuth(a *Auth, serverID string) error {
	if !a.Signed() {
		return nil
	}
	canonical := e.Canonical()
	if e.Sig != "" || e.MACs == "" {
		return a.verifyTrainer(canonical, e.Sig)
	}
	targets := sortedTargets(e.Targets) // MACs follow the sorted order, as Canonical does
	if serverID != "" {
		i, ok := slices.BinarySearch(targets, serverID)
		if !ok {
			return fmt.Errorf("%w: no MAC for server %s (was the command sent to others?)", ErrBadSignature, serverID)
		}
		return a.verifyCommandMAC(e.Fleet, serverID, i, len(targets), canonical, e.MACs)
	}
	for i, id := range targets {
		if err := a.verifyCommandMAC(e.Fleet, id, i, len(targets), canonical, e.MACs); err != nil {
			return err
		}
	}
	return nil
}

func sortedTargets(t []string) []string {
	if slices.IsSorted(t) {
		return t
	}
	s := slices.Clone(t)
	slices.Sort(s)
	return s
}

// Encode marshals the envelope, refusing one over MaxMessageBytes.
func (e *Envelope) Encode() ([]byte, error) { return encode(e) }

// DecodeEnvelope strictly decodes an envelope (signature and deadline are Verify's job).
func DecodeEnvelope(b []byte) (*Envelope, error) {
	var e Envelope
	if len(b) > MaxMessageBytes || !fastEnvelope(b, &e) {
		e = Envelope{}
		if err := decode(b, &e); err != nil {
			return nil, err
		}
	}
	if e.V != Version {
		return nil, fmt.Errorf("%w: v=%d, want %d", ErrVersion, e.V, Version)
	}
	return &e, nil
}

// Result says how a command ended on one server.
type Result string

// Results. Rejected means the server refused the command before acting on it.
const (
	ResultOK       Result = "ok"
	ResultFailed   Result = "failed"
	ResultRejected Result = "rejected"
)

// Phase is one step of a command on one server, with its timing.
type Phase struct {
	Name    string  `json:"name"`
	OK      bool    `json:"ok"`
	Error   string  `json:"error,omitempty"`
	Seconds float64 `json:"seconds"`
	// Detail carries phase-specific facts (blocks cleared, jobs flushed, bytes fetched).
	Detail map[string]int64 `json:"detail,omitempty"`
}

// Ack is one server's answer to one command, pushed onto the command's ack list.
type Ack struct {
	V         int    `json:"v"`
	CommandID string `json:"command_id"`
	ServerID  string `json:"server_id"`
	Kind      Kind   `json:"kind"`
	Result    Result `json:"result"`
	// Code is a short machine-readable reason for a failure or rejection; Error the message.
	Code   string  `json:"code,omitempty"`
	Error  string  `json:"error,omitempty"`
	Phases []Phase `json:"phases,omitempty"`
	// WeightVersion and StagedVersion are the server's after the command; WeightSHA256 the
	// digest of the checkpoint it serves ("" when it serves what it loaded at start).
	WeightVersion int64  `json:"weight_version"`
	StagedVersion int64  `json:"staged_version,omitempty"`
	WeightSHA256  string `json:"weight_sha256,omitempty"`
	// LastTokenBefore and FirstTokenAfter (Unix nanoseconds, 0 when unknown) bound a commit's
	// generation bubble: the last token generated before the pause, the first after the resume.
	LastTokenBefore int64 `json:"last_token_before,omitempty"`
	FirstTokenAfter int64 `json:"first_token_after,omitempty"`
	// Duplicate is set on a re-ack of a command already executed.
	Duplicate bool  `json:"duplicate,omitempty"`
	At        int64 `json:"at"`
	// Sig is the HMAC-SHA256 of Canonical (which also binds the fleet name); a client with
	// a secret trusts no ack without a valid one, so whoever can write to Redis cannot
	// forge an ok, failed or paused answer.
	Sig string `json:"sig,omitempty"`
}

// Canonical is what an ack's Sig signs, for fleet.
func (a *Ack) Canonical(fleet string) []byte {
	var c canon
	n := 192 + len(fleet) + len(a.CommandID) + len(a.ServerID) + len(a.Code) + len(a.Error) + len(a.WeightSHA256)
	for _, p := range a.Phases {
		n += 64 + len(p.Name) + len(p.Error) + 32*len(p.Detail)
	}
	c.b.Grow(n) // one allocation: every server signs an ack per command, the trainer checks each
	c.str("rollout.ack")
	c.int(int64(a.V))
	c.str(fleet)
	c.str(a.CommandID)
	c.str(a.ServerID)
	c.str(string(a.Kind))
	c.str(string(a.Result))
	c.str(a.Code)
	c.str(a.Error)
	c.int(int64(len(a.Phases)))
	for _, p := range a.Phases {
		c.str(p.Name)
		c.bool(p.OK)
		c.str(p.Error)
		c.str(strconv.FormatFloat(p.Seconds, 'g', -1, 64))
		keys := make([]string, 0, len(p.Detail))
		for k := range p.Detail {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		c.int(int64(len(keys)))
		for _, k := range keys {
			c.str(k)
			c.int(p.Detail[k])
		}
	}
	c.int(a.WeightVersion)
	c.int(a.StagedVersion)
	c.int(a.LastTokenBefore)
	c.int(a.FirstTokenAfter)
	c.bool(a.Duplicate)
	c.int(a.At)
	c.str(a.WeightSHA256)
	return c.b.Bytes()
}

// Sign sets Sig with the server key derived from secret for the ack's server (nothing when
// secret is empty: an unsigned fleet).
func (a *Ack) Sign(secret []byte, fleet string) { a.SignWith(authOf(secret), fleet) }

// SignWith sets Sig with auth's key for the ack's server ("" when auth cannot sign for it).
func (a *Ack) SignWith(auth *Auth, fleet string) {
	a.Sig = auth.signServer(fleet, a.ServerID, a.Canonical(fleet))
}

// Verify checks the ack's signature when secret is set.
func (a *Ack) Verify(secret []byte, fleet string) error { return a.VerifyWith(authOf(secret), fleet) }

// VerifyWith checks that the ack's server signed it (a trainer's Auth can check any
// server's; an issued server key only its own).
func (a *Ack) VerifyWith(auth *Auth, fleet string) error {
	return auth.verifyServer(fleet, a.ServerID, a.Canonical(fleet), a.Sig)
}

// Encode marshals the ack.
func (a *Ack) Encode() ([]byte, error) {
	if b, ok := appendAck(make([]byte, 0, 256+64*len(a.Phases)), a); ok && len(b) <= MaxMessageBytes {
		return b, nil
	}
	return encode(a)
}

// DecodeAck strictly decodes an ack.
func DecodeAck(b []byte) (*Ack, error) {
	var a Ack
	if len(b) > MaxMessageBytes || !fastAck(b, &a) {
		a = Ack{}
		if err := decode(b, &a); err != nil {
			return nil, err
		}
	}
	if a.V != Version {
		return nil, fmt.Errorf("%w: v=%d, want %d", ErrVersion, a.V, Version)
	}
	return &a, nil
}

// EngineState is a server's state as its heartbeat, its /state route, its metrics and the
// SDK's ServerStatus report it. Both sides compare states through these constants, never
// through string literals, so that a state added here is one the compiler finds every use
// of. The wire form is the plain string.
type EngineState string

// Server states a heartbeat reports.
const (
	// StateRunning schedules requests.
	StateRunning EngineState = "running"
	// StatePaused schedules nothing new (the pause mode says what happens to running ones).
	StatePaused EngineState = "paused"
	// StateSleeping is paused with the KV pool (and at level 2 the weights) released.
	StateSleeping EngineState = "sleeping"
	// StateUpdating is a server running a weight update (an HTTP one, or a fleet commit's
	// last step, after the resume, while the agent waits for the first token); it serves.
	StateUpdating EngineState = "updating"
	// StateStopping is a server's last heartbeat as it shuts down (never in rotation).
	StateStopping EngineState = "stopping"
)

// Serving reports whether a server in state s may take generate requests when in rotation:
// running or updating.
func (s EngineState) Serving() bool { return s == StateRunning || s == StateUpdating }

// Heartbeat is what a server publishes about itself under its heartbeat key, with a TTL.
type Heartbeat struct {
	V             int         `json:"v"`
	Fleet         string      `json:"fleet"`
	ServerID      string      `json:"server_id"`
	State         EngineState `json:"state"`
	WeightVersion int64       `json:"weight_version"`
	StagedVersion int64       `json:"staged_version,omitempty"`
	// Epoch is the desired-state epoch the server last converged to; InRotation is true only
	// when it serves the desired version and is neither paused nor asleep by its own doing.
	Epoch        int64   `json:"epoch"`
	InRotation   bool    `json:"in_rotation"`
	Running      int     `json:"running"`
	Waiting      int     `json:"waiting"`
	KVUsage      float64 `json:"kv_usage"`
	AdvertiseURL string  `json:"advertise_url"`
	Build        string  `json:"build,omitempty"`
	// Error is the last convergence failure, if any (e.g. a fetch that failed).
	Error string `json:"error,omitempty"`
	// PeerURL is the base of the server's read-only /weights/ route (empty: it has none),
	// where its peers fetch the versions it Holds (staged or serving, verified) and the
	// version it is fetching (relayed as it arrives).
	PeerURL string  `json:"peer_url,omitempty"`
	Holds   []int64 `json:"holds,omitempty"`
	// WeightSHA256 is the digest of the checkpoint the server serves ("" when it serves what
	// it loaded at start); DesiredEpoch the highest desired-state epoch it accepted, which a
	// client that finds the key gone or older uses to tell a replayed record.
	WeightSHA256 string `json:"weight_sha256,omitempty"`
	DesiredEpoch int64  `json:"desired_epoch,omitempty"`
	At           int64  `json:"at"`
	Sig          string `json:"sig,omitempty"`
}

// HoldsVersion reports whether the heartbeat says the server holds version v for its peers.
func (h *Heartbeat) HoldsVersion(v int64) bool { return h.PeerURL != "" && slices.Contains(h.Holds, v) }

// Canonical is what a heartbeat's Sig signs.
func (h *Heartbeat) Canonical() []byte {
	var c canon
	c.str("rollout.heartbeat")
	c.int(int64(h.V))
	c.str(h.Fleet)
	c.str(h.ServerID)
	c.str(string(h.State))
	c.int(h.WeightVersion)
	c.int(h.StagedVersion)
	c.int(h.Epoch)
	c.bool(h.InRotation)
	c.int(int64(h.Running))
	c.int(int64(h.Waiting))
	c.str(strconv.FormatFloat(h.KVUsage, 'g', -1, 64))
	c.str(h.AdvertiseURL)
	c.str(h.Build)
	c.str(h.Error)
	c.int(h.At)
	if h.PeerURL != "" || len(h.Holds) > 0 {
		// Appended only when set, so heartbeats without peers sign as before.
		c.str("peer")
		c.str(h.PeerURL)
		c.int(int64(len(h.Holds)))
		for _, v := range h.Holds {
			c.int(v)
		}
	}
	if h.WeightSHA256 != "" || h.DesiredEpoch != 0 {
		c.str("desired")
		c.str(h.WeightSHA256)
		c.int(h.DesiredEpoch)
	}
	return c.b.Bytes()
}

// Sign sets Sig with the server key derived from secret for the heartbeat's server.
func (h *Heartbeat) Sign(secret []byte) { h.SignWith(authOf(secret)) }

// SignWith sets Sig with a's key for the heartbeat's server ("" when a cannot sign for it).
func (h *Heartbeat) SignWith(a *Auth) { h.Sig = a.signServer(h.Fleet, h.ServerID, h.Canonical()) }

// Verify checks the fleet and, when secret is set, the signature.
func (h *Heartbeat) Verify(secret []byte, fleet string) error {
	return h.VerifyWith(authOf(secret), fleet)
}

// VerifyWith checks the fleet and that the heartbeat's server signed it (a trainer's Auth
// can check any server's; an issued server key only its own).
func (h *Heartbeat) VerifyWith(a *Auth, fleet string) error {
	if h.Fleet != fleet {
		return fmt.Errorf("%w: %q, this is %q", ErrWrongFleet, h.Fleet, fleet)
	}
	return a.verifyServer(fleet, h.ServerID, h.Canonical(), h.Sig)
}

// Encode marshals the heartbeat.
func (h *Heartbeat) Encode() ([]byte, error) { return encode(h) }

// DecodeHeartbeat strictly decodes a heartbeat.
func DecodeHeartbeat(b []byte) (*Heartbeat, error) {
	var h Heartbeat
	if err := decode(b, &h); err != nil {
		return nil, err
	}
	if h.V != Version {
		return nil, fmt.Errorf("%w: v=%d, want %d", ErrVersion, h.V, Version)
	}
	if h.ServerID == "" {
		return nil, fmt.Errorf("%w: heartbeat without server_id", ErrMalformed)
	}
	return &h, nil
}

// DesiredState is what every server of the fleet should converge to. Epoch grows by one on
// every change (compare-and-set), so a server can tell a newer record from one it has seen.
type DesiredState struct {
	V     int    `json:"v"`
	Fleet string `json:"fleet"`
	Epoch int64  `json:"epoch"`
	// Weights is the version every server should serve (nil: whatever it loaded at start).
	Weights *WeightsRef `json:"weights,omitempty"`
	// Plan is how a server that converges by itself commits Weights (mode, clear_cache,
	// sleep_level; Version is ignored): the same cut the transaction's commit command uses.
	Plan *Commit `json:"plan,omitempty"`
	// Paused asks servers to stay paused (an operator's fleet pause), with PauseMode (empty:
	// the plan's mode, else abort); Sleep > 0 asks them to sleep at that level (1: KV, 2:
	// also the weights). Servers converge to this run state in both directions: a server
	// that is paused or asleep while the record says serving resumes or wakes by itself.
	Paused    bool   `json:"paused"`
	PauseMode string `json:"pause_mode,omitempty"`
	Sleep     int    `json:"sleep,omitempty"`
	// Rolling claims the version a rolling update is committing batch by batch, before
	// Weights names it: the version number is taken for that digest, so no other update (or
	// commit command) may put another checkpoint under it. Convergence ignores it.
	Rolling *WeightsRef `json:"rolling,omitempty"`
	// Signed says the fleet's messages are signed: a server without a secret must not join.
	Signed    bool  `json:"signed"`
	UpdatedAt int64 `json:"updated_at"`
	// Trace is the W3C trace context of the call that wrote this state, so a server that
	// converges to it by itself (before or instead of the transaction's commands) records
	// the cut in that call's trace. Signed like an envelope's.
	Trace map[string]string `json:"trace,omitempty"`
	Sig   string            `json:"sig,omitempty"`
}

// Canonical is what a desired state's Sig signs.
func (d *DesiredState) Canonical() []byte {
	var c canon
	c.str("rollout.desired")
	c.int(int64(d.V))
	c.str(d.Fleet)
	c.int(d.Epoch)
	c.bool(d.Weights != nil)
	if d.Weights != nil {
		c.int(d.Weights.Version)
		c.str(d.Weights.URI)
		c.str(d.Weights.SHA256)
	}
	c.bool(d.Plan != nil)
	if d.Plan != nil {
		c.int(d.Plan.Version)
		c.str(d.Plan.Mode)
		c.bool(d.Plan.ClearCache)
		c.int(int64(d.Plan.SleepLevel))
	}
	c.bool(d.Paused)
	c.bool(d.Signed)
	c.int(d.UpdatedAt)
	if len(d.Trace) > 0 { // absent, the bytes are those of states written before the field
		c.strMap(d.Trace)
	}
	if d.PauseMode != "" || d.Sleep != 0 {
		c.str("run")
		c.str(d.PauseMode)
		c.int(int64(d.Sleep))
	}
	if d.Plan != nil && d.Plan.SHA256 != "" {
		c.str("plan_sha256")
		c.str(d.Plan.SHA256)
	}
	if d.Rolling != nil {
		c.str("rolling")
		c.int(d.Rolling.Version)
		c.str(d.Rolling.URI)
		c.str(d.Rolling.SHA256)
	}
	return c.b.Bytes()
}

// Sign sets Sig with the trainer key derived from secret.
func (d *DesiredState) Sign(secret []byte) { d.SignWith(authOf(secret)) }

// SignWith sets Sig with a's trainer key (empty when a holds none).
func (d *DesiredState) SignWith(a *Auth) { d.Sig = a.signTrainer(d.Canonical()) }

// Verify checks the fleet and, when secret is set, the signature.
func (d *DesiredState) Verify(secret []byte, fleet string) error {
	return d.VerifyWith(authOf(secret), fleet)
}

// VerifyWith checks the fleet, the content and the trainer signature with a's trusted keys.
func (d *DesiredState) VerifyWith(a *Auth, fleet string) error {
	if d.Fleet != fleet {
		return fmt.Errorf("%w: %q, this is %q", ErrWrongFleet, d.Fleet, fleet)
	}
	if d.Weights != nil {
		if err := d.Weights.Validate(); err != nil {
			return err
		}
		if d.Weights.SHA256 == "" {
			return fmt.Errorf("%w: desired weights version %d without a sha256", ErrInvalid, d.Weights.Version)
		}
	}
	if d.Rolling != nil && (d.Rolling.Validate() != nil || d.Rolling.SHA256 == "") {
		return fmt.Errorf("%w: desired rolling version %d without a valid ref and sha256", ErrInvalid, d.Rolling.Version)
	}
	if d.Sleep < 0 || d.Sleep > 2 || d.PauseMode != "" && !validMode(d.PauseMode) {
		return fmt.Errorf("%w: desired run state: sleep %d, pause mode %q", ErrInvalid, d.Sleep, d.PauseMode)
	}
	return a.verifyTrainer(d.Canonical(), d.Sig)
}

// Encode marshals the desired state.
func (d *DesiredState) Encode() ([]byte, error) { return encode(d) }

// DecodeDesiredState strictly decodes a desired state.
func DecodeDesiredState(b []byte) (*DesiredState, error) {
	var d DesiredState
	if err := decode(b, &d); err != nil {
		return nil, err
	}
	if d.V != Version {
		return nil, fmt.Errorf("%w: v=%d, want %d", ErrVersion, d.V, Version)
	}
	return &d, nil
}

// Claims reports the digest the desired state binds version v to ("" when it binds none):
// Weights' when it names v, else Rolling's.
func (d *DesiredState) Claims(v int64) string {
	switch {
	case d == nil:
		return ""
	case d.Weights != nil && d.Weights.Version == v:
		return d.Weights.SHA256
	case d.Rolling != nil && d.Rolling.Version == v:
		return d.Rolling.SHA256
	}
	return ""
}

// PeerToken is the bearer token a server presents to a peer's /weights/ route for version v
// with digest sha: the trainer key's signature of (fleet, version, digest), so only a trainer
// can make one, every member can check it, and it opens that one version only. Ed25519
// signatures are deterministic, so a server holding the fleet secret computes the same token
// the trainer puts in the stage command (Stage.Grant) for servers with issued keys. Empty
// when the fleet is unsigned (peer routes then take no token, as the rest of an unsigned
// fleet).
func PeerToken(secret []byte, fleet string, v int64, sha string) string {
	return authOf(secret).PeerGrant(fleet, v, sha)
}

// PeerGrant is PeerToken with a's trainer key ("" when a holds none).
func (a *Auth) PeerGrant(fleet string, v int64, sha string) string {
	return a.signTrainer(peerCanonical(fleet, v, sha))
}

// CheckPeerToken reports whether tok is a trainer's grant for (fleet, v, sha), checked with
// the trainer key derived from secret.
func CheckPeerToken(secret []byte, fleet string, v int64, sha, tok string) bool {
	return authOf(secret).CheckPeerGrant(fleet, v, sha, tok)
}

// CheckPeerGrant reports whether tok is a trainer's grant for (fleet, v, sha) under a key a
// trusts (true for an unsigned a).
func (a *Auth) CheckPeerGrant(fleet string, v int64, sha, tok string) bool {
	return a.verifyTrainer(peerCanonical(fleet, v, sha), tok) == nil
}

func peerCanonical(fleet string, v int64, sha string) []byte {
	var c canon
	c.str("rollout.peer")
	c.str(fleet)
	c.int(v)
	c.str(strings.ToLower(sha))
	return c.b.Bytes()
}

// CheckSecret refuses a secret too short to sign with; an empty secret means unsigned.
func CheckSecret(secret []byte) error {
	if len(secret) > 0 && len(secret) < MinSecretBytes {
		return fmt.Errorf("%w (got %d)", ErrShortSecret, len(secret))
	}
	return nil
}

// Names of the bus keys and channels of one fleet. Redis Cluster hashes the {fleet} tag, so
// every key of a fleet lands in one slot.
type Names struct{ Fleet string }

// Control is the pub/sub channel commands are published on.
func (n Names) Control() string { return "rollout:{" + n.Fleet + "}:control" }

// Desired is the desired-state key.
func (n Names) Desired() string { return "rollout:{" + n.Fleet + "}:desired" }

// HeartbeatPrefix prefixes every server's heartbeat key.
func (n Names) HeartbeatPrefix() string { return "rollout:{" + n.Fleet + "}:hb:" }

// Heartbeat is server id's heartbeat key.
func (n Names) Heartbeat(id string) string { return n.HeartbeatPrefix() + id }

// Acks is the durable ack list of command id.
func (n Names) Acks(commandID string) string { return "rollout:{" + n.Fleet + "}:ack:" + commandID }

// canon builds canonical bytes: each field a big-endian uint32 length and its bytes.
type canon struct{ b bytes.Buffer }

func (c *canon) bytes(p []byte) {
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(p)))
	c.b.Write(n[:])
	c.b.Write(p)
}
func (c *canon) str(s string) {
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(s)))
	c.b.Write(n[:])
	c.b.WriteString(s)
}

// int writes v's decimal digits as a string would be written, without making the string.
func (c *canon) int(v int64) {
	var d [24]byte
	c.bytes(strconv.AppendInt(d[:0], v, 10))
}
func (c *canon) bool(v bool) { c.str(strconv.FormatBool(v)) }
func (c *canon) strs(v []string) {
	c.int(int64(len(v)))
	for _, s := range v {
		c.str(s)
	}
}
func (c *canon) strMap(m map[string]string) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	c.int(int64(len(keys)))
	for _, k := range keys {
		c.str(k)
		c.str(m[k])
	}
}

// canonicalJSON makes the signed body independent of how the sender wrote its JSON: object
// keys sorted, no whitespace, strings re-escaped one way, numbers kept as written. Two bodies
// with the same canonical form decode to the same command, so nothing an attacker can change
// without the secret survives verification.
func canonicalJSON(b []byte) []byte {
	if len(bytes.TrimSpace(b)) == 0 {
		// A missing body is encoded as null: both must sign alike.
		return []byte("null")
	}
	if string(b) == "{}" {
		return b // already canonical: the body of most run-state commands
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return b // malformed bodies fail strict decoding later; sign what arrived
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return b // trailing data: strict decoding refuses it too
	}
	out, err := json.Marshal(v) // maps marshal with sorted keys
	if err != nil {
		return b
	}
	return out
}

func encode(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if len(b) > MaxMessageBytes {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(b), MaxMessageBytes)
	}
	return b, nil
}

func decode(b []byte, v any) error {
	if len(b) > MaxMessageBytes {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(b), MaxMessageBytes)
	}
	return strict(b, v)
}

// strict decodes one JSON value, refusing unknown fields and trailing data.
func strict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: trailing data", ErrMalformed)
	}
	return nil
}
