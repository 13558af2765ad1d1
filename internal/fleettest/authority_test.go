package fleettest_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/internal/fleettest"
	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/protocol"
)

// TestIssuedKeysSeparateAuthority (issue 26, "a compromised server"): servers started with
// issued keys (--fleet-key-file) take the trainer's updates and control calls; what one
// server's key can sign is only that server's own messages. A pause signed with everything
// s1 holds is refused by every server, and a heartbeat for s2 signed with s1's key is not
// believed by the trainer.
func TestIssuedKeysSeparateAuthority(t *testing.T) {
	skipShort(t)
	f := fleettest.Start(t, fleettest.Options{Servers: 2, Fleet: "issued", IssuedKeys: true})
	c := dial(t, f)
	ref := fileRef(t, 1, 71)
	res, err := c.UpdateWeights(t.Context(), ref, sdk.Plan{})
	require.NoError(t, err)
	assert.Equal(t, sdk.OutcomeCommitted, res.Outcome)
	require.NoError(t, errOf(c.Pause(t.Context(), sdk.PauseOptions{})))
	require.NoError(t, errOf(c.Resume(t.Context(), sdk.ResumeOptions{})))

	raw, err := os.ReadFile(f.Procs[0].KeyFile())
	require.NoError(t, err)
	stolen, err := protocol.ParseServerKey(raw)
	require.NoError(t, err)
	require.False(t, stolen.CanSignCommands())

	b := dialBus(t, f)
	e := pauseEnvelope(t, f.Name, time.Now())
	e.SignWith(stolen) // signs nothing: a server key cannot make a trainer signature
	require.Empty(t, e.Sig)
	// The best the thief can do: sign the command bytes with s1's own key.
	hb := protocol.Heartbeat{V: protocol.Version, Fleet: f.Name, ServerID: "s1"}
	hb.SignWith(stolen)
	e.Sig = "ed25519:" + stolen.KeyID() + ":" + strings.Split(hb.Sig, ":")[2]
	publish(t, b, f, e)
	for _, p := range f.Procs {
		waitMetric(t, p, 1, "rollout_control_rejected_total", "reason", "bad_signature")
	}
	assertServing(t, f, 1)

	forged := f.Heartbeat("s2")
	require.NotNil(t, forged)
	forged.State, forged.InRotation, forged.WeightVersion = protocol.StatePaused, false, 0
	forged.SignWith(stolen) // s1's key cannot sign as s2: empty
	require.Empty(t, forged.Sig)
	forged.Sig = hb.Sig // s1's signature on s2's heartbeat
	fraw, err := forged.Encode()
	require.NoError(t, err)
	require.NoError(t, b.Set(t.Context(), protocol.Names{Fleet: f.Name}.Heartbeat("s2"), fraw, time.Minute))
	st, err := c.Status(t.Context())
	require.NoError(t, err)
	for _, s := range st {
		if s.ID == "s2" {
			assert.EqualValues(t, 1, s.WeightVersion, "the forged heartbeat is not believed")
		}
	}
}

// TestForgedAcksDoNotCommit (issue 26, finding 1) runs `rollout fleet update` with a digest
// every server's check fails, while an attacker with Redis access pushes "ok" acks for every
// command it sees: the update still aborts (exit 1), the desired state does not move, and
// every server keeps serving version 0 in rotation.
func TestForgedAcksDoNotCommit(t *testing.T) {
	skipShort(t)
	f := fleettest.Start(t, fleettest.Options{Servers: 2, Fleet: "forged-acks"})
	b := dialBus(t, f)
	sub, err := b.Subscribe(t.Context(), protocol.Names{Fleet: f.Name}.Control())
	require.NoError(t, err)
	defer sub.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go forgeAcks(ctx, b, f, sub, []byte("attacker-secret-of-at-least-32-bytes-long"))

	ckpt := filepath.Join(t.TempDir(), "ckpt")
	checkpoint(t, ckpt, 72)
	secret := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(secret, []byte(f.Secret), 0o600))
	cmd := exec.Command(fleettest.Binary(t), "fleet", "update", "--redis", f.Redis.URL(), "--fleet", f.Name, "--fleet-secret-file", secret,
		"--version", "1", "--source", "file://"+ckpt, "--sha256", strings.Repeat("0", 64), "--timeout", "10s")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	require.Error(t, err, "the update must not report success:\n%s", out.String())
	assert.NotContains(t, out.String(), "committed (every target")
	c := dial(t, f)
	d, err := c.DesiredState(t.Context())
	require.NoError(t, err)
	assert.True(t, d == nil || d.Weights == nil, "the desired state did not move")
	assertServing(t, f, 0)
}

// forgeAcks pushes an "ok" ack from every server for every command on the control channel:
// unsigned, and signed with a wrong secret.
func forgeAcks(ctx context.Context, b bus.Bus, f *fleettest.Fleet, sub bus.Subscription, wrong []byte) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-sub.Events():
			if !ok {
				return
			}
			if ev.Kind != bus.EventMessage {
				continue
			}
			e, err := protocol.DecodeEnvelope(ev.Payload)
			if err != nil {
				continue
			}
			for _, p := range f.Procs {
				for _, key := range [][]byte{nil, wrong} {
					a := protocol.Ack{V: protocol.Version, CommandID: e.ID, ServerID: p.ID, Kind: e.Kind, Result: protocol.ResultOK,
						WeightVersion: 1, StagedVersion: 1, At: time.Now().UnixMilli()}
					a.Sign(key, f.Name)
					raw, _ := a.Encode()
					_ = b.Push(ctx, protocol.Names{Fleet: f.Name}.Acks(e.ID), raw, time.Minute)
				}
			}
		}
	}
}

// TestGarbageAndPhantomsFromRedis (issue 26, findings 3 and 5, from outside): garbage
// written to the desired-state key is replaced by the servers' record and neither a new
// client nor the CLI fails on it; a dead server's heartbeat written back under its key (with
// a fresh TTL, its signed time old) is not a member, so an all-or-nothing update commits.
func TestGarbageAndPhantomsFromRedis(t *testing.T) {
	skipShort(t)
	f := fleettest.Start(t, fleettest.Options{Servers: 2, Fleet: "garbage"})
	c := dial(t, f)
	_, err := c.UpdateWeights(t.Context(), fileRef(t, 1, 81), sdk.Plan{})
	require.NoError(t, err)
	b := dialBus(t, f)
	key := protocol.Names{Fleet: f.Name}.Desired()
	require.NoError(t, f.SetKey(key, []byte("garbage")))
	waitKeyVersion(t, b, f, 1, "the servers write their record back over the garbage")
	c2 := dial(t, f)
	st, err := c2.Status(t.Context())
	require.NoError(t, err)
	require.Len(t, st, 2)

	// A phantom: s2's heartbeat as it was, written back under another id's key after a
	// minute, with a TTL of an hour.
	hb := f.Heartbeat("s2")
	require.NotNil(t, hb)
	ghost := *hb
	ghost.ServerID, ghost.At = "s9", time.Now().Add(-time.Minute).UnixMilli()
	ghost.Sign([]byte(f.Secret))
	raw, err := ghost.Encode()
	require.NoError(t, err)
	require.NoError(t, b.Set(t.Context(), protocol.Names{Fleet: f.Name}.Heartbeat("s9"), raw, time.Hour))
	res, err := c2.UpdateWeights(t.Context(), fileRef(t, 2, 82), sdk.Plan{Policy: sdk.AllOrNothing, StageTimeout: 20 * time.Second})
	require.NoError(t, err, "the phantom is not a target the update waits for")
	assert.Equal(t, sdk.OutcomeCommitted, res.Outcome)
	assert.Len(t, res.Servers, 2)
}

// TestDeleteThenReplayOldDesiredState (issue 26, finding 2, from Redis): the attacker deletes
// the desired-state key and writes back an older signed record (a fleet pause the trainer
// has since resumed). No server pauses again (their logs, read as a history, show no
// convergence to a pause after the replay), and the servers write the newest record back.
func TestDeleteThenReplayOldDesiredState(t *testing.T) {
	skipShort(t)
	f := fleettest.Start(t, fleettest.Options{Servers: 2, Fleet: "replay"})
	c := dial(t, f)
	b := dialBus(t, f)
	key := protocol.Names{Fleet: f.Name}.Desired()
	require.NoError(t, errOf(c.Pause(t.Context(), sdk.PauseOptions{})))
	old, err := b.Get(t.Context(), key)
	require.NoError(t, err)
	paused, err := protocol.DecodeDesiredState(old)
	require.NoError(t, err)
	require.True(t, paused.Paused)
	require.NoError(t, errOf(c.Resume(t.Context(), sdk.ResumeOptions{})))
	assertServing(t, f, 0)
	const pausing = "converging: the fleet is paused"
	before := map[string]int{}
	for _, p := range f.Procs {
		before[p.ID] = strings.Count(p.Logs(), pausing)
	}

	opt, err := redis.ParseURL(f.Redis.URL())
	require.NoError(t, err)
	rc := redis.NewClient(opt)
	defer rc.Close()
	require.NoError(t, rc.Del(t.Context(), key).Err())
	require.NoError(t, rc.Set(t.Context(), key, old, 0).Err())

	require.Eventually(t, func() bool {
		raw, err := b.Get(t.Context(), key)
		if err != nil {
			return false
		}
		d, err := protocol.DecodeDesiredState(raw)
		return err == nil && d.Epoch > paused.Epoch && !d.Paused
	}, 20*time.Second, 20*time.Millisecond, "the servers write the newest record back over the replayed one")
	wrote := 0
	for _, p := range f.Procs {
		assert.Equal(t, before[p.ID], strings.Count(p.Logs(), pausing), "%s paused again on a replayed record", p.ID)
		wrote += strings.Count(p.Logs(), "wrote back the newest record")
	}
	assert.Positive(t, wrote, "a server says it repaired the key")
	assertServing(t, f, 0)
}

// errOf drops a control call's results, for tests that check only its error.
func errOf(_ []sdk.ServerResult, err error) error { return err }
