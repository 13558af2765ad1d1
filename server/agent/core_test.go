package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"
	"unsafe"

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
		{"expired", func() []byte { return raw(t, signedEnv(t, pause, now.Add(-40*time.Second), time.Second)) }, ReasonExpired, true},
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
	done(c, Result{Phases: []protocol.Phase{{Name: "pause", OK: true}}}, paused, now)
	r = c.Ready()
	require.Len(t, r.Acks, 1)
	assert.Equal(t, e1.ID, r.Acks[0].CommandID)
	assert.Equal(t, protocol.ResultOK, r.Acks[0].Result)
	assert.Equal(t, []CommandCount{{Kind: "pause", Result: "ok"}}, r.Commands)
	require.NotNil(t, r.Work, "the next command starts as soon as the first is done")
	assert.Equal(t, e2.ID, r.Work.Envelope.ID)

	done(c, Result{Err: errors.New("boom"), Code: "engine_error"}, paused, now)
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

// TestCoreExpiresQueuedCommands: a command whose deadline (plus the clock-skew allowance)
// passed while it waited is refused as expired when its turn comes.
func TestCoreExpiresQueuedCommands(t *testing.T) {
	c := newTestCore(coreSecret)
	now := t0.Add(time.Second)
	long := signedEnv(t, protocol.Pause{Mode: protocol.ModeWait}, now, time.Minute)
	short := signedEnv(t, protocol.Resume{}, now, time.Second)
	c.Envelope(raw(t, long), now)
	c.Envelope(raw(t, short), now)
	require.NotNil(t, c.Ready().Work)
	done(c, Result{}, EngineState{State: "paused", WeightVersion: 1}, now.Add(40*time.Second))
	r := c.Ready()
	assert.Nil(t, r.Work)
	assert.Equal(t, []string{ReasonExpired}, r.Rejected)
	require.Len(t, r.Acks, 2)
	assert.Equal(t, protocol.ResultOK, r.Acks[0].Result)
	assert.Equal(t, short.ID, r.Acks[1].CommandID)
	assert.Equal(t, ReasonExpired, r.Acks[1].Code)
}

// TestCoreAllowsClockSkew: a command from a sender whose clock is 20 s behind is executed,
// not refused as expired (issue 25, case 10).
func TestCoreAllowsClockSkew(t *testing.T) {
	c := newTestCore(coreSecret)
	now := t0.Add(time.Minute)
	e := signedEnv(t, protocol.Pause{Mode: protocol.ModeAbort}, now.Add(-20*time.Second), 10*time.Second)
	c.Envelope(raw(t, e), now)
	r := c.Ready()
	assert.Empty(t, r.Rejected)
	require.NotNil(t, r.Work)
	assert.Equal(t, e.ID, r.Work.Envelope.ID)
}

const (
	shaA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	shaB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

// TestCoreConverge: what the core does about the desired state, from each starting point:
// weights by version and digest, run state in both directions.
func TestCoreConverge(t *testing.T) {
	ref := protocol.WeightsRef{Version: 3, URI: "file:///w3", SHA256: shaA}
	plan := &protocol.Commit{Mode: protocol.ModeKeep, ClearCache: true, SleepLevel: 1}
	commit := func(mode string, cc bool, level int) *Work {
		return &Work{Commit: &protocol.Commit{Version: 3, Mode: mode, ClearCache: cc, SleepLevel: level, SHA256: shaA}}
	}
	tests := []struct {
		name       string
		desired    *protocol.DesiredState // nil: the key does not exist
		eng        EngineState
		want       *Work // only its action fields are compared; nil: nothing to do
		inRotation bool
	}{
		{"no desired state", nil, EngineState{State: "running", WeightVersion: 1}, nil, true},
		{"no weights named", &protocol.DesiredState{Epoch: 1}, EngineState{State: "running", WeightVersion: 1}, nil, true},
		{"at the version", &protocol.DesiredState{Epoch: 2, Weights: &ref, Plan: plan}, EngineState{State: "running", WeightVersion: 3, WeightSHA256: shaA}, nil, true},
		{"at the version, another checkpoint", &protocol.DesiredState{Epoch: 2, Weights: &ref}, EngineState{State: "running", WeightVersion: 3, WeightSHA256: shaB}, nil, false},
		{"above the version", &protocol.DesiredState{Epoch: 2, Weights: &ref}, EngineState{State: "running", WeightVersion: 4}, nil, true},
		{"behind, nothing staged", &protocol.DesiredState{Epoch: 2, Weights: &ref, Plan: plan}, EngineState{State: "running", WeightVersion: 1},
			&Work{Stage: &ref}, false},
		{"behind, the version staged from another checkpoint", &protocol.DesiredState{Epoch: 2, Weights: &ref, Plan: plan},
			EngineState{State: "running", WeightVersion: 1, StagedVersion: 3, StagedSHA256: shaB}, &Work{Stage: &ref}, false},
		{"behind, staged", &protocol.DesiredState{Epoch: 2, Weights: &ref, Plan: plan}, EngineState{State: "running", WeightVersion: 1, StagedVersion: 3, StagedSHA256: shaA},
			commit(protocol.ModeKeep, true, 1), false},
		{"behind, no plan", &protocol.DesiredState{Epoch: 2, Weights: &ref}, EngineState{State: "running", WeightVersion: 2, StagedVersion: 3, StagedSHA256: shaA},
			commit(protocol.ModeAbort, true, 0), false},
		{"fleet paused", &protocol.DesiredState{Epoch: 5, Paused: true}, EngineState{State: "running", WeightVersion: 1},
			&Work{Pause: &protocol.Pause{Mode: protocol.ModeAbort}}, false},
		{"fleet paused with a mode", &protocol.DesiredState{Epoch: 5, Paused: true, PauseMode: protocol.ModeKeep}, EngineState{State: "running", WeightVersion: 1},
			&Work{Pause: &protocol.Pause{Mode: protocol.ModeKeep}}, false},
		{"fleet paused, already paused", &protocol.DesiredState{Epoch: 5, Paused: true}, EngineState{State: "paused", WeightVersion: 1}, nil, false},
		{"serving, engine paused", &protocol.DesiredState{Epoch: 1}, EngineState{State: "paused", WeightVersion: 1}, &Work{Resume: true}, false},
		{"serving, engine asleep", &protocol.DesiredState{Epoch: 1}, EngineState{State: "sleeping", WeightVersion: 1}, &Work{Wake: true, Resume: true}, false},
		{"fleet asleep", &protocol.DesiredState{Epoch: 1, Sleep: 1}, EngineState{State: "running", WeightVersion: 1},
			&Work{Sleep: &protocol.Sleep{Level: 1, Mode: protocol.ModeAbort}}, false},
		{"fleet asleep, already asleep", &protocol.DesiredState{Epoch: 1, Sleep: 2}, EngineState{State: "sleeping", WeightVersion: 1}, nil, false},
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
			if w == nil {
				w = r.Fetch
			}
			if tt.want == nil {
				assert.Nil(t, w)
			} else {
				require.NotNil(t, w)
				assert.Nil(t, w.Envelope)
				assert.Equal(t, "converge", w.Kind())
				assert.Equal(t, tt.want.Stage != nil, r.Fetch != nil, "a stage runs on the fetch lane")
				assert.Equal(t, tt.want.Stage, w.Stage)
				assert.Equal(t, tt.want.Commit, w.Commit)
				assert.Equal(t, tt.want.Pause, w.Pause)
				assert.Equal(t, tt.want.Sleep, w.Sleep)
				assert.Equal(t, tt.want.Wake, w.Wake)
				assert.Equal(t, tt.want.Resume, w.Resume)
			}
			assert.Equal(t, tt.inRotation, c.InRotation())
			hb := c.Heartbeat(t0)
			assert.Equal(t, tt.inRotation, hb.InRotation)
			if !tt.inRotation {
				assert.Contains(t, hb.Error, "out of rotation: ", "the heartbeat says why")
			}
			require.NoError(t, hb.Verify(coreSecret, "f"), "heartbeats are signed")
		})
	}
}

// TestCoreConvergenceBackoff: a failed convergence is retried with growing backoff for the
// same record, at once for a new epoch, and its error is in the heartbeat until it succeeds.
func TestCoreConvergenceBackoff(t *testing.T) {
	c := newTestCore(coreSecret)
	ref := protocol.WeightsRef{Version: 2, URI: "file:///w2", SHA256: shaA}
	d := desiredRaw(t, protocol.DesiredState{Epoch: 1, Weights: &ref}, coreSecret)
	behind := EngineState{State: "running", WeightVersion: 1}
	require.NoError(t, c.Desired(d, true, t0))
	require.NotNil(t, c.Ready().Fetch)

	now := t0
	for _, wait := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
		done(c, Result{Err: errors.New("digest mismatch")}, behind, now)
		assert.Nil(t, c.Ready().Fetch, "no retry before the backoff")
		assert.Contains(t, c.Heartbeat(now).Error, "digest mismatch")
		c.Converge(now.Add(wait - time.Millisecond))
		assert.Nil(t, c.Ready().Fetch)
		now = now.Add(wait)
		c.Converge(now)
		require.NotNil(t, c.Ready().Fetch, "retried after %s", wait)
	}
	done(c, Result{Err: errors.New("digest mismatch")}, behind, now)
	require.NoError(t, c.Desired(desiredRaw(t, protocol.DesiredState{Epoch: 2, Weights: &ref}, coreSecret), true, now))
	require.NotNil(t, c.Ready().Fetch, "a new epoch retries at once")
	done(c, Result{}, EngineState{State: "running", WeightVersion: 1, StagedVersion: 2, StagedSHA256: shaA}, now)
	require.NotNil(t, c.Ready().Work, "staged: the commit follows")
	done(c, Result{Committed: 2}, EngineState{State: "running", WeightVersion: 2, WeightSHA256: shaA}, now)
	assert.Nil(t, c.Ready().Work)
	hb := c.Heartbeat(now)
	assert.Empty(t, hb.Error)
	assert.True(t, hb.InRotation)
	assert.EqualValues(t, 2, hb.Epoch)
	assert.Equal(t, shaA, hb.WeightSHA256)
	assert.EqualValues(t, 2, hb.DesiredEpoch)
}

// TestCoreDesiredStateChecks: a bad record is ignored and counted once, and a server without
// a record of its own then counts as in a fresh fleet (issue 25, case 11); a signed fleet
// without a secret is refused; an older epoch does not replace a newer one.
func TestCoreDesiredStateChecks(t *testing.T) {
	ref := protocol.WeightsRef{Version: 2, URI: "file:///w2", SHA256: shaA}
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
		assert.Nil(t, r.Repair, "nothing of its own to write back")
		assert.True(t, c.InRotation(), "a bad record does not keep a server out of rotation for good")
	})
	t.Run("unsigned with a secret", func(t *testing.T) {
		c := newTestCore(coreSecret)
		require.NoError(t, c.Desired(desiredRaw(t, protocol.DesiredState{Epoch: 1, Weights: &ref}, nil), true, t0))
		assert.Equal(t, []string{ReasonUnsigned}, c.Ready().Rejected)
		c.Converge(t0)
		assert.Contains(t, c.Heartbeat(t0).Error, "desired state was refused: unsigned")
		assert.Nil(t, c.Ready().Fetch, "an unverified record is not acted on")
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
		c.Engine(EngineState{State: "running", WeightVersion: 2, WeightSHA256: shaA})
		newer := desiredRaw(t, protocol.DesiredState{Epoch: 5, Weights: &ref}, coreSecret)
		require.NoError(t, c.Desired(newer, true, t0))
		c.Ready()
		old := desiredRaw(t, protocol.DesiredState{Epoch: 4, Paused: true}, coreSecret)
		require.NoError(t, c.Desired(old, true, t0))
		v, paused, known := c.desiredVersion()
		assert.EqualValues(t, 2, v)
		assert.False(t, paused)
		assert.True(t, known)
		r := c.Ready()
		assert.Equal(t, []string{ReasonReplayed}, r.Rejected)
		require.NotNil(t, r.Repair, "the newer record is written back over the replay")
		assert.Equal(t, old, r.Repair.Old)
		assert.Equal(t, newer, r.Repair.New)
		assert.Nil(t, r.Work)
	})
}

// TestCoreKeepsTheDesiredStateWhenTheKeyIsLost: a Redis restart that lost the key (or a
// DEL) changes nothing: the server keeps the record, stays out of rotation while behind
// it, and asks to write it back (issue 25, cases 3 and 6).
func TestCoreKeepsTheDesiredStateWhenTheKeyIsLost(t *testing.T) {
	c := newTestCore(coreSecret)
	ref := protocol.WeightsRef{Version: 2, URI: "file:///w2", SHA256: shaA}
	d := desiredRaw(t, protocol.DesiredState{Epoch: 3, Weights: &ref}, coreSecret)
	require.NoError(t, c.Desired(d, true, t0))
	r := c.Ready()
	assert.Equal(t, d, r.Persist, "an accepted record is saved")
	require.NotNil(t, r.Fetch)

	require.NoError(t, c.Desired(nil, false, t0))
	r = c.Ready()
	require.NotNil(t, r.Repair)
	assert.Nil(t, r.Repair.Old, "the key is missing")
	assert.Equal(t, d, r.Repair.New)
	assert.False(t, c.InRotation(), "still behind the fleet's version")
	v, _, _ := c.desiredVersion()
	assert.EqualValues(t, 2, v)

	require.NoError(t, c.Desired([]byte("garbage"), true, t0))
	r = c.Ready()
	require.NotNil(t, r.Repair, "garbage is overwritten too")
	assert.Equal(t, []byte("garbage"), r.Repair.Old)
}

// TestCoreRestoresTheSavedDesiredState: a server restarted with a state directory knows the
// fleet's version before Redis answers, and after an empty Redis writes it back.
func TestCoreRestoresTheSavedDesiredState(t *testing.T) {
	ref := protocol.WeightsRef{Version: 2, URI: "file:///w2", SHA256: shaA}
	saved := desiredRaw(t, protocol.DesiredState{Epoch: 7, Weights: &ref}, coreSecret)
	c := NewCore(CoreConfig{Fleet: "f", ServerID: "s1", Secret: coreSecret, Start: t0, Saved: saved})
	c.Engine(EngineState{State: "running"})
	require.NoError(t, c.Desired(nil, false, t0))
	r := c.Ready()
	require.NotNil(t, r.Repair)
	assert.Equal(t, saved, r.Repair.New)
	assert.False(t, c.InRotation(), "a restarted server on version 0 stays out of rotation")
	assert.NotNil(t, r.Fetch, "and converges to the saved version")

	bad := NewCore(CoreConfig{Fleet: "f", ServerID: "s1", Secret: []byte("another-secret-another-secret-0123456"), Start: t0, Saved: saved})
	d, _ := bad.DesiredState()
	assert.Nil(t, d, "a saved record that no longer verifies is dropped")
}

// TestCoreResumeAfterPauseRace: a fleet resume that arrives while the server still holds
// the fleet pause's record reads the newer record first, resumes, and is not paused again
// (issue 25, case 4).
func TestCoreResumeAfterPauseRace(t *testing.T) {
	c := newTestCore(coreSecret)
	paused := desiredRaw(t, protocol.DesiredState{Epoch: 2, Paused: true, PauseMode: protocol.ModeKeep}, coreSecret)
	require.NoError(t, c.Desired(paused, true, t0))
	r := c.Ready()
	require.NotNil(t, r.Work)
	require.NotNil(t, r.Work.Pause)
	done(c, Result{}, EngineState{State: "paused", WeightVersion: 1}, t0)
	c.Ready()

	e := signedEnv(t, protocol.Resume{}, t0, time.Minute, "s1", "s2")
	e.Epoch, e.FleetWide = 3, true
	e.Sign(coreSecret)
	c.Envelope(raw(t, e), t0)
	r = c.Ready()
	assert.True(t, r.Resync, "the command names a newer desired state")
	assert.Nil(t, r.Work, "held until it is read")
	require.NoError(t, c.Desired(desiredRaw(t, protocol.DesiredState{Epoch: 3}, coreSecret), true, t0))
	c.Resynced(t0)
	r = c.Ready()
	require.NotNil(t, r.Work)
	assert.Equal(t, e.ID, r.Work.Envelope.ID)
	assert.Nil(t, r.Work.Answer, "the resume agrees with the record: it runs")
	done(c, Result{}, EngineState{State: "running", WeightVersion: 1}, t0)
	r = c.Ready()
	assert.Nil(t, r.Work, "nothing pauses it again")
	assert.True(t, c.InRotation())
}

// TestCoreConvergesAfterALostResume: a server that missed the fleet's resume resumes by
// itself once it reads the record (issue 25, case 4: a lost resume or wake message).
func TestCoreConvergesAfterALostResume(t *testing.T) {
	c := newTestCore(coreSecret)
	c.Engine(EngineState{State: "sleeping", WeightVersion: 1})
	require.NoError(t, c.Desired(desiredRaw(t, protocol.DesiredState{Epoch: 4}, coreSecret), true, t0))
	r := c.Ready()
	require.NotNil(t, r.Work)
	assert.True(t, r.Work.Wake)
	assert.True(t, r.Work.Resume)
}

// TestCoreSupersededRunStateCommands: a fleet-wide pause replayed after the fleet resumed
// (say, after a server restart wiped its seen ids) changes nothing (issue 25, case 8); a
// pause aimed at this server alone holds it paused against convergence until a resume.
func TestCoreSupersededRunStateCommands(t *testing.T) {
	c := newTestCore(coreSecret)
	require.NoError(t, c.Desired(desiredRaw(t, protocol.DesiredState{Epoch: 6}, coreSecret), true, t0))
	c.Ready()
	replay := signedEnv(t, protocol.Pause{Mode: protocol.ModeAbort, ClearCache: true}, t0, time.Minute)
	replay.Epoch, replay.FleetWide = 5, true
	replay.Sign(coreSecret)
	c.Envelope(raw(t, replay), t0)
	r := c.Ready()
	require.NotNil(t, r.Work)
	require.NotNil(t, r.Work.Answer, "superseded: nothing runs on the engine")
	assert.EqualValues(t, 1, r.Work.Answer.Phases[0].Detail["superseded"])
	done(c, *r.Work.Answer, EngineState{State: "running", WeightVersion: 1}, t0)
	r = c.Ready()
	require.Len(t, r.Acks, 1)
	assert.Equal(t, protocol.ResultOK, r.Acks[0].Result)

	own := signedEnv(t, protocol.Pause{Mode: protocol.ModeAbort}, t0, time.Minute, "s1")
	own.Epoch = 6
	own.Sign(coreSecret)
	c.Envelope(raw(t, own), t0)
	r = c.Ready()
	require.NotNil(t, r.Work)
	assert.Nil(t, r.Work.Answer)
	done(c, Result{}, EngineState{State: "paused", WeightVersion: 1}, t0)
	r = c.Ready()
	assert.Nil(t, r.Work, "a pause aimed at this server alone is not undone by convergence")
	c.Envelope(raw(t, signedEnv(t, protocol.Resume{}, t0, time.Minute, "s1")), t0)
	require.NotNil(t, c.Ready().Work)
	done(c, Result{}, EngineState{State: "running", WeightVersion: 1}, t0)
	c.Ready()
	assert.True(t, c.InRotation())
}

// TestCoreControlDoesNotWaitBehindAStage: abort and pause go out while a stage fetches
// (issue 25, case 7), and a convergence stage the fleet no longer wants is cancelled.
func TestCoreControlDoesNotWaitBehindAStage(t *testing.T) {
	c := newTestCore(coreSecret)
	ref := protocol.WeightsRef{Version: 2, URI: "file:///w2", SHA256: shaA}
	require.NoError(t, c.Desired(desiredRaw(t, protocol.DesiredState{Epoch: 1, Weights: &ref}, coreSecret), true, t0))
	r := c.Ready()
	require.NotNil(t, r.Fetch)
	abort := signedEnv(t, protocol.Abort{}, t0, time.Minute)
	c.Envelope(raw(t, abort), t0)
	r = c.Ready()
	require.NotNil(t, r.Work, "the abort runs beside the stage")
	assert.Equal(t, abort.ID, r.Work.Envelope.ID)
	stage := signedEnv(t, protocol.Stage{Weights: protocol.WeightsRef{Version: 3, URI: "file:///w3", SHA256: shaB}}, t0, time.Minute)
	c.Envelope(raw(t, stage), t0)
	assert.Nil(t, c.Ready().Fetch, "one fetch at a time")

	ref3 := protocol.WeightsRef{Version: 3, URI: "file:///w3", SHA256: shaB}
	require.NoError(t, c.Desired(desiredRaw(t, protocol.DesiredState{Epoch: 2, Weights: &ref3}, coreSecret), true, t0))
	assert.True(t, c.Ready().CancelFetch, "the fleet moved past the version being staged")
}

// TestCoreBoundsRejectionAcks: a flood of forged commands costs at most a few acks a
// second; every one is counted (issue 26, finding 6).
func TestCoreBoundsRejectionAcks(t *testing.T) {
	c := newTestCore(coreSecret)
	forged := []byte("another-secret-another-secret-0123456")
	acks, rejected := 0, 0
	for i := range 1000 {
		e, err := protocol.NewEnvelope("f", nil, protocol.Pause{Mode: protocol.ModeAbort}, t0, time.Minute)
		require.NoError(t, err)
		e.Sign(forged)
		c.Envelope(raw(t, e), t0.Add(time.Duration(i)*time.Millisecond)) // one second of flood
		r := c.Ready()
		acks += len(r.Acks)
		rejected += len(r.Rejected)
	}
	assert.Equal(t, 1000, rejected)
	assert.LessOrEqual(t, acks, 2*rejectAcksPerSecond)
	assert.GreaterOrEqual(t, acks, rejectAcksPerSecond)
}

// TestCoreCommitAfterSelfConvergence: a commit command for a version the server committed
// by itself is acked ok with that cut's phases and bubble. It is still handed out as work
// (so it gets its control.process span in the sender's trace), carrying its answer, so the
// loop runs nothing on the engine.
func TestCoreCommitAfterSelfConvergence(t *testing.T) {
	c := newTestCore(coreSecret)
	c.Engine(EngineState{State: "running", WeightVersion: 1, StagedVersion: 2, StagedSHA256: shaA})
	ref := protocol.WeightsRef{Version: 2, URI: "file:///w2", SHA256: shaA}
	require.NoError(t, c.Desired(desiredRaw(t, protocol.DesiredState{Epoch: 1, Weights: &ref}, coreSecret), true, t0))
	require.NotNil(t, c.Ready().Work)
	assert.Equal(t, protocol.StateUpdating, c.Heartbeat(t0).State)
	cut := Result{Phases: []protocol.Phase{{Name: "pause", OK: true}, {Name: "commit", OK: true}, {Name: "resume", OK: true}},
		Committed: 2, LastTokenBefore: 10, FirstTokenAfter: 20}
	serving := EngineState{State: "running", WeightVersion: 2, WeightSHA256: shaA}
	done(c, cut, serving, t0)
	c.Ready()

	e := signedEnv(t, protocol.Commit{Version: 2, Mode: protocol.ModeAbort, SHA256: shaA}, t0, time.Minute)
	c.Envelope(raw(t, e), t0)
	r := c.Ready()
	require.NotNil(t, r.Work)
	require.NotNil(t, r.Work.Answer, "nothing to run on the engine")
	assert.Empty(t, r.Acks, "acked once the loop reports the work done")
	done(c, *r.Work.Answer, serving, t0)
	r = c.Ready()
	require.Len(t, r.Acks, 1)
	a := r.Acks[0]
	assert.Equal(t, protocol.ResultOK, a.Result)
	assert.Equal(t, cut.Phases, a.Phases)
	assert.EqualValues(t, 10, a.LastTokenBefore)
	assert.EqualValues(t, 20, a.FirstTokenAfter)
	assert.EqualValues(t, 2, a.WeightVersion)
	assert.Equal(t, shaA, a.WeightSHA256)

	other := signedEnv(t, protocol.Commit{Version: 2, Mode: protocol.ModeAbort, SHA256: shaB}, t0, time.Minute)
	c.Envelope(raw(t, other), t0)
	r = c.Ready()
	require.NotNil(t, r.Work)
	require.NotNil(t, r.Work.Answer, "another checkpoint's commit is refused without touching the engine")
	assert.Equal(t, "conflict", r.Work.Answer.Code, "the fleet bound version 2 to shaA")
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
	done(c, Result{}, EngineState{State: "running", WeightVersion: 1}, t0)
	r = c.Ready()
	assert.Nil(t, r.Work)
	require.Len(t, r.Acks, 1)
	hb := c.Heartbeat(t0)
	assert.Equal(t, protocol.StateStopping, hb.State)
	assert.False(t, hb.InRotation)
	c.Converge(t0)
	assert.Nil(t, c.Ready().Work)
}

// done completes the work the core handed out on the control lane (else the fetch lane).
func done(c *Core, res Result, st EngineState, now time.Time) {
	w := c.busy
	if w == nil {
		w = c.fetch
	}
	c.Done(w, res, st, now)
}

// desiredVersion is the desired version (0: none), whether the fleet is paused, and whether
// the desired state was read.
func (c *Core) desiredVersion() (version int64, paused, known bool) {
	d, known := c.DesiredState()
	if d == nil {
		return 0, false, known
	}
	if d.Weights != nil {
		version = d.Weights.Version
	}
	return version, d.Paused, known
}

// TestCoreRefusesACommitAgainstTheClaim: a commit of a version the desired state binds to
// another checkpoint, as Weights or as a rolling update's claim, is refused (code conflict)
// without touching the engine: two checkpoints never serve under one number.
func TestCoreRefusesACommitAgainstTheClaim(t *testing.T) {
	for name, d := range map[string]protocol.DesiredState{
		"weights": {Epoch: 1, Weights: &protocol.WeightsRef{Version: 2, URI: "file:///a", SHA256: shaA}},
		"rolling": {Epoch: 1, Rolling: &protocol.WeightsRef{Version: 2, URI: "file:///a", SHA256: shaA}},
	} {
		t.Run(name, func(t *testing.T) {
			c := newTestCore(coreSecret)
			c.Engine(EngineState{State: "running", WeightVersion: 1, StagedVersion: 2, StagedSHA256: shaB})
			require.NoError(t, c.Desired(desiredRaw(t, d, coreSecret), true, t0))
			c.Ready()
			e := signedEnv(t, protocol.Commit{Version: 2, Mode: protocol.ModeAbort, SHA256: shaB}, t0, time.Minute, "s1")
			c.Envelope(raw(t, e), t0)
			r := c.Ready()
			require.NotNil(t, r.Work)
			require.NotNil(t, r.Work.Answer)
			assert.Equal(t, "conflict", r.Work.Answer.Code)
		})
	}
}

// TestCoreKeepsNoMessageForReacks: the ack a server keeps for re-acks until the command's
// deadline holds copies of the command's strings, not substrings of the decoded message: a
// 32-target command is over a kilobyte, and a server keeps every command of the last
// lifetime (at 32 servers and a few hundred commands a second, 40 MB more a thousand rounds).
func TestCoreKeepsNoMessageForReacks(t *testing.T) {
	c := newTestCore(coreSecret)
	now := t0.Add(time.Second)
	targets := make([]string, 32)
	for i := range targets {
		targets[i] = fmt.Sprintf("s%d", i+1)
	}
	msg := raw(t, signedEnv(t, protocol.Resume{}, now, time.Minute, targets...))
	c.Envelope(msg, now)
	r := c.Ready()
	require.NotNil(t, r.Work)
	done(c, Result{Phases: []protocol.Phase{{Name: "resume", OK: true}}}, EngineState{State: "running", WeightVersion: 1}, now)
	require.Len(t, c.Ready().Acks, 1)
	// Where the decoder's copy of msg lies: the envelope's id is a substring of it.
	id := r.Work.Envelope.ID
	at := bytes.Index(msg, []byte(id))
	require.Positive(t, at)
	start := uintptr(unsafe.Pointer(unsafe.StringData(id))) - uintptr(at)
	inMessage := func(s string) bool {
		p := uintptr(unsafe.Pointer(unsafe.StringData(s)))
		return s != "" && p >= start && p < start+uintptr(len(msg))
	}
	require.True(t, inMessage(id), "the decoder keeps substrings of one copy")
	require.Len(t, c.seen, 1)
	for key, s := range c.seen {
		require.NotNil(t, s.ack)
		for _, kept := range []string{key, s.ack.CommandID, string(s.ack.Kind), s.ack.ServerID} {
			assert.False(t, inMessage(kept), "%q is part of the decoded message", kept)
		}
	}
}
