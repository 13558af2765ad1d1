package agent

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/protocol"
)

// stuckEngine is an engine whose Pause takes effect and then outlasts the caller (a
// pause(wait) behind a long request): the seam for a fault a real engine only shows by timing.
type stuckEngine struct {
	mu      sync.Mutex
	state   protocol.EngineState
	resumed int
	clock   *StepClock
}

func (e *stuckEngine) Pause(ctx context.Context, _ string, _ bool) (ResetResult, error) {
	e.mu.Lock()
	e.state = "paused"
	e.mu.Unlock()
	<-ctx.Done()
	return ResetResult{}, ctx.Err()
}

func (e *stuckEngine) Resume(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.state = "running"
	e.resumed++
	return nil
}

func (e *stuckEngine) Sleep(context.Context, int, string) error { return errors.New("unused") }
func (e *stuckEngine) WakeUp(context.Context, []string) error   { return errors.New("unused") }
func (e *stuckEngine) Reset(context.Context, bool, bool) (ResetResult, error) {
	return ResetResult{}, errors.New("unused")
}
func (e *stuckEngine) Commit(context.Context, int64) (int64, error) { return 0, errors.New("unused") }
func (e *stuckEngine) Abort([]string) int                           { return 0 }
func (e *stuckEngine) Requests(context.Context) (int, int, error)   { return 0, 0, nil }
func (e *stuckEngine) Steps() *StepClock                            { return e.clock }
func (e *stuckEngine) State() EngineState {
	e.mu.Lock()
	defer e.mu.Unlock()
	return EngineState{State: e.state, WeightVersion: 1, StagedVersion: 2}
}

func (e *stuckEngine) DropStaged(context.Context, int64) (bool, error) { return false, nil }

// TestCommitUndoesAPauseCutShort: a commit whose pause outlives the deadline fails and
// resumes the server instead of leaving it paused.
func TestCommitUndoesAPauseCutShort(t *testing.T) {
	eng := &stuckEngine{state: "running", clock: NewStepClock(nil)}
	mem := bus.NewMem(bus.MemOptions{})
	t.Cleanup(func() { _ = mem.Close() })
	a, err := New(Config{Bus: mem, Fleet: "f", ServerID: "s1", Engine: eng,
		Stage: func(context.Context, protocol.WeightsRef) (int64, error) { return 0, nil }})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
	defer cancel()
	res := a.commit(ctx, protocol.Commit{Version: 2, Mode: protocol.ModeWait}, false)
	require.ErrorIs(t, res.Err, context.DeadlineExceeded)
	assert.Equal(t, 1, eng.resumed)
	assert.EqualValues(t, "running", eng.State().State)
	require.Len(t, res.Phases, 2)
	assert.Equal(t, "pause", res.Phases[0].Name)
	assert.False(t, res.Phases[0].OK)
	assert.Equal(t, "resume", res.Phases[1].Name)
	assert.True(t, res.Phases[1].OK)
}

// cutEngine is an engine whose every call succeeds and whose Resume is reported on resumed,
// so a test can produce the first token step after it.
type cutEngine struct {
	stuckEngine
	running int
	resumed chan struct{}
}

func (e *cutEngine) Pause(context.Context, string, bool) (ResetResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.state = "paused"
	e.running = 0 // mode abort: the requests are gone; their clients will resubmit
	return ResetResult{Success: true}, nil
}

func (e *cutEngine) Resume(ctx context.Context) error {
	_ = e.stuckEngine.Resume(ctx)
	close(e.resumed)
	return nil
}

func (e *cutEngine) Commit(context.Context, int64) (int64, error) { return 2, nil }

func (e *cutEngine) State() EngineState {
	e.mu.Lock()
	defer e.mu.Unlock()
	return EngineState{State: e.state, WeightVersion: 1, StagedVersion: 2, Running: e.running}
}

// TestCommitWaitsForTheResubmittedFirstToken: a server that was generating when a
// pause(abort) cleared it waits (bounded) after the resume for the first token of the
// resubmitted requests, so the ack bounds the bubble; an idle one acks at once.
func TestCommitWaitsForTheResubmittedFirstToken(t *testing.T) {
	for _, loaded := range []bool{true, false} {
		eng := &cutEngine{stuckEngine: stuckEngine{state: "running", clock: NewStepClock(nil)}, resumed: make(chan struct{})}
		if loaded {
			eng.running = 3
		}
		eng.clock.Hook(nil)(5) // a token step before the commit
		mem := bus.NewMem(bus.MemOptions{})
		t.Cleanup(func() { _ = mem.Close() })
		a, err := New(Config{Bus: mem, Fleet: "f", ServerID: "s1", Engine: eng,
			Stage: func(context.Context, protocol.WeightsRef) (int64, error) { return 0, nil }})
		require.NoError(t, err)
		stepped := make(chan struct{})
		if loaded {
			go func() {
				<-eng.resumed
				eng.clock.Hook(nil)(1) // the resubmitted request's first token
				close(stepped)
			}()
		}
		res := a.commit(t.Context(), protocol.Commit{Version: 2, Mode: protocol.ModeAbort, ClearCache: true}, false)
		require.NoError(t, res.Err)
		assert.Positive(t, res.LastTokenBefore)
		if loaded {
			<-stepped
			assert.Greater(t, res.FirstTokenAfter, res.LastTokenBefore)
		} else {
			assert.Zero(t, res.FirstTokenAfter, "an idle server does not wait")
		}
	}
}
