package offload_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/model"
)

// TestEngineRandomInterleaving drives the real EngineCore with the connector through random
// adds, aborts, resets (single and double), pauses with cache clearing, the RL weight-update
// cycle (pause, sleep, swap, wake, resume) and slow/fast copies, then checks zero violations
// and that every completed request's greedy output equals the reference forward under the
// weights it ran with.
func TestEngineRandomInterleaving(t *testing.T) {
	ops := 70
	if testing.Short() {
		ops = 30
	}
	s := startEngine(t, time.Millisecond, engine.Hooks{})
	ctx := testCtx(t)
	weights := map[int64]*model.Weights{1: s.w}
	version := int64(1)
	rng := rand.New(rand.NewPCG(7, 7))
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
	for i := range ops {
		switch r := rng.IntN(100); {
		case r < 40:
			id := fmt.Sprintf("q%d", i)
			p := append(append([]int(nil), prefixes[rng.IntN(len(prefixes))]...), tinyPrompt(1+rng.IntN(12), i)...)
			ru := &run{prompt: p, n: 1 + rng.IntN(8)}
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
			s.conn.SetDelay([]time.Duration{0, time.Millisecond, 5 * time.Millisecond}[rng.IntN(3)])
		default:
			time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
		}
	}
	wg.Wait()
	waitIdle(t, s.conn)
	completed := 0
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
		require.Equal(t, referenceGreedy(t, weights[v], ru.prompt, ru.n), ru.res.TokenIDs(), "request %s under version %d", id, v)
	}
	st := s.conn.Stats()
	t.Logf("%d ops, %d completed, %d weight versions; stats %v", ops, completed, len(weights), st)
	assert.Zero(t, s.conn.Violations())
	assert.Positive(t, completed)
	assert.Positive(t, st["offload_hit_tokens_total"], "the run exercised loads")
}
