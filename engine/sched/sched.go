package sched

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/rolloutkit/rollout/engine/kvcache"
	"github.com/rolloutkit/rollout/engine/kvconnector"
)

// Scheduler is vLLM v1's scheduler as a pure state machine: no goroutines, clocks or randomness.
// It is not safe for concurrent use; one goroutine (the engine core) drives it. See the package
// documentation for the call loop.
type Scheduler struct {
	cfg  Config
	pool *kvcache.Manager
	conn kvconnector.Scheduler
	bs   int

	requests map[string]*Request // every request not yet released (incl. delayed frees)
	waiting  []*Request          // FCFS; front first (preempted requests are put back in front)
	running  []*Request

	finished    []string        // finished since the last Schedule
	finishedSet map[string]bool // same ids: an id cannot be reused before its finish is delivered
	preempted   []string        // preempted since the last Schedule
	delaySend   map[string]bool // finished; connector holds the blocks until FinishedSending
	delayRecv   map[string]bool // finished while a load wrote into its blocks; until FinishedRecving
	recvDone    map[string]bool // waiting-for-remote-KV requests whose load completed
	// dropOnRecv: loading requests a reset_running reset caught with the load in flight; their
	// KV predates the reset, so when the load lands they recompute instead of using it.
	dropOnRecv map[string]bool
	// ignoreRecv counts, per id, load completions still to come for loads DropAllKV forgot:
	// they report on KV that no longer exists and must not mark a later load of the id done.
	ignoreRecv map[string]int

	pause           PauseState
	version         int64
	step            uint64
	pending         bool // a SchedulerOutput awaits UpdateFromOutput
	numPreemptions  int64
	numLoadFailures int64
}

// New builds a scheduler over a block pool and a connector (nil means kvconnector.Noop).
func New(cfg Config, pool *kvcache.Manager, conn kvconnector.Scheduler) (*Scheduler, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil block pool", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	bs := pool.BlockSize()
	// A lone request must always fit, or preemption could not guarantee progress.
	if need := (cfg.MaxModelLen + bs - 1) / bs; need > pool.NumBlocks()-1 {
		return nil, fmt.Errorf("%w: MaxModelLen: %d tokens need %d blocks, the pool has %d", ErrInvalidConfig, cfg.MaxModelLen, need, pool.NumBlocks()-1)
	}
	if conn == nil {
		conn = kvconnector.Noop{}
	}
	if b, ok := conn.(kvconnector.PoolBinder); ok {
		b.BindBlockPool(pool)
	}
	return &Scheduler{
		cfg:         cfg,
		pool:        pool,
		conn:        conn,
		bs:          bs,
		requests:    map[string]*Request{},
		finishedSet: map[string]bool{},
		delaySend:   map[string]bool{},
		delayRecv:   map[string]bool{},
		recvDone:    map[string]bool{},
		dropOnRecv:  map[string]bool{},
		ignoreRecv:  map[string]int{},
	}, nil
}

// Pool returns the block pool.
func (s *Scheduler) Pool() *kvcache.Manager { return s.pool }

// Config returns the configuration.
func (s *Scheduler) Config() Config { return s.cfg }

// SetWeightVersion sets the weight version new prefixes are hashed under. Call it at a step
// boundary, when the weights actually change.
func (s *Scheduler) SetWeightVersion(v int64) { s.version = v }

// WeightVersion returns the current weight version.
func (s *Scheduler) WeightVersion() int64 { return s.version }

// SetPauseState sets the pause state; it takes effect at the next Schedule.
func (s *Scheduler) SetPauseState(p PauseState) { s.pause = p }

// PauseState returns the pause state.
func (s *Scheduler) PauseState() PauseState { return s.pause }

// Get returns a live request by id (finished requests are gone once released).
func (s *Scheduler) Get(id string) (*Request, bool) {
	r, ok := s.requests[id]
	return r, ok
}

// NumRunning is the size of the running batch.
func (s *Scheduler) NumRunning() int { return len(s.running) }

// NumWaiting is the size of the waiting queue (preempted and loading requests included).
func (s *Scheduler) NumWaiting() int { return len(s.waiting) }

// NumUnfinishedRequests counts requests that still need scheduling, pause-aware: 0 when
// PausedAll, only running requests when PausedNew (vLLM get_num_unfinished_requests).
func (s *Scheduler) NumUnfinishedRequests() int {
	switch s.pause {
	case PausedAll:
		return 0
	case PausedNew:
		return len(s.running)
	}
	return len(s.waiting) + len(s.running)
}

// HasUnfinishedRequests is NumUnfinishedRequests() > 0.
func (s *Scheduler) HasUnfinishedRequests() bool { return s.NumUnfinishedRequests() > 0 }

// HasFinishedRequests reports finished requests the next step must still deliver, or whose blocks
// a connector still holds.
func (s *Scheduler) HasFinishedRequests() bool {
	return len(s.finished) > 0 || len(s.delaySend) > 0 || len(s.delayRecv) > 0
}

// HasRequests reports whether the engine must keep stepping: unfinished or undelivered finished
// requests, or connector work (the connector's only way to keep the engine alive).
func (s *Scheduler) HasRequests() bool {
	return s.HasUnfinishedRequests() || s.HasFinishedRequests() || s.conn.HasPendingPushWork()
}

// Stats returns a snapshot of the counters.
func (s *Scheduler) Stats() Stats {
	return Stats{
		Steps:          s.step,
		NumRunning:     len(s.running),
		NumWaiting:     len(s.waiting),
		NumPreemptions: s.numPreemptions,
		KVUsage:        s.pool.Usage(),
		KV:             s.pool.Stats(),
		PauseState:     s.pause,
		WeightVersion:  s.version,
	}
}

// Add queues a new request. The scheduler takes ownership of req.
func (s *Scheduler) Add(req *Request) error {
	if req == nil || req.ID == "" {
		return fmt.Errorf("%w: nil request or empty id", ErrInvalidRequest)
	}
	if _, ok := s.requests[req.ID]; ok || s.finishedSet[req.ID] {
		return fmt.Errorf("%w: %q", ErrDuplicateID, req.ID)
	}
	if len(req.PromptTokenIDs) == 0 {
		return fmt.Errorf("%w: request %q", ErrEmptyPrompt, req.ID)
	}
	if len(req.PromptTokenIDs) > s.cfg.MaxModelLen {
		return fmt.Errorf("%w: request %q has %d prompt tokens, context is %d", ErrPromptTooLong, req.ID, len(req.PromptTokenIDs), s.cfg.MaxModelLen)
	}
	if req.Params.MaxTokens <= 0 || req.Params.MinTokens < 0 {
		return fmt.Errorf("%w: request %q: max_tokens %d must be > 0, min_tokens %d >= 0", ErrInvalidRequest, req.ID, req.Params.MaxTokens, req.Params.MinTokens)
	}
	req.tokens = slices.Clone(req.PromptTokenIDs)
	req.numComputed, req.numCached, req.numPreemptions = 0, -1, 0
	req.status, req.finishReason = StatusWaiting, FinishNone
	req.weightVersion = s.version
	req.rehash(s.bs)
	s.requests[req.ID] = req
	s.waiting = append(s.waiting, req)
	s.conn.OnNewRequest(req)
	return nil
}

// Abort finishes the given requests with FinishAbort and returns their final outputs. Unknown or
// already finished ids are ignored.
func (s *Scheduler) Abort(ids ...string) []RequestOutput { return s.FinishRequests(ids, FinishAbort) }

// FinishAll finishes every unfinished request with reason (pause(abort), shutdown).
func (s *Scheduler) FinishAll(reason FinishReason) []RequestOutput {
	ids := make([]string, 0, len(s.running)+len(s.waiting))
	for _, r := range s.running {
		ids = append(ids, r.ID)
	}
	for _, r := range s.waiting {
		ids = append(ids, r.ID)
	}
	return s.FinishRequests(ids, reason)
}

// FinishRequests finishes the given requests with reason (FinishNone counts as FinishAbort) and
// returns one final output each. Unknown or already finished ids are ignored.
func (s *Scheduler) FinishRequests(ids []string, reason FinishReason) []RequestOutput {
	if reason == FinishNone {
		reason = FinishAbort
	}
	var outs []RequestOutput
	done := map[*Request]bool{}
	for _, id := range ids {
		r, ok := s.requests[id]
		if !ok || r.status == StatusFinished {
			continue
		}
		loading := r.status == StatusWaitingForRemoteKVs && !s.recvDone[id]
		delete(s.recvDone, id)
		delete(s.dropOnRecv, id)
		r.status, r.finishReason = StatusFinished, reason
		done[r] = true
		s.release(r, loading)
		outs = append(outs, s.finalOutput(r))
	}
	if len(done) > 0 {
		s.running = slices.DeleteFunc(s.running, func(r *Request) bool { return done[r] })
		s.waiting = slices.DeleteFunc(s.waiting, func(r *Request) bool { return done[r] })
	}
	return outs
}

func (s *Scheduler) finalOutput(r *Request) RequestOutput {
	return RequestOutput{ReqID: r.ID, WeightVersion: s.version, Finished: true, FinishReason: r.finishReason, NumCachedTokens: r.NumCachedTokens()}
}

// release tells the connector the request finished and frees its blocks unless the connector
// delays the free or a load still writes into them (vLLM _free_request).
func (s *Scheduler) release(r *Request, loading bool) {
	blocks := s.pool.Blocks(r.ID)
	blocks = blocks[:min(len(blocks), (r.numComputed+s.bs-1)/s.bs)]
	delay := s.conn.RequestFinished(r, blocks)
	s.finished = append(s.finished, r.ID)
	s.finishedSet[r.ID] = true
	if delay {
		s.delaySend[r.ID] = true
	}
	if loading {
		s.delayRecv[r.ID] = true
	}
	if !delay && !loading {
		s.pool.Free(r.ID)
		delete(s.requests, r.ID)
	}
}

func (s *Scheduler) maybeFree(id string) {
	if s.delaySend[id] || s.delayRecv[id] {
		return
	}
	s.pool.Free(id)
	delete(s.requests, id)
}

// preempt frees a running request's KV and puts it at the front of the waiting queue; it will
// recompute (or reload) from scratch. The caller removes it from running.
func (s *Scheduler) preempt(r *Request) {
	s.pool.Free(r.ID)
	r.status = StatusPreempted
	r.numComputed = 0
	r.numPreemptions++
	s.numPreemptions++
	s.waiting = slices.Insert(s.waiting, 0, r)
	s.preempted = append(s.preempted, r.ID)
}

// preemptLoaded frees the blocks of the last waiting request whose asynchronous load has
// completed (other than keep), turning it back into a request that recomputes; false if none.
func (s *Scheduler) preemptLoaded(keep *Request) bool {
	for i := len(s.waiting) - 1; i >= 0; i-- {
		r := s.waiting[i]
		if r == keep || r.status != StatusWaitingForRemoteKVs || !s.recvDone[r.ID] {
			continue
		}
		delete(s.recvDone, r.ID)
		s.turnBack(r)
		return true
	}
	return false
}

// turnBack frees the blocks of a waiting request that holds them (its connector load landed,
// or is forgotten) and makes it recompute from scratch, in place in the waiting queue.
func (s *Scheduler) turnBack(r *Request) {
	s.pool.Free(r.ID)
	r.status, r.numComputed = StatusPreempted, 0
	r.numPreemptions++
	s.numPreemptions++
	s.preempted = append(s.preempted, r.ID)
}

// DropAllKV turns every request that holds KV blocks into one that recomputes from scratch:
// running requests are preempted, and waiting requests whose connector load landed or is
// still unreported give up their blocks. The engine calls it right before it releases the KV
// pool's memory (sleep), once no transfer touches the pool, so that no request resumes on KV
// that is gone; a completion reported later for a forgotten load is ignored. It returns the
// number of requests it turned back.
func (s *Scheduler) DropAllKV() int {
	n := 0
	for len(s.running) > 0 {
		r := s.running[len(s.running)-1]
		s.running = s.running[:len(s.running)-1]
		s.preempt(r)
		n++
	}
	for _, r := range s.waiting {
		if r.status != StatusWaitingForRemoteKVs {
			continue
		}
		if !s.recvDone[r.ID] {
			s.ignoreRecv[r.ID]++
		}
		delete(s.recvDone, r.ID)
		delete(s.dropOnRecv, r.ID)
		s.turnBack(r)
		n++
	}
	return n
}

// Schedule plans the next step (vLLM schedule()). Every call must be followed by
// UpdateFromOutput with its result before the next Schedule; a step may schedule 0 tokens and must
// still be executed, because it carries the connector metadata and the finished/preempted ids.
//
// A step plans the running requests first, then (unless that preempted something or new work
// is paused) admits waiting ones, then builds the output and its connector metadata.
func (s *Scheduler) Schedule() (*SchedulerOutput, error) {
	if s.pending {
		return nil, fmt.Errorf("%w: step %d", ErrStepPending, s.step)
	}
	s.step++
	s.pending = true
	p := stepPlan{budget: s.cfg.MaxNumBatchedTokens}
	if s.pause == PausedAll {
		p.budget = 0
	}
	if preempted := s.planRunning(&p); !preempted && s.pause == Unpaused {
		s.planWaiting(&p)
	}
	so := s.buildOutput(p.items)
	for _, it := range p.items {
		it.r.numComputed += it.n
	}
	for _, id := range s.finished {
		delete(s.finishedSet, id)
	}
	s.finished, s.preempted = nil, nil
	return so, nil
}

// planned is one request of a step: its n tokens, the blocks allocated for them, and whether
// it was admitted from the waiting queue this step.
type planned struct {
	r     *Request
	n     int
	added []int
	fresh bool
}

// stepPlan is the step Schedule is building: the requests planned so far and the token
// budget left.
type stepPlan struct {
	items  []planned
	budget int
}

// planRunning plans the running requests, in order, within the budget; on a block shortage
// it preempts from the back (LIFO), stopping at the request that preempted itself. It
// reports whether it preempted anything.
func (s *Scheduler) planRunning(p *stepPlan) (preempted bool) {
	for i := 0; i < len(s.running) && p.budget > 0; i++ {
		r := s.running[i]
		n := r.NumTokens() - r.numComputed
		if s.cfg.LongPrefillTokenThreshold > 0 {
			n = min(n, s.cfg.LongPrefillTokenThreshold)
		}
		n = min(n, p.budget)
		if n <= 0 {
			continue
		}
		var added []int
		self := false
		for {
			var ok bool
			if added, ok = s.pool.AllocateSlots(r.ID, r.numComputed+n, nil); ok {
				break
			}
			victim := s.running[len(s.running)-1]
			s.running = s.running[:len(s.running)-1]
			s.preempt(victim)
			preempted = true
			if victim == r {
				self = true
				break
			}
		}
		if self {
			break
		}
		p.items = append(p.items, planned{r: r, n: n, added: added})
		p.budget -= n
	}
	return preempted
}

// planWaiting admits waiting requests while the budget and MaxNumSeqs allow. Requests whose
// load has landed go first: they already hold blocks, and a request ahead of them that cannot
// get blocks would otherwise wait for them forever.
func (s *Scheduler) planWaiting(p *stepPlan) {
	order := make([]*Request, 0, len(s.waiting))
	for _, r := range s.waiting {
		if r.status == StatusWaitingForRemoteKVs && s.recvDone[r.ID] {
			order = append(order, r)
		}
	}
	for _, r := range s.waiting {
		if !(r.status == StatusWaitingForRemoteKVs && s.recvDone[r.ID]) {
			order = append(order, r)
		}
	}
	admitted := map[*Request]bool{}
	for _, r := range order {
		if p.budget <= 0 || len(s.running) >= s.cfg.MaxNumSeqs {
			break
		}
		if r.status == StatusWaitingForRemoteKVs && !s.landLoad(r) {
			continue
		}
		run, stop := s.admit(r, p)
		if run {
			admitted[r] = true
		}
		if stop {
			break
		}
	}
	if len(admitted) > 0 {
		s.waiting = slices.DeleteFunc(s.waiting, func(r *Request) bool { return admitted[r] })
	}
}

// landLoad prepares a request whose connector load was pending for admission, and reports
// false while the load has not landed. If the weights changed while the KV was loading, the
// loaded KV belongs to the old version: it is dropped and the request starts over like a
// preempted one. Otherwise its blocks become cacheable; the status changes only once the
// request is scheduled, so a failed allocation leaves it as it was.
func (s *Scheduler) landLoad(r *Request) bool {
	if !s.recvDone[r.ID] {
		return false
	}
	if r.weightVersion != s.version {
		delete(s.recvDone, r.ID)
		s.turnBack(r)
		return true
	}
	s.pool.CacheBlocks(r.ID, r.hashes, r.numComputed)
	if r.numComputed >= r.NumTokens() {
		r.numComputed = r.NumTokens() - 1 // recompute the last token for its logits
	}
	return true
}

// admit tries to start waiting request r: it looks up its prefix (locally and through the
// connector) when it starts fresh, allocates its blocks and, unless the connector loads its
// KV asynchronously (then it parks as waiting for remote KV), plans it. It reports whether r
// now runs, and whether admission stops for this step (no budget for an unchunked prefill,
// or no blocks for a fresh request).
func (s *Scheduler) admit(r *Request, p *stepPlan) (run, stop bool) {
	fresh := r.numComputed == 0
	var hit []int
	local, ext, async := 0, 0, false
	if fresh {
		if r.weightVersion != s.version {
			// KV for this request is computed from scratch under the current weights:
			// hash (and so cache and look up) it under the current version.
			r.weightVersion = s.version
			r.rehash(s.bs)
		}
		if !r.SkipPrefixCache {
			hit, local = s.pool.GetComputedBlocks(r.hashes, r.NumTokens())
		}
		ext, async = s.conn.GetNumNewMatchedTokens(r, local)
		if ext == kvconnector.Defer || ext < 0 {
			return false, false
		}
		if ext == 0 {
			async = false
		} else if !async && local+ext >= r.NumTokens() {
			ext = r.NumTokens() - 1 - local
		}
	}
	computed := r.numComputed + local + ext
	n := 0
	if !async {
		n = r.NumTokens() - computed
		if s.cfg.LongPrefillTokenThreshold > 0 {
			n = min(n, s.cfg.LongPrefillTokenThreshold)
		}
		if n > p.budget {
			if s.cfg.DisableChunkedPrefill {
				return false, true
			}
			n = p.budget
		}
	}
	added, ok := s.pool.AllocateSlots(r.ID, computed+n, hit)
	for !ok && len(s.running) == 0 && len(p.items) == 0 && s.preemptLoaded(r) {
		// Nothing runs, so nothing will free blocks: requests parked with loaded KV
		// must give theirs up, or they and r could wait for each other forever.
		added, ok = s.pool.AllocateSlots(r.ID, computed+n, hit)
	}
	if !ok {
		// A loaded request needs only a few more blocks: try the others.
		return false, fresh
	}
	s.conn.UpdateStateAfterAlloc(r, s.pool.Blocks(r.ID), ext)
	r.numComputed = computed
	if r.numCached < 0 {
		r.numCached = computed
	}
	delete(s.recvDone, r.ID)
	if async {
		r.status = StatusWaitingForRemoteKVs
		return false, false
	}
	r.status = StatusRunning
	s.running = append(s.running, r)
	p.items = append(p.items, planned{r: r, n: n, added: added, fresh: true})
	p.budget -= n
	return true, false
}

// buildOutput turns the step's plan into its SchedulerOutput, with the connector's metadata
// for it.
func (s *Scheduler) buildOutput(plan []planned) *SchedulerOutput {
	so := &SchedulerOutput{
		Step:            s.step,
		WeightVersion:   s.version,
		FinishedReqIDs:  s.finished,
		PreemptedReqIDs: s.preempted,
	}
	info := kvconnector.StepInfo{Step: s.step, FinishedReqIDs: s.finished, PreemptedReqIDs: s.preempted}
	for _, p := range plan {
		r := p.r
		start := r.numComputed
		sr := ScheduledRequest{
			ReqID:       r.ID,
			Req:         r,
			TokenIDs:    r.tokens[start : start+p.n : start+p.n],
			StartPos:    start,
			BlockIDs:    s.pool.Blocks(r.ID),
			NewBlockIDs: p.added,
			Sample:      start+p.n == r.NumTokens(),
			Fresh:       p.fresh,
		}
		so.Scheduled = append(so.Scheduled, sr)
		so.NumScheduledTokens += p.n
		info.Scheduled = append(info.Scheduled, kvconnector.ScheduledRequest{
			Req: r, NumScheduledTokens: p.n, NewBlockIDs: sr.NewBlockIDs, BlockIDs: sr.BlockIDs, Resumed: p.fresh && r.numPreemptions > 0,
		})
	}
	info.NumScheduledTokens = so.NumScheduledTokens
	so.ConnectorMeta = s.conn.BuildConnectorMeta(info)
	so.ConnectorMeta.Step = s.step
	return so
}

// UpdateFromOutput applies the result of executing so (vLLM update_from_output): it caches the
// blocks the step filled, appends sampled tokens, finishes requests that hit a stop condition and
// hands the connector its output. It returns one output per request that got a token or finished.
// mo may be nil for a step that ran no model. If a request that had to sample has no token, it is
// rolled back by one token (recomputed next step) and ErrMissingSample is returned with the outputs.
func (s *Scheduler) UpdateFromOutput(so *SchedulerOutput, mo *ModelOutput) ([]RequestOutput, error) {
	if so == nil || !s.pending || so.Step != s.step {
		return nil, fmt.Errorf("%w: got step %v, pending %d (%v)", ErrOutputMismatch, stepOf(so), s.step, s.pending)
	}
	if mo != nil && mo.Step != 0 && mo.Step != so.Step {
		return nil, fmt.Errorf("%w: model output for step %d, scheduler output %d", ErrOutputMismatch, mo.Step, so.Step)
	}
	s.pending = false
	if mo == nil {
		mo = &ModelOutput{}
	}
	var outs []RequestOutput
	var missing []string
	stopped := map[*Request]bool{}
	for _, sr := range so.Scheduled {
		r := sr.Req
		if s.requests[sr.ReqID] != r || r.status != StatusRunning {
			continue // finished or preempted since Schedule: its results are stale
		}
		s.pool.CacheBlocks(r.ID, r.hashes, r.numComputed)
		if !sr.Sample {
			continue
		}
		smp, ok := mo.Sampled[r.ID]
		if !ok {
			r.numComputed--
			missing = append(missing, r.ID)
			continue
		}
		r.tokens = append(r.tokens, smp.TokenID)
		r.hashes = kvcache.ExtendHashes(r.hashes, r.tokens, s.bs, r.weightVersion, r.CacheSalt)
		out := RequestOutput{
			ReqID:           r.ID,
			NewTokenIDs:     []int{smp.TokenID},
			Payloads:        []any{smp.Payload},
			WeightVersion:   so.WeightVersion,
			NumCachedTokens: r.NumCachedTokens(),
		}
		if reason := s.checkStop(r, smp.TokenID); reason != FinishNone {
			r.status, r.finishReason = StatusFinished, reason
			stopped[r] = true
			s.release(r, false)
			out.Finished, out.FinishReason = true, reason
		}
		outs = append(outs, out)
	}
	if len(stopped) > 0 {
		s.running = slices.DeleteFunc(s.running, func(r *Request) bool { return stopped[r] })
	}

	kv := mo.KVConnector
	s.conn.UpdateConnectorOutput(kv)
	failedLoad := map[string]bool{}
	recving := kv.FinishedRecving
	for _, id := range kv.FailedRecving {
		failedLoad[id] = true
		if !slices.Contains(recving, id) {
			recving = append(slices.Clip(recving), id)
		}
	}
	for _, id := range recving {
		if n := s.ignoreRecv[id]; n > 0 {
			// The completion of a load DropAllKV forgot: its blocks are gone.
			if n == 1 {
				delete(s.ignoreRecv, id)
			} else {
				s.ignoreRecv[id] = n - 1
			}
			continue
		}
		r, ok := s.requests[id]
		if !ok {
			continue
		}
		if r.status == StatusWaitingForRemoteKVs {
			if s.dropOnRecv[id] || failedLoad[id] {
				// A reset_running reset retired this KV while it was loading, or the load
				// failed its checks: the blocks hold nothing usable, so recompute.
				if failedLoad[id] {
					s.numLoadFailures++
				}
				delete(s.dropOnRecv, id)
				s.turnBack(r)
				continue
			}
			s.recvDone[id] = true
		} else if s.delayRecv[id] {
			delete(s.delayRecv, id)
			s.maybeFree(id)
		}
	}
	for _, id := range kv.FinishedSending {
		if s.delaySend[id] {
			delete(s.delaySend, id)
			s.maybeFree(id)
		}
	}
	if len(missing) > 0 {
		return outs, fmt.Errorf("%w: step %d, requests %s", ErrMissingSample, so.Step, strings.Join(missing, ","))
	}
	return outs, nil
}

// FailStep is UpdateFromOutput's counterpart for a step whose execution failed (the forward
// pass or a connector phase before it): every request the step scheduled is rolled back to the
// step's start (nothing it was to compute is cached, stored or sampled) and finished with
// reason, and their final outputs are returned. Call it between Schedule and UpdateFromOutput
// (which still runs, to hand the connector the step's output; the failed requests' stale
// results are ignored there). Failing rather than retrying them means a fault that repeats
// cannot make the engine loop forever on the same requests.
func (s *Scheduler) FailStep(so *SchedulerOutput, reason FinishReason) []RequestOutput {
	if so == nil || !s.pending || so.Step != s.step {
		return nil
	}
	var ids []string
	for _, sr := range so.Scheduled {
		r := sr.Req
		if s.requests[sr.ReqID] != r || r.status != StatusRunning {
			continue
		}
		r.numComputed = sr.StartPos
		ids = append(ids, r.ID)
	}
	return s.FinishRequests(ids, reason)
}

// NumLoadFailures counts connector loads that completed without valid KV (their requests
// recomputed).
func (s *Scheduler) NumLoadFailures() int64 { return s.numLoadFailures }

func stepOf(so *SchedulerOutput) any {
	if so == nil {
		return nil
	}
	return so.Step
}

// checkStop follows vLLM check_stop: length first, then (past MinTokens) EOS, then stop tokens.
func (s *Scheduler) checkStop(r *Request, tok int) FinishReason {
	nOut := len(r.tokens) - len(r.PromptTokenIDs)
	if r.NumTokens() >= s.cfg.MaxModelLen || nOut >= r.Params.MaxTokens {
		return FinishLength
	}
	if nOut < r.Params.MinTokens {
		return FinishNone
	}
	if !r.Params.IgnoreEOS && slices.Contains(s.cfg.EOSTokenIDs, tok) {
		return FinishStop
	}
	if slices.Contains(r.Params.StopTokenIDs, tok) {
		return FinishStop
	}
	return FinishNone
}

// ResetPrefixCache clears the prefix cache (vLLM reset_prefix_cache), never reporting a success
// it did not achieve. With resetRunning every running request is preempted first (LIFO), every
// waiting request whose connector load landed gives its blocks up and recomputes, one whose load
// is in flight recomputes once it lands, and the pool's cache is cleared even while blocks are
// in use (what still holds them keeps its content, no longer reachable by a lookup); without it
// the reset is refused while any block is in use. Either way ok is false, with the reason, while
// blocks are still in use after the reset (loads in flight, frees the connector delays): success
// means nothing computed before the reset is held or reachable. With resetConnector the
// connector is reset too, even if the pool reset failed; ok is true only when every requested
// reset succeeded. ctx reaches the connector's reset (trace parentage only).
func (s *Scheduler) ResetPrefixCache(ctx context.Context, resetRunning, resetConnector bool) (ok bool, detail ResetDetail) {
	if resetRunning {
		for len(s.running) > 0 {
			r := s.running[len(s.running)-1]
			s.running = s.running[:len(s.running)-1]
			s.preempt(r)
			detail.RequestsPreempted++
		}
		for _, r := range s.waiting {
			if r.status != StatusWaitingForRemoteKVs {
				continue
			}
			if s.recvDone[r.ID] {
				delete(s.recvDone, r.ID)
				s.turnBack(r)
				detail.RequestsPreempted++
			} else {
				s.dropOnRecv[r.ID] = true
			}
		}
	}
	detail.BlocksInUse = s.pool.NumBlocks() - 1 - s.pool.NumFreeBlocks()
	var reasons []string
	gpuOK, cleared, reason := s.pool.Reset(resetRunning)
	detail.BlocksCleared, detail.PrefixCacheReset = cleared, gpuOK
	switch {
	case !gpuOK:
		reasons = append(reasons, "prefix cache: "+reason)
	case detail.BlocksInUse > 0:
		reasons = append(reasons, fmt.Sprintf("prefix cache cleared, but %d blocks are still in use by %d requests (loads in flight or frees the connector delays)",
			detail.BlocksInUse, s.pool.NumRequestsWithBlocks()))
	}
	ok = gpuOK && detail.BlocksInUse == 0
	if resetConnector {
		jobs, cok := s.conn.ResetCache(ctx)
		detail.ConnectorJobsFlushed, detail.ConnectorReset = jobs, cok
		if !cok {
			reasons = append(reasons, "connector reset failed")
		}
		ok = ok && cok
	}
	detail.Reason = strings.Join(reasons, "; ")
	return ok, detail
}

// CheckInvariants verifies the scheduler's and the pool's consistency; for property tests.
func (s *Scheduler) CheckInvariants() error {
	if err := s.pool.CheckInvariants(); err != nil {
		return err
	}
	where := map[*Request]string{}
	for _, r := range s.running {
		if where[r] != "" {
			return fmt.Errorf("request %q queued twice", r.ID)
		}
		where[r] = "running"
		if r.status != StatusRunning {
			return fmt.Errorf("running request %q has status %v", r.ID, r.status)
		}
		if s.pool.NumBlocksOf(r.ID) < (r.numComputed+s.bs-1)/s.bs {
			return fmt.Errorf("running request %q: %d computed tokens in %d blocks", r.ID, r.numComputed, s.pool.NumBlocksOf(r.ID))
		}
	}
	for _, r := range s.waiting {
		if where[r] != "" {
			return fmt.Errorf("request %q queued twice", r.ID)
		}
		where[r] = "waiting"
		switch r.status {
		case StatusWaiting, StatusPreempted:
			if r.numComputed != 0 || s.pool.NumBlocksOf(r.ID) != 0 {
				return fmt.Errorf("waiting request %q: %d computed, %d blocks", r.ID, r.numComputed, s.pool.NumBlocksOf(r.ID))
			}
		case StatusWaitingForRemoteKVs:
		default:
			return fmt.Errorf("waiting request %q has status %v", r.ID, r.status)
		}
	}
	if len(s.running) > s.cfg.MaxNumSeqs {
		return fmt.Errorf("%d running > MaxNumSeqs %d", len(s.running), s.cfg.MaxNumSeqs)
	}
	for id, r := range s.requests {
		if r.ID != id {
			return fmt.Errorf("request map key %q holds %q", id, r.ID)
		}
		if where[r] == "" && !(r.status == StatusFinished && (s.delaySend[id] || s.delayRecv[id])) {
			return fmt.Errorf("request %q (%v) is in no queue", id, r.status)
		}
		if r.NumTokens() > s.cfg.MaxModelLen+1 {
			return fmt.Errorf("request %q has %d tokens, context %d", id, r.NumTokens(), s.cfg.MaxModelLen)
		}
	}
	if len(where) != len(s.running)+len(s.waiting) {
		return fmt.Errorf("queues hold %d requests, want %d", len(where), len(s.running)+len(s.waiting))
	}
	for r := range where {
		if s.requests[r.ID] != r {
			return fmt.Errorf("queued request %q not in the request map", r.ID)
		}
	}
	if n := s.pool.NumRequestsWithBlocks(); n > len(s.requests) {
		return fmt.Errorf("pool tracks %d requests, scheduler %d", n, len(s.requests))
	}
	return nil
}
