package offload_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/kvcache"
	"github.com/rolloutkit/rollout/engine/kvconnector"
	"github.com/rolloutkit/rollout/engine/sched"
)

// refOutputs is what the fake model samples for a request run alone with correct KV.
func refOutputs(h *harness, prompt []int, maxTokens, eosAt int) []int {
	toks := append([]int(nil), prompt...)
	var out []int
	for len(out) < maxTokens {
		ph := prefixHashes(toks)
		var acc uint64 = 7
		for pos := range toks {
			for l := 0; l < h.layout.NumLayers; l++ {
				for j := 0; j < h.layout.KVDim; j++ {
					acc = acc*31 + uint64(math.Float32bits(kvValue(ph[pos], l, j)))
					acc = acc*31 + uint64(math.Float32bits(kvValue(ph[pos], l, j+100)))
				}
			}
		}
		tok := 1 + int(acc%uint64(vocab-1))
		if eosAt > 0 && len(out)+1 == eosAt {
			tok = eos
		}
		out = append(out, tok)
		toks = append(toks, tok)
		if tok == eos || len(toks) >= (h.layout.NumBlocks-1)*h.layout.BlockSize {
			break
		}
	}
	return out
}

type randReq struct {
	prompt           []int
	maxTokens, eosAt int
}

// TestRandomInterleaving drives thousands of random operations (adds, finishes, aborts,
// preemptions from a small pool, resets, double resets, pauses, sleeps and wakes, weight swaps,
// slow and fast copies) and checks after every step: no safety violation, no CPU slot leaked or
// owned twice, every flush delivered exactly once and by the very next step, cached and loaded
// KV bit-identical to what the model computes, and every completed request's output identical
// to a run without offloading.
func TestRandomInterleaving(t *testing.T) {
	ops := 3000
	if testing.Short() {
		ops = 600
	}
	for seed := range uint64(3) {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			policy := []string{"lru", "arc"}[seed%2]
			h := newHarness(t, harnessCfg{blockSize: 4, numBlocks: 24, bpc: 1 + int(seed%2), cpuChunks: 24, policy: policy, maxTokens: 24, maxSeqs: 4})
			reqs := map[string]randReq{}
			live := []string{}
			flushedOnce := map[int64]bool{}
			stores, loads := 0, 0
			version := int64(0)
			prefixes := [][]int{seq(12, 1), seq(16, 2), seq(8, 3)}
			n := 0

			step := func() {
				pending := h.stat("offload_flush_pending")
				i := len(h.metas)
				h.step()
				m := h.metas[i]
				if pending > 0 {
					require.Len(t, m.FlushJobIDs, int(pending), "the pending flush set is delivered by the next step")
				}
				for _, id := range m.FlushJobIDs {
					require.False(t, flushedOnce[id], "job %d flushed twice", id)
					flushedOnce[id] = true
				}
				require.Zero(t, h.stat("offload_flush_pending"))
			}
			resetAll := func() {
				_, _ = h.sched.ResetPrefixCache(context.Background(), true, true)
			}
			sleepWake := func() {
				// Sleep(1): pause(abort), reset, deliver the flush, wait idle, release; wake with
				// fresh zeroed storage, as the engine does.
				h.sched.FinishAll(sched.FinishAbort)
				resetAll()
				for h.sched.HasRequests() {
					step()
				}
				require.NoError(t, h.worker.WaitIdle(context.Background()))
				b := h.worker.(kvconnector.StorageBinder)
				b.ReleaseKVStorage()
				st, err := kvcache.NewStorage(h.layout)
				require.NoError(t, err)
				h.storage = st
				require.NoError(t, b.BindKVStorage(st))
				live = live[:0]
			}
			for range ops {
				switch r := rng.IntN(100); {
				case r < 20:
					id := fmt.Sprintf("q%d", n)
					n++
					p := append(append([]int(nil), prefixes[rng.IntN(len(prefixes))]...), seq(1+rng.IntN(10), n)...)
					rr := randReq{prompt: p, maxTokens: 1 + rng.IntN(12)}
					if rng.IntN(4) == 0 {
						rr.eosAt = 1 + rng.IntN(rr.maxTokens)
						h.eosAt[id] = rr.eosAt
					}
					reqs[id] = rr
					h.add(id, p, rr.maxTokens)
					live = append(live, id)
				case r < 24 && len(live) > 0:
					h.sched.Abort(live[rng.IntN(len(live))])
				case r < 26:
					resetAll()
				case r < 27:
					resetAll()
					resetAll() // no step between
				case r < 33:
					_, _ = h.sched.ResetPrefixCache(context.Background(), false, false)
				case r < 34:
					// Pause(abort, clearCache) then Sleep(1), back to back.
					sleepWake()
				case r < 35:
					version++
					h.sched.SetWeightVersion(version)
				case r < 38:
					h.hooks.SetDelay([]time.Duration{0, 0, time.Millisecond, 3 * time.Millisecond}[rng.IntN(4)])
				default:
					if h.sched.HasRequests() {
						step()
					}
				}
			}
			for h.sched.HasRequests() {
				step()
			}
			require.NoError(t, h.worker.WaitIdle(context.Background()))
			require.False(t, h.conn.Scheduler().HasPendingPushWork())
			require.Zero(t, h.stat("offload_jobs_inflight"))
			require.Zero(t, h.conn.Violations())
			completed := 0
			for id, rr := range reqs {
				reason, ok := h.reasons[id]
				if !ok || reason == sched.FinishAbort {
					continue
				}
				completed++
				require.Equal(t, refOutputs(h, rr.prompt, rr.maxTokens, rr.eosAt), h.outs[id], "request %s", id)
			}
			for id := range reqs {
				stores += len(h.stored(id))
				loads += len(h.loaded(id))
			}
			t.Logf("%d ops: %d requests completed, %d chunks stored, %d loaded, %d flushed, %d verified prefixes, stats %v",
				ops, completed, stores, loads, len(flushedOnce), h.checked, h.conn.Stats())
			require.Positive(t, loads, "the run exercised loads")
			require.Positive(t, len(flushedOnce), "the run exercised flushes")
		})
	}
}
