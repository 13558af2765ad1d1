package engine

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/kvcache"
	"github.com/rolloutkit/rollout/engine/model"
)

// inOrder parks the loop, queues each call in turn (each reaches the engine's input queue
// before the next is sent) and releases the loop, so that the loop receives them in this order
// with no step between. It returns their errors.
func inOrder(t *testing.T, e *Engine, calls ...func() error) []error {
	t.Helper()
	release := e.block(t)
	defer release()
	errs := make([]error, len(calls))
	var wg sync.WaitGroup
	for i, c := range calls {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = c() }()
		waitQueued(t, e, i+1)
	}
	release()
	wg.Wait()
	return errs
}

// TestSleepBehindPauseWaitAndQueuedResume is issue 25's sequence: a Sleep that arrives while a
// Pause(wait) drains with a Resume queued behind it. The Sleep used to skip its own pause (the
// engine was paused when it arrived), the Resume then restarted the engine once the drain
// ended, and the sleep released the KV pool (level 2: the weights too) under a running engine:
// the next step dereferenced a nil model or pool (level 2) or aborted every request (level 1).
// Taken in order, the Resume runs the engine again and the Sleep then pauses it and sleeps.
func TestSleepBehindPauseWaitAndQueuedResume(t *testing.T) {
	for _, level := range []int{1, 2} {
		t.Run(fmt.Sprintf("level%d", level), func(t *testing.T) {
			e, _ := testEngine(t, nil)
			ctx := ctxT(t)
			a, err := e.Add(ctx, Request{ID: "a", PromptTokenIDs: prompt(8, 1), Sampling: greedy(40)})
			require.NoError(t, err)
			_, err = a.Recv(ctx) // a runs: the pause with wait has something to drain
			require.NoError(t, err)
			errs := inOrder(t, e,
				func() error { _, err := e.Pause(ctx, PauseWait, false); return err },
				func() error { return e.Resume(ctx) },
				func() error { return e.Sleep(ctx, level, PauseWait) })
			require.Equal(t, []error{nil, nil, nil}, errs)
			st, err := e.CheckInvariants(ctx)
			require.NoError(t, err)
			assert.Equal(t, StateSleeping, st.State, "the sleep came last")
			assert.True(t, st.Paused && st.KVReleased, "%+v", st)
			res, err := a.Collect(ctx)
			require.NoError(t, err)
			assert.Equal(t, FinishLength, res.FinishReason, "the drain ran the request to its end")

			if level == 2 {
				w2, err := model.Preset("tiny", 2)
				require.NoError(t, err)
				_, err = e.UpdateWeights(ctx, w2, 2, false)
				require.NoError(t, err)
			}
			require.NoError(t, e.WakeUp(ctx, nil))
			b, err := e.Add(ctx, Request{ID: "b", PromptTokenIDs: prompt(8, 2), Sampling: greedy(5)})
			require.NoError(t, err)
			res, err = b.Collect(ctx)
			require.NoError(t, err)
			assert.Equal(t, FinishLength, res.FinishReason, "a request after the wake-up runs")
			assert.Zero(t, e.Metrics().InvariantViolations)
		})
	}
}

// TestPauseKeepBehindQueuedResume: a Pause(keep) that arrives while a Pause(wait) drains with
// a Resume queued behind it used to freeze the engine at once, report success, and be undone
// by the Resume once the drain ended: the engine ran after a successful Pause(keep). Taken in
// order, the Pause(keep) comes last and the engine stays paused.
func TestPauseKeepBehindQueuedResume(t *testing.T) {
	e, _ := testEngine(t, nil)
	ctx := ctxT(t)
	a, err := e.Add(ctx, Request{ID: "a", PromptTokenIDs: prompt(8, 1), Sampling: greedy(40)})
	require.NoError(t, err)
	_, err = a.Recv(ctx)
	require.NoError(t, err)
	errs := inOrder(t, e,
		func() error { _, err := e.Pause(ctx, PauseWait, false); return err },
		func() error { return e.Resume(ctx) },
		func() error { _, err := e.Pause(ctx, PauseKeep, false); return err })
	require.Equal(t, []error{nil, nil, nil}, errs)
	st, err := e.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, StatePaused, st.State)
	assert.Equal(t, string(PauseKeep), st.PauseMode)
	// Frozen requests stay frozen: one added now does not start.
	b, err := e.Add(ctx, Request{ID: "b", PromptTokenIDs: prompt(8, 2), Sampling: greedy(2)})
	require.NoError(t, err)
	st, err = e.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, st.Waiting, "nothing scheduled after a successful Pause(keep)")
	require.NoError(t, e.Resume(ctx))
	_, err = b.Collect(ctx)
	require.NoError(t, err)
}

// TestWithdrawnControlCallTakesNoEffect: a control call whose caller gives up before the loop
// started it (an HTTP client timing out on /resume behind a draining pause) never takes
// effect. It used to stay queued and run later, resuming an engine its caller was told had
// not resumed.
func TestWithdrawnControlCallTakesNoEffect(t *testing.T) {
	e, _ := testEngine(t, nil)
	ctx := ctxT(t)
	_, err := e.Pause(ctx, PauseKeep, false)
	require.NoError(t, err)
	release := e.block(t)
	rctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- e.Resume(rctx) }()
	waitQueued(t, e, 1)
	cancel()
	err = <-errc
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, ErrStillRunning, "the loop is parked: the call cannot have started")
	release()
	require.NoError(t, e.barrier(ctx))
	paused, err := e.IsPaused(ctx)
	require.NoError(t, err)
	assert.True(t, paused, "the withdrawn Resume did not run")
}

// TestStartedControlCallCompletes: a Pause(wait) whose caller gives up while it drains has
// already taken effect (the engine is paused) and completes: the caller is told so with
// ErrStillRunning, and the control calls behind it still wait for its drain.
func TestStartedControlCallCompletes(t *testing.T) {
	var (
		stage              atomic.Int32
		e                  *Engine
		entered1, entered2 = make(chan struct{}), make(chan struct{})
		gate1, gate2       = make(chan struct{}), make(chan struct{})
	)
	e, _ = testEngine(t, func(c *Config) {
		c.Hooks.BeforeForward = func(uint64) error {
			// On the engine goroutine: hold the first forward while the pause is queued, then
			// the first forward taken once the pause started (the request has tokens left).
			switch {
			case stage.CompareAndSwap(1, 2):
				close(entered1)
				<-gate1
			case e.ctl.Phase == ctlPaused && stage.CompareAndSwap(3, 4):
				close(entered2)
				<-gate2
			}
			return nil
		}
	})
	ctx := ctxT(t)
	stage.Store(1)
	a, err := e.Add(ctx, Request{ID: "a", PromptTokenIDs: prompt(8, 1), Sampling: greedy(20)})
	require.NoError(t, err)
	<-entered1
	pctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { _, err := e.Pause(pctx, PauseWait, false); errc <- err }()
	waitQueued(t, e, 1)
	stage.Store(3)
	close(gate1)
	<-entered2 // the pause started and the engine drains
	cancel()
	err = <-errc
	require.ErrorIs(t, err, ErrStillRunning)
	require.ErrorIs(t, err, context.Canceled)
	close(gate2)
	paused, err := e.IsPaused(ctx)
	require.NoError(t, err)
	assert.True(t, paused)
	require.NoError(t, e.Resume(ctx), "queued behind the drain, it runs once the drain is over")
	res, err := a.Collect(ctx)
	require.NoError(t, err)
	assert.Equal(t, FinishLength, res.FinishReason, "the drain ran to its end")
}

// TestWeightsCopyKeepsItsVersionInUse: a commit that retires the set Weights is copying must
// not make it free for reuse before the copy ends. VersionsInUse used to report only the
// staged and serving versions, so a server recycling retired sets (weights.Recycler) could
// load the next update into the set mid-copy: a torn copy, and a data race.
func TestWeightsCopyKeepsItsVersionInUse(t *testing.T) {
	e, w1 := testEngine(t, nil)
	ctx := ctxT(t)
	w2, err := model.Preset("tiny", 2)
	require.NoError(t, err)
	var during []int64
	e.beforeCopy = func() {
		_, err := e.UpdateWeights(ctx, w2, 2, false) // retires version 1 mid-copy
		require.NoError(t, err)
		during = e.VersionsInUse()
	}
	got, err := e.Weights(ctx)
	require.NoError(t, err)
	assert.Equal(t, w1, got, "the copy is of the set served when Weights was called")
	assert.ElementsMatch(t, []int64{2, 1}, during, "version 1 is read until its copy ends")
	assert.Equal(t, []int64{2}, e.VersionsInUse(), "and free once it ended")
}

// TestAbandonedPauseWaitLetsLaterCallsStart: once the caller of a Pause(wait) gave up, the
// pause (which took effect when it started) no longer holds the control calls behind it until
// its drain ends: a Pause(abort) sent next aborts the request the drain was waiting for.
func TestAbandonedPauseWaitLetsLaterCallsStart(t *testing.T) {
	var (
		stage              atomic.Int32
		e                  *Engine
		entered1, entered2 = make(chan struct{}), make(chan struct{})
		gate1, gate2       = make(chan struct{}), make(chan struct{})
	)
	e, _ = testEngine(t, func(c *Config) {
		c.Hooks.BeforeForward = func(uint64) error {
			switch {
			case stage.CompareAndSwap(1, 2):
				close(entered1)
				<-gate1
			case e.ctl.Phase == ctlPaused && stage.CompareAndSwap(3, 4):
				close(entered2)
				<-gate2
			}
			return nil
		}
	})
	ctx := ctxT(t)
	stage.Store(1)
	a, err := e.Add(ctx, Request{ID: "a", PromptTokenIDs: prompt(8, 1), Sampling: greedy(200)})
	require.NoError(t, err)
	<-entered1
	pctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { _, err := e.Pause(pctx, PauseWait, false); errc <- err }()
	waitQueued(t, e, 1)
	stage.Store(3)
	close(gate1)
	<-entered2 // the wait pause started; its drain is held in a forward
	cancel()
	require.ErrorIs(t, <-errc, ErrStillRunning)
	abortc := make(chan error, 1)
	go func() { _, err := e.Pause(ctx, PauseAbort, false); abortc <- err }()
	waitQueued(t, e, 1)
	close(gate2) // one step ends, then the loop takes the abort pause
	require.NoError(t, <-abortc)
	res, err := a.Collect(ctx)
	require.NoError(t, err)
	assert.Equal(t, FinishAbort, res.FinishReason, "aborted, not left to run its 200 tokens")
	assert.Less(t, len(res.Tokens), 200)
	st, err := e.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, string(PauseAbort), st.PauseMode)
}

// TestResumeOfRunningEngineSkipsTheLoop: a Resume that finds the engine running with no
// control call pending answers without the loop (the loop is parked here and never sees it),
// but one behind a pending control call keeps its place in the FIFO: with a Pause queued, a
// Resume whose caller gives up is withdrawn (it did not answer ahead of the Pause), and once
// the Pause has taken effect a Resume goes through the loop and runs the engine again. A
// withdrawn Pause leaves nothing pending, so the fast answer comes back.
func TestResumeOfRunningEngineSkipsTheLoop(t *testing.T) {
	e, _ := testEngine(t, nil)
	ctx := ctxT(t)
	release := e.block(t)
	defer release()
	require.NoError(t, e.Resume(ctx), "running, nothing pending: answered with the loop parked")
	assert.Zero(t, len(e.in), "the fast Resume sent the loop nothing")

	// A Pause whose caller gives up while it is queued: withdrawn, nothing pending after.
	pctx, cancelPause := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { _, err := e.Pause(pctx, PauseKeep, false); errc <- err }()
	waitQueued(t, e, 1)
	assert.False(t, e.ResumeIfRunning(), "a Pause is pending")
	cancelPause()
	require.ErrorIs(t, <-errc, context.Canceled)
	assert.True(t, e.ResumeIfRunning(), "the withdrawn Pause is not pending")

	// A Pause that stays queued: a Resume behind it must not answer first.
	go func() { _, err := e.Pause(ctx, PauseKeep, false); errc <- err }()
	waitQueued(t, e, 2) // the withdrawn Pause is still in the input queue
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, e.Resume(cctx), context.Canceled, "queued behind the Pause, then withdrawn")
	release()
	require.NoError(t, <-errc)
	paused, err := e.IsPaused(ctx)
	require.NoError(t, err)
	require.True(t, paused, "the Pause took effect; the withdrawn Resume did not")
	assert.False(t, e.ResumeIfRunning(), "paused")
	require.NoError(t, e.Resume(ctx))
	paused, err = e.IsPaused(ctx)
	require.NoError(t, err)
	assert.False(t, paused)
	assert.True(t, e.ResumeIfRunning())
}

// TestWakeUpReusesTheReleasedKVPool: a sleep that releases the KV pool gives its memory back
// at once and keeps the allocation, and the wake-up reuses it (zeroed, as a new pool reads),
// so that a weight update's cut never waits on faulting in a new pool (the bubble of one
// update in three or four was that, up to 250 ms on stories15m). A sleep of level 2, whose
// weights come back with the same shape, reuses it too; greedy output is unchanged.
func TestWakeUpReusesTheReleasedKVPool(t *testing.T) {
	for _, level := range []int{1, 2} {
		t.Run(fmt.Sprintf("level%d", level), func(t *testing.T) {
			e, w := testEngine(t, func(c *Config) { c.PrefaultKV = true })
			ctx := ctxT(t)
			before, err := e.Add(ctx, Request{ID: "before", PromptTokenIDs: prompt(8, 1), Sampling: greedy(6)})
			require.NoError(t, err)
			want, err := before.Collect(ctx)
			require.NoError(t, err)
			onLoop := func(f func()) error { // reads the engine's fields on its goroutine
				_, err := controlCall(ctx, e, "test_inspect", func(_ context.Context, done func(struct{}, error)) { f(); done(struct{}{}, nil) })
				return err
			}
			var pool *kvcache.Storage
			require.NoError(t, onLoop(func() { pool = e.kv }))
			require.NotNil(t, pool)

			require.NoError(t, e.Sleep(ctx, level, PauseAbort))
			require.NoError(t, onLoop(func() {
				assert.Nil(t, e.kv)
				assert.Same(t, pool, e.kvReleased, "the released pool is kept for the wake-up")
			}))
			if level == 2 {
				_, err := e.UpdateWeights(ctx, w, 2, false)
				require.NoError(t, err)
			}
			require.NoError(t, e.WakeUp(ctx, nil))
			require.NoError(t, onLoop(func() {
				assert.Same(t, pool, e.kv, "the wake-up reused the pool")
				assert.Nil(t, e.kvReleased)
			}))
			after, err := e.Add(ctx, Request{ID: "after", PromptTokenIDs: prompt(8, 1), Sampling: greedy(6)})
			require.NoError(t, err)
			got, err := after.Collect(ctx)
			require.NoError(t, err)
			assert.Equal(t, tokenIDs(want.Tokens), tokenIDs(got.Tokens))
			_, err = e.CheckInvariants(ctx)
			require.NoError(t, err)
		})
	}
}
