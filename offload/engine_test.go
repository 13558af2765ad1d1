package offload_test

import (
	"context"
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
	e    *engine.Engine
	conn *offload.Connector
	w    *model.Weights
	stop func()
}

func startEngine(t *testing.T, delay time.Duration, hooks engine.Hooks) *engineSetup {
	t.Helper()
	w, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	conn, err := offload.New(offload.Config{CPUBytes: 8 << 20, BlockSize: 16, Delay: delay})
	require.NoError(t, err)
	e, err := engine.New(engine.Config{Weights: w, WeightVersion: 1, NumBlocks: 160, Workers: 2,
		Connector: conn.Scheduler(), ConnectorWorker: conn.Worker(), Hooks: hooks})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	s := &engineSetup{e: e, conn: conn, w: w}
	var once sync.Once
	s.stop = func() { once.Do(func() { cancel(); require.NoError(t, <-done) }) }
	t.Cleanup(s.stop)
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
	s := startEngine(t, 150*time.Millisecond, engine.Hooks{
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
	for range 2 {
		go func() {
			r, err := s.e.ResetPrefixCache(ctx, true, true)
			assert.NoError(t, err)
			results <- r
		}()
	}
	time.Sleep(50 * time.Millisecond) // both calls queued behind the parked loop
	close(g.release)
	r1, r2 := <-results, <-results
	assert.True(t, r1.Success && r2.Success, "%+v %+v", r1, r2)
	assert.Equal(t, 1, r1.JobsFlushed+r2.JobsFlushed, "the store of prefill chunks 0 and 1, queued once")
	assert.Zero(t, min(r1.JobsFlushed, r2.JobsFlushed), "the second reset unions nothing new and does not fail")
	waitIdle(t, s.conn)
	stats = s.conn.Stats()
	assert.EqualValues(t, 1, stats["offload_resets_merged_total"])
	assert.EqualValues(t, 1, stats["offload_flush_delivered_total"], "the flushed id delivered exactly once")
	assert.Zero(t, stats["safety_violations_total"])
	// The engine goes idle (no step spins).
	steps := s.e.Metrics().Steps
	time.Sleep(30 * time.Millisecond)
	assert.Equal(t, steps, s.e.Metrics().Steps)
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
	time.Sleep(20 * time.Millisecond)
	sleepDone := make(chan map[string]float64, 1)
	go func() {
		err := s.e.Sleep(ctx, 1, engine.PauseAbort)
		sleepDone <- s.conn.Stats() // read the moment Sleep returned
		errs <- err
	}()
	time.Sleep(20 * time.Millisecond)
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
