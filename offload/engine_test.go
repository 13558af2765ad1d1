package offload_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/sample"
	"github.com/rolloutkit/rollout/offload"
)

// gate parks the engine loop inside its OnStep hook when armed, so a test can queue several
// utility calls that the loop then handles back to back, with no step between them.
type gate struct {
	mu      sync.Mutex
	armed   func() bool
	parked  chan struct{}
	release chan struct{}
	done    atomic.Bool
}

func newGate() *gate { return &gate{parked: make(chan struct{}), release: make(chan struct{})} }

func (g *gate) onStep(int) {
	g.mu.Lock()
	armed := g.armed
	g.mu.Unlock()
	if g.done.Load() || armed == nil || !armed() {
		return
	}
	g.done.Store(true)
	close(g.parked)
	<-g.release
}

func (g *gate) arm(f func() bool) { g.mu.Lock(); g.armed = f; g.mu.Unlock() }

type engineSetup struct {
	e     *engine.Engine
	conn  *offload.Connector
	hooks *offload.TestHooks // conn's
	w     *model.Weights
	stop  func()
}

func startEngine(t *testing.T, delay time.Duration, hooks engine.Hooks) *engineSetup {
	t.Helper()
	return startEngineGated(t, delay, nil, hooks)
}

// startEngineGated is startEngine with a transfer gate (nil: none) holding copies in flight.
func startEngineGated(t *testing.T, delay time.Duration, xg *xferGate, hooks engine.Hooks) *engineSetup {
	t.Helper()
	w, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	cfg := offload.Config{CPUBytes: 8 << 20, BlockSize: 16, CopyThreads: 3, SplitBytes: 1, Test: &offload.TestHooks{Delay: delay}}
	if xg != nil {
		cfg.Test.TransferGate = xg.wait
	}
	conn, err := offload.New(cfg)
	require.NoError(t, err)
	e, err := engine.New(engine.Config{Weights: w, WeightVersion: 1, NumBlocks: 160, Workers: 2,
		Connector: conn.Scheduler(), ConnectorWorker: conn.Worker(), Hooks: hooks})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	s := &engineSetup{e: e, conn: conn, hooks: cfg.Test, w: w}
	var once sync.Once
	s.stop = func() { once.Do(func() { cancel(); require.NoError(t, <-done) }) }
	t.Cleanup(s.stop)
	if xg != nil {
		t.Cleanup(xg.release) // before the stop (last in, first out), which waits for copies
	}
	return s
}

func greedy(n int) sample.Params {
	p := sample.Defaults()
	p.Temperature = 0
	p.MaxTokens = n
	p.IgnoreEOS = true
	return p
}

func tinyPrompt(n, salt int) []int {
	ids := make([]int, n)
	for i := range ids {
		ids[i] = (i*31 + salt*17 + 5) % 256
	}
	return ids
}

func referenceGreedy(t *testing.T, w *model.Weights, p []int, n int) []int {
	t.Helper()
	out, err := model.ReferenceGreedy(w, p, n)
	require.NoError(t, err)
	return out
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// waitIdle polls until the connector reports nothing pending and nothing in flight.
func waitIdle(t *testing.T, c *offload.Connector) {
	t.Helper()
	require.Eventually(t, func() bool {
		s := c.Stats()
		return s["offload_jobs_inflight"] == 0 && s["offload_flush_pending"] == 0 && s["offload_transfers_inflight"] == 0
	}, 10*time.Second, time.Millisecond)
}

// The exact regression through the real EngineCore: the request finishes while its store is
// in flight, two resets are handled back to back, and the flush is delivered by one more step.
func TestEngineDoubleResetWhileFinalStoreInFlight(t *testing.T) {
	g := newGate()
	var finished atomic.Bool
	xg := &xferGate{ch: make(chan struct{})} // every copy stays in flight until released
	s := startEngineGated(t, 0, xg, engine.Hooks{
		OnStep:   g.onStep,
		OnFinish: func(string, engine.FinishReason, int, int, engine.Timings) { finished.Store(true) },
	})
	g.arm(finished.Load)
	ctx := testCtx(t)
	p := tinyPrompt(40, 1)
	st, err := s.e.Add(ctx, engine.Request{ID: "r", PromptTokenIDs: p, Sampling: greedy(3)})
	require.NoError(t, err)
	res, err := st.Collect(ctx)
	require.NoError(t, err)
	assert.Equal(t, referenceGreedy(t, s.w, p, 3), res.TokenIDs())
	<-g.parked // the loop is parked right after the step that finished the request
	stats := s.conn.Stats()
	require.Positive(t, stats["offload_jobs_inflight"], "its store is still in flight")

	results := make(chan engine.ResetResult, 2)
	for i := range 2 {
		go func() {
			r, err := s.e.ResetPrefixCache(ctx, true, true)
			assert.NoError(t, err)
			results <- r
		}()
		waitQueuedCalls(t, s.e, i+1) // both calls queued behind the parked loop
	}
	xg.release() // the flush that the resets queue waits on the store: let it copy
	close(g.release)
	r1, r2 := <-results, <-results
	// The finished request's blocks are held until its store lands, so neither reset may
	// claim success; both cleared the caches.
	assert.False(t, r1.Success || r2.Success, "%+v %+v", r1, r2)
	assert.Contains(t, r1.Reason, "still in use")
	assert.Equal(t, 1, r1.JobsFlushed+r2.JobsFlushed, "the store of prefill chunks 0 and 1, queued once")
	assert.Zero(t, min(r1.JobsFlushed, r2.JobsFlushed), "the second reset unions nothing new and does not fail")
	waitIdle(t, s.conn)
	stats = s.conn.Stats()
	assert.EqualValues(t, 1, stats["offload_resets_merged_total"])
	assert.EqualValues(t, 1, stats["offload_flush_delivered_total"], "the flushed id delivered exactly once")
	assert.Zero(t, stats["safety_violations_total"])
	// Nothing is held any more: a reset now succeeds.
	r, err := s.e.ResetPrefixCache(ctx, true, true)
	require.NoError(t, err)
	assert.True(t, r.Success, r.Reason)
	require.NoError(t, s.e.Sleep(ctx, 1, engine.PauseAbort))
	assert.Zero(t, s.conn.Stats()["offload_transfers_inflight"])
}

// Pause(abort, clearCache) then Sleep(1) handled back to back while a long request runs with
// delayed copies: zero violations, and Sleep returns only after every copy finished.
func TestEnginePauseClearThenSleepWithCopiesInFlight(t *testing.T) {
	g := newGate()
	var steps atomic.Int64
	s := startEngine(t, 30*time.Millisecond, engine.Hooks{OnStep: func(n int) { steps.Add(1); g.onStep(n) }})
	ctx := testCtx(t)
	// Earlier finished requests leave stores queued, and the long one keeps storing chunks.
	for i := range 3 {
		st, err := s.e.Add(ctx, engine.Request{ID: fmt.Sprintf("short%d", i), PromptTokenIDs: tinyPrompt(33, 10+i), Sampling: greedy(2)})
		require.NoError(t, err)
		defer func() { _, _ = st.Collect(ctx) }()
	}
	g.arm(func() bool { return steps.Load() >= 40 && s.conn.Stats()["offload_transfers_inflight"] > 0 })
	long, err := s.e.Add(ctx, engine.Request{ID: "long", PromptTokenIDs: tinyPrompt(50, 2), Sampling: greedy(1500)})
	require.NoError(t, err)
	<-g.parked
	require.Positive(t, s.conn.Stats()["offload_transfers_inflight"])

	errs := make(chan error, 2)
	go func() { _, err := s.e.Pause(ctx, engine.PauseAbort, true); errs <- err }()
	waitQueuedCalls(t, s.e, 1)
	sleepDone := make(chan map[string]float64, 1)
	go func() {
		err := s.e.Sleep(ctx, 1, engine.PauseAbort)
		sleepDone <- s.conn.Stats() // read the moment Sleep returned
		errs <- err
	}()
	waitQueuedCalls(t, s.e, 2)
	close(g.release)
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	at := <-sleepDone
	assert.Zero(t, at["offload_transfers_inflight"], "Sleep returned only after the copies finished")
	assert.Zero(t, at["offload_jobs_inflight"])
	assert.Zero(t, at["offload_flush_pending"])
	assert.Zero(t, at["safety_violations_total"])
	res, err := long.Collect(ctx)
	require.NoError(t, err)
	assert.Equal(t, engine.FinishAbort, res.FinishReason)
	st, err := s.e.Stats(ctx)
	require.NoError(t, err)
	assert.True(t, st.KVReleased)

	// Wake, resume: generation is correct again and the CPU tier serves a prefix.
	require.NoError(t, s.e.WakeUp(ctx, nil))
	require.NoError(t, s.e.Resume(ctx))
	p := tinyPrompt(70, 5)
	for i := range 2 {
		stream, err := s.e.Add(ctx, engine.Request{ID: fmt.Sprintf("after%d", i), PromptTokenIDs: p, Sampling: greedy(4)})
		require.NoError(t, err)
		r, err := stream.Collect(ctx)
		require.NoError(t, err)
		assert.Equal(t, referenceGreedy(t, s.w, p, 4), r.TokenIDs())
		waitIdle(t, s.conn)
		if i == 0 {
			_, err = s.e.ResetPrefixCache(ctx, false, false) // the engine's cache only
			require.NoError(t, err)
		} else {
			assert.Equal(t, 64, r.NumCachedTokens, "the second run loaded its prefix from CPU slots")
		}
	}
	assert.Zero(t, s.conn.Violations())
}

// Misconfiguration fails engine construction with a clear error.
func TestEngineRejectsMisconfiguredConnector(t *testing.T) {
	w, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	for name, cfg := range map[string]offload.Config{
		"block size mismatch":       {CPUBytes: 8 << 20, BlockSize: 32},
		"CPU bytes below one chunk": {CPUBytes: 1024, BlockSize: 16},
	} {
		conn, err := offload.New(cfg)
		require.NoError(t, err, name)
		_, err = engine.New(engine.Config{Weights: w, NumBlocks: 160, Workers: 1, Connector: conn.Scheduler(), ConnectorWorker: conn.Worker()})
		require.ErrorIs(t, err, offload.ErrInvalidConfig, name)
		t.Log(name, ": ", err)
	}
}

// waitQueuedCalls waits until n messages sit in the engine's input queue (behind a parked loop).
func waitQueuedCalls(t *testing.T, e *engine.Engine, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return e.Metrics().InputQueued >= n }, 10*time.Second, 100*time.Microsecond)
}

// parkAtLoad brings the engine to the state of issue 9's first defect: request "b" was granted
// a CPU load of its 32-token prefix by the step the gate is parked in, so calls the test
// queues now are handled while b waits for (or has) its loaded KV.
func parkAtLoad(t *testing.T, s *engineSetup, g *gate, p []int) *engine.Stream {
	t.Helper()
	ctx := testCtx(t)
	a, err := s.e.Add(ctx, engine.Request{ID: "a", PromptTokenIDs: p, Sampling: greedy(3)})
	require.NoError(t, err)
	_, err = a.Collect(ctx)
	require.NoError(t, err)
	waitIdle(t, s.conn)
	r, err := s.e.ResetPrefixCache(ctx, false, false) // the engine's cache only: b loads from CPU
	require.NoError(t, err)
	require.True(t, r.Success, r.Reason)

	g.arm(func() bool { return s.conn.Stats()["offload_hit_tokens_total"] >= 32 })
	b, err := s.e.Add(ctx, engine.Request{ID: "b", PromptTokenIDs: p, Sampling: greedy(8)})
	require.NoError(t, err)
	<-g.parked
	return b
}

// queueThenRelease runs the calls, each queued behind the parked loop in order, then lets the
// loop go and waits for all of them.
func queueThenRelease(t *testing.T, s *engineSetup, g *gate, calls ...func() error) {
	t.Helper()
	errs := make(chan error, len(calls))
	for i, c := range calls {
		go func() { errs <- c() }()
		waitQueuedCalls(t, s.e, i+1)
	}
	close(g.release)
	for range calls {
		require.NoError(t, <-errs)
	}
}

// loadWhilePaused parks at b's load, queues Pause(keep) and Sleep(1) behind it, so the load
// lands while the engine pauses and sleeps, and returns b's stream once the sleep returned.
func loadWhilePaused(t *testing.T, s *engineSetup, g *gate, p []int) *engine.Stream {
	t.Helper()
	ctx := testCtx(t)
	b := parkAtLoad(t, s, g, p)
	queueThenRelease(t, s, g,
		func() error { _, err := s.e.Pause(ctx, engine.PauseKeep, false); return err },
		func() error { return s.e.Sleep(ctx, 1, engine.PauseKeep) })
	st, err := s.e.Stats(ctx)
	require.NoError(t, err)
	require.True(t, st.KVReleased)
	assert.Zero(t, st.KVBlocksUsed, "no request holds blocks of the released pool")
	return b
}

// TestPauseClearCacheDropsLoadedKV: a pause with clear_cache that catches a request whose
// load landed leaves nothing in use and says success with no reason (it used to answer
// success with "forced with N blocks still in use" and keep the loaded KV).
func TestPauseClearCacheDropsLoadedKV(t *testing.T) {
	g := newGate()
	s := startEngine(t, 0, engine.Hooks{OnStep: g.onStep})
	ctx := testCtx(t)
	p := tinyPrompt(40, 1)
	b := parkAtLoad(t, s, g, p)
	var r engine.ResetResult
	queueThenRelease(t, s, g, func() (err error) { r, err = s.e.Pause(ctx, engine.PauseKeep, true); return err })
	assert.True(t, r.Success, r.Reason)
	assert.Empty(t, r.Reason)
	assert.Equal(t, 1, r.Preempted, "the loaded request recomputes")
	st, err := s.e.Stats(ctx)
	require.NoError(t, err)
	assert.Zero(t, st.KVBlocksUsed)
	require.NoError(t, s.e.Resume(ctx))
	res, err := b.Collect(ctx)
	require.NoError(t, err)
	assert.Equal(t, referenceGreedy(t, s.w, p, 8), res.TokenIDs())
	assert.Zero(t, s.conn.Violations())
}

// TestSleepDropsKVOfLoadedWaitingRequest: a request whose CPU load lands while the engine
// pauses and sleeps must not keep its blocks through the pool release; after the wake-up it
// recomputes and generates exactly the reference continuation (it used to resume on the
// zeroed pool the wake-up allocates).
func TestSleepDropsKVOfLoadedWaitingRequest(t *testing.T) {
	g := newGate()
	s := startEngine(t, 0, engine.Hooks{OnStep: g.onStep})
	ctx := testCtx(t)
	p := tinyPrompt(40, 1)
	b := loadWhilePaused(t, s, g, p)
	require.NoError(t, s.e.WakeUp(ctx, nil))
	require.NoError(t, s.e.Resume(ctx))
	res, err := b.Collect(ctx)
	require.NoError(t, err)
	assert.Equal(t, referenceGreedy(t, s.w, p, 8), res.TokenIDs(), "b computed on KV that is not its own")
	waitIdle(t, s.conn)
	assert.Zero(t, s.conn.Violations())
	assert.Zero(t, s.e.Metrics().InvariantViolations)
}

// TestAbortWhileAsleepBuildsNoStore: aborting, while asleep, a request whose load landed
// before the sleep builds no store against the released KV storage (it used to, and the
// worker counted a violation).
func TestAbortWhileAsleepBuildsNoStore(t *testing.T) {
	g := newGate()
	s := startEngine(t, 0, engine.Hooks{OnStep: g.onStep})
	ctx := testCtx(t)
	b := loadWhilePaused(t, s, g, tinyPrompt(40, 1))
	b.Abort()
	res, err := b.Collect(ctx)
	require.NoError(t, err)
	assert.Equal(t, engine.FinishAbort, res.FinishReason)
	waitIdle(t, s.conn)
	assert.Zero(t, s.conn.Violations(), "a store read the released KV storage")
	require.NoError(t, s.e.WakeUp(ctx, nil))
	assert.Zero(t, s.e.Metrics().InvariantViolations)
}

// TestFailedLoadRecomputes: a load that fails its checksum is a counted violation, but the
// request must not run on that KV: it recomputes (exactly the reference output), the failed
// keys leave the CPU tier, and its recompute stores good chunks a later request loads.
func TestFailedLoadRecomputes(t *testing.T) {
	s := startEngine(t, 0, engine.Hooks{})
	ctx := testCtx(t)
	p := tinyPrompt(40, 3)
	want := referenceGreedy(t, s.w, p, 6)
	run := func(id string) engine.Result {
		t.Helper()
		st, err := s.e.Add(ctx, engine.Request{ID: id, PromptTokenIDs: p, Sampling: greedy(6)})
		require.NoError(t, err)
		res, err := st.Collect(ctx)
		require.NoError(t, err)
		waitIdle(t, s.conn)
		r, err := s.e.ResetPrefixCache(ctx, false, false) // the next request looks in the CPU tier
		require.NoError(t, err)
		require.True(t, r.Success, r.Reason)
		return res
	}
	assert.Equal(t, want, run("a").TokenIDs())
	s.conn.CorruptCPUTier()
	assert.Equal(t, want, run("b").TokenIDs(), "b ran on KV that failed its checksum")
	stats := s.conn.Stats()
	assert.EqualValues(t, 1, stats["offload_load_failures_total"])
	assert.EqualValues(t, 2, stats["safety_violations_total"], "the checksum mismatches themselves, one per chunk")
	c := run("c")
	assert.Equal(t, want, c.TokenIDs())
	assert.Equal(t, 32, c.NumCachedTokens, "c loaded the chunks b stored after recomputing")
	assert.EqualValues(t, 2, s.conn.Violations(), "no further violation: the bad keys were dropped")
}

// TestFailedForwardFailsStepAndStores: a forward error fails the requests of that step (they
// end aborted) and the stores built for the chunks it was to compute (never readable); the
// engine goes idle instead of spinning on the never-submitted stores, and serves on correctly.
func TestFailedForwardFailsStepAndStores(t *testing.T) {
	var failNext atomic.Bool
	s := startEngine(t, 0, engine.Hooks{BeforeForward: func(uint64) error {
		if failNext.CompareAndSwap(true, false) {
			return errors.New("injected forward error")
		}
		return nil
	}})
	ctx := testCtx(t)
	p := tinyPrompt(40, 4)
	failNext.Store(true)
	a, err := s.e.Add(ctx, engine.Request{ID: "a", PromptTokenIDs: p, Sampling: greedy(6)})
	require.NoError(t, err)
	res, err := a.Collect(ctx)
	require.NoError(t, err)
	assert.Equal(t, engine.FinishAbort, res.FinishReason)
	assert.Empty(t, res.Tokens)
	waitIdle(t, s.conn)
	assert.EqualValues(t, 1, s.e.Metrics().StepErrors)
	// a's blocks are freed by the engine step that collects the failed stores' completion,
	// which can come after the connector went idle: wait for that step, not only the
	// connector (a check right after waitIdle failed about once in 200 runs under -race).
	require.Eventually(t, func() bool {
		st, err := s.e.Stats(ctx)
		return err == nil && st.KVBlocksUsed == 0
	}, 10*time.Second, time.Millisecond, "the failed step's blocks are freed")
	b, err := s.e.Add(ctx, engine.Request{ID: "b", PromptTokenIDs: p, Sampling: greedy(6)})
	require.NoError(t, err)
	res, err = b.Collect(ctx)
	require.NoError(t, err)
	assert.Equal(t, referenceGreedy(t, s.w, p, 6), res.TokenIDs())
	assert.Zero(t, res.NumCachedTokens, "nothing of the failed step was cached or stored")
	assert.Zero(t, s.conn.Violations())
}
