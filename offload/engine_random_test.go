package offload_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/model"
)

// TestEngineRandomInterleaving drives the real EngineCore with the connector through random
// adds, aborts, resets (single and double), pauses with cache clearing, the RL weight-update
// cycle (pause, sleep, swap, wake, resume), sleeps that catch waiting and loading requests,
// concurrent UpdateWeights callers, a corrupted CPU tier (loads fail their checksum), injected
// forward errors and slow/fast copies, then checks that the only safety violations are the
// injected checksum failures, that no block was owned across a pool release, and that every
// completed request's greedy output equals that of a plain engine (no connector, nothing
// else running) under the weights it ran with: no token was computed on KV that is not its own.
//
// Both are fixed by the seed, whatever the timing: each operation draws from its own stream
// (seeded by its index), so the sequence of operations does not depend on how many draws an
// earlier one made, and the expected output is the engine's own float32 computation, which the
// kernels make independent of batching, chunking and block placement (docs/architecture.md),
// so the comparison is exact. The float64 reference would need a tolerance: its argmax can
// differ from float32's on a near tie.
func TestEngineRandomInterleaving(t *testing.T) {
	ops := 70
	if testing.Short() {
		ops = 30
	}
	var failNext atomic.Bool
	s := startEngine(t, time.Millisecond, engine.Hooks{BeforeForward: func(uint64) error {
		if failNext.CompareAndSwap(true, false) {
			return errors.New("injected forward error")
		}
		return nil
	}})
	ctx := testCtx(t)
	weights := map[int64]*model.Weights{1: s.w}
	version := int64(1)
	type run struct {
		prompt []int
		n      int
		res    engine.Result
		err    error
	}
	var (
		mu   sync.Mutex
		runs = map[string]*run{}
		wg   sync.WaitGroup
		ids  []string
	)
	prefixes := [][]int{tinyPrompt(32, 1), tinyPrompt(48, 2), tinyPrompt(16, 3)}
	corrupted := 0
	add := func(id string, p []int, n int) {
		ru := &run{prompt: p, n: n}
		st, err := s.e.Add(ctx, engine.Request{ID: id, PromptTokenIDs: p, Sampling: greedy(ru.n)})
		require.NoError(t, err)
		mu.Lock()
		runs[id] = ru
		ids = append(ids, id)
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := st.Collect(ctx)
			mu.Lock()
			ru.res, ru.err = res, err
			mu.Unlock()
		}()
	}
	for i := range ops {
		rng := rand.New(rand.NewPCG(7, uint64(i)))
		r := rng.IntN(100)
		if i == ops/3 {
			r = 86 // at least one corruption per run
		}
		switch {
		case r < 40:
			p := append(append([]int(nil), prefixes[rng.IntN(len(prefixes))]...), tinyPrompt(1+rng.IntN(12), i)...)
			add(fmt.Sprintf("q%d", i), p, 1+rng.IntN(8))
		case r < 46 && len(ids) > 0:
			s.e.Abort(ids[rng.IntN(len(ids))])
		case r < 54:
			// Let everything finish, then drop only the engine's prefix cache: later requests
			// with a shared prefix load it from the CPU tier.
			wg.Wait()
			waitIdle(t, s.conn)
			res, err := s.e.ResetPrefixCache(ctx, false, false)
			require.NoError(t, err)
			require.True(t, res.Success, res.Reason)
		case r < 60:
			var wg2 sync.WaitGroup
			for range 1 + rng.IntN(2) {
				wg2.Add(1)
				go func() { defer wg2.Done(); _, err := s.e.ResetPrefixCache(ctx, true, true); assert.NoError(t, err) }()
			}
			wg2.Wait()
		case r < 66:
			mode := []engine.PauseMode{engine.PauseAbort, engine.PauseKeep}[rng.IntN(2)]
			_, err := s.e.Pause(ctx, mode, true)
			require.NoError(t, err)
			require.NoError(t, s.e.Resume(ctx))
		case r < 72:
			// The RL weight-update cycle: two back-to-back resets, sleep, swap, wake, resume.
			var wg2 sync.WaitGroup
			wg2.Add(2)
			go func() { defer wg2.Done(); _, err := s.e.Pause(ctx, engine.PauseAbort, true); assert.NoError(t, err) }()
			go func() { defer wg2.Done(); assert.NoError(t, s.e.Sleep(ctx, 1, engine.PauseAbort)) }()
			wg2.Wait()
			require.Zero(t, s.conn.Stats()["offload_transfers_inflight"], "asleep with copies in flight")
			version++
			w, err := model.Preset("tiny", uint64(version))
			require.NoError(t, err)
			weights[version] = w
			_, err = s.e.UpdateWeights(ctx, w, version, false)
			require.NoError(t, err)
			require.NoError(t, s.e.WakeUp(ctx, nil))
			require.NoError(t, s.e.Resume(ctx))
		case r < 78:
			s.hooks.SetDelay([]time.Duration{0, time.Millisecond, 5 * time.Millisecond}[rng.IntN(3)])
		case r < 82:
			// A sleep that keeps the requests (waiting, loading, landed): they recompute after
			// the wake-up and must still produce the reference output.
			mode := []engine.PauseMode{engine.PauseKeep, engine.PauseWait}[rng.IntN(2)]
			_, err := s.e.Pause(ctx, mode, false)
			require.NoError(t, err)
			require.NoError(t, s.e.Sleep(ctx, 1, mode))
			require.NoError(t, s.e.WakeUp(ctx, nil))
			require.NoError(t, s.e.Resume(ctx))
		case r < 85:
			// Concurrent updates of a quiet engine (so no request spans the swap).
			_, err := s.e.Pause(ctx, engine.PauseAbort, true)
			require.NoError(t, err)
			var wg2 sync.WaitGroup
			for range 2 {
				version++
				v := version
				w, err := model.Preset("tiny", uint64(v))
				require.NoError(t, err)
				weights[v] = w
				wg2.Add(1)
				go func() {
					defer wg2.Done()
					if _, err := s.e.UpdateWeights(ctx, w, v, false); err != nil {
						assert.ErrorIs(t, err, engine.ErrStaleVersion)
					}
				}()
			}
			wg2.Wait()
			require.Equal(t, version, s.e.Version(), "the newest version serves")
			require.NoError(t, s.e.Resume(ctx))
		case r < 89:
			// Corrupt what the CPU tier holds and drop the engine's own cache, so the next
			// requests with a shared prefix load bad bytes: those loads fail their checksum
			// and the requests recompute.
			p := append(append([]int(nil), prefixes[rng.IntN(2)]...), tinyPrompt(1+rng.IntN(12), i)...)
			add(fmt.Sprintf("c%d", i), p, 2) // stores the prefix, unless an abort or reset follows
			wg.Wait()
			waitIdle(t, s.conn)
			res, err := s.e.ResetPrefixCache(ctx, false, false)
			require.NoError(t, err)
			require.True(t, res.Success, res.Reason)
			s.conn.CorruptCPUTier()
			corrupted++
			add(fmt.Sprintf("d%d", i), p, 3) // loads the corrupted prefix, fails, recomputes
		case r < 92:
			failNext.Store(true) // the next step's requests end aborted
		default:
			// Let the engine take a step or two (or go idle) before the next operation. The
			// number is drawn once: a draw inside the poll would consume the stream as often
			// as the poll runs.
			steps, more := s.e.Metrics().Steps, int64(rng.IntN(2))
			require.Eventually(t, func() bool {
				m := s.e.Metrics()
				return m.Steps > steps+more || m.Running+m.Waiting == 0
			}, 10*time.Second, 100*time.Microsecond)
		}
	}
	wg.Wait()
	waitIdle(t, s.conn)
	completed := 0
	byVersion := map[int64][]string{}
	for id, ru := range runs {
		require.NoError(t, ru.err, id)
		if ru.res.FinishReason == engine.FinishAbort {
			continue
		}
		completed++
		v := ru.res.Tokens[0].WeightVersion
		for _, tok := range ru.res.Tokens {
			require.Equal(t, v, tok.WeightVersion, "request %s spans a swap", id)
		}
		byVersion[v] = append(byVersion[v], id)
	}
	for v, ids := range byVersion {
		want := plainGreedy(t, weights[v], ids, func(id string) ([]int, int) { return runs[id].prompt, runs[id].n })
		for _, id := range ids {
			require.Equal(t, want[id], runs[id].res.TokenIDs(), "request %s under version %d", id, v)
		}
	}
	st := s.conn.Stats()
	t.Logf("%d ops, %d completed, %d weight versions, %d corruptions, %d step errors; stats %v",
		ops, completed, len(weights), corrupted, s.e.Metrics().StepErrors, st)
	assert.Equal(t, st["offload_checksum_failures_total"], st["safety_violations_total"], "only the injected corruption")
	assert.Zero(t, s.e.Metrics().InvariantViolations, "a block owned across a KV pool release")
	_, err := s.e.CheckInvariants(ctx)
	require.NoError(t, err)
	assert.Positive(t, completed)
	assert.Positive(t, st["offload_hit_tokens_total"], "the run exercised loads")
}

// plainGreedy runs the requests ids (prompt and length from req) on a plain engine serving w,
// with no connector and nothing else, and returns their greedy outputs.
func plainGreedy(t *testing.T, w *model.Weights, ids []string, req func(id string) ([]int, int)) map[string][]int {
	t.Helper()
	e, err := engine.New(engine.Config{Weights: w, NumBlocks: 512, Workers: 2})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(testCtx(t))
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()
	streams := map[string]*engine.Stream{}
	for _, id := range ids {
		p, n := req(id)
		st, err := e.Add(ctx, engine.Request{ID: id, PromptTokenIDs: p, Sampling: greedy(n)})
		require.NoError(t, err)
		streams[id] = st
	}
	out := map[string][]int{}
	for id, st := range streams {
		res, err := st.Collect(ctx)
		require.NoError(t, err)
		require.Equal(t, engine.FinishLength, res.FinishReason, id)
		out[id] = res.TokenIDs()
	}
	return out
}
