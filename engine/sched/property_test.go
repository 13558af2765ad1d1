package sched

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/rolloutkit/rollout/engine/kvcache"
	"github.com/rolloutkit/rollout/engine/kvconnector"
	"pgregory.net/rapid"
)

const propVocab = 20 // small, so EOS (0) and the stop token (3) are sampled now and then

// chaosConn is a connector driven by rapid: it defers lookups, grants asynchronous loads of
// block-aligned prefixes and delays frees at random. The test completes loads (writing the KV the
// connector "loaded" into the fake runner's store) and sends at random steps.
type chaosConn struct {
	kvconnector.Noop
	t        *rapid.T
	bs       int
	local    map[string]int  // local hit passed to the last lookup
	loading  map[string]bool // async loads granted, not yet reported finished
	sending  map[string]bool // delayed frees not yet reported
	finished map[string]int  // RequestFinished calls
	metas    int
	resets   int
	calm     bool // draining: no more chaos, so shrinking cannot starve the drain
}

func (c *chaosConn) GetNumNewMatchedTokens(r kvconnector.Request, n int) (int, bool) {
	if c.calm {
		return 0, false
	}
	if rapid.IntRange(0, 9).Draw(c.t, "defer") == 0 {
		return kvconnector.Defer, false
	}
	c.local[r.RequestID()] = n
	avail := (r.NumTokens() - 1 - n) / c.bs * c.bs
	if avail <= 0 || rapid.IntRange(0, 3).Draw(c.t, "async") != 0 {
		return 0, false
	}
	return rapid.IntRange(1, avail/c.bs).Draw(c.t, "extBlocks") * c.bs, true
}

func (c *chaosConn) UpdateStateAfterAlloc(r kvconnector.Request, _ []int, ext int) {
	if ext > 0 {
		c.loading[r.RequestID()] = true
	}
}

func (c *chaosConn) BuildConnectorMeta(step kvconnector.StepInfo) kvconnector.Metadata {
	c.metas++
	return kvconnector.Metadata{Step: step.Step}
}

func (c *chaosConn) RequestFinished(r kvconnector.Request, _ []int) bool {
	c.finished[r.RequestID()]++
	if !c.calm && rapid.IntRange(0, 3).Draw(c.t, "delayFree") == 0 {
		c.sending[r.RequestID()] = true
		return true
	}
	return false
}

func (c *chaosConn) ResetCache(context.Context) (int, bool) {
	c.resets++
	return 0, true
}

type propState struct {
	t         *rapid.T
	s         *Scheduler
	pool      *kvcache.Manager
	run       *fakeRunner
	conn      *chaosConn
	bs        int
	reqs      map[string]*Request
	streamed  map[string][]int
	finals    map[string][]RequestOutput
	aborted   map[string]bool
	delivered map[string]int
	next      int
	steps     int
}

var prefixes = [][]int{nil, {1, 2, 4, 5, 6, 8, 9, 10}, {11, 12, 13, 14, 15, 16, 17, 18, 19, 1, 2, 4}}

func (p *propState) record(outs []RequestOutput) {
	for _, o := range outs {
		if len(p.finals[o.ReqID]) > 0 {
			p.t.Fatalf("output for %q after it finished: %+v", o.ReqID, o)
		}
		p.streamed[o.ReqID] = append(p.streamed[o.ReqID], o.NewTokenIDs...)
		if len(o.Payloads) != len(o.NewTokenIDs) {
			p.t.Fatalf("%q: %d payloads for %d tokens", o.ReqID, len(o.Payloads), len(o.NewTokenIDs))
		}
		if o.Finished {
			p.finals[o.ReqID] = append(p.finals[o.ReqID], o)
		}
	}
}

func (p *propState) step(all bool) {
	so, err := p.s.Schedule()
	if err != nil {
		p.t.Fatal(err)
	}
	p.steps++
	for _, id := range so.FinishedReqIDs {
		p.delivered[id]++
	}
	if so.ConnectorMeta.Step != so.Step {
		p.t.Fatalf("metadata step %d in step %d", so.ConnectorMeta.Step, so.Step)
	}
	mo, err := p.run.run(so)
	if err != nil {
		p.t.Fatal(err)
	}
	for _, id := range sortedKeys(p.conn.loading) {
		if !all && !rapid.Bool().Draw(p.t, "loadDone") {
			continue
		}
		r := p.reqs[id]
		if r.Status() == StatusWaitingForRemoteKVs {
			// Write the KV the connector loaded: positions after the local hit.
			blocks := p.pool.Blocks(id)
			for pos := p.conn.local[id]; pos < r.NumComputedTokens(); pos++ {
				p.run.kv[blocks[pos/p.bs]][pos%p.bs] = kvEntry{valid: true, tok: r.TokenIDs()[pos], pos: pos, ver: r.WeightVersion()}
			}
		}
		delete(p.conn.loading, id)
		mo.KVConnector.FinishedRecving = append(mo.KVConnector.FinishedRecving, id)
	}
	for _, id := range sortedKeys(p.conn.sending) {
		if !all && !rapid.Bool().Draw(p.t, "sendDone") {
			continue
		}
		delete(p.conn.sending, id)
		mo.KVConnector.FinishedSending = append(mo.KVConnector.FinishedSending, id)
	}
	if !all && len(so.Scheduled) > 0 {
		// Aborts (and resets) may land between execution and UpdateFromOutput, as in vLLM's
		// step(); the stale results of those requests must be dropped.
		switch rapid.IntRange(0, 9).Draw(p.t, "midStep") {
		case 0:
			id := so.Scheduled[rapid.IntRange(0, len(so.Scheduled)-1).Draw(p.t, "midAbort")].ReqID
			outs := p.s.Abort(id)
			for _, o := range outs {
				p.aborted[o.ReqID] = true
			}
			p.record(outs)
		case 1:
			p.s.ResetPrefixCache(context.Background(), true, false)
		}
	}
	outs, err := p.s.UpdateFromOutput(so, mo)
	if err != nil {
		p.t.Fatal(err)
	}
	p.record(outs)
}

func sortedKeys(m map[string]bool) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func (p *propState) pick() string {
	if p.next == 0 {
		return "none"
	}
	return fmt.Sprintf("r%d", rapid.IntRange(0, p.next-1).Draw(p.t, "pick"))
}

// TestPropertySchedulerRandomInterleaving drives the scheduler with random adds, aborts, steps,
// resets, pauses, weight-version bumps and finish-all, plus a chaotic connector, and checks after
// every action the pool and scheduler invariants; the fake runner checks every step that each
// request reads back exactly its own KV, never KV from another weight version. At the end every
// request has finished exactly once, its finish was delivered in exactly one SchedulerOutput, the
// connector heard of it once, and its streamed tokens equal its output (none lost or duplicated)
// and the fake model's continuation.
func TestPropertySchedulerRandomInterleaving(t *testing.T) {
	totalSteps := 0
	rapid.Check(t, func(t *rapid.T) {
		bs := rapid.SampledFrom([]int{1, 2, 4}).Draw(t, "bs")
		maxLen := 24
		minBlocks := (maxLen+bs-1)/bs + 1
		numBlocks := rapid.IntRange(minBlocks, minBlocks+24/bs).Draw(t, "numBlocks")
		cfg := Config{
			MaxNumBatchedTokens:       rapid.IntRange(1, 40).Draw(t, "budget"),
			MaxNumSeqs:                rapid.IntRange(1, 6).Draw(t, "maxSeqs"),
			MaxModelLen:               maxLen,
			EOSTokenIDs:               []int{0},
			LongPrefillTokenThreshold: rapid.SampledFrom([]int{0, 0, 5}).Draw(t, "longPrefill"),
		}
		pool, err := kvcache.New(kvcache.Config{NumBlocks: numBlocks, BlockSize: bs, PrefixCaching: rapid.Bool().Draw(t, "prefixCaching")})
		if err != nil {
			t.Fatal(err)
		}
		conn := &chaosConn{t: t, bs: bs, local: map[string]int{}, loading: map[string]bool{}, sending: map[string]bool{}, finished: map[string]int{}}
		s, err := New(cfg, pool, conn)
		if err != nil {
			t.Fatal(err)
		}
		p := &propState{
			t: t, s: s, pool: pool, conn: conn, bs: bs,
			run:  newFakeRunner(numBlocks, bs, propVocab),
			reqs: map[string]*Request{}, streamed: map[string][]int{}, finals: map[string][]RequestOutput{},
			aborted: map[string]bool{}, delivered: map[string]int{},
		}
		actions := map[string]func(*rapid.T){
			"add": func(t *rapid.T) {
				prompt := slices.Clone(rapid.SampledFrom(prefixes).Draw(t, "prefix"))
				prompt = append(prompt, rapid.SliceOfN(rapid.IntRange(1, propVocab-1), 1, 8).Draw(t, "suffix")...)
				r := &Request{
					ID:             fmt.Sprintf("r%d", p.next),
					PromptTokenIDs: prompt,
					Params: Params{
						MaxTokens:    rapid.IntRange(1, 10).Draw(t, "maxTokens"),
						MinTokens:    rapid.IntRange(0, 2).Draw(t, "minTokens"),
						IgnoreEOS:    rapid.Bool().Draw(t, "ignoreEOS"),
						StopTokenIDs: rapid.SampledFrom([][]int{nil, {3}}).Draw(t, "stop"),
					},
					CacheSalt: rapid.SampledFrom([]string{"", "", "salt"}).Draw(t, "salt"),
				}
				p.next++
				if err := s.Add(r); err != nil {
					t.Fatal(err)
				}
				p.reqs[r.ID] = r
			},
			"abort": func(t *rapid.T) {
				id := p.pick()
				outs := s.Abort(id)
				for _, o := range outs {
					p.aborted[o.ReqID] = true
				}
				p.record(outs)
			},
			"step":  func(t *rapid.T) { p.step(false) },
			"step2": func(t *rapid.T) { p.step(false) },
			"burst": func(t *rapid.T) {
				for range rapid.IntRange(1, 8).Draw(t, "burst") {
					p.step(false)
					if err := s.CheckInvariants(); err != nil {
						t.Fatal(err)
					}
				}
			},
			"reset": func(t *rapid.T) {
				resetRunning := rapid.Bool().Draw(t, "resetRunning")
				running := s.NumRunning()
				ok, d := s.ResetPrefixCache(context.Background(), resetRunning, rapid.Bool().Draw(t, "resetConnector"))
				// Preempted counts landed loads too; blocks a load in flight or a delayed free
				// holds make even a reset_running reset fail, with the reason.
				if resetRunning && (d.RequestsPreempted < running || s.NumRunning() != 0) {
					t.Fatalf("reset with resetRunning: ok %v detail %+v", ok, d)
				}
				if ok != (d.BlocksInUse == 0) {
					t.Fatalf("reset ok=%v with %d blocks in use (resetRunning %v): %+v", ok, d.BlocksInUse, resetRunning, d)
				}
				if ok {
					for b := 1; b < pool.NumBlocks(); b++ {
						if _, cached := pool.HashOf(b); cached {
							t.Fatalf("reset reported success but block %d is still cached", b)
						}
					}
				} else if d.Reason == "" {
					t.Fatalf("failed reset without a reason: %+v", d)
				}
			},
			"pause": func(t *rapid.T) {
				s.SetPauseState(rapid.SampledFrom([]PauseState{Unpaused, Unpaused, PausedNew, PausedAll}).Draw(t, "pauseState"))
			},
			"version": func(t *rapid.T) { s.SetWeightVersion(s.WeightVersion() + 1) },
			"finishAll": func(t *rapid.T) {
				if rapid.IntRange(0, 4).Draw(t, "reallyFinishAll") != 0 {
					return
				}
				outs := s.FinishAll(FinishAbort)
				for _, o := range outs {
					p.aborted[o.ReqID] = true
				}
				p.record(outs)
			},
			"": func(t *rapid.T) {
				if err := s.CheckInvariants(); err != nil {
					t.Fatal(err)
				}
			},
		}
		// Several rounds make long histories (rapid's Repeat averages 30 actions).
		for range 6 {
			t.Repeat(actions)
		}

		// Drain: resume and complete every transfer.
		s.SetPauseState(Unpaused)
		conn.calm = true
		for i := 0; s.HasRequests(); i++ {
			if i > 5000 {
				var st []string
				for _, r := range s.waiting {
					st = append(st, fmt.Sprintf("%s:%v:c%d:n%d:b%d:done%v", r.ID, r.status, r.numComputed, r.NumTokens(), pool.NumBlocksOf(r.ID), s.recvDone[r.ID]))
				}
				t.Fatalf("did not drain: %d running, %d waiting %v, free %d", s.NumRunning(), s.NumWaiting(), st, pool.NumFreeBlocks())
			}
			p.step(true)
			if err := s.CheckInvariants(); err != nil {
				t.Fatal(err)
			}
		}
		if pool.NumRequestsWithBlocks() != 0 || pool.NumFreeBlocks() != numBlocks-1 {
			t.Fatalf("blocks leaked: %d requests, %d free of %d", pool.NumRequestsWithBlocks(), pool.NumFreeBlocks(), numBlocks-1)
		}
		for id, r := range p.reqs {
			if n := len(p.finals[id]); n != 1 {
				t.Fatalf("%s finished %d times", id, n)
			}
			if p.delivered[id] != 1 {
				t.Fatalf("%s finish delivered %d times", id, p.delivered[id])
			}
			if conn.finished[id] != 1 {
				t.Fatalf("%s: RequestFinished called %d times", id, conn.finished[id])
			}
			fin := p.finals[id][0]
			if (fin.FinishReason == FinishAbort) != p.aborted[id] || fin.FinishReason != r.FinishReason() {
				t.Fatalf("%s finish reason %q (aborted %v, request says %q)", id, fin.FinishReason, p.aborted[id], r.FinishReason())
			}
			out := r.OutputTokenIDs()
			if !slices.Equal(p.streamed[id], out) {
				t.Fatalf("%s streamed %v, output %v", id, p.streamed[id], out)
			}
			if len(out) > r.Params.MaxTokens {
				t.Fatalf("%s: %d tokens > max %d", id, len(out), r.Params.MaxTokens)
			}
			for j, tok := range out {
				if want := nextToken(r.TokenIDs()[:len(r.PromptTokenIDs)+j], propVocab); tok != want {
					t.Fatalf("%s token %d = %d, model says %d", id, j, tok, want)
				}
			}
			if fin.FinishReason == FinishLength && len(out) != r.Params.MaxTokens && r.NumTokens() < maxLen {
				t.Fatalf("%s: length finish at %d tokens", id, len(out))
			}
		}
		totalSteps += p.steps
	})
	t.Logf("%d scheduler steps in total", totalSteps)
}
