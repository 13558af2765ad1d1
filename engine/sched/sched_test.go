package sched

import (
	"context"
	"fmt"
	"testing"

	"github.com/rolloutkit/rollout/engine/kvcache"
	"github.com/rolloutkit/rollout/engine/kvconnector"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func baseConfig() Config {
	return Config{MaxNumBatchedTokens: 64, MaxNumSeqs: 8, MaxModelLen: 32, EOSTokenIDs: []int{7}}
}

// stepScripted runs a step whose sampled tokens are overridden by script (id -> token).
func (h *harness) stepScripted(script map[string]int) (*SchedulerOutput, []RequestOutput) {
	h.t.Helper()
	so, err := h.s.Schedule()
	require.NoError(h.t, err)
	mo, err := h.run.run(so)
	require.NoError(h.t, err)
	for id, tok := range script {
		if _, ok := mo.Sampled[id]; ok {
			mo.Sampled[id] = Sample{TokenID: tok}
		}
	}
	outs, err := h.s.UpdateFromOutput(so, mo)
	require.NoError(h.t, err)
	h.record(outs)
	require.NoError(h.t, h.s.CheckInvariants())
	return so, outs
}

// vLLM test_scheduler.py::test_schedule_partial_requests: the budget is filled in FCFS order and
// the last admitted prompt is chunked; a partial chunk does not sample.
func TestSchedulePartialRequests(t *testing.T) {
	cfg := baseConfig()
	cfg.MaxNumBatchedTokens = 10
	h := newHarness(t, cfg, 20, 4, nil)
	for _, id := range []string{"r0", "r1", "r2"} {
		h.add(id, tokens(100, 8), Params{MaxTokens: 4})
	}
	so := h.step()
	assert.Equal(t, map[string]int{"r0": 8, "r1": 2}, scheduledTokens(so))
	assert.True(t, so.Scheduled[0].Sample)
	assert.False(t, so.Scheduled[1].Sample)
	assert.Equal(t, 10, so.NumScheduledTokens)
	assert.Len(t, h.outs["r0"], 1)
	assert.Empty(t, h.outs["r1"])

	so = h.step()
	assert.Equal(t, map[string]int{"r0": 1, "r1": 6, "r2": 3}, scheduledTokens(so))
	assert.Equal(t, 2, so.Scheduled[1].StartPos)
	assert.True(t, so.Scheduled[1].Sample)
	assert.False(t, so.Scheduled[2].Sample)
	h.drain(50)
	for _, id := range []string{"r0", "r1", "r2"} {
		assert.Equal(t, FinishLength, lastOut(h.outs[id]).FinishReason, id)
	}
}

// Without chunked prefill a prompt that does not fit the remaining budget waits.
func TestNoChunkedPrefill(t *testing.T) {
	cfg := baseConfig()
	cfg.MaxNumBatchedTokens = 32
	cfg.DisableChunkedPrefill = true
	h := newHarness(t, cfg, 20, 4, nil)
	h.add("r0", tokens(1, 20), Params{MaxTokens: 2})
	h.add("r1", tokens(1, 20), Params{MaxTokens: 2})
	so := h.step()
	assert.Equal(t, map[string]int{"r0": 20}, scheduledTokens(so))
}

// vLLM test_prefix_caching / test_scheduler num_cached_tokens: a second request with the same
// prompt hits the first one's full blocks and recomputes the rest.
func TestPrefixHitOnSecondRequest(t *testing.T) {
	h := newHarness(t, baseConfig(), 20, 4, nil)
	h.add("a", tokens(100, 10), Params{MaxTokens: 1})
	h.drain(10)
	b := h.add("b", tokens(100, 10), Params{MaxTokens: 2})
	so := h.step()
	require.Len(t, so.Scheduled, 1)
	assert.Equal(t, 8, so.Scheduled[0].StartPos)
	assert.Len(t, so.Scheduled[0].TokenIDs, 2)
	assert.True(t, so.Scheduled[0].Fresh)
	assert.Equal(t, 8, b.NumCachedTokens())
	assert.Equal(t, 8, h.outs["b"][0].NumCachedTokens)
	h.drain(10)
	assert.Equal(t, h.outs["a"][0].NewTokenIDs, h.outs["b"][0].NewTokenIDs, "same context, same token")
	st := h.s.Stats().KV
	assert.Equal(t, int64(8), st.PrefixHits)

	// SkipPrefixCache never reads cached KV.
	c := &Request{ID: "c", PromptTokenIDs: tokens(100, 10), Params: Params{MaxTokens: 1}, SkipPrefixCache: true}
	require.NoError(t, h.s.Add(c))
	so = h.step()
	assert.Equal(t, 0, so.Scheduled[0].StartPos)
	assert.Zero(t, c.NumCachedTokens())
}

// The first block hash covers the weight version and the cache salt: the same prompt under a new
// version (or another salt) gets no hit, and hits again once something was computed under it.
func TestVersionInFirstBlockHash(t *testing.T) {
	h := newHarness(t, baseConfig(), 20, 4, nil)
	h.add("v0", tokens(100, 10), Params{MaxTokens: 1})
	h.drain(10)
	h.s.SetWeightVersion(1)
	r := h.add("v1", tokens(100, 10), Params{MaxTokens: 1})
	so := h.step()
	assert.Equal(t, 0, so.Scheduled[0].StartPos)
	assert.Equal(t, int64(1), r.WeightVersion())
	assert.Equal(t, int64(1), h.outs["v1"][0].WeightVersion)
	r2 := h.add("v1b", tokens(100, 10), Params{MaxTokens: 1})
	h.step()
	assert.Equal(t, 8, r2.NumCachedTokens())

	salted := &Request{ID: "salt", PromptTokenIDs: tokens(100, 10), Params: Params{MaxTokens: 1}, CacheSalt: "tenant"}
	require.NoError(t, h.s.Add(salted))
	h.step()
	assert.Zero(t, salted.NumCachedTokens())
}

// A request admitted under one version but first scheduled under another hashes under the one
// it computes with.
func TestWaitingRequestRehashedAtStart(t *testing.T) {
	h := newHarness(t, baseConfig(), 20, 4, nil)
	h.add("a", tokens(100, 10), Params{MaxTokens: 1})
	h.drain(10)
	r := h.add("b", tokens(100, 10), Params{MaxTokens: 1})
	h.s.SetWeightVersion(5)
	so := h.step()
	assert.Equal(t, 0, so.Scheduled[0].StartPos, "KV from version 0 not reused under 5")
	assert.Equal(t, int64(5), r.WeightVersion())
}

// vLLM test_scheduler.py preemption: when blocks run out the last running request is preempted
// (here the request itself, which stops the running loop), its KV freed; it resumes later,
// recomputing (helped by its own cached prefix) and produces the same tokens.
func TestPreemptionAndResume(t *testing.T) {
	cfg := baseConfig()
	cfg.MaxModelLen = 8
	h := newHarness(t, cfg, 6, 2, nil) // 5 usable blocks, each request needs up to 4
	a := h.add("a", tokens(10, 4), Params{MaxTokens: 3, IgnoreEOS: true})
	b := h.add("b", tokens(20, 4), Params{MaxTokens: 3, IgnoreEOS: true})
	so := h.step()
	assert.Equal(t, map[string]int{"a": 4, "b": 4}, scheduledTokens(so))
	so = h.step()
	assert.Equal(t, map[string]int{"a": 1}, scheduledTokens(so))
	assert.Equal(t, []string{"b"}, so.PreemptedReqIDs)
	assert.Equal(t, StatusPreempted, b.Status())
	assert.Equal(t, 1, b.NumPreemptions())
	assert.Zero(t, b.NumComputedTokens())
	assert.Zero(t, h.pool.NumBlocksOf("b"))
	h.drain(30)
	for _, r := range []*Request{a, b} {
		assert.Equal(t, FinishLength, r.FinishReason())
		require.Len(t, r.OutputTokenIDs(), 3)
		for j, tok := range r.OutputTokenIDs() {
			ctx := r.TokenIDs()[:len(r.PromptTokenIDs)+j]
			assert.Equal(t, nextToken(ctx, 1000), tok, "%s token %d", r.ID, j)
		}
		var streamed []int
		for _, o := range h.outs[r.ID] {
			streamed = append(streamed, o.NewTokenIDs...)
		}
		assert.Equal(t, r.OutputTokenIDs(), streamed, "nothing lost or duplicated")
	}
	assert.Equal(t, int64(1), h.s.Stats().NumPreemptions)
}

// Preemption picks the last running request (LIFO) when it is not the one being scheduled.
func TestPreemptLastRunning(t *testing.T) {
	cfg := baseConfig()
	cfg.MaxModelLen = 8
	h := newHarness(t, cfg, 7, 2, nil) // 6 usable blocks
	h.add("a", tokens(10, 4), Params{MaxTokens: 4, IgnoreEOS: true})
	h.add("b", tokens(20, 4), Params{MaxTokens: 4, IgnoreEOS: true})
	h.add("c", tokens(30, 3), Params{MaxTokens: 4, IgnoreEOS: true})
	h.step() // a:2 blocks, b:2, c:2 -> pool full
	so := h.step()
	// a needs a third block: c (last) is preempted, which leaves enough for b too.
	assert.Equal(t, map[string]int{"a": 1, "b": 1}, scheduledTokens(so))
	assert.Equal(t, []string{"c"}, so.PreemptedReqIDs)
	h.drain(40)
}

// vLLM test_scheduler.py::test_stop_via_update_from_output: EOS, stop token ids, ignore_eos,
// min_tokens and max_tokens.
func TestStopViaUpdateFromOutput(t *testing.T) {
	h := newHarness(t, baseConfig(), 40, 4, nil)
	h.add("eos", tokens(1, 3), Params{MaxTokens: 5})
	h.add("stop", tokens(1, 3), Params{MaxTokens: 5, StopTokenIDs: []int{42, 43}})
	h.add("ignore", tokens(1, 3), Params{MaxTokens: 5, IgnoreEOS: true})
	h.add("min", tokens(1, 3), Params{MaxTokens: 5, MinTokens: 2})
	h.add("max", tokens(1, 3), Params{MaxTokens: 1})
	_, outs := h.stepScripted(map[string]int{"eos": 7, "stop": 43, "ignore": 7, "min": 7, "max": 7})
	byID := map[string]RequestOutput{}
	for _, o := range outs {
		byID[o.ReqID] = o
	}
	assert.Equal(t, FinishStop, byID["eos"].FinishReason)
	assert.Equal(t, []int{7}, byID["eos"].NewTokenIDs, "the stop token is part of the output")
	assert.Equal(t, FinishStop, byID["stop"].FinishReason)
	assert.False(t, byID["ignore"].Finished)
	assert.False(t, byID["min"].Finished)
	assert.Equal(t, FinishLength, byID["max"].FinishReason, "length is checked before EOS")
	_, outs = h.stepScripted(map[string]int{"ignore": 7, "min": 7})
	for _, o := range outs {
		switch o.ReqID {
		case "ignore":
			assert.False(t, o.Finished)
		case "min":
			assert.Equal(t, FinishStop, o.FinishReason)
		}
	}
}

func TestMaxTokensAndContextLength(t *testing.T) {
	cfg := baseConfig()
	cfg.MaxModelLen = 8
	h := newHarness(t, cfg, 20, 4, nil)
	mt := h.add("maxtok", tokens(10, 2), Params{MaxTokens: 3, IgnoreEOS: true})
	ctx := h.add("ctx", tokens(20, 6), Params{MaxTokens: 10, IgnoreEOS: true})
	full := h.add("full", tokens(30, 8), Params{MaxTokens: 10, IgnoreEOS: true})
	h.drain(20)
	assert.Len(t, mt.OutputTokenIDs(), 3)
	assert.Equal(t, FinishLength, mt.FinishReason())
	assert.Len(t, ctx.OutputTokenIDs(), 2)
	assert.Equal(t, FinishLength, ctx.FinishReason())
	assert.Len(t, full.OutputTokenIDs(), 1)
	assert.Equal(t, FinishLength, full.FinishReason())
}

func TestAddValidation(t *testing.T) {
	cfg := baseConfig()
	cfg.MaxModelLen = 8
	h := newHarness(t, cfg, 20, 4, nil)
	for name, tc := range map[string]struct {
		req  *Request
		want error
	}{
		"nil":      {nil, ErrInvalidRequest},
		"no id":    {&Request{PromptTokenIDs: []int{1}, Params: Params{MaxTokens: 1}}, ErrInvalidRequest},
		"empty":    {&Request{ID: "x", Params: Params{MaxTokens: 1}}, ErrEmptyPrompt},
		"too long": {&Request{ID: "x", PromptTokenIDs: tokens(0, 9), Params: Params{MaxTokens: 1}}, ErrPromptTooLong},
		"max 0":    {&Request{ID: "x", PromptTokenIDs: []int{1}}, ErrInvalidRequest},
		"min < 0":  {&Request{ID: "x", PromptTokenIDs: []int{1}, Params: Params{MaxTokens: 1, MinTokens: -1}}, ErrInvalidRequest},
	} {
		assert.ErrorIs(t, h.s.Add(tc.req), tc.want, name)
	}
	h.add("dup", []int{1}, Params{MaxTokens: 1})
	assert.ErrorIs(t, h.s.Add(&Request{ID: "dup", PromptTokenIDs: []int{1}, Params: Params{MaxTokens: 1}}), ErrDuplicateID)
	assert.Equal(t, 1, h.s.NumWaiting())

	_, err := New(Config{MaxNumBatchedTokens: 1, MaxNumSeqs: 1, MaxModelLen: 100}, h.pool, nil)
	assert.ErrorIs(t, err, ErrInvalidConfig, "context larger than the pool")
	_, err = New(Config{}, h.pool, nil)
	assert.ErrorIs(t, err, ErrInvalidConfig)
}

// vLLM test_scheduler.py abort tests: aborting running and waiting requests frees their blocks,
// reports abort once, and the finished ids reach exactly one SchedulerOutput.
func TestAbortRunningAndWaiting(t *testing.T) {
	cfg := baseConfig()
	cfg.MaxNumSeqs = 1
	h := newHarness(t, cfg, 20, 4, nil)
	h.add("run", tokens(1, 6), Params{MaxTokens: 10, IgnoreEOS: true})
	h.add("wait", tokens(1, 6), Params{MaxTokens: 10, IgnoreEOS: true})
	h.step()
	require.Equal(t, 1, h.s.NumRunning())
	require.Equal(t, 1, h.s.NumWaiting())

	outs := h.s.Abort("wait", "run", "nope")
	require.Len(t, outs, 2)
	for _, o := range outs {
		assert.True(t, o.Finished)
		assert.Equal(t, FinishAbort, o.FinishReason)
	}
	assert.Empty(t, h.s.Abort("run"), "second abort is a no-op")
	assert.Zero(t, h.s.NumRunning()+h.s.NumWaiting())
	assert.Zero(t, h.pool.NumRequestsWithBlocks())
	assert.True(t, h.s.HasRequests(), "finished ids still to deliver")
	assert.ErrorIs(t, h.s.Add(&Request{ID: "run", PromptTokenIDs: []int{1}, Params: Params{MaxTokens: 1}}), ErrDuplicateID)
	so := h.step()
	assert.ElementsMatch(t, []string{"wait", "run"}, so.FinishedReqIDs)
	assert.Zero(t, so.NumScheduledTokens)
	assert.False(t, h.s.HasRequests())
	so = h.step()
	assert.Empty(t, so.FinishedReqIDs)
	h.add("run", []int{1}, Params{MaxTokens: 1})
}

// vLLM PauseState: PAUSED_NEW keeps running requests going and admits none; PAUSED_ALL schedules
// nothing and reports no unfinished requests; FinishAll is pause(abort).
func TestPauseStates(t *testing.T) {
	cfg := baseConfig()
	cfg.MaxNumSeqs = 1
	h := newHarness(t, cfg, 20, 4, nil)
	h.add("a", tokens(1, 4), Params{MaxTokens: 3, IgnoreEOS: true})
	h.add("b", tokens(1, 4), Params{MaxTokens: 3, IgnoreEOS: true})
	h.step()

	h.s.SetPauseState(PausedAll)
	assert.Zero(t, h.s.NumUnfinishedRequests())
	assert.False(t, h.s.HasRequests())
	so := h.step()
	assert.Zero(t, so.NumScheduledTokens)

	h.s.SetPauseState(PausedNew)
	assert.Equal(t, 1, h.s.NumUnfinishedRequests())
	h.drain(10)
	assert.Equal(t, FinishLength, lastOut(h.outs["a"]).FinishReason)
	assert.Empty(t, h.outs["b"], "waiting request not admitted while PausedNew")
	assert.False(t, h.s.HasRequests())

	h.s.SetPauseState(Unpaused)
	assert.True(t, h.s.HasRequests())
	h.step()
	assert.Len(t, h.outs["b"], 1)

	outs := h.s.FinishAll(FinishAbort)
	require.Len(t, outs, 1)
	assert.Equal(t, "b", outs[0].ReqID)
	assert.Equal(t, FinishAbort, outs[0].FinishReason)
	h.drain(3)
}

type fakeConn struct {
	kvconnector.Noop
	resetOK       bool
	resets        int
	jobs          int
	pending       bool
	metas         []kvconnector.StepInfo
	finishedCalls map[string]int
	asyncFor      map[string]int // id -> external tokens to load asynchronously
	deferOnce     map[string]bool
	delayFree     map[string]bool
	allocs        map[string]int
}

func newFakeConn() *fakeConn {
	return &fakeConn{resetOK: true, finishedCalls: map[string]int{}, asyncFor: map[string]int{}, deferOnce: map[string]bool{}, delayFree: map[string]bool{}, allocs: map[string]int{}}
}

func (c *fakeConn) GetNumNewMatchedTokens(r kvconnector.Request, n int) (int, bool) {
	if c.deferOnce[r.RequestID()] {
		delete(c.deferOnce, r.RequestID())
		return kvconnector.Defer, false
	}
	if ext := c.asyncFor[r.RequestID()]; ext > 0 {
		delete(c.asyncFor, r.RequestID())
		return ext, true
	}
	return 0, false
}

func (c *fakeConn) UpdateStateAfterAlloc(r kvconnector.Request, blocks []int, ext int) {
	c.allocs[r.RequestID()] = ext
}

func (c *fakeConn) BuildConnectorMeta(step kvconnector.StepInfo) kvconnector.Metadata {
	c.metas = append(c.metas, step)
	return kvconnector.Metadata{Step: step.Step, FlushJobIDs: []int64{int64(c.jobs)}}
}

func (c *fakeConn) RequestFinished(r kvconnector.Request, blocks []int) bool {
	c.finishedCalls[r.RequestID()]++
	return c.delayFree[r.RequestID()]
}

func (c *fakeConn) HasPendingPushWork() bool { return c.pending }

func (c *fakeConn) ResetCache(context.Context) (int, bool) {
	c.resets++
	return c.jobs, c.resetOK
}

// vLLM reset_prefix_cache: refused while requests hold blocks (but the connector reset
// still runs); with resetRunning every running request is preempted first and the reset succeeds;
// a failing connector makes the whole reset fail. Never a success that was not achieved.
func TestResetPrefixCache(t *testing.T) {
	conn := newFakeConn()
	conn.jobs = 3
	h := newHarness(t, baseConfig(), 20, 4, conn)
	r := h.add("a", tokens(1, 9), Params{MaxTokens: 5, IgnoreEOS: true})
	h.step()

	ok, d := h.s.ResetPrefixCache(context.Background(), false, true)
	assert.False(t, ok)
	assert.False(t, d.PrefixCacheReset)
	assert.Contains(t, d.Reason, "blocks in use")
	assert.Positive(t, d.BlocksInUse)
	assert.Equal(t, 1, conn.resets, "connector reset runs even when the pool reset failed")
	assert.True(t, d.ConnectorReset)
	assert.Equal(t, 3, d.ConnectorJobsFlushed)
	assert.Equal(t, StatusRunning, r.Status())

	ok, d = h.s.ResetPrefixCache(context.Background(), true, true)
	assert.True(t, ok, d.Reason)
	assert.Equal(t, 1, d.RequestsPreempted)
	assert.Equal(t, 2, d.BlocksCleared)
	assert.Zero(t, d.BlocksInUse)
	assert.Empty(t, d.Reason)
	assert.Equal(t, StatusPreempted, r.Status())

	so := h.step()
	assert.Equal(t, []string{"a"}, so.PreemptedReqIDs)
	require.Len(t, so.Scheduled, 1)
	assert.Equal(t, 0, so.Scheduled[0].StartPos, "nothing reused after the reset")
	assert.True(t, conn.metas[len(conn.metas)-1].Scheduled[0].Resumed)
	h.drain(20)
	assert.Len(t, r.OutputTokenIDs(), 5)

	// Idle pool: plain reset succeeds; a failing connector fails the whole call.
	ok, d = h.s.ResetPrefixCache(context.Background(), false, false)
	assert.True(t, ok)
	assert.Positive(t, d.BlocksCleared)
	conn.resetOK = false
	ok, d = h.s.ResetPrefixCache(context.Background(), false, true)
	assert.False(t, ok)
	assert.True(t, d.PrefixCacheReset)
	assert.False(t, d.ConnectorReset)
	assert.Contains(t, d.Reason, "connector")
}

// Every step carries connector metadata, including 0-token steps that only a connector's pending
// work keeps alive; BuildConnectorMeta runs exactly once per Schedule.
func TestZeroTokenStepCarriesMetadata(t *testing.T) {
	conn := newFakeConn()
	h := newHarness(t, baseConfig(), 20, 4, conn)
	assert.False(t, h.s.HasRequests())
	conn.pending = true
	assert.True(t, h.s.HasRequests())
	so := h.step()
	assert.Zero(t, so.NumScheduledTokens)
	assert.Equal(t, so.Step, so.ConnectorMeta.Step)
	assert.Len(t, conn.metas, 1)
	h.step()
	assert.Len(t, conn.metas, 2)
}

// Connector-driven paths: a deferred lookup, an asynchronous load (WAITING_FOR_REMOTE_KVS until
// FinishedRecving), a delayed free (blocks held until FinishedSending), an abort during a load
// (free delayed until the load lands); RequestFinished exactly once per request.
func TestConnectorAsyncLoadAndDelayedFree(t *testing.T) {
	conn := newFakeConn()
	h := newHarness(t, baseConfig(), 20, 4, conn)
	conn.deferOnce["d"] = true
	h.add("d", tokens(1, 5), Params{MaxTokens: 1})
	so := h.step()
	assert.Empty(t, so.Scheduled, "deferred")
	so = h.step()
	assert.Len(t, so.Scheduled, 1)

	// Async load of 8 external tokens for a 10-token prompt.
	conn.asyncFor["remote"] = 8
	r := h.add("remote", tokens(50, 10), Params{MaxTokens: 1})
	so = h.step()
	assert.Empty(t, so.Scheduled)
	assert.Equal(t, StatusWaitingForRemoteKVs, r.Status())
	assert.Equal(t, 8, conn.allocs["remote"])
	assert.Equal(t, 2, h.pool.NumBlocksOf("remote"), "blocks for the loaded tokens only")
	// Pretend the load wrote the KV, then report it.
	for p := 0; p < 8; p++ {
		blk := h.pool.Blocks("remote")[p/4]
		h.run.kv[blk][p%4] = kvEntry{valid: true, tok: r.TokenIDs()[p], pos: p}
	}
	so, err := h.s.Schedule()
	require.NoError(t, err)
	assert.Empty(t, so.Scheduled)
	_, err = h.s.UpdateFromOutput(so, &ModelOutput{Step: so.Step, KVConnector: kvconnector.Output{FinishedRecving: []string{"remote"}}})
	require.NoError(t, err)
	so = h.step()
	require.Len(t, so.Scheduled, 1)
	assert.Equal(t, 8, so.Scheduled[0].StartPos)
	assert.Equal(t, 8, r.NumCachedTokens())
	assert.Equal(t, FinishLength, r.FinishReason())

	// Delayed free.
	conn.delayFree["held"] = true
	h.add("held", tokens(70, 5), Params{MaxTokens: 1})
	h.step()
	_, live := h.s.Get("held")
	assert.True(t, live)
	assert.Equal(t, 2, h.pool.NumBlocksOf("held"))
	h.step() // delivers the finished id
	assert.True(t, h.s.HasRequests(), "blocks still held")
	so, err = h.s.Schedule()
	require.NoError(t, err)
	_, err = h.s.UpdateFromOutput(so, &ModelOutput{Step: so.Step, KVConnector: kvconnector.Output{FinishedSending: []string{"held"}}})
	require.NoError(t, err)
	assert.Zero(t, h.pool.NumBlocksOf("held"))
	assert.False(t, h.s.HasRequests())

	// Abort while loading.
	conn.asyncFor["ab"] = 4
	h.add("ab", tokens(90, 6), Params{MaxTokens: 1})
	h.step()
	require.Len(t, h.s.Abort("ab"), 1)
	assert.Equal(t, 1, h.pool.NumBlocksOf("ab"), "a load still writes into them")
	h.step()
	assert.True(t, h.s.HasRequests())
	so, err = h.s.Schedule()
	require.NoError(t, err)
	_, err = h.s.UpdateFromOutput(so, &ModelOutput{Step: so.Step, KVConnector: kvconnector.Output{FinishedRecving: []string{"ab"}}})
	require.NoError(t, err)
	assert.Zero(t, h.pool.NumBlocksOf("ab"))
	require.NoError(t, h.s.CheckInvariants())
	for id, n := range conn.finishedCalls {
		assert.Equal(t, 1, n, id)
	}
	assert.Len(t, conn.finishedCalls, 4)
}

func TestStepOrdering(t *testing.T) {
	h := newHarness(t, baseConfig(), 20, 4, nil)
	h.add("a", tokens(1, 4), Params{MaxTokens: 3, IgnoreEOS: true})
	so, err := h.s.Schedule()
	require.NoError(t, err)
	_, err = h.s.Schedule()
	assert.ErrorIs(t, err, ErrStepPending)
	_, err = h.s.UpdateFromOutput(&SchedulerOutput{Step: so.Step + 1}, nil)
	assert.ErrorIs(t, err, ErrOutputMismatch)
	_, err = h.s.UpdateFromOutput(so, &ModelOutput{Step: so.Step + 7})
	assert.ErrorIs(t, err, ErrOutputMismatch)

	// A missing sample rolls the request back one token; it is recomputed next step.
	mo, err := h.run.run(so)
	require.NoError(t, err)
	delete(mo.Sampled, "a")
	outs, err := h.s.UpdateFromOutput(so, mo)
	assert.ErrorIs(t, err, ErrMissingSample)
	assert.Empty(t, outs)
	require.NoError(t, h.s.CheckInvariants())
	so = h.step()
	require.Len(t, so.Scheduled, 1)
	assert.Equal(t, 3, so.Scheduled[0].StartPos)
	assert.Len(t, h.outs["a"], 1)
	_, err = h.s.UpdateFromOutput(so, nil)
	assert.ErrorIs(t, err, ErrOutputMismatch, "already applied")
}

// A block pool the scheduler was built with is bound to a connector that asks for it.
func TestPoolBinding(t *testing.T) {
	pool, err := kvcache.New(kvcache.Config{NumBlocks: 10, BlockSize: 4})
	require.NoError(t, err)
	b := &binder{fakeConn: newFakeConn()}
	_, err = New(baseConfig(), pool, b)
	require.NoError(t, err)
	assert.Equal(t, kvconnector.BlockPool(pool), b.pool)
}

type binder struct {
	*fakeConn
	pool kvconnector.BlockPool
}

func (b *binder) BindBlockPool(p kvconnector.BlockPool) { b.pool = p }

// The scheduler is deterministic: the same calls give the same steps and outputs.
func TestDeterministic(t *testing.T) {
	run := func() ([]*SchedulerOutput, map[string][]RequestOutput) {
		cfg := baseConfig()
		cfg.MaxNumBatchedTokens = 7
		cfg.MaxModelLen = 16
		h := newHarness(t, cfg, 12, 2, nil)
		for i := range 6 {
			h.add(fmt.Sprint("r", i), tokens(i%2, 5+i), Params{MaxTokens: 6, IgnoreEOS: true})
		}
		var sos []*SchedulerOutput
		for h.s.HasRequests() {
			so := h.step()
			for i := range so.Scheduled {
				so.Scheduled[i].Req = nil // compare plans, not pointers
			}
			sos = append(sos, so)
		}
		return sos, h.outs
	}
	sos1, outs1 := run()
	sos2, outs2 := run()
	assert.Equal(t, sos1, sos2)
	assert.Equal(t, outs1, outs2)
	assert.Greater(t, len(sos1), 10)
}

// recv runs one step whose connector output reports the listed loads as landed.
func (h *harness) recv(ids ...string) *SchedulerOutput {
	h.t.Helper()
	so, err := h.s.Schedule()
	require.NoError(h.t, err)
	mo, err := h.run.run(so)
	require.NoError(h.t, err)
	mo.KVConnector.FinishedRecving = ids
	outs, err := h.s.UpdateFromOutput(so, mo)
	require.NoError(h.t, err)
	h.record(outs)
	require.NoError(h.t, h.s.CheckInvariants())
	return so
}

// DropAllKV (the engine's last call before a sleep releases the pool) leaves no request
// holding blocks: a landed load and an unreported one both recompute, and the late completion
// of the forgotten load does not mark the request's next load done.
func TestDropAllKVLeavesNoBlockOwned(t *testing.T) {
	conn := newFakeConn()
	h := newHarness(t, baseConfig(), 20, 4, conn)
	conn.asyncFor["landed"], conn.asyncFor["loading"] = 8, 8
	landed := h.add("landed", tokens(10, 10), Params{MaxTokens: 2})
	loading := h.add("loading", tokens(40, 10), Params{MaxTokens: 2})
	h.step()
	require.Equal(t, StatusWaitingForRemoteKVs, landed.Status())
	require.Equal(t, StatusWaitingForRemoteKVs, loading.Status())
	h.s.SetPauseState(PausedAll)
	h.recv("landed")
	assert.Equal(t, 2, h.s.DropAllKV())
	assert.Zero(t, h.pool.NumBlocks()-1-h.pool.NumFreeBlocks(), "no block owned")
	assert.Equal(t, StatusPreempted, landed.Status())
	assert.Zero(t, loading.NumComputedTokens())
	require.NoError(t, h.s.CheckInvariants())

	// After the wake-up "loading" is granted a new load; the forgotten one reports first.
	conn.asyncFor["loading"] = 8
	h.s.SetPauseState(Unpaused)
	h.recv("loading") // the forgotten load's completion, in the step that grants the new load
	assert.Equal(t, StatusWaitingForRemoteKVs, loading.Status(), "the stale completion is ignored")
	so := h.step()
	assert.NotContains(t, scheduledTokens(so), "loading", "its new load has not landed")
	for p := range 8 { // the new load writes the KV
		h.run.kv[h.pool.Blocks("loading")[p/4]][p%4] = kvEntry{valid: true, tok: loading.TokenIDs()[p], pos: p}
	}
	h.recv("loading")
	h.drain(20)
	assert.Len(t, loading.OutputTokenIDs(), 2)
	assert.Len(t, landed.OutputTokenIDs(), 2)
	assert.Equal(t, 8, landed.NumCachedTokens(), "landed counted its first load as cached")
}

// A reset_running reset leaves no KV of before the reset in use: a landed load recomputes at
// once, an in-flight one once it lands; while the load is in flight the reset says it could
// not free everything (success false, with the reason).
func TestResetRunningDropsLoadedKV(t *testing.T) {
	conn := newFakeConn()
	h := newHarness(t, baseConfig(), 20, 4, conn)
	conn.asyncFor["landed"], conn.asyncFor["loading"] = 8, 8
	landed := h.add("landed", tokens(10, 10), Params{MaxTokens: 2})
	loading := h.add("loading", tokens(40, 10), Params{MaxTokens: 2})
	h.step()
	h.s.SetPauseState(PausedAll)
	h.recv("landed")
	ok, d := h.s.ResetPrefixCache(context.Background(), true, false)
	assert.False(t, ok, "the in-flight load still holds blocks")
	assert.Contains(t, d.Reason, "still in use")
	assert.Equal(t, 1, d.RequestsPreempted)
	assert.Equal(t, StatusPreempted, landed.Status())
	assert.Equal(t, 2, d.BlocksInUse)
	h.recv("loading")
	assert.Equal(t, StatusPreempted, loading.Status(), "its KV predates the reset")
	ok, d = h.s.ResetPrefixCache(context.Background(), true, false)
	assert.True(t, ok, d.Reason)
	assert.Empty(t, d.Reason)
	h.s.SetPauseState(Unpaused)
	h.drain(20)
	assert.Len(t, loading.OutputTokenIDs(), 2)
}
