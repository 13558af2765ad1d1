package agent

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/sdk/protocol"
)

var (
	coreSecret = []byte("core-test-secret-core-test-secret-0123")
	t0         = time.Unix(1_800_000_000, 0)
)

func newTestCore(secret []byte) *Core {
	c := NewCore(CoreConfig{Fleet: "f", ServerID: "s1", AdvertiseURL: "http://s1", Build: "b", Secret: secret, Start: t0})
	c.Engine(EngineState{State: "running", WeightVersion: 1})
	return c
}

func signedEnv(t *testing.T, cmd any, issued time.Time, timeout time.Duration, targets ...string) *protocol.Envelope {
	t.Helper()
	e, err := protocol.NewEnvelope("f", targets, cmd, issued, timeout)
	require.NoError(t, err)
	e.Sign(coreSecret)
	return e
}

func raw(t *testing.T, e *protocol.Envelope) []byte {
	t.Helper()
	b, err := e.Encode()
	require.NoError(t, err)
	return b
}

func desiredRaw(t *testing.T, d protocol.DesiredState, secret []byte) []byte {
	t.Helper()
	d.V, d.Fleet = protocol.Version, "f"
	if secret != nil {
		d.Sign(secret)
	}
	b, err := d.Encode()
	require.NoError(t, err)
	return b
}

// TestCoreRefusals: every refusal is counted by reason, acked when the sender can be told,
// and hands out no work.
func TestCoreRefusals(t *testing.T) {
	now := t0.Add(time.Minute)
	pause := protocol.Pause{Mode: protocol.ModeAbort}
	tests := []struct {
		name   string
		msg    func() []byte
		reason string
		acked  bool
	}{
		{"garbage", func() []byte { return []byte("nope") }, ReasonMalformed, false},
		{"wire version", func() []byte {
			e := signedEnv(t, pause, now, time.Minute)
			e.V = 2
			return raw(t, e)
		}, ReasonMalformed, false},
		{"unsigned", func() []byte {
			e := signedEnv(t, pause, now, time.Minute)
			e.Sig = ""
			return raw(t, e)
		}, ReasonUnsigned, true},
		{"bad signature", func() []byte {
			e := signedEnv(t, pause, now, time.Minute)
			e.Sign([]byte("another-secret-another-secret-another"))
			return raw(t, e)
		}, ReasonBadSignature, true},
		{"tampered targets", func() []byte {
			e := signedEnv(t, pause, now, time.Minute, "s2")
			e.Targets = []string{"s1"}
			return raw(t, e)
		}, ReasonBadSignature, true},
		{"expired", func() []byte { return raw(t, signedEnv(t, pause, now.Add(-2*time.Second), time.Second)) }, ReasonExpired, true},
		{"issued before start", func() []byte {
			return raw(t, signedEnv(t, pause, t0.Add(-time.Minute), 5*time.Minute))
		}, ReasonReplayed, true},
		{"lifetime too long", func() []byte { return raw(t, signedEnv(t, pause, now, time.Hour)) }, ReasonReplayed, true},
		{"wrong fleet", func() []byte {
			e, err := protocol.NewEnvelope("g", nil, pause, now, time.Minute)
			require.NoError(t, err)
			e.Sign(coreSecret)
			return raw(t, e)
		}, ReasonWrongFleet, false},
		{"bad body", func() []byte {
			e := signedEnv(t, pause, now, time.Minute)
			e.Body = json.RawMessage(`{"mode":"sideways"}`)
			e.Sign(coreSecret)
			return raw(t, e)
		}, ReasonMalformed, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestCore(coreSecret)
			c.Envelope(tt.msg(), now)
			r := c.Ready()
			assert.Nil(t, r.Work)
			assert.Equal(t, []string{tt.reason}, r.Rejected)
			assert.Empty(t, r.Commands)
			if tt.acked {
				require.Len(t, r.Acks, 1)
				assert.Equal(t, protocol.ResultRejected, r.Acks[0].Result)
				assert.Equal(t, tt.reason, r.Acks[0].Code)
				assert.Equal(t, "s1", r.Acks[0].ServerID)
			} else {
				assert.Empty(t, r.Acks)
			}
		})
	}
}

// TestCoreUnsignedFleet: without a secret, signatures are not required.
func TestCoreUnsignedFleet(t *testing.T) {
	c := newTestCore(nil)
	e, err := protocol.NewEnvelope("f", nil, protocol.Resume{}, t0, time.Minute)
	require.NoError(t, err)
	c.Envelope(raw(t, e), t0)
	r := c.Ready()
	require.NotNil(t, r.Work)
	assert.Empty(t, r.Rejected)
	hb := c.Heartbeat(t0)
	assert.Empty(t, hb.Sig)
}

// TestCoreOrderDedupeAndTargets: commands run one at a time in arrival order; a copy of a
// finished command is re-acked as a duplicate, a copy of a queued one is dropped, and
// commands for other servers are ignored.
func TestCoreOrderDedupeAndTargets(t *testing.T) {
	c := newTestCore(coreSecret)
	now := t0.Add(time.Second)
	e1 := signedEnv(t, protocol.Pause{Mode: protocol.ModeKeep}, now, time.Minute)
	e2 := signedEnv(t, protocol.Resume{}, now, time.Minute, "s1", "s2")
	other := signedEnv(t, protocol.Resume{}, now, time.Minute, "s2")

	c.Envelope(raw(t, e1), now)
	r := c.Ready()
	require.NotNil(t, r.Work)
	assert.Equal(t, e1.ID, r.Work.Envelope.ID)
	assert.True(t, c.Busy())

	c.Envelope(raw(t, e2), now)
	c.Envelope(raw(t, e1), now) // a copy while it runs: no second ack
	c.Envelope(raw(t, other), now)
	assert.True(t, c.Ready().Empty(), "busy: nothing new starts; copies and others' commands change nothing")

	paused := EngineState{State: "paused", WeightVersion: 1}
	c.Done(Result{Phases: []protocol.Phase{{Name: "pause", OK: true}}}, paused, now)
	r = c.Ready()
	require.Len(t, r.Acks, 1)
	assert.Equal(t, e1.ID, r.Acks[0].CommandID)
	assert.Equal(t, protocol.ResultOK, r.Acks[0].Result)
	assert.Equal(t, []CommandCount{{Kind: "pause", Result: "ok"}}, r.Commands)
	require.NotNil(t, r.Work, "the next command starts as soon as the first is done")
	assert.Equal(t, e2.ID, r.Work.Envelope.ID)

	c.Done(Result{Err: errors.New("boom"), Code: "engine_error"}, paused, now)
	r = c.Ready()
	require.Len(t, r.Acks, 1)
	assert.Equal(t, protocol.ResultFailed, r.Acks[0].Result)
	assert.Equal(t, "engine_error", r.Acks[0].Code)
	assert.Equal(t, "boom", r.Acks[0].Error)
	assert.Equal(t, []CommandCount{{Kind: "resume", Result: "failed"}}, r.Commands)

	later := now.Add(time.Second)
	c.Envelope(raw(t, e1), later)
	r = c.Ready()
	assert.Nil(t, r.Work)
	require.Len(t, r.Acks, 1)
	assert.True(t, r.Acks[0].Duplicate)
	assert.Equal(t, protocol.ResultOK, r.Acks[0].Result)
	assert.Equal(t, later.UnixMilli(), r.Acks[0].At)
	assert.Empty(t, r.Commands, "a duplicate is not counted again")
}

// TestCoreExpiresQueuedCommands: a command whose deadline passed while it waited is refused
// as expired when its turn comes.
func TestCoreExpiresQueuedCommands(t *testing.T) {
	c := newTestCore(coreSecret)
	now := t0.Add(time.Second)
	long := signedEnv(t, protocol.Stage{Weights: protocol.WeightsRef{Version: 2, URI: "file:///w"}}, now, time.Minute)
	short := signedEnv(t, protocol.Resume{}, now, time.Second)
	c.Envelope(raw(t, long), now)
	c.Envelope(raw(t, short), now)
	require.NotNil(t, c.Ready().Work)
	c.Done(Result{}, EngineState{State: "running", WeightVersion: 1, StagedVersion: 2}, now.Add(5*time.Second))
	r := c.Ready()
	assert.Nil(t, r.Work)
	assert.Equal(t, []string{ReasonExpired}, r.Rejected)
	require.Len(t, r.Acks, 2)
	assert.Equal(t, protocol.ResultOK, r.Acks[0].Result)
	assert.Equal(t, short.ID, r.Acks[1].CommandID)
	assert.Equal(t, ReasonExpired, r.Acks[1].Code)
}

// TestCoreConverge: what the core does about the desired state, from each starting point.
func TestCoreConverge(t *testing.T) {
	ref := protocol.WeightsRef{Version: 3, URI: "file:///w3", SHA256: ""}
	plan := &protocol.Commit{Mode: protocol.ModeKeep, ClearCache: true, SleepLevel: 1}
	tests := []struct {
		name       string
		desired    *protocol.DesiredState // nil: the key does not exist
		eng        EngineState
		wantStage  bool
		wantCommit *protocol.Commit
		wantPause  bool
		inRotation bool
	}{
		{"no desired state", nil, EngineState{State: "running", WeightVersion: 1}, false, nil, false, true},
		{"no weights named", &protocol.DesiredState{Epoch: 1}, EngineState{State: "running", WeightVersion: 1}, false, nil, false, true},
		{"at the version", &protocol.DesiredState{Epoch: 2, Weights: &ref, Plan: plan}, EngineState{State: "running", WeightVersion: 3}, false, nil, false, true},
		{"above the version", &protocol.DesiredState{Epoch: 2, Weights: &ref}, EngineState{State: "running", WeightVersion: 4}, false, nil, false, true},
		{"behind, nothing staged", &protocol.DesiredState{Epoch: 2, Weights: &ref, Plan: plan}, EngineState{State: "running", WeightVersion: 1},
			true, &protocol.Commit{Version: 3, Mode: protocol.ModeKeep, ClearCache: true, SleepLevel: 1}, false, false},
		{"behind, staged", &protocol.DesiredState{Epoch: 2, Weights: &ref, Plan: plan}, EngineState{State: "running", WeightVersion: 1, StagedVersion: 3},
			false, &protocol.Commit{Version: 3, Mode: protocol.ModeKeep, ClearCache: true, SleepLevel: 1}, false, false},
		{"behind, no plan", &protocol.DesiredState{Epoch: 2, Weights: &ref}, EngineState{State: "running", WeightVersion: 2, StagedVersion: 3},
			false, &protocol.Commit{Version: 3, Mode: protocol.ModeAbort, ClearCache: true}, false, false},
		{"fleet paused", &protocol.DesiredState{Epoch: 5, Paused: true}, EngineState{State: "running", WeightVersion: 1}, false, nil, true, false},
		{"fleet paused, already paused", &protocol.DesiredState{Epoch: 5, Paused: true}, EngineState{State: "paused", WeightVersion: 1}, false, nil, false, false},
		{"asleep", &protocol.DesiredState{Epoch: 1}, EngineState{State: "sleeping", WeightVersion: 1}, false, nil, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestCore(coreSecret)
			c.Engine(tt.eng)
			assert.False(t, c.InRotation(), "not in rotation before the desired state is read")
			var err error
			if tt.desired == nil {
				err = c.Desired(nil, false, t0)
			} else {
				err = c.Desired(desiredRaw(t, *tt.desired, coreSecret), true, t0)
			}
			require.NoError(t, err)
			r := c.Ready()
			assert.Empty(t, r.Rejected)
			w := r.Work
			if tt.wantCommit == nil && !tt.wantPause {
				assert.Nil(t, w)
			} else {
				require.NotNil(t, w)
				assert.Nil(t, w.Envelope)
				assert.Equal(t, "converge", w.Kind())
				assert.Equal(t, tt.wantStage, w.Stage != nil)
				assert.Equal(t, tt.wantCommit, w.Commit)
				assert.Equal(t, tt.wantPause, w.Pause != nil)
				if w.Stage != nil {
					assert.Equal(t, ref, *w.Stage)
				}
			}
			assert.Equal(t, tt.inRotation, c.InRotation())
			hb := c.Heartbeat(t0)
			assert.Equal(t, tt.inRotation, hb.InRotation)
			require.NoError(t, hb.Verify(coreSecret, "f"), "heartbeats are signed")
		})
	}
}

// TestCoreConvergenceBackoff: a failed convergence is retried with growing backoff for the
// same record, at once for a new epoch, and its error is in the heartbeat until it succeeds.
func TestCoreConvergenceBackoff(t *testing.T) {
	c := newTestCore(coreSecret)
	ref := protocol.WeightsRef{Version: 2, URI: "file:///w2"}
	d := desiredRaw(t, protocol.DesiredState{Epoch: 1, Weights: &ref}, coreSecret)
	behind := EngineState{State: "running", WeightVersion: 1}
	require.NoError(t, c.Desired(d, true, t0))
	require.NotNil(t, c.Ready().Work)

	now := t0
	for _, wait := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
		c.Done(Result{Err: errors.New("digest mismatch")}, behind, now)
		assert.Nil(t, c.Ready().Work, "no retry before the backoff")
		assert.Equal(t, "digest mismatch", c.Heartbeat(now).Error)
		c.Converge(now.Add(wait - time.Millisecond))
		assert.Nil(t, c.Ready().Work)
		now = now.Add(wait)
		c.Converge(now)
		require.NotNil(t, c.Ready().Work, "retried after %s", wait)
	}
	c.Done(Result{Err: errors.New("digest mismatch")}, behind, now)
	require.NoError(t, c.Desired(desiredRaw(t, protocol.DesiredState{Epoch: 2, Weights: &ref}, coreSecret), true, now))
	require.NotNil(t, c.Ready().Work, "a new epoch retries at once")
	c.Done(Result{Committed: 2}, EngineState{State: "running", WeightVersion: 2}, now)
	assert.Nil(t, c.Ready().Work)
	hb := c.Heartbeat(now)
	assert.Empty(t, hb.Error)
	assert.True(t, hb.InRotation)
	assert.EqualValues(t, 2, hb.Epoch)
}

// TestCoreDesiredStateChecks: a bad record is ignored and counted once; a signed fleet
// without a secret is refused; an older epoch does not replace a newer one.
func TestCoreDesiredStateChecks(t *testing.T) {
	ref := protocol.WeightsRef{Version: 2, URI: "file:///w2"}
	t.Run("tampered", func(t *testing.T) {
		c := newTestCore(coreSecret)
		d := protocol.DesiredState{V: protocol.Version, Fleet: "f", Epoch: 1}
		d.Sign(coreSecret)
		d.Weights = &ref
		b, err := d.Encode()
		require.NoError(t, err)
		require.NoError(t, c.Desired(b, true, t0))
		require.NoError(t, c.Desired(b, true, t0))
		r := c.Ready()
		assert.Equal(t, []string{ReasonBadSignature}, r.Rejected, "counted once")
		assert.Nil(t, r.Work)
		assert.False(t, c.InRotation(), "nothing good read yet")
	})
	t.Run("unsigned with a secret", func(t *testing.T) {
		c := newTestCore(coreSecret)
		require.NoError(t, c.Desired(desiredRaw(t, protocol.DesiredState{Epoch: 1, Weights: &ref}, nil), true, t0))
		assert.Equal(t, []string{ReasonUnsigned}, c.Ready().Rejected)
		c.Converge(t0)
		assert.Contains(t, c.Heartbeat(t0).Error, "desired state was refused: unsigned")
		assert.False(t, c.InRotation())
	})
	t.Run("malformed", func(t *testing.T) {
		c := newTestCore(coreSecret)
		require.NoError(t, c.Desired([]byte(`{"v":1,"bogus":true}`), true, t0))
		assert.Equal(t, []string{ReasonMalformed}, c.Ready().Rejected)
	})
	t.Run("signed fleet, no secret", func(t *testing.T) {
		c := newTestCore(nil)
		err := c.Desired(desiredRaw(t, protocol.DesiredState{Epoch: 1, Signed: true}, coreSecret), true, t0)
		assert.ErrorIs(t, err, ErrRefuseJoin)
	})
	t.Run("older epoch", func(t *testing.T) {
		c := newTestCore(coreSecret)
		c.Engine(EngineState{State: "running", WeightVersion: 2})
		require.NoError(t, c.Desired(desiredRaw(t, protocol.DesiredState{Epoch: 5, Weights: &ref}, coreSecret), true, t0))
		require.NoError(t, c.Desired(desiredRaw(t, protocol.DesiredState{Epoch: 4, Paused: true}, coreSecret), true, t0))
		v, paused, known := c.DesiredVersion()
		assert.EqualValues(t, 2, v)
		assert.False(t, paused)
		assert.True(t, known)
	})
}

// TestCoreCommitAfterSelfConvergence: a commit command for a version the server committed
// by itself is acked ok with that cut's phases and bubble. It is still handed out as work
// (so it gets its control.process span in the sender's trace), carrying its answer, so the
// loop runs nothing on the engine.
func TestCoreCommitAfterSelfConvergence(t *testing.T) {
	c := newTestCore(coreSecret)
	ref := protocol.WeightsRef{Version: 2, URI: "file:///w2"}
	require.NoError(t, c.Desired(desiredRaw(t, protocol.DesiredState{Epoch: 1, Weights: &ref}, coreSecret), true, t0))
	require.NotNil(t, c.Ready().Work)
	assert.Equal(t, protocol.StateUpdating, c.Heartbeat(t0).State)
	cut := Result{Phases: []protocol.Phase{{Name: "pause", OK: true}, {Name: "commit", OK: true}, {Name: "resume", OK: true}},
		Committed: 2, LastTokenBefore: 10, FirstTokenAfter: 20}
	c.Done(cut, EngineState{State: "running", WeightVersion: 2}, t0)
	c.Ready()

	e := signedEnv(t, protocol.Commit{Version: 2, Mode: protocol.ModeAbort}, t0, time.Minute)
	c.Envelope(raw(t, e), t0)
	r := c.Ready()
	require.NotNil(t, r.Work)
	require.NotNil(t, r.Work.Answer, "nothing to run on the engine")
	assert.Empty(t, r.Acks, "acked once the loop reports the work done")
	c.Done(*r.Work.Answer, EngineState{State: "running", WeightVersion: 2}, t0)
	r = c.Ready()
	require.Len(t, r.Acks, 1)
	a := r.Acks[0]
	assert.Equal(t, protocol.ResultOK, a.Result)
	assert.Equal(t, cut.Phases, a.Phases)
	assert.EqualValues(t, 10, a.LastTokenBefore)
	assert.EqualValues(t, 20, a.FirstTokenAfter)
	assert.EqualValues(t, 2, a.WeightVersion)
}

// TestCoreStop: queued commands are acked as failed, no more work starts, the heartbeat
// says stopping once the running work is done.
func TestCoreStop(t *testing.T) {
	c := newTestCore(coreSecret)
	require.NoError(t, c.Desired(nil, false, t0))
	c.Ready()
	e1 := signedEnv(t, protocol.Resume{}, t0, time.Minute)
	e2 := signedEnv(t, protocol.Reset{}, t0, time.Minute)
	c.Envelope(raw(t, e1), t0)
	c.Envelope(raw(t, e2), t0)
	require.NotNil(t, c.Ready().Work)
	c.Stop(t0)
	r := c.Ready()
	require.Len(t, r.Acks, 1)
	assert.Equal(t, e2.ID, r.Acks[0].CommandID)
	assert.Equal(t, CodeStopping, r.Acks[0].Code)
	assert.NotEqual(t, protocol.StateStopping, c.Heartbeat(t0).State, "still running e1")
	c.Done(Result{}, EngineState{State: "running", WeightVersion: 1}, t0)
	r = c.Ready()
	assert.Nil(t, r.Work)
	require.Len(t, r.Acks, 1)
	hb := c.Heartbeat(t0)
	assert.Equal(t, protocol.StateStopping, hb.State)
	assert.False(t, hb.InRotation)
	c.Converge(t0)
	assert.Nil(t, c.Ready().Work)
}
