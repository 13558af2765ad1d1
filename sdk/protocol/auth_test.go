package protocol_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/sdk/protocol"
)

var secret2 = []byte("the-next-fleet-secret-after-rotation-0123")

func issued(t *testing.T, a *protocol.Auth, id string) *protocol.Auth {
	t.Helper()
	b, err := a.IssueServerKey("f", id)
	require.NoError(t, err)
	k, err := protocol.ParseServerKey(b)
	require.NoError(t, err)
	return k
}

// TestSeparateAuthorities: a server with an issued key verifies the trainer's commands and
// desired states but cannot make one; it signs its own heartbeats and acks, which the
// trainer verifies, and cannot sign as another server (issue 26: "a compromised server can
// speak only for itself").
func TestSeparateAuthorities(t *testing.T) {
	trainer, err := protocol.NewAuth(secret)
	require.NoError(t, err)
	s1 := issued(t, trainer, "s1")
	require.False(t, s1.CanSignCommands())
	assert.Equal(t, "s1", s1.ServerID())

	e := envelope(t, protocol.Pause{Mode: protocol.ModeAbort})
	e.Targets = nil // every server: the trainer key's signature
	e.SignWith(trainer)
	require.NotEmpty(t, e.Sig)
	require.NoError(t, e.VerifyFor(s1, "f", "s1", t0))
	forged := envelope(t, protocol.Pause{Mode: protocol.ModeAbort})
	forged.Targets = nil
	forged.SignWith(s1)
	assert.Empty(t, forged.Sig, "a server key cannot sign a command")
	forged.Sig = e.Sig
	require.ErrorIs(t, forged.VerifyFor(s1, "f", "s1", t0), protocol.ErrBadSignature)

	d := desired()
	d.SignWith(trainer)
	require.NoError(t, d.VerifyWith(s1, "f"))

	hb := heartbeat()
	hb.ServerID = "s1"
	hb.SignWith(s1)
	require.NotEmpty(t, hb.Sig)
	require.NoError(t, hb.VerifyWith(trainer, "f"), "the trainer checks every server's heartbeat")
	other := heartbeat()
	other.ServerID = "s2"
	other.SignWith(s1)
	assert.Empty(t, other.Sig, "s1's key cannot sign as s2")
	other.Sig = hb.Sig
	require.ErrorIs(t, other.VerifyWith(trainer, "f"), protocol.ErrBadSignature)

	ack := protocol.Ack{V: protocol.Version, CommandID: "c", ServerID: "s1", Kind: protocol.KindPause, Result: protocol.ResultOK}
	ack.SignWith(s1, "f")
	require.NoError(t, ack.VerifyWith(trainer, "f"))
	ack.ServerID = "s2"
	require.ErrorIs(t, ack.VerifyWith(trainer, "f"), protocol.ErrBadSignature, "an ack speaks for the server that signed it")

	grant := trainer.PeerGrant("f", 3, digest)
	assert.True(t, s1.CheckPeerGrant("f", 3, digest, grant))
	assert.False(t, s1.CheckPeerGrant("f", 4, digest, grant))
	assert.Empty(t, s1.PeerGrant("f", 3, digest), "a server cannot grant peer access")
}

// TestCommandMACs: a command to named servers carries a MAC per target, which each checks
// with its own key; a server's key can make a MAC only for itself, so a compromised server
// can command nobody but itself.
func TestCommandMACs(t *testing.T) {
	trainer, err := protocol.NewAuth(secret)
	require.NoError(t, err)
	s1, s2 := issued(t, trainer, "s1"), issued(t, trainer, "s2")
	e := envelope(t, protocol.Pause{Mode: protocol.ModeAbort}) // targets s2, s1
	e.SignWith(trainer)
	require.Empty(t, e.Sig)
	require.NotEmpty(t, e.MACs)
	require.NoError(t, e.VerifyFor(s1, "f", "s1", t0))
	require.NoError(t, e.VerifyFor(s2, "f", "s2", t0))
	require.NoError(t, e.VerifyWith(trainer, "f", t0), "the secret checks every MAC")
	requireOnly(t, e.VerifyFor(s1, "f", "s3", t0), protocol.ErrBadSignature)

	e.Targets = []string{"s2", "s3"} // s1's MAC position now names s2 (and the targets no longer match)
	requireOnly(t, e.VerifyFor(s2, "f", "s2", t0), protocol.ErrBadSignature)
	body := envelope(t, protocol.Pause{Mode: protocol.ModeAbort})
	body.SignWith(trainer)
	body.Body = []byte(`{"mode":"keep","clear_cache":false}`)
	requireOnly(t, body.VerifyFor(s1, "f", "s1", t0), protocol.ErrBadSignature)

	many := make([]string, protocol.MaxMACTargets+1)
	for i := range many {
		many[i] = fmt.Sprintf("s%d", i)
	}
	big, err := protocol.NewEnvelope("f", many, protocol.Resume{}, t0, time.Minute)
	require.NoError(t, err)
	big.SignWith(trainer)
	assert.Empty(t, big.MACs, "above MaxMACTargets one signature instead")
	require.NoError(t, big.VerifyFor(s1, "f", "s1", t0))
}

// TestKeyRotation: the trainer moves to a new secret without downtime. Servers first trust
// both trainer keys (re-issued under the old secret, listing both), the trainer signs with
// the new one while still checking heartbeats under the old one; then servers get keys
// issued under the new secret and the old one is dropped everywhere.
func TestKeyRotation(t *testing.T) {
	old, err := protocol.NewAuth(secret)
	require.NoError(t, err)
	both, err := protocol.NewAuth(secret, secret2) // old signs, both trusted
	require.NoError(t, err)
	s1 := issued(t, both, "s1")
	assert.Len(t, s1.TrustedKeys(), 2)

	next, err := protocol.NewAuth(secret2, secret) // the new one signs, the old still verifies
	require.NoError(t, err)
	assert.NotEqual(t, old.KeyID(), next.KeyID())
	e := envelope(t, protocol.Resume{}) // to s1 and s2: MACs under both secrets
	e.SignWith(next)
	require.NoError(t, e.VerifyFor(s1, "f", "s1", t0), "a server issued under the old key takes the new trainer's commands")
	e.Targets = nil
	e.SignWith(next)
	require.NoError(t, e.VerifyFor(s1, "f", "s1", t0), "and its signed ones, trusting both keys")
	hb := heartbeat()
	hb.ServerID = "s1"
	hb.SignWith(s1) // still under the old key
	require.NoError(t, hb.VerifyWith(next, "f"), "the trainer still checks heartbeats under the old key")

	s1new := issued(t, next, "s1")
	hb.SignWith(s1new)
	nextOnly, err := protocol.NewAuth(secret2)
	require.NoError(t, err)
	require.NoError(t, hb.VerifyWith(nextOnly, "f"))
	hb.SignWith(s1)
	require.ErrorIs(t, hb.VerifyWith(nextOnly, "f"), protocol.ErrBadSignature, "after the rotation the old key is gone")
	onlyNew, err := protocol.TrustKeys(nextOnly.TrustedKeys()...)
	require.NoError(t, err)
	e.SignWith(old)
	require.ErrorIs(t, e.VerifyFor(onlyNew, "f", "s1", t0), protocol.ErrBadSignature)
}

// TestServerKeyFileChecks: a key file that is not one, or whose key id it does not trust,
// or a trusted key whose id does not match it, is refused.
func TestServerKeyFileChecks(t *testing.T) {
	trainer, err := protocol.NewAuth(secret)
	require.NoError(t, err)
	good, err := trainer.IssueServerKey("f", "s1")
	require.NoError(t, err)
	for name, b := range map[string]string{
		"not json":      "nope",
		"wrong type":    strings.Replace(string(good), protocol.ServerKeyType, "x", 1),
		"short key":     strings.Replace(string(good), `"key": "`, `"key": "ab`, 1),
		"untrusted kid": strings.Replace(string(good), `"key_id": "`+trainer.KeyID(), `"key_id": "0000000000000000`, 1),
	} {
		_, err := protocol.ParseServerKey([]byte(b))
		require.Error(t, err, name)
	}
	pub := trainer.TrustedKeys()[0]
	_, err = protocol.TrustKeys(strings.Replace(pub, trainer.KeyID(), "0000000000000000", 1))
	require.ErrorIs(t, err, protocol.ErrInvalid)
	_, err = trainer.IssueServerKey("", "s1")
	require.ErrorIs(t, err, protocol.ErrInvalid)
	_, err = (&protocol.Auth{}).IssueServerKey("f", "s1")
	require.ErrorIs(t, err, protocol.ErrInvalid)
}
