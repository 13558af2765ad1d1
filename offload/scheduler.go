package offload

import (
	"context"
	"maps"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/rolloutkit/rollout/engine/kvcache"
	"github.com/rolloutkit/rollout/engine/kvconnector"
	"github.com/rolloutkit/rollout/offload/cpu"
)

// reqState is the scheduler side's view of one request (vLLM RequestOffloadState).
type reqState struct {
	req       kvconnector.Request
	blockIDs  []int // the request's block table as last seen (read-only)
	nextChunk int   // next chunk index to store
	numLocal  int   // tokens the engine's own prefix cache served
	jobs      map[int64]bool
	done      bool // RequestFinished was called
	signaled  bool // its finish was seen in a step (no further stores after that)
	delayed   bool // RequestFinished asked the scheduler to keep the blocks
}

// job is the scheduler side's view of one transfer (vLLM TransferJobStatus).
type job struct {
	id      int64
	reqID   string
	store   bool
	keys    []cpu.Key
	sources []int // pool blocks a store reads (fence index)
}

// schedSide implements kvconnector.Scheduler and kvconnector.PoolBinder. Every method runs on the
// engine goroutine.
type schedSide struct {
	c       *Connector
	resetAt time.Time // first reset not yet delivered in a step (zero: none)
	// resets are the spans of the resets not yet delivered, first first.
	resets []trace.SpanContext

	reqs        map[string]*reqState
	jobs        map[int64]*job
	fence       map[int]map[int64]bool // pool block -> store jobs reading it
	beingLoaded map[cpu.Key]int
	counter     int64
	stale       int64

	// Per-step state, reset by BuildConnectorMeta.
	loads     []*Transfer
	flush     map[int64]bool // the pending flush set
	allocated map[int]bool
	release   []string
	events    []kvconnector.Event
}

var (
	_ kvconnector.TypedScheduler[*Payload, *WorkerMeta] = (*schedSide)(nil)
	_ kvconnector.PoolBinder                            = (*schedSide)(nil)
)

func newSchedSide(c *Connector) *schedSide {
	return &schedSide{c: c, reqs: map[string]*reqState{}, jobs: map[int64]*job{}, fence: map[int]map[int64]bool{},
		beingLoaded: map[cpu.Key]int{}, flush: map[int64]bool{}, allocated: map[int]bool{}}
}

// BindBlockPool implements kvconnector.PoolBinder. A block size mismatch disables the connector
// and is reported by BindKVStorage (so engine.New fails) and Connector.Err.
func (s *schedSide) BindBlockPool(p kvconnector.BlockPool) { s.c.bindPool(p) }

func (s *schedSide) tpc() int { return s.c.cfg.BlockSize * s.c.cfg.BlocksPerChunk }

// key is chunk i's key: the hash of the chunk's last block.
func (s *schedSide) key(hashes []kvcache.BlockHash, i int) cpu.Key {
	return hashes[(i+1)*s.c.cfg.BlocksPerChunk-1]
}

func (s *schedSide) state(req kvconnector.Request) *reqState {
	st := s.reqs[req.RequestID()]
	if st == nil {
		st = &reqState{req: req, jobs: map[int64]bool{}}
		s.reqs[req.RequestID()] = st
	}
	return st
}

// OnNewRequest implements kvconnector.Scheduler.
func (s *schedSide) OnNewRequest(req kvconnector.Request) { s.state(req) }

// GetNumNewMatchedTokens implements kvconnector.Scheduler: the longest run of complete chunks
// readable in the CPU tier beyond the local hit, loaded asynchronously. It defers while the
// request has jobs in flight, while a hit key is still being written, or while another request
// is loading one of the hit keys (that request will fill the engine's prefix cache instead).
func (s *schedSide) GetNumNewMatchedTokens(req kvconnector.Request, numLocal int) (int, bool) {
	st := s.state(req)
	st.blockIDs = nil
	if len(st.jobs) > 0 {
		return kvconnector.Defer, false
	}
	st.numLocal = numLocal
	mgr, _ := s.c.manager()
	if mgr == nil {
		return 0, false
	}
	tpc := s.tpc()
	hashes := req.BlockHashes()
	// The last token is always recomputed for its logits, as with the engine's prefix cache.
	maxHit := min(req.NumTokens()-1, len(hashes)/s.c.cfg.BlocksPerChunk*tpc)
	if maxHit-numLocal < tpc {
		return 0, false
	}
	start, end := numLocal/tpc, maxHit/tpc
	hits, deferred := 0, false
	for i := start; i < end; i++ {
		r := mgr.Lookup(s.key(hashes, i))
		if r == cpu.Miss {
			s.c.stats.lookupMisses.Add(1)
			break
		}
		hits++
		if r == cpu.HitPending {
			deferred = true
		}
	}
	if deferred {
		return kvconnector.Defer, false
	}
	if hits == 0 {
		return 0, false
	}
	maxHit = tpc * (start + hits)
	if maxHit-numLocal < tpc {
		return 0, false
	}
	for i := start; i < start+hits; i++ {
		if s.beingLoaded[s.key(hashes, i)] > 0 {
			return kvconnector.Defer, false
		}
	}
	keys := make([]cpu.Key, start+hits)
	for i := range keys {
		keys[i] = s.key(hashes, i)
	}
	mgr.Touch(keys)
	return maxHit - numLocal, true
}

// UpdateStateAfterAlloc implements kvconnector.Scheduler: it creates the load job for the chunks
// the request was granted.
func (s *schedSide) UpdateStateAfterAlloc(req kvconnector.Request, blockIDs []int, numExternal int) {
	if numExternal == 0 {
		return
	}
	st := s.state(req)
	mgr, pool := s.c.manager()
	if mgr == nil {
		return
	}
	st.blockIDs = blockIDs
	for _, b := range blockIDs {
		if b != kvcache.NullBlock {
			s.allocated[b] = true
		}
	}
	bs, bpc, tpc := s.c.cfg.BlockSize, s.c.cfg.BlocksPerChunk, s.tpc()
	cached := st.numLocal + numExternal
	localBlocks := st.numLocal / bs
	first, end := localBlocks/bpc, cached/tpc
	hashes := req.BlockHashes()
	keys := make([]cpu.Key, 0, end-first)
	for c := first; c < end; c++ {
		keys = append(keys, s.key(hashes, c))
	}
	slots, err := mgr.PrepareLoad(keys)
	if err != nil {
		// GetNumNewMatchedTokens saw these keys readable in this same schedule: unreachable.
		s.c.violation(-1, "load of keys that are not readable", "req", req.RequestID(), "err", err)
		return
	}
	t := &Transfer{ID: s.counter, ReqID: req.RequestID()}
	s.counter++
	for i, c := 0, first; c < end; i, c = i+1, c+1 {
		off := max(0, localBlocks-c*bpc)
		ct := ChunkTransfer{Index: c, Slot: slots[i], Offset: off}
		for b := c*bpc + off; b < (c+1)*bpc; b++ {
			ct.Blocks = append(ct.Blocks, blockIDs[b])
			ct.Gens = append(ct.Gens, pool.Generation(blockIDs[b]))
		}
		t.Chunks = append(t.Chunks, ct)
	}
	st.nextChunk = max(st.nextChunk, end) // loaded chunks are not stored again
	st.jobs[t.ID] = true
	s.jobs[t.ID] = &job{id: t.ID, reqID: t.ReqID, keys: keys}
	for _, k := range keys {
		s.beingLoaded[k]++
	}
	s.loads = append(s.loads, t)
	s.c.stats.hitTokens.Add(int64(numExternal))
	s.gauges()
}

// BuildConnectorMeta implements kvconnector.TypedScheduler.
func (s *schedSide) BuildConnectorMeta(step kvconnector.StepInfo) kvconnector.TypedMetadata[*Payload] {
	for _, id := range step.PreemptedReqIDs {
		// Its blocks are free again: its stores must finish before anyone reuses them, and it
		// recomputes from scratch, so it stores from chunk 0 again (present keys are skipped).
		if st := s.reqs[id]; st != nil {
			for j := range st.jobs {
				s.flush[j] = true
			}
			st.blockIDs, st.nextChunk = nil, 0
		}
	}
	for _, sr := range step.Scheduled {
		st := s.state(sr.Req)
		st.blockIDs = sr.BlockIDs
		for _, b := range sr.NewBlockIDs {
			if b != kvcache.NullBlock {
				s.allocated[b] = true
			}
		}
	}
	for b := range s.allocated {
		for j := range s.fence[b] {
			s.flush[j] = true
		}
	}
	var stores []*Transfer
	for _, sr := range step.Scheduled {
		if t := s.buildStore(s.reqs[sr.Req.RequestID()], sr.Req.NumComputedTokens()+sr.NumScheduledTokens); t != nil {
			stores = append(stores, t)
		}
	}
	for _, id := range step.FinishedReqIDs {
		st := s.reqs[id]
		if st == nil {
			continue
		}
		// Only KV actually computed is stored: the token sampled last (EOS) was never run
		// through the model, so the block it completes holds no valid KV for it.
		if t := s.buildStore(st, st.req.NumComputedTokens()); t != nil {
			stores = append(stores, t)
		}
		st.signaled = true
		s.maybeDrop(st)
	}
	flush := slices.Sorted(maps.Keys(s.flush))
	s.c.stats.flushDelivered.Add(int64(len(flush)))
	meta := kvconnector.TypedMetadata[*Payload]{Step: step.Step, FlushJobIDs: flush, Payload: &Payload{
		Loads: s.loads, Stores: stores, Release: s.release, NumScheduledTokens: step.NumScheduledTokens,
		ResetAt: s.resetAt, FlushSpan: s.deliverySpan(step.Step, flush),
	}}
	s.loads, s.release = nil, nil
	s.resetAt = time.Time{}
	s.resets = s.resets[:0]
	clear(s.flush)
	clear(s.allocated)
	s.gauges()
	return meta
}

// storable is the number of complete chunks of st computed within tokens and held in its
// block table.
func (s *schedSide) storable(st *reqState, tokens int) int {
	tokens = min(tokens, st.req.NumTokens())
	return min(tokens/s.tpc(), len(st.blockIDs)/s.c.cfg.BlocksPerChunk, len(st.req.BlockHashes())/s.c.cfg.BlocksPerChunk)
}

// buildStore creates the store job for st's chunks [nextChunk, storable), or nil.
func (s *schedSide) buildStore(st *reqState, tokens int) *Transfer {
	if st == nil || st.signaled {
		return nil
	}
	mgr, pool := s.c.manager()
	if mgr == nil {
		return nil
	}
	n := s.storable(st, tokens)
	if n <= st.nextChunk {
		return nil
	}
	hashes := st.req.BlockHashes()
	bpc := s.c.cfg.BlocksPerChunk
	keys := make([]cpu.Key, 0, n-st.nextChunk)
	index := map[cpu.Key]int{}
	for c := st.nextChunk; c < n; c++ {
		if st.blockIDs[(c+1)*bpc-1] == kvcache.NullBlock {
			continue
		}
		k := s.key(hashes, c)
		keys = append(keys, k)
		index[k] = c
	}
	if len(keys) == 0 {
		st.nextChunk = n
		return nil
	}
	out := mgr.PrepareStore(keys)
	s.c.stats.cpuSlotsUsed.Store(int64(mgr.Stats().Used))
	if out == nil {
		// No room: retried on a later step (the index does not advance).
		s.c.stats.allocFailures.Add(1)
		return nil
	}
	s.takeManagerEvents(mgr)
	mgr.Touch(keys)
	st.nextChunk = n
	if len(out.Keys) == 0 {
		return nil
	}
	t := &Transfer{ID: s.counter, ReqID: st.req.RequestID(), Store: true}
	s.counter++
	j := &job{id: t.ID, reqID: t.ReqID, store: true, keys: out.Keys}
	for i, k := range out.Keys {
		c := index[k]
		ct := ChunkTransfer{Index: c, Slot: out.Slots[i]}
		for b := c * bpc; b < (c+1)*bpc; b++ {
			blk := st.blockIDs[b]
			ct.Blocks = append(ct.Blocks, blk)
			ct.Gens = append(ct.Gens, pool.Generation(blk))
			j.sources = append(j.sources, blk)
			if s.fence[blk] == nil {
				s.fence[blk] = map[int64]bool{}
			}
			s.fence[blk][t.ID] = true
			if st.done && s.allocated[blk] {
				// The final store of a finished request whose block was already handed to a new
				// owner this step: flush it before that owner's forward pass.
				s.flush[t.ID] = true
			}
		}
		t.Chunks = append(t.Chunks, ct)
	}
	st.jobs[t.ID] = true
	s.jobs[t.ID] = j
	return t
}

// maybeDrop forgets a finished request once its finish was seen and no job is left, releasing
// its blocks if RequestFinished delayed their free.
func (s *schedSide) maybeDrop(st *reqState) {
	if !st.done || !st.signaled || len(st.jobs) > 0 {
		return
	}
	if st.delayed {
		s.release = append(s.release, st.req.RequestID())
	}
	delete(s.reqs, st.req.RequestID())
}

// UpdateConnectorOutput implements kvconnector.TypedScheduler.
func (s *schedSide) UpdateConnectorOutput(out kvconnector.TypedOutput[*WorkerMeta]) {
	wm := out.WorkerMeta
	if wm == nil {
		return
	}
	mgr, _ := s.c.manager()
	for _, id := range slices.Sorted(maps.Keys(wm.Completed)) {
		ok := wm.Completed[id]
		if id < s.stale {
			s.c.stats.staleCompletions.Add(1) // a job from before a reset: ignored
			continue
		}
		j := s.jobs[id]
		if j == nil {
			s.c.stats.unknownCompletes.Add(1)
			continue
		}
		if mgr != nil {
			before := mgr.Stats()
			switch {
			case j.store:
				mgr.CompleteStore(j.keys, ok)
			case ok:
				mgr.CompleteLoad(j.keys)
			default:
				// A load that failed its checks (checksum, generation): the request recomputes
				// (the scheduler hears it through FailedRecving), and keys whose content
				// failed must not be read again.
				mgr.CompleteLoad(j.keys)
				mgr.Remove(j.keys)
				s.c.stats.loadFailures.Add(1)
			}
			after := mgr.Stats()
			s.c.stats.duplicateComplete.Add(after.DuplicateComplete - before.DuplicateComplete + after.UnknownCompletes - before.UnknownCompletes)
			s.takeManagerEvents(mgr)
			s.c.stats.cpuSlotsUsed.Store(int64(after.Used))
		}
		if !j.store {
			for _, k := range j.keys {
				if s.beingLoaded[k]--; s.beingLoaded[k] <= 0 {
					delete(s.beingLoaded, k)
				}
			}
		}
		for _, b := range j.sources {
			delete(s.fence[b], id)
			if len(s.fence[b]) == 0 {
				delete(s.fence, b)
			}
		}
		delete(s.jobs, id)
		if st := s.reqs[j.reqID]; st != nil {
			delete(st.jobs, id)
			s.maybeDrop(st)
		}
	}
	s.gauges()
}

// RequestFinished implements kvconnector.Scheduler. It delays the free while the request has
// stores in flight or a complete chunk still to store (the final store is built by the next
// step, from its finished id).
func (s *schedSide) RequestFinished(req kvconnector.Request, blockIDs []int) bool {
	st := s.reqs[req.RequestID()]
	if st == nil {
		return false
	}
	st.done = true
	st.blockIDs = blockIDs
	delay := false
	for id := range st.jobs {
		if j := s.jobs[id]; j != nil && j.store {
			delay = true
		}
	}
	if mgr, _ := s.c.manager(); mgr != nil && s.storable(st, req.NumComputedTokens()) > st.nextChunk {
		delay = true
	}
	st.delayed = delay
	return delay
}

// HasPendingPushWork implements kvconnector.Scheduler, with the fix: an undelivered flush set (or
// an undelivered release) is pending work too, and so is an undelivered reset whose flush set is
// empty: one more step tells the workers, so every reset's delivery is observed promptly
// (rollout_reset_to_flush_seconds, offload.flush.delivered) rather than at whatever step comes
// next, possibly after a resume.
func (s *schedSide) HasPendingPushWork() bool {
	return len(s.jobs) > 0 || len(s.flush) > 0 || len(s.release) > 0 || !s.resetAt.IsZero()
}

// deliverySpan starts the offload.flush.delivered span of a step that carries the undelivered
// resets' flush set (nil when the step delivers no reset): a child of the first reset, linked
// to the others.
func (s *schedSide) deliverySpan(step uint64, flush []int64) trace.Span {
	if s.resetAt.IsZero() {
		return nil
	}
	var parent trace.SpanContext
	var links []trace.Link
	for i, sc := range s.resets {
		if i == 0 {
			parent = sc
			continue
		}
		links = append(links, trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{attribute.String("rollout.link", "merged_reset")}})
	}
	ctx := context.Background()
	if parent.IsValid() {
		ctx = trace.ContextWithSpanContext(ctx, parent)
	}
	_, span := s.c.tracer.Start(ctx, SpanFlushDelivered, trace.WithLinks(links...), trace.WithAttributes(
		attribute.Int64(AttrStep, int64(step)), attribute.Int64Slice(AttrJobIDs, flush), attribute.Int(AttrJobs, len(flush)),
		attribute.Int(AttrResetsMerged, len(s.resets)),
		attribute.Float64(AttrResetToDelivery, s.c.cfg.Now().Sub(s.resetAt).Seconds())))
	return span
}

// ResetCache implements kvconnector.Scheduler, re-entrantly: every tracked job joins the pending
// flush set (a union with what an earlier reset left undelivered); the CPU tier is emptied; the
// stale threshold makes completions of the old jobs no-ops. Its span is a child of ctx's and
// links to the earlier resets of the same flush.
func (s *schedSide) ResetCache(ctx context.Context) (int, bool) {
	links := make([]trace.Link, len(s.resets))
	for i, sc := range s.resets {
		links[i] = trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{attribute.String("rollout.link", "merged_into")}}
	}
	_, span := s.c.tracer.Start(ctx, SpanResetCache, trace.WithLinks(links...))
	defer span.End()
	merged := len(s.resets)
	if len(s.flush) > 0 {
		s.c.stats.resetsMerged.Add(1)
	}
	if s.resetAt.IsZero() {
		s.resetAt = s.c.cfg.Now()
	}
	n := 0
	for id := range s.jobs {
		if !s.flush[id] {
			s.flush[id] = true
			n++
		}
	}
	for id, st := range s.reqs {
		if st.done {
			if st.delayed {
				// Freed by the step that delivers the flush, after the worker waited on it.
				s.release = append(s.release, id)
			}
			delete(s.reqs, id)
			continue
		}
		st.nextChunk = 0
		clear(st.jobs)
	}
	if mgr, _ := s.c.manager(); mgr != nil {
		mgr.Reset()
		s.c.stats.cpuSlotsUsed.Store(0)
	}
	s.stale = s.counter
	clear(s.jobs)
	clear(s.fence)
	clear(s.beingLoaded)
	s.c.stats.resets.Add(1)
	s.gauges()
	span.SetAttributes(attribute.Int(AttrJobsFlushed, n), attribute.Int(AttrFlushPending, len(s.flush)), attribute.Int(AttrResetsMerged, merged))
	if sc := span.SpanContext(); sc.IsValid() {
		s.resets = append(s.resets, sc)
	}
	return n, true
}

// TakeEvents implements kvconnector.Scheduler: the events since the previous call, always
// none unless Config.RecordEvents.
func (s *schedSide) TakeEvents() []kvconnector.Event {
	if mgr, _ := s.c.manager(); mgr != nil {
		s.takeManagerEvents(mgr)
	}
	ev := s.events
	s.events = nil
	return ev
}

// takeManagerEvents drains the CPU manager's events after every call that may emit some, so
// they never pile up there; they are kept for TakeEvents only with Config.RecordEvents (with
// no consumer they would grow by one entry per store and eviction forever).
func (s *schedSide) takeManagerEvents(mgr *cpu.Manager) {
	for _, e := range mgr.TakeEvents() {
		if s.c.cfg.RecordEvents {
			s.events = append(s.events, kvconnector.Event{Removed: e.Removed, Medium: "cpu", BlockHashes: e.Keys})
		}
	}
}

// Stats implements kvconnector.Scheduler.
func (s *schedSide) Stats() kvconnector.Stats { return s.c.Stats() }

func (s *schedSide) gauges() {
	s.c.stats.jobsInflight.Store(int64(len(s.jobs)))
	s.c.stats.flushPending.Store(int64(len(s.flush)))
}

// CheckInvariants verifies the scheduler side's bookkeeping; for tests.
func (c *Connector) CheckInvariants() error {
	s := c.sched
	for id, j := range s.jobs {
		st := s.reqs[j.reqID]
		if st == nil || !st.jobs[id] {
			return errorf("job %d of %q is not tracked by its request", id, j.reqID)
		}
		if id < s.stale || id >= s.counter {
			return errorf("job %d outside [%d, %d)", id, s.stale, s.counter)
		}
	}
	for id, st := range s.reqs {
		loads, stores := 0, 0
		for j := range st.jobs {
			if s.jobs[j] == nil {
				return errorf("request %q tracks unknown job %d", id, j)
			}
			if s.jobs[j].store {
				stores++
			} else {
				loads++
			}
		}
		if loads > 1 || (loads == 1 && stores > 0) {
			return errorf("request %q has %d loads and %d stores", id, loads, stores)
		}
	}
	for b, js := range s.fence {
		for j := range js {
			if s.jobs[j] == nil || !s.jobs[j].store {
				return errorf("fence of block %d holds job %d, which is not a tracked store", b, j)
			}
		}
	}
	if mgr, _ := c.manager(); mgr != nil {
		return mgr.CheckInvariants()
	}
	return nil
}
