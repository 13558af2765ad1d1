package sdk

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/sdk/protocol"
)

// TestForgedAcksAreIgnored: whoever can write to Redis can push to an ack list, but an ack
// the client cannot verify is not a server's answer: a forged "ok" for a pause nobody
// executed makes the call time out, not succeed (issue 26, finding 1).
func TestForgedAcksAreIgnored(t *testing.T) {
	b, agents, c := newMemFleet(t, secret, 1, 0)
	agents[0].set(func(a *fakeAgent) { a.silent[protocol.KindPause] = true })
	done := make(chan error, 1)
	go func() {
		done <- errOf(c.Pause(t.Context(), PauseOptions{Call: Call{Targets: []string{"a"}, Timeout: 2 * time.Second}}))
	}()
	require.Eventually(t, func() bool { return len(agents[0].got()) == 1 }, 10*time.Second, time.Millisecond)
	env := agents[0].got()[0]
	for _, key := range [][]byte{nil, []byte("another-secret-another-secret-0123456")} {
		forged := protocol.Ack{V: protocol.Version, CommandID: env.ID, ServerID: "a", Kind: protocol.KindPause, Result: protocol.ResultOK, At: time.Now().UnixMilli()}
		forged.Sign(key, "f")
		raw, err := forged.Encode()
		require.NoError(t, err)
		require.NoError(t, b.Push(t.Context(), protocol.Names{Fleet: "f"}.Acks(env.ID), raw, time.Minute))
	}
	err := <-done
	require.ErrorIs(t, err, ErrTimeout, "a forged ok is not an answer")
}

// TestPlanTargetsMustCoverTheFleet: an update moves the whole fleet's desired state, so a
// Plan.Targets that leaves out a live server is refused up front instead of reporting
// "committed" while the server left out follows anyway (issue 25, case 9).
func TestPlanTargetsMustCoverTheFleet(t *testing.T) {
	_, agents, c := newMemFleet(t, secret, 3, 0)
	_, err := c.UpdateWeights(t.Context(), ref(1), Plan{Targets: []string{"a", "b"}})
	require.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), `["c"]`)
	for _, a := range agents {
		assert.Empty(t, a.got(), "nothing was sent")
	}
	_, err = c.UpdateWeights(t.Context(), ref(1), Plan{Targets: []string{"c", "b", "a"}})
	require.NoError(t, err)
}

// TestVersionNamesOneCheckpoint: an update needs a digest; the same version and digest
// again completes an update (a retry after a cancelled roll); the same version with another
// checkpoint's digest is a conflict (issue 25, cases 1 and 5).
func TestVersionNamesOneCheckpoint(t *testing.T) {
	_, _, c := newMemFleet(t, secret, 2, 0)
	_, err := c.UpdateWeights(t.Context(), WeightsRef{Version: 1, URI: "file:///x"}, Plan{})
	require.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), "sha256")
	res, err := c.UpdateWeights(t.Context(), ref(1), Plan{})
	require.NoError(t, err)
	assert.Equal(t, OutcomeCommitted, res.Outcome)
	res, err = c.UpdateWeights(t.Context(), ref(1), Plan{})
	require.NoError(t, err, "a retry of the committed version and digest")
	assert.Equal(t, OutcomeCommitted, res.Outcome)
	other := ref(1)
	other.SHA256 = strings.Repeat("cd", 32)
	_, err = c.UpdateWeights(t.Context(), other, Plan{})
	require.ErrorIs(t, err, ErrConflict)
}

// TestStaleHeartbeatIsNotLive: a dead server's heartbeat written back under its key (the
// key's TTL is not signed; the time inside is) does not make it a live member that every
// all-or-nothing update waits for (issue 26, finding 3).
func TestStaleHeartbeatIsNotLive(t *testing.T) {
	b, _, c := newMemFleet(t, secret, 1, 0)
	hb := protocol.Heartbeat{V: protocol.Version, Fleet: "f", ServerID: "ghost", State: protocol.StateRunning, InRotation: true,
		AdvertiseURL: "http://127.0.0.1:1", At: time.Now().Add(-time.Hour).UnixMilli()}
	hb.Sign(secret)
	raw, err := hb.Encode()
	require.NoError(t, err)
	require.NoError(t, b.Set(t.Context(), protocol.Names{Fleet: "f"}.Heartbeat("ghost"), raw, time.Hour))
	st, err := c.Status(t.Context())
	require.NoError(t, err)
	for _, s := range st {
		assert.NotEqual(t, "ghost", s.ID)
	}
	res, err := c.UpdateWeights(t.Context(), ref(1), Plan{})
	require.NoError(t, err, "the phantom is not a target")
	assert.Len(t, res.Servers, 1)
}

// TestGarbageDesiredStateDoesNotBrickClients: one garbage write to the desired-state key
// does not make Dial or the next call fail; a client whose secret the servers' heartbeats
// confirm writes a good record over it (issue 25, case 11; issue 26, finding 5).
func TestGarbageDesiredStateDoesNotBrickClients(t *testing.T) {
	b, _, c := newMemFleet(t, secret, 2, 0)
	_, err := c.UpdateWeights(t.Context(), ref(1), Plan{})
	require.NoError(t, err)
	key := protocol.Names{Fleet: "f"}.Desired()
	require.NoError(t, b.Set(t.Context(), key, []byte("garbage"), 0))

	c2, err := Dial(t.Context(), Options{Bus: b, Fleet: "f", Secret: secret})
	require.NoError(t, err, "Dial survives a garbage key")
	t.Cleanup(func() { _ = c2.Close() })
	require.NoError(t, errOf(c.Pause(t.Context(), PauseOptions{})))
	raw, err := b.Get(t.Context(), key)
	require.NoError(t, err)
	d, err := protocol.DecodeDesiredState(raw)
	require.NoError(t, err, "the key holds a good record again")
	require.NoError(t, d.Verify(secret, "f"))
	assert.True(t, d.Paused)
	require.NotNil(t, d.Weights, "built on what the client last read, not on the garbage")
	assert.EqualValues(t, 1, d.Weights.Version)

	// A record signed with another secret, on a fleet whose heartbeats verify: forged.
	forged := protocol.DesiredState{V: protocol.Version, Fleet: "f", Epoch: 99, Paused: false, Signed: true}
	forged.Sign([]byte("another-secret-another-secret-0123456"))
	fraw, err := forged.Encode()
	require.NoError(t, err)
	require.NoError(t, b.Set(t.Context(), key, fraw, 0))
	require.NoError(t, errOf(c.Resume(t.Context(), ResumeOptions{})))
	raw, err = b.Get(t.Context(), key)
	require.NoError(t, err)
	d, err = protocol.DecodeDesiredState(raw)
	require.NoError(t, err)
	require.NoError(t, d.Verify(secret, "f"), "the forged record was replaced")
}

// TestRequestsCarryTheFleetFloor: every /generate names the fleet's committed version as
// its floor, so a server below it (restarted, lagging) refuses instead of serving old
// weights whatever this client's view of it said (issue 25, case 2).
func TestRequestsCarryTheFleetFloor(t *testing.T) {
	_, gens, c := genFleet(t, 2, 0)
	_, err := c.UpdateWeights(t.Context(), ref(1), Plan{})
	require.NoError(t, err)
	_, err = c.Generate(t.Context(), GenerateRequest{PromptTokenIDs: []int{1, 2}, Sampling: SamplingParams{MaxTokens: 2}})
	require.NoError(t, err)
	n := 0
	for _, g := range gens {
		for _, r := range g.got() {
			assert.EqualValues(t, 1, r.MinVersion)
			n++
		}
	}
	assert.Equal(t, 1, n)
}

// TestRollingClaimsItsVersion: a rolling update claims its version in the desired state
// before the first batch swaps, so another update of the same version with another
// checkpoint is refused before any server commits it (the fault harness's soak found two
// checkpoints under one version when a roll and a second trainer's update raced).
func TestRollingClaimsItsVersion(t *testing.T) {
	b, agents, c := newMemFleet(t, secret, 2, 0)
	for _, a := range agents {
		a.set(func(a *fakeAgent) { a.silent[protocol.KindCommit] = a.id == "b" }) // the roll stalls on its second batch
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.UpdateWeights(t.Context(), ref(1), Plan{Policy: Rolling(1), CommitTimeout: 5 * time.Second})
		done <- err
	}()
	commits := func(a *fakeAgent) int {
		n := 0
		for _, e := range a.got() {
			if e.Kind == protocol.KindCommit {
				n++
			}
		}
		return n
	}
	require.Eventually(t, func() bool { return commits(agents[0])+commits(agents[1]) == 2 }, 10*time.Second, time.Millisecond, "both batches sent")
	d, err := c.DesiredState(t.Context())
	require.NoError(t, err)
	require.NotNil(t, d.Rolling, "mid-roll the version is claimed")
	assert.Equal(t, ref(1), *d.Rolling)
	assert.Nil(t, d.Weights, "and not yet the fleet's")

	other := ref(1)
	other.SHA256 = strings.Repeat("cd", 32)
	c2, err := Dial(t.Context(), Options{Bus: b, Fleet: "f", Secret: secret})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c2.Close() })
	_, err = c2.UpdateWeights(t.Context(), other, Plan{})
	require.Error(t, err, "another checkpoint under the claimed version is refused")
	assert.True(t, errors.Is(err, ErrConflict) || errors.Is(err, ErrInvalid), "%v", err)
	for _, a := range agents {
		for _, e := range a.got() {
			if e.Kind == protocol.KindStage {
				cmd, err := e.Command()
				require.NoError(t, err)
				assert.Equal(t, ref(1).SHA256, cmd.(protocol.Stage).Weights.SHA256, "nothing of the other checkpoint was sent")
			}
		}
	}
	<-done
}
