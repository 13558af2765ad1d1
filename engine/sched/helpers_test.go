package sched

import (
	"fmt"
	"hash/fnv"
	"testing"

	"github.com/rolloutkit/rollout/engine/kvcache"
	"github.com/rolloutkit/rollout/engine/kvconnector"
	"github.com/stretchr/testify/require"
)

// kvEntry is what the fake runner writes into a KV slot: enough to check that whatever a request
// reads back is exactly its own context, computed under the right weights.
type kvEntry struct {
	valid bool
	tok   int
	pos   int
	ver   int64
}

// fakeRunner plays the model runner over a simulated paged KV store. It checks, for every
// scheduled request, that the positions before StartPos read back from its block table hold the
// request's own tokens (so prefix hits and preemption recovery are correct) and, for a fresh
// request, that reused KV was written under the current weight version. The sampled token is a
// hash of the context read from the cache.
type fakeRunner struct {
	bs    int
	vocab int
	kv    [][]kvEntry
}

func newFakeRunner(numBlocks, bs, vocab int) *fakeRunner {
	kv := make([][]kvEntry, numBlocks)
	for i := range kv {
		kv[i] = make([]kvEntry, bs)
	}
	return &fakeRunner{bs: bs, vocab: vocab, kv: kv}
}

// nextToken is the fake model: a hash of the whole context.
func nextToken(ctx []int, vocab int) int {
	h := fnv.New64a()
	for _, t := range ctx {
		fmt.Fprintf(h, "%d,", t)
	}
	return int(h.Sum64() % uint64(vocab))
}

func (f *fakeRunner) run(so *SchedulerOutput) (*ModelOutput, error) {
	mo := &ModelOutput{Step: so.Step, Sampled: map[string]Sample{}}
	for _, sr := range so.Scheduled {
		all := sr.Req.TokenIDs()
		if sr.StartPos+len(sr.TokenIDs) > len(sr.BlockIDs)*f.bs {
			return nil, fmt.Errorf("%s: %d tokens but %d blocks", sr.ReqID, sr.StartPos+len(sr.TokenIDs), len(sr.BlockIDs))
		}
		for p := 0; p < sr.StartPos; p++ {
			e := f.kv[sr.BlockIDs[p/f.bs]][p%f.bs]
			if !e.valid || e.pos != p || e.tok != all[p] {
				return nil, fmt.Errorf("step %d %s: KV at pos %d is %+v, want token %d", so.Step, sr.ReqID, p, e, all[p])
			}
			if sr.Fresh && e.ver != so.WeightVersion {
				return nil, fmt.Errorf("step %d %s: reused KV at pos %d from version %d under version %d", so.Step, sr.ReqID, p, e.ver, so.WeightVersion)
			}
		}
		for i, tok := range sr.TokenIDs {
			p := sr.StartPos + i
			if sr.BlockIDs[p/f.bs] == kvcache.NullBlock {
				return nil, fmt.Errorf("%s writes the null block", sr.ReqID)
			}
			f.kv[sr.BlockIDs[p/f.bs]][p%f.bs] = kvEntry{valid: true, tok: tok, pos: p, ver: so.WeightVersion}
		}
		if sr.Sample {
			end := sr.StartPos + len(sr.TokenIDs)
			ctx := make([]int, end)
			for p := range end {
				ctx[p] = f.kv[sr.BlockIDs[p/f.bs]][p%f.bs].tok
			}
			mo.Sampled[sr.ReqID] = Sample{TokenID: nextToken(ctx, f.vocab), Payload: end}
		}
	}
	return mo, nil
}

type harness struct {
	t    *testing.T
	s    *Scheduler
	pool *kvcache.Manager
	run  *fakeRunner
	outs map[string][]RequestOutput
}

func newHarness(t *testing.T, cfg Config, numBlocks, bs int, conn kvconnector.Scheduler) *harness {
	t.Helper()
	pool, err := kvcache.New(kvcache.Config{NumBlocks: numBlocks, BlockSize: bs, PrefixCaching: true})
	require.NoError(t, err)
	s, err := New(cfg, pool, conn)
	require.NoError(t, err)
	return &harness{t: t, s: s, pool: pool, run: newFakeRunner(numBlocks, bs, 1000), outs: map[string][]RequestOutput{}}
}

func (h *harness) add(id string, prompt []int, p Params) *Request {
	h.t.Helper()
	r := &Request{ID: id, PromptTokenIDs: prompt, Params: p}
	require.NoError(h.t, h.s.Add(r))
	return r
}

// step runs one full step and returns the scheduler output.
func (h *harness) step() *SchedulerOutput {
	h.t.Helper()
	so, err := h.s.Schedule()
	require.NoError(h.t, err)
	mo, err := h.run.run(so)
	require.NoError(h.t, err)
	outs, err := h.s.UpdateFromOutput(so, mo)
	require.NoError(h.t, err)
	h.record(outs)
	require.NoError(h.t, h.s.CheckInvariants())
	return so
}

func (h *harness) record(outs []RequestOutput) {
	for _, o := range outs {
		h.outs[o.ReqID] = append(h.outs[o.ReqID], o)
	}
}

func (h *harness) drain(maxSteps int) {
	h.t.Helper()
	for i := 0; h.s.HasRequests(); i++ {
		require.Less(h.t, i, maxSteps, "engine did not drain")
		h.step()
	}
}

func scheduledTokens(so *SchedulerOutput) map[string]int {
	m := map[string]int{}
	for _, sr := range so.Scheduled {
		m[sr.ReqID] = len(sr.TokenIDs)
	}
	return m
}

func tokens(from, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = from + i
	}
	return out
}

func lastOut(outs []RequestOutput) RequestOutput {
	if len(outs) == 0 {
		return RequestOutput{}
	}
	return outs[len(outs)-1]
}
