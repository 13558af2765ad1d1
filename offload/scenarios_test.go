package offload_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/kvcache"
	"github.com/rolloutkit/rollout/engine/kvconnector"
	"github.com/rolloutkit/rollout/offload"
	"github.com/rolloutkit/rollout/offload/cpu"
)

// TestExactRegression is the reset bug: a request finishes while its store is in flight,
// ResetCache runs twice with no step between, and the flush must still be delivered exactly
// once by one more step before the engine goes idle.
func TestExactRegression(t *testing.T) {
	h := newHarness(t, harnessCfg{blockSize: 4, numBlocks: 32, hold: true})
	h.add("r", seq(8, 1), 2)
	h.step() // prefill: store job for chunks 0 and 1 is built
	h.step() // decode: the store is submitted (and held in flight); the request finishes
	require.Equal(t, []int{0, 1}, h.stored("r"))
	require.Contains(t, h.reasons, "r")
	require.EqualValues(t, 1, h.stat("offload_jobs_inflight"), "the final store is still in flight")

	ok1, d1 := h.sched.ResetPrefixCache(context.Background(), true, true)
	ok2, d2 := h.sched.ResetPrefixCache(context.Background(), true, true)
	// The finished request's blocks stay held until its store lands: both resets clear the
	// prefix cache and the CPU tier but say, truthfully, that those blocks are still in use.
	assert.False(t, ok1 || ok2)
	assert.Contains(t, d1.Reason, "3 blocks are still in use")
	assert.Equal(t, d1.Reason, d2.Reason)
	assert.True(t, d1.PrefixCacheReset && d1.ConnectorReset && d2.PrefixCacheReset && d2.ConnectorReset)
	assert.Equal(t, 1, d1.ConnectorJobsFlushed)
	assert.Equal(t, 0, d2.ConnectorJobsFlushed, "the second reset adds nothing new and does not crash")
	assert.EqualValues(t, 1, h.stat("offload_resets_merged_total"))
	require.True(t, h.conn.Scheduler().HasPendingPushWork(), "an undelivered flush is pending work")
	require.True(t, h.sched.HasRequests(), "the engine still reports work")

	before := len(h.metas)
	h.release() // the flushing step waits on the store, so it may copy now
	h.step()
	meta := h.metas[before]
	assert.Equal(t, []int64{0}, meta.FlushJobIDs, "exactly the flushed job ids, once")
	assert.Zero(t, h.stat("offload_transfers_inflight"), "the worker waited on the flushed store")
	assert.False(t, h.conn.Scheduler().HasPendingPushWork())
	assert.False(t, h.sched.HasRequests(), "idle after the delivering step")
	assert.EqualValues(t, 1, h.stat("offload_flush_delivered_total"))
	assert.EqualValues(t, 0, h.stat("offload_flush_pending"))
	assert.Zero(t, h.pool.NumBlocks()-1-h.pool.NumFreeBlocks(), "the delayed free happened after the wait")
	// The stale completion of job 0 was ignored, not misapplied.
	assert.EqualValues(t, 1, h.stat("offload_stale_completions_total"))
	require.NoError(t, h.worker.WaitIdle(context.Background()))
	assert.Zero(t, h.conn.Violations())
	ok, d := h.sched.ResetPrefixCache(context.Background(), true, true)
	assert.True(t, ok, "nothing is held any more: %s", d.Reason)
}

// Port of test_offloading_connector's core flow: stores per complete chunk, a load
// after the engine's prefix cache was reset, and the outputs of the same run without the
// connector.
func TestStorePerChunkThenLoadAfterGPUReset(t *testing.T) {
	run := func(noConn bool) *harness {
		h := newHarness(t, harnessCfg{blockSize: 4, numBlocks: 100, bpc: 3, noConnector: noConn})
		h.add("a", seq(36, 1), 13)
		h.runIdle()
		h.gpuReset()
		h.add("b", append(seq(36, 1), seq(5, 9)...), 4)
		h.runIdle()
		return h
	}
	h, plain := run(false), run(true)
	assert.Equal(t, []int{0, 1, 2, 3}, h.stored("a"), "36 prompt tokens then chunk 3 once 48 tokens are computed")
	assert.Equal(t, []int{0, 1, 2}, h.loaded("b"))
	assert.Equal(t, 36, h.cached["b"], "num_cached_tokens counts the loaded tokens")
	assert.Equal(t, 0, plain.cached["b"])
	assert.Equal(t, plain.outs, h.outs, "outputs identical to the run without offloading")
	assert.EqualValues(t, 36, h.stat("offload_hit_tokens_total"))
	assert.Positive(t, h.checked)
	assert.Empty(t, h.loaded("a"))
}

// vLLM's final-block case, with Rollout's decision: the block completed by the final sampled token (EOS) holds no
// computed KV for it, so it is not stored; a block whose tokens were all computed is.
func TestLastBlockOffloadedAtFinish(t *testing.T) {
	h := newHarness(t, harnessCfg{blockSize: 4, numBlocks: 16})
	h.add("partial", seq(3, 1), 5)
	h.eosAt["partial"] = 1 // 3 prompt tokens + EOS fill block 0, but EOS was never computed
	h.runIdle()
	assert.Empty(t, h.stored("partial"))
	h.add("full", seq(4, 2), 1)
	h.runIdle()
	assert.Equal(t, []int{0}, h.stored("full"))
	assert.EqualValues(t, 0, h.stat("offload_jobs_inflight"))
}

// A vLLM test case: an aborted queued request has keys but no blocks, so no store job.
func TestAbortQueuedRequestBuildsNoStore(t *testing.T) {
	h := newHarness(t, harnessCfg{blockSize: 4, numBlocks: 16, maxSeqs: 1})
	h.add("a", seq(16, 1), 3)
	h.add("b", seq(16, 2), 3)
	h.step()
	h.sched.Abort("b")
	h.runIdle()
	assert.Empty(t, h.stored("b"))
	assert.Equal(t, []int{0, 1, 2, 3}, h.stored("a"))
}

// A vLLM test case: a preempted request's in-flight stores are flushed by the next step; its blocks
// were freed, so the stores are discarded rather than committed, and nothing is a violation.
func TestRequestPreemptionFlushesItsStores(t *testing.T) {
	run := func(noConn bool) *harness {
		h := newHarness(t, harnessCfg{blockSize: 4, numBlocks: 13, noConnector: noConn, delay: 5 * time.Millisecond})
		h.add("a", seq(24, 1), 20)
		h.add("b", seq(8, 2), 20)
		h.runIdle()
		return h
	}
	h, plain := run(false), run(true)
	assert.Equal(t, plain.outs, h.outs)
	r, ok := h.sched.Get("b")
	_ = r
	assert.False(t, ok)
	jobsOf := map[int64]string{}
	for _, m := range h.metas {
		if p, ok := h.payload(m); ok {
			for _, t := range p.Stores {
				jobsOf[t.ID] = t.ReqID
			}
		}
	}
	found := false
	for _, f := range h.flushed() {
		for _, id := range f {
			found = found || jobsOf[id] != ""
		}
	}
	assert.True(t, found, "a preempted request's stores are in a flush set")
	assert.Zero(t, h.conn.Violations())
}

// A vLLM test case: two requests with the same CPU-resident prefix: one load; the other defers and then
// hits the engine's prefix cache.
func TestConcurrentLookupsOfTheSamePrefix(t *testing.T) {
	h := newHarness(t, harnessCfg{blockSize: 4, numBlocks: 64, bpc: 3, hold: true})
	h.add("a", seq(13, 1), 1)
	h.step() // a's store is held
	h.release()
	h.runIdle()
	h.hold() // b's load stays in flight
	h.gpuReset()
	h.add("b", append(seq(12, 1), 7, 8), 2)
	h.add("c", append(seq(12, 1), 9, 10), 2)
	h.step() // b's load is submitted; c defers
	h.step() // still in flight: c defers again
	require.Equal(t, []int{0}, h.loaded("b"))
	h.release()
	h.runIdle()
	assert.Equal(t, []int{0}, h.loaded("b"))
	assert.Empty(t, h.loaded("c"), "no second load of keys being loaded")
	assert.Equal(t, 12, h.cached["b"])
	assert.Equal(t, 12, h.cached["c"], "c hit the engine's prefix cache once b's load landed")
}

// A vLLM test case: a request aborted during its load keeps its blocks until the load completed.
func TestAbortLoadingRequest(t *testing.T) {
	h := newHarness(t, harnessCfg{blockSize: 4, numBlocks: 64, bpc: 3, hold: true})
	h.add("a", seq(13, 1), 1)
	h.step()
	h.release()
	h.runIdle()
	h.hold()
	h.gpuReset()
	h.add("b", seq(14, 1), 2)
	h.step() // b's load is submitted, and held
	require.Equal(t, []int{0}, h.loaded("b"))
	h.sched.Abort("b")
	_, held := h.sched.Get("b")
	assert.True(t, held, "blocks held while the load writes them")
	h.step()
	_, held = h.sched.Get("b")
	assert.True(t, held, "still held: the load has not landed")
	h.release()
	h.runIdle()
	_, held = h.sched.Get("b")
	assert.False(t, held)
	assert.Zero(t, h.pool.NumBlocks()-1-h.pool.NumFreeBlocks())
}

// A vLLM test case: reset with a load in flight: the load joins the flush set, every tracking structure
// empties, the stale threshold ignores its completion.
func TestResetCacheWithLoadInFlight(t *testing.T) {
	h := newHarness(t, harnessCfg{blockSize: 4, numBlocks: 64, bpc: 3, hold: true})
	h.add("a", seq(13, 1), 1)
	h.step()
	h.release()
	h.runIdle()
	h.hold()
	h.gpuReset()
	h.add("b", seq(14, 1), 2)
	h.step()
	require.Equal(t, []int{0}, h.loaded("b"))
	n, ok := h.conn.Scheduler().ResetCache(context.Background())
	assert.True(t, ok)
	assert.Equal(t, 1, n)
	assert.EqualValues(t, 1, h.stat("offload_flush_pending"))
	assert.EqualValues(t, 0, h.stat("offload_jobs_inflight"))
	i := len(h.metas)
	h.release() // the flushing step waits on the load
	h.runIdle()
	assert.Len(t, h.metas[i].FlushJobIDs, 1)
	assert.Equal(t, []int64{h.mustPayload(h.metas[i-1]).Loads[0].ID}, h.metas[i].FlushJobIDs)
	assert.Equal(t, 12, h.cached["b"], "the flushed load still landed")
	assert.Len(t, h.outs["b"], 2)
	assert.Equal(t, []int{0}, h.stored("b"), "surviving requests re-offload from chunk 0 after a reset")
	assert.EqualValues(t, 1, h.stat("offload_cpu_slots_used"))
}

// A vLLM test case: complete_store is per job with only that job's keys.
func TestOneStoreJobPerNewlyCompleteChunkRun(t *testing.T) {
	h := newHarness(t, harnessCfg{blockSize: 4, numBlocks: 64, bpc: 3})
	h.add("a", seq(12, 1), 13)
	h.runIdle()
	var jobs [][]int
	for _, m := range h.metas {
		if p, ok := h.payload(m); ok {
			for _, t := range p.Stores {
				var c []int
				for _, ch := range t.Chunks {
					c = append(c, ch.Index)
				}
				jobs = append(jobs, c)
			}
		}
	}
	assert.Equal(t, [][]int{{0}, {1}}, jobs)
}

// A vLLM test case: a store that does not fit the CPU tier is counted and retried, never advanced.
func TestAllocationFailureIsCountedAndRetried(t *testing.T) {
	h := newHarness(t, harnessCfg{blockSize: 4, numBlocks: 32, cpuChunks: 1, delay: 20 * time.Millisecond})
	h.add("a", seq(4, 1), 3)
	h.add("b", seq(4, 2), 3)
	h.runIdle()
	assert.Positive(t, h.stat("offload_alloc_failures_total"))
	assert.Len(t, h.outs["a"], 3)
	assert.Len(t, h.outs["b"], 3)
}

// vLLM's handle_preemptions: a store of this very step listed in the flush set is submitted and
// waited on before the step proceeds.
func TestHandlePreemptionsSubmitsAndWaitsOnFlushedStoreOfThisStep(t *testing.T) {
	h := newHarness(t, harnessCfg{blockSize: 4, numBlocks: 8, delay: 10 * time.Millisecond})
	added, ok := h.pool.AllocateSlots("x", 4, nil)
	require.True(t, ok)
	b := added[0]
	tr := &offload.Transfer{ID: 1000, ReqID: "x", Store: true, Chunks: []offload.ChunkTransfer{{Slot: slotOf(0, 1), Blocks: []int{b}, Gens: []uint64{h.pool.Generation(b)}}}}
	_, w := h.conn.TypedSides()
	w.BindMetadata(kvconnector.TypedMetadata[*offload.Payload]{FlushJobIDs: []int64{1000}, Payload: &offload.Payload{Stores: []*offload.Transfer{tr}}})
	require.NoError(t, w.HandlePreemptions(context.Background()))
	_, _ = w.GetFinished(nil)
	wm := w.BuildWorkerMeta()
	require.NotNil(t, wm)
	assert.Equal(t, map[int64]bool{1000: true}, wm.Completed)
	w.ClearMetadata()
	// Not queued a second time.
	w.BindMetadata(kvconnector.TypedMetadata[*offload.Payload]{})
	require.NoError(t, w.HandlePreemptions(context.Background()))
	_, _ = w.GetFinished(nil)
	assert.Nil(t, w.BuildWorkerMeta())
	w.ClearMetadata()
	assert.Zero(t, h.conn.Violations())
}

// The safety checks fire: a load from a slot that holds other content and a load into a block
// the job no longer owns are violations, counted and reported as failed.
func TestSafetyChecksDetectViolations(t *testing.T) {
	h := newHarness(t, harnessCfg{blockSize: 4, numBlocks: 8, quiet: true})
	added, ok := h.pool.AllocateSlots("x", 8, nil)
	require.True(t, ok)
	gens := []uint64{h.pool.Generation(added[0]), h.pool.Generation(added[1])}
	_, w := h.conn.TypedSides()
	stepWith := func(p *offload.Payload, flush ...int64) map[int64]bool {
		w.BindMetadata(kvconnector.TypedMetadata[*offload.Payload]{FlushJobIDs: flush, Payload: p})
		require.NoError(t, w.HandlePreemptions(context.Background()))
		require.NoError(t, w.StartLoadKV(context.Background()))
		_, _ = w.GetFinished(nil)
		require.NoError(t, w.WaitIdle(context.Background()))
		wm := w.BuildWorkerMeta()
		w.ClearMetadata()
		if wm == nil {
			return nil
		}
		return wm.Completed
	}
	store := &offload.Transfer{ID: 1, Store: true, Chunks: []offload.ChunkTransfer{{Slot: slotOf(0, 5), Blocks: added[:1], Gens: gens[:1]}}}
	assert.Equal(t, map[int64]bool{1: true}, stepWith(&offload.Payload{Stores: []*offload.Transfer{store}}, 1))
	wrongGen := &offload.Transfer{ID: 2, Chunks: []offload.ChunkTransfer{{Slot: slotOf(0, 4), Blocks: added[1:], Gens: gens[1:]}}}
	assert.Equal(t, map[int64]bool{2: false}, stepWith(&offload.Payload{Loads: []*offload.Transfer{wrongGen}}))
	assert.EqualValues(t, 1, h.conn.Violations())
	h.pool.Free("x") // the blocks change generation
	stale := &offload.Transfer{ID: 3, Chunks: []offload.ChunkTransfer{{Slot: slotOf(0, 5), Blocks: added[1:], Gens: gens[1:]}}}
	assert.Equal(t, map[int64]bool{3: false}, stepWith(&offload.Payload{Loads: []*offload.Transfer{stale}}))
	assert.EqualValues(t, 2, h.conn.Violations())
	// A store whose source was freed is discarded, not a violation.
	discarded := &offload.Transfer{ID: 4, Store: true, Chunks: []offload.ChunkTransfer{{Slot: slotOf(1, 6), Blocks: added[:1], Gens: gens[:1]}}}
	assert.Equal(t, map[int64]bool{4: false}, stepWith(&offload.Payload{Stores: []*offload.Transfer{discarded}}, 4))
	assert.EqualValues(t, 2, h.conn.Violations())
	assert.EqualValues(t, 1, h.stat("offload_stores_discarded_total"))
	h.conn = nil // the violations above were the point of this test
}

func TestBadInput(t *testing.T) {
	_, err := offload.New(offload.Config{CPUBytes: 0, BlockSize: 16})
	require.ErrorIs(t, err, offload.ErrInvalidConfig)
	_, err = offload.New(offload.Config{CPUBytes: 1 << 20, BlockSize: 0})
	require.ErrorIs(t, err, offload.ErrInvalidConfig)
	_, err = offload.New(offload.Config{CPUBytes: 1 << 20, BlockSize: 16, Policy: "fifo"})
	require.ErrorIs(t, err, offload.ErrInvalidConfig)
	_, err = offload.New(offload.Config{CPUBytes: 100, BlockSize: 16, BlockBytes: 4096})
	require.ErrorIs(t, err, offload.ErrInvalidConfig)
	require.ErrorContains(t, err, "smaller than one chunk")
	_, err = offload.New(offload.Config{CPUBytes: 1 << 20, BlockSize: 16, CopyThreads: -1})
	require.ErrorIs(t, err, offload.ErrInvalidConfig)
	_, err = offload.New(offload.Config{CPUBytes: 1 << 20, BlockSize: 16, SplitBytes: -1})
	require.ErrorIs(t, err, offload.ErrInvalidConfig)

	// Unknown and duplicate completions are harmless and counted.
	h := newHarness(t, harnessCfg{blockSize: 4, numBlocks: 16})
	s, _ := h.conn.TypedSides()
	s.UpdateConnectorOutput(kvconnector.TypedOutput[*offload.WorkerMeta]{WorkerMeta: &offload.WorkerMeta{Completed: map[int64]bool{77: true}}})
	// An output without a report (the engine's bound side passes another connector's report
	// on as none) changes nothing.
	h.conn.Scheduler().UpdateConnectorOutput(kvconnector.Output{})
	assert.EqualValues(t, 1, h.stat("offload_unknown_completions_total"))
	h.add("a", seq(8, 1), 2)
	h.runIdle()
	s.UpdateConnectorOutput(kvconnector.TypedOutput[*offload.WorkerMeta]{WorkerMeta: &offload.WorkerMeta{Completed: map[int64]bool{0: true}}})
	assert.EqualValues(t, 2, h.stat("offload_unknown_completions_total"), "a duplicate completion of a finished job")
	assert.EqualValues(t, 0, s.Stats()["safety_violations_total"])
	// A lookup of unknown keys is a miss, counted.
	h.gpuReset()
	h.add("b", seq(9, 5), 1)
	h.runIdle()
	assert.Positive(t, h.stat("offload_lookup_misses_total"))
	assert.Empty(t, h.loaded("b"))
	assert.True(t, slices.Equal(h.stored("a"), []int{0, 1}))
}

func slotOf(id int, gen uint64) cpu.Slot { return cpu.Slot{ID: id, Gen: gen} }

// fakeReq is a connector-level request for object-level tests.
type fakeReq struct {
	id     string
	tokens []int
	hashes []kvcache.BlockHash
}

func (r *fakeReq) RequestID() string                { return r.id }
func (r *fakeReq) NumPromptTokens() int             { return len(r.tokens) }
func (r *fakeReq) NumTokens() int                   { return len(r.tokens) }
func (r *fakeReq) NumComputedTokens() int           { return 0 }
func (r *fakeReq) BlockHashes() []kvcache.BlockHash { return r.hashes }
func (r *fakeReq) Aborted() bool                    { return false }

// A vLLM test case: a request with a tracked transfer defers its lookup instead of issuing a load.
func TestPendingTransferDefersPrefixLookup(t *testing.T) {
	h := newHarness(t, harnessCfg{blockSize: 4, numBlocks: 16})
	s := h.conn.Scheduler()
	toks := seq(9, 3)
	r := &fakeReq{id: "x", tokens: toks, hashes: kvcache.ExtendHashes(nil, toks, 4, 0, "")}
	s.OnNewRequest(r)
	added, ok := h.pool.AllocateSlots("x", 8, nil)
	require.True(t, ok)
	meta := s.BuildConnectorMeta(kvconnector.StepInfo{Step: 1, NumScheduledTokens: 8,
		Scheduled: []kvconnector.ScheduledRequest{{Req: r, NumScheduledTokens: 8, NewBlockIDs: added, BlockIDs: added}}})
	require.Len(t, h.mustPayload(meta).Stores, 1, "a store job for chunks 0 and 1")
	n, async := s.GetNumNewMatchedTokens(r, 0)
	assert.Equal(t, kvconnector.Defer, n)
	assert.False(t, async)
	assert.True(t, s.HasPendingPushWork())
	// A reset makes the job stale; the request may look up again (and misses: the tier is empty).
	jobs, ok := s.ResetCache(context.Background())
	assert.True(t, ok)
	assert.Equal(t, 1, jobs)
	n, _ = s.GetNumNewMatchedTokens(r, 0)
	assert.Equal(t, 0, n)
	meta = s.BuildConnectorMeta(kvconnector.StepInfo{Step: 2})
	assert.Equal(t, []int64{0}, meta.FlushJobIDs)
	assert.False(t, s.HasPendingPushWork())
	// The worker never saw the store (it was built outside a worker step): nothing to wait for.
	h.pool.Free("x")
}

// vLLM's case, continued: with less than one chunk beyond the engine's own prefix hit the CPU tier is
// not even looked up; otherwise it is, once per chunk until the first miss.
func TestNoLookupWithLessThanOneChunkBeyondLocalHit(t *testing.T) {
	h := newHarness(t, harnessCfg{blockSize: 4, numBlocks: 100, bpc: 3})
	h.add("a", seq(36, 1), 1)
	h.runIdle()
	misses := h.stat("offload_lookup_misses_total")
	h.add("b", append(seq(4, 1), seq(8, 7)...), 1) // 4-token local hit, 12 tokens: 7 left < 12
	h.runIdle()
	assert.Equal(t, misses, h.stat("offload_lookup_misses_total"), "no lookup")
	assert.Equal(t, 4, h.cached["b"])
	h.add("c", seq(13, 8), 1) // nothing local, one full chunk: looked up, misses
	h.runIdle()
	assert.Equal(t, misses+1, h.stat("offload_lookup_misses_total"))
	assert.Empty(t, h.loaded("c"))
}

// Cache events do not pile up when nothing drains them (they used to grow by one entry per
// store and eviction forever); with RecordEvents they are kept until TakeEvents.
func TestCacheEventsAreBounded(t *testing.T) {
	for _, record := range []bool{false, true} {
		h := newHarness(t, harnessCfg{blockSize: 4, numBlocks: 32, cpuChunks: 4, recordEvents: record})
		for i := range 6 { // more chunks than the CPU tier holds: stores and evictions
			h.add(string(rune('a'+i)), seq(12, i), 1)
			h.runIdle()
		}
		require.NoError(t, h.worker.WaitIdle(context.Background()))
		h.runIdle()
		assert.Positive(t, h.stat("offload_stored_bytes_total"))
		if !record {
			assert.Zero(t, h.conn.BufferedEvents())
			assert.Empty(t, h.conn.Scheduler().TakeEvents())
			continue
		}
		ev := h.conn.Scheduler().TakeEvents()
		assert.NotEmpty(t, ev)
		assert.True(t, slices.ContainsFunc(ev, func(e kvconnector.Event) bool { return e.Removed }), "evictions recorded")
		assert.Zero(t, h.conn.BufferedEvents(), "drained")
	}
}
