package offload

import (
	"context"
	"encoding/binary"
	"hash/crc32"
	"slices"
	"sync"
	"time"
	"unsafe"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/rolloutkit/rollout/engine/kvconnector"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// slotState is the worker's record of one CPU slot: which allocation's content it holds, its
// checksum, and who is touching it right now.
type slotState struct {
	gen     uint64 // generation of the allocation whose store last wrote it
	sum     uint32
	valid   bool // a store of gen completed (sum is set)
	writer  bool
	readers int
}

// xfer is a submitted transfer.
type xfer struct {
	t    *Transfer
	prev *xfer // the previous transfer in the same direction: FIFO
	done chan struct{}
	ok   bool
}

// workerSide implements kvconnector.Worker and kvconnector.StorageBinder. The step methods run
// on the engine goroutine; copies run on one goroutine per transfer, chained FIFO per direction,
// and a large transfer shares its copy with the helpers of copies.
type workerSide struct {
	c      *Connector
	copies *copyPool

	mu          sync.Mutex
	storage     kvconnector.KVStorage
	blockFloats int
	buf         []float32
	slots       []slotState
	inflight    map[int64]*xfer
	last        [2]*xfer // per direction: 0 load, 1 store
	unsubmitted []*Transfer
	completed   map[int64]bool
	recv        []string
	failedRecv  []string // loads that completed without valid KV (subset of recv)
	// failedTaken are the failed loads among those the last GetFinished reported, for
	// TakeFailedRecving: taken with recv under one lock, so a load that fails between the two
	// calls is reported, failed, in the next step with its completion, not failed in this
	// step and then completed in the next.
	failedTaken []string

	// Current step (engine goroutine only).
	meta    kvconnector.TypedMetadata[*Payload]
	payload *Payload
	popped  map[int64]bool
	loaded  bool // StartLoadKV submitted this step's loads
}

var (
	_ kvconnector.TypedWorker[*Payload, *WorkerMeta] = (*workerSide)(nil)
	_ kvconnector.StorageBinder                      = (*workerSide)(nil)
	_ kvconnector.StepFailer                         = (*workerSide)(nil)
	_ kvconnector.LoadErrorReporter                  = (*workerSide)(nil)
)

func newWorkerSide(c *Connector) *workerSide {
	return &workerSide{c: c, copies: newCopyPool(c.cfg.CopyThreads), inflight: map[int64]*xfer{}, completed: map[int64]bool{}, popped: map[int64]bool{}}
}

// BindKVStorage implements kvconnector.StorageBinder: it sizes the CPU tier on the first bind
// and fails clearly when the configuration does not fit the pool.
func (w *workerSide) BindKVStorage(s kvconnector.KVStorage) error {
	n, err := w.c.bindStorage(s.BlockFloats())
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	chunk := s.BlockFloats() * w.c.cfg.BlocksPerChunk
	if w.buf == nil {
		w.buf = make([]float32, n*chunk)
		w.slots = make([]slotState, n)
	}
	w.storage, w.blockFloats = s, s.BlockFloats()
	return nil
}

// ReleaseKVStorage implements kvconnector.StorageBinder. The engine calls it after WaitIdle; a
// transfer still in flight here is a violation (and is waited for before the storage goes).
func (w *workerSide) ReleaseKVStorage() {
	w.mu.Lock()
	var busy []*xfer
	for _, x := range w.inflight {
		busy = append(busy, x)
	}
	w.mu.Unlock()
	for _, x := range busy {
		w.c.violation(x.t.ID, "KV storage released while the transfer is in flight")
		<-x.done
	}
	w.mu.Lock()
	w.storage = nil
	w.mu.Unlock()
}

// BindMetadata implements kvconnector.TypedWorker.
func (w *workerSide) BindMetadata(meta kvconnector.TypedMetadata[*Payload]) {
	w.meta = meta
	w.payload = meta.Payload
	if w.payload == nil {
		w.payload = &Payload{}
	}
	clear(w.popped)
	w.loaded = false
}

// HandlePreemptions implements kvconnector.Worker: stores of this step that are in the flush set
// join the deferred stores; all of them are submitted; then it waits on the flush set.
func (w *workerSide) HandlePreemptions(ctx context.Context) error {
	flush := map[int64]bool{}
	for _, id := range w.meta.FlushJobIDs {
		flush[id] = true
	}
	w.mu.Lock()
	for _, t := range w.payload.Stores {
		if flush[t.ID] {
			w.unsubmitted = append(w.unsubmitted, t)
			w.popped[t.ID] = true
		}
	}
	w.submitDeferredLocked()
	inflight := 0
	for _, id := range w.meta.FlushJobIDs {
		if w.inflight[id] != nil {
			inflight++
		}
	}
	w.mu.Unlock()
	delivered := w.payload.FlushSpan
	var wait trace.Span
	if delivered != nil {
		ctx, wait = w.c.tracer.Start(trace.ContextWithSpan(ctx, delivered), SpanFlushWait, trace.WithAttributes(
			attribute.Int(AttrJobs, len(w.meta.FlushJobIDs)), attribute.Int(AttrJobsInFlight, inflight)))
	}
	if err := w.wait(ctx, w.meta.FlushJobIDs); err != nil {
		if delivered != nil {
			wait.RecordError(err)
			wait.SetStatus(codes.Error, err.Error())
			wait.End()
			delivered.End()
		}
		return err
	}
	if wait != nil {
		wait.End()
	}
	if !w.payload.ResetAt.IsZero() {
		since := w.c.cfg.Now().Sub(w.payload.ResetAt)
		if delivered != nil {
			delivered.SetAttributes(attribute.Float64(AttrResetToFlush, since.Seconds()))
			delivered.End()
		}
		if cb := w.c.cfg.OnFlushDelivered; cb != nil {
			cb(ctx, w.meta.FlushJobIDs, since)
		}
	}
	return nil
}

// StartLoadKV implements kvconnector.Worker.
func (w *workerSide) StartLoadKV(context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.submitDeferredLocked()
	for _, t := range w.payload.Loads {
		w.submitLocked(t)
	}
	w.loaded = true
	return nil
}

// FailStep implements kvconnector.StepFailer: the step's forward pass did not compute the KV
// its new stores were built to copy, so they are never submitted and complete as failed (their
// keys never become readable); loads the step did not submit complete as failed loads, so
// their requests recompute. Stores of earlier steps, and stores this step's flush set already
// submitted, copy KV computed before and go ahead.
func (w *workerSide) FailStep() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, t := range w.payload.Stores {
		if !w.popped[t.ID] {
			w.popped[t.ID] = true
			w.completed[t.ID] = false
		}
	}
	if !w.loaded {
		for _, t := range w.payload.Loads {
			w.completed[t.ID] = false
			w.recv = append(w.recv, t.ReqID)
			w.failedRecv = append(w.failedRecv, t.ReqID)
		}
		w.loaded = true
	}
}

// TakeFailedRecving implements kvconnector.LoadErrorReporter: the failed loads among those
// GetFinished reported.
func (w *workerSide) TakeFailedRecving() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	f := w.failedTaken
	w.failedTaken = nil
	return f
}

// WaitForSave implements kvconnector.Worker: stores are deferred to the next step, so there is
// nothing to wait for.
func (w *workerSide) WaitForSave(context.Context) error { return nil }

// GetFinished implements kvconnector.Worker: it defers this step's stores to the next step and
// reports completed loads and the requests the scheduler side released.
func (w *workerSide) GetFinished([]string) (finishedSending, finishedRecving []string) {
	w.mu.Lock()
	for _, t := range w.payload.Stores {
		if !w.popped[t.ID] {
			w.unsubmitted = append(w.unsubmitted, t)
		}
	}
	var oldest *xfer
	if w.payload.NumScheduledTokens == 0 && len(w.completed) == 0 {
		for _, x := range w.inflight {
			if oldest == nil || x.t.ID < oldest.t.ID {
				oldest = x
			}
		}
	}
	w.mu.Unlock()
	if oldest != nil {
		// A step without a forward pass is only polling transfers: wait a little for one to
		// land rather than spin (vLLM sleeps 1 ms in the same case).
		select {
		case <-oldest.done:
		case <-time.After(time.Millisecond):
		}
	}
	w.mu.Lock()
	recv := w.recv
	w.recv = nil
	w.failedTaken = append(w.failedTaken, w.failedRecv...)
	w.failedRecv = nil
	w.mu.Unlock()
	return slices.Clone(w.payload.Release), recv
}

// BuildWorkerMeta implements kvconnector.TypedWorker.
func (w *workerSide) BuildWorkerMeta() *WorkerMeta {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.completed) == 0 {
		return nil
	}
	wm := &WorkerMeta{Completed: w.completed}
	w.completed = map[int64]bool{}
	return wm
}

// ClearMetadata implements kvconnector.Worker. A delivery span still open (the step failed
// before its wait) ends here.
func (w *workerSide) ClearMetadata() {
	if w.payload != nil && w.payload.FlushSpan != nil {
		w.payload.FlushSpan.End()
	}
	w.meta, w.payload = kvconnector.TypedMetadata[*Payload]{}, nil
}

// WaitIdle implements kvconnector.Worker: deferred stores are submitted, then every transfer is
// waited for.
func (w *workerSide) WaitIdle(ctx context.Context) error {
	w.mu.Lock()
	w.submitDeferredLocked()
	ids := make([]int64, 0, len(w.inflight))
	for id := range w.inflight {
		ids = append(ids, id)
	}
	w.mu.Unlock()
	return w.wait(ctx, ids)
}

// wait blocks until the listed transfers finished; unknown or finished ids are no-ops.
func (w *workerSide) wait(ctx context.Context, ids []int64) error {
	for _, id := range ids {
		w.mu.Lock()
		x := w.inflight[id]
		w.mu.Unlock()
		if x == nil {
			continue
		}
		select {
		case <-x.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (w *workerSide) submitDeferredLocked() {
	for _, t := range w.unsubmitted {
		w.submitLocked(t)
	}
	w.unsubmitted = w.unsubmitted[:0]
}

func (w *workerSide) submitLocked(t *Transfer) {
	dir := 0
	if t.Store {
		dir = 1
	}
	x := &xfer{t: t, prev: w.last[dir], done: make(chan struct{})}
	w.last[dir] = x
	w.inflight[t.ID] = x
	w.c.stats.xfersInflight.Add(1)
	w.copies.acquire()
	storage, buf := w.storage, w.buf
	go w.run(x, storage, buf)
}

// run performs one transfer after the previous one in its direction.
func (w *workerSide) run(x *xfer, storage kvconnector.KVStorage, buf []float32) {
	if x.prev != nil {
		<-x.prev.done
		x.prev = nil // let it be collected
	}
	_, pool := w.c.manager()
	var ok bool
	switch {
	case storage == nil || buf == nil || pool == nil:
		w.c.violation(x.t.ID, "transfer submitted without bound KV storage")
		ok = false
	default:
		if g := w.c.transferGate(); g != nil {
			g(x.t)
		}
		w.throttle(x.t, storage.BlockFloats())
		ok = w.transfer(x.t, storage, buf, pool)
	}
	w.mu.Lock()
	w.doneLocked(x, ok)
	w.mu.Unlock()
	w.copies.release()
	close(x.done)
}

// doneLocked records a finished transfer: a load is reported by the next GetFinished (and, if
// it failed, by the TakeFailedRecving after it).
func (w *workerSide) doneLocked(x *xfer, ok bool) {
	x.ok = ok
	w.completed[x.t.ID] = ok
	if !x.t.Store {
		w.recv = append(w.recv, x.t.ReqID)
		if !ok {
			w.failedRecv = append(w.failedRecv, x.t.ReqID)
		}
	}
	delete(w.inflight, x.t.ID)
	w.c.stats.xfersInflight.Add(-1)
	if w.last[boolDir(x.t.Store)] == x {
		w.last[boolDir(x.t.Store)] = nil
	}
}

func boolDir(store bool) int {
	if store {
		return 1
	}
	return 0
}

// throttle applies the test-only delay and bandwidth cap.
func (w *workerSide) throttle(t *Transfer, blockFloats int) {
	d := w.c.testDelay()
	if bw := w.c.testBandwidth(); bw > 0 {
		n := 0
		for _, c := range t.Chunks {
			n += len(c.Blocks)
		}
		d += time.Duration(float64(n*blockFloats*4) / bw * float64(time.Second))
	}
	if d > 0 {
		time.Sleep(d)
	}
}

func (w *workerSide) chunkRegion(buf []float32, slot, blockFloats int) []float32 {
	n := blockFloats * w.c.cfg.BlocksPerChunk
	return buf[slot*n : (slot+1)*n : (slot+1)*n]
}

// checksumUpdate extends crc by the block checksum of f: the CRC-32C of each of its three
// parts (split at sumThird), then the CRC-32C of those three values. Three parts rather than
// one CRC over the whole block so that the fused copy (copySum3) can run three independent
// CRC32 chains, which is what makes the checksum nearly free next to the copy; stores and
// loads both use this definition, block by block. Because each block's three values are
// computed apart from the running crc, a transfer's blocks can be copied on several
// goroutines and folded into crc in order afterwards (see copyPool).
func checksumUpdate(crc uint32, f []float32) uint32 {
	if len(f) == 0 {
		return crc
	}
	a, b, c := sum3(f)
	return combineSums(crc, a, b, c)
}

// sum3 is the three part checksums of f's block checksum.
func sum3(f []float32) (a, b, c uint32) {
	if len(f) == 0 {
		return 0, 0, 0
	}
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), len(f)*4)
	t := sumThird(len(raw))
	return crc32.Update(0, castagnoli, raw[:t]), crc32.Update(0, castagnoli, raw[t:2*t]), crc32.Update(0, castagnoli, raw[2*t:])
}

// copySum copies src into dst (equal lengths) and extends crc by src's block checksum.
func copySum(dst, src []float32, crc uint32) uint32 {
	if len(src) == 0 {
		return crc
	}
	a, b, c := copySum3(dst, src)
	return combineSums(crc, a, b, c)
}

// copyThenSum is copySum without the fused assembly.
func copyThenSum(dst, src []float32, crc uint32) uint32 {
	copy(dst, src)
	return checksumUpdate(crc, src)
}

// sumThird is where a block of n bytes is split for its checksum: whole 64-byte lines, the
// third part taking the remainder.
func sumThird(n int) int { return n / 192 * 64 }

// combineSums extends crc by the three part checksums, little-endian.
func combineSums(crc, a, b, c uint32) uint32 {
	var buf [12]byte
	binary.LittleEndian.PutUint32(buf[0:], a)
	binary.LittleEndian.PutUint32(buf[4:], b)
	binary.LittleEndian.PutUint32(buf[8:], c)
	return crc32.Update(crc, castagnoli, buf[:])
}

func gensMatch(pool kvconnector.BlockPool, c *ChunkTransfer) bool {
	for i, b := range c.Blocks {
		if pool.Generation(b) != c.Gens[i] {
			return false
		}
	}
	return true
}

// transfer copies t's chunks. They go in batches in which no CPU slot (stores) or pool block
// (loads) repeats: a batch's chunks are checked one by one, their blocks copied together (split
// across the copy pool when the transfer is large, see copyPool), then each chunk is checked
// again and completed, as it would be alone. A chunk that repeats a slot or block of an earlier
// chunk of the batch starts the next batch, so it sees that chunk's result as it did when
// chunks were copied one at a time.
func (w *workerSide) transfer(t *Transfer, storage kvconnector.KVStorage, buf []float32, pool kvconnector.BlockPool) bool {
	bf := storage.BlockFloats()
	blocks := 0
	for i := range t.Chunks {
		blocks += len(t.Chunks[i].Blocks)
		if !t.Store {
			blocks += max(t.Chunks[i].Offset, 0) // checksummed, not copied
		}
	}
	bytes := int64(blocks) * int64(bf) * 4
	split := bytes >= w.c.cfg.SplitBytes
	ok := true
	seen := map[int]bool{}
	for lo := 0; lo < len(t.Chunks); {
		clear(seen)
		hi := lo
		for ; hi < len(t.Chunks); hi++ {
			if !t.Store {
				if repeats(seen, t.Chunks[hi].Blocks...) {
					break
				}
			} else if repeats(seen, t.Chunks[hi].Slot.ID) {
				break
			}
		}
		hi = max(hi, lo+1)
		var bok bool
		if t.Store {
			bok = w.storeBatch(t, t.Chunks[lo:hi], storage, buf, pool, split)
		} else {
			bok = w.loadBatch(t, t.Chunks[lo:hi], storage, buf, pool, split)
		}
		ok = ok && bok
		lo = hi
	}
	return ok
}

// repeats reports whether any of ids is in seen, adding them all.
func repeats(seen map[int]bool, ids ...int) bool {
	rep := false
	for _, id := range ids {
		rep = rep || seen[id]
		seen[id] = true
	}
	return rep
}

// claim is a chunk of a batch that passed its checks before the copy: its slot, the
// checksum a load expects, and its pieces in the batch's piece list.
type claim struct {
	s           *slotState
	want        uint32
	ok          bool // passed the checks before the copy (and, for a store, its source is fresh)
	first, last int
}

// storeBatch copies a batch of chunks' pool blocks into their slots. A source block whose
// generation changed (its request was preempted and the block freed) makes the result unusable
// but is not a violation: the chunk's store fails and its key never becomes readable.
func (w *workerSide) storeBatch(t *Transfer, cs []ChunkTransfer, storage kvconnector.KVStorage, buf []float32, pool kvconnector.BlockPool, split bool) bool {
	bf := storage.BlockFloats()
	claims := make([]claim, len(cs))
	var ps []piece
	for i := range cs {
		c := &cs[i]
		if c.Slot.ID < 0 || c.Slot.ID >= len(w.slots) {
			w.c.violation(t.ID, "store to a slot outside the CPU tier", "slot", c.Slot.ID)
			continue
		}
		w.mu.Lock()
		s := &w.slots[c.Slot.ID]
		if s.writer || s.readers > 0 {
			w.mu.Unlock()
			w.c.violation(t.ID, "store to a CPU slot another transfer is using", "slot", c.Slot.ID, "writer", s.writer, "readers", s.readers)
			continue
		}
		s.writer, s.gen, s.valid = true, c.Slot.Gen, false
		w.mu.Unlock()
		cl := claim{s: s, ok: gensMatch(pool, c), first: len(ps)}
		if cl.ok {
			// The checksum is taken block by block right after each copy, while the block is
			// still in cache: one pass over memory instead of two.
			dst := w.chunkRegion(buf, c.Slot.ID, bf)
			for j, b := range c.Blocks {
				ps = append(ps, piece{dst: dst[j*bf : (j+1)*bf], src: storage.Block(b)})
			}
		}
		cl.last = len(ps)
		claims[i] = cl
	}
	w.copies.run(ps, split)
	ok := true
	for i := range cs {
		c, cl := &cs[i], claims[i]
		if cl.s == nil {
			ok = false
			continue
		}
		sum := fold(0, ps[cl.first:cl.last])
		fresh := cl.ok && gensMatch(pool, c)
		w.mu.Lock()
		cl.s.writer = false
		stolen := cl.s.gen != c.Slot.Gen
		if fresh && !stolen {
			cl.s.sum, cl.s.valid = sum, true
		}
		w.mu.Unlock()
		switch {
		case stolen:
			w.c.violation(t.ID, "CPU slot reassigned during a store", "slot", c.Slot.ID)
			ok = false
		case !fresh:
			w.c.stats.storesDiscarded.Add(1)
			ok = false
		default:
			w.c.stats.storedBytes.Add(int64(len(c.Blocks) * bf * 4))
		}
	}
	return ok
}

// loadBatch copies a batch of chunks' slots into their requests' pool blocks after verifying
// each slot still holds the content the job was created for, then verifies its checksum.
func (w *workerSide) loadBatch(t *Transfer, cs []ChunkTransfer, storage kvconnector.KVStorage, buf []float32, pool kvconnector.BlockPool, split bool) bool {
	bf := storage.BlockFloats()
	claims := make([]claim, len(cs))
	var ps []piece
	defer func() {
		w.mu.Lock()
		for _, cl := range claims {
			if cl.s != nil {
				cl.s.readers--
			}
		}
		w.mu.Unlock()
	}()
	for i := range cs {
		c := &cs[i]
		if c.Slot.ID < 0 || c.Slot.ID >= len(w.slots) {
			w.c.violation(t.ID, "load from a slot outside the CPU tier", "slot", c.Slot.ID)
			continue
		}
		w.mu.Lock()
		s := &w.slots[c.Slot.ID]
		if s.writer || !s.valid || s.gen != c.Slot.Gen {
			writer, valid, gen := s.writer, s.valid, s.gen
			w.mu.Unlock()
			w.c.violation(t.ID, "load from a CPU slot that does not hold the stored chunk", "slot", c.Slot.ID, "writer", writer, "valid", valid, "gen", gen, "want_gen", c.Slot.Gen)
			continue
		}
		s.readers++
		cl := claim{s: s, want: s.sum, first: len(ps)}
		w.mu.Unlock()
		if cl.ok = gensMatch(pool, c); !cl.ok {
			w.c.violation(t.ID, "load into pool blocks the request no longer owns", "blocks", c.Blocks)
		} else {
			// One pass: each block is checksummed right after it was copied (still in
			// cache). A mismatch is found only after the copy, but the blocks belong to this
			// job's request and the failed job is a violation either way.
			src := w.chunkRegion(buf, c.Slot.ID, bf)
			for j := range c.Offset {
				ps = append(ps, piece{src: src[j*bf : (j+1)*bf]})
			}
			for j, b := range c.Blocks {
				ps = append(ps, piece{dst: storage.Block(b), src: src[(c.Offset+j)*bf : (c.Offset+j+1)*bf]})
			}
		}
		cl.last = len(ps)
		claims[i] = cl
	}
	w.copies.run(ps, split)
	ok := true
	for i := range cs {
		c, cl := &cs[i], claims[i]
		if !cl.ok {
			ok = false
			continue
		}
		if got := fold(0, ps[cl.first:cl.last]); got != cl.want {
			w.c.stats.checksumFailures.Add(1)
			w.c.violation(t.ID, "checksum mismatch on load", "slot", c.Slot.ID, "want", cl.want, "got", got)
			ok = false
			continue
		}
		if !gensMatch(pool, c) {
			w.c.violation(t.ID, "pool blocks reassigned during a load", "blocks", c.Blocks)
			ok = false
			continue
		}
		w.c.stats.loadedBytes.Add(int64(len(c.Blocks) * bf * 4))
	}
	return ok
}
