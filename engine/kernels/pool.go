package kernels

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Spin-then-block bounds. A decode step issues its mat-vecs microseconds apart, so workers
// stay hot within a step (fork/join ≈ 0.2 µs instead of a futex wake-up of 5-50 µs), while an
// idle engine parks them and uses no CPU. The caller waits less: if the OS has put it on the
// same CPU as the worker it waits for, every µs it spins is a µs the worker does not run.
const (
	spinFor     = 50 * time.Microsecond // worker, between jobs
	joinSpinFor = 20 * time.Microsecond // caller, for the other parts to finish
	hotSpins    = 256                   // polls before yielding at all
)

// Pool runs data-parallel kernels on a fixed set of workers: the caller of Parallel plus
// Workers()-1 persistent goroutines. Parallel may be called from several goroutines; calls are
// serialised. A nil *Pool runs everything on the caller.
type Pool struct {
	workers int

	mu     sync.Mutex // serialises Parallel and Close
	closed bool       // guarded by mu

	// The current job, written by Parallel before it publishes job and read only by whoever
	// claims one of its chunks (the job cannot finish, nor the next start, before that chunk).
	fn    func(lo, hi int)
	n     int
	parts int
	chunk int   // items per chunk; 0 = one chunk per part
	units int32 // chunks in the job

	// job is gen<<jobPartsBits | parts: the generation, bumped once per job and by Close, and
	// the job's part count, in one word so a worker late for a job cannot read a newer one's.
	job atomic.Uint64
	// next[i] is part i's chunk cursor: gen (32 bits) | next chunk (16) | chunks (16). Claiming
	// a chunk is a CAS on it, so a worker late for a job (older gen) can claim nothing.
	next   []atomic.Uint64
	done   atomic.Int32 // chunks of the current job finished
	panics atomic.Pointer[workerPanic]
	stop   atomic.Bool

	sleepMu  sync.Mutex
	wake     *sync.Cond
	sleepers atomic.Int32 // workers parked or about to park on wake

	joinMu      sync.Mutex
	joined      *sync.Cond // signalled when the last part of a job finishes
	callerAwait atomic.Bool

	wg sync.WaitGroup
}

// jobPartsBits bounds the pool size.
const jobPartsBits = 16

// workerPanic carries a panic from a worker's part to the caller of Parallel.
type workerPanic struct{ v any }

// NewPool returns a pool of n workers (n < 1 is taken as 1): it starts n-1 goroutines, which
// run until Close.
func NewPool(n int) *Pool {
	p := &Pool{workers: min(max(1, n), 1<<jobPartsBits-1)}
	p.next = make([]atomic.Uint64, p.workers)
	p.wake = sync.NewCond(&p.sleepMu)
	p.joined = sync.NewCond(&p.joinMu)
	for i := 1; i < p.workers; i++ {
		p.wg.Add(1)
		go p.worker(i)
	}
	return p
}

// Workers is the pool's parallelism.
func (p *Pool) Workers() int {
	if p == nil {
		return 1
	}
	return p.workers
}

// Close stops the workers and waits for them to exit. It is idempotent; Parallel after Close
// runs everything on the caller.
func (p *Pool) Close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	p.stop.Store(true)
	p.job.Add(1 << jobPartsBits)
	p.sleepMu.Lock()
	p.wake.Broadcast()
	p.sleepMu.Unlock()
	p.wg.Wait()
}

// Parallel splits [0,n) into min(Workers(), n) contiguous ranges, part i being
// [i*n/parts, (i+1)*n/parts), runs fn once on each and returns when all are done. The split
// depends only on n and Workers(), never on timing: a part whose worker is slow to start is
// run by another goroutine instead, but still as the same range. fn must not call Parallel on
// the same pool. A panic in fn is re-raised in the caller once every part has finished.
func (p *Pool) Parallel(n int, fn func(lo, hi int)) { p.run(n, 0, fn) }

// ParallelChunks is Parallel with load balancing: each part is cut into chunks of chunk items
// (the last one shorter), and a goroutine that finishes its own part helps finish the others'.
// fn is called once per chunk, from any goroutine, so it must not depend on which ranges share
// a call. Owners run their chunks front to back, so without contention each worker touches
// the same data every call (it stays in that core's cache); when the OS deschedules a worker,
// the others absorb its chunks instead of waiting. chunk <= 0 means whole parts, as Parallel.
// With nothing to balance (one worker, n == 1, a nil or closed pool) fn runs once on [0,n).
func (p *Pool) ParallelChunks(n, chunk int, fn func(lo, hi int)) { p.run(n, max(chunk, 0), fn) }

// maxChunks bounds the chunks per part (16 bits of the cursor).
const maxChunks = 1<<16 - 1

func (p *Pool) run(n, chunk int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	if p == nil || p.workers == 1 || n == 1 {
		fn(0, n)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		fn(0, n)
		return
	}
	parts := min(p.workers, n)
	if chunk > 0 {
		chunk = max(chunk, (n/parts+1+maxChunks-1)/maxChunks)
	}
	g := p.job.Load()>>jobPartsBits + 1
	gen := g & (1<<32 - 1)
	var units int32
	for i := range parts {
		count := 1
		if chunk > 0 {
			size := (i+1)*n/parts - i*n/parts
			count = (size + chunk - 1) / chunk
		}
		units += int32(count)
		p.next[i].Store(gen<<32 | uint64(count))
	}
	p.fn, p.n, p.parts, p.chunk, p.units = fn, n, parts, chunk, units
	p.done.Store(0)
	p.job.Store(g<<jobPartsBits | uint64(parts))
	// Dekker pairing with park: a worker increments sleepers, then re-reads job; we published
	// job, then read sleepers. One of the two sees the other, so no wake-up is lost.
	if p.sleepers.Load() > 0 {
		p.sleepMu.Lock()
		p.wake.Broadcast()
		p.sleepMu.Unlock()
	}
	p.work(0, parts, gen)
	p.join(units)
	p.fn = nil
	if wp := p.panics.Swap(nil); wp != nil {
		panic(wp.v)
	}
}

// work runs the chunks of part i of job gen, then helps with the other parts'.
func (p *Pool) work(i, parts int, gen uint64) {
	for j := range parts {
		p.runChunks((i+j)%parts, gen)
	}
}

// runChunks claims and runs chunks of part i of job gen until none are left.
func (p *Pool) runChunks(i int, gen uint64) {
	for {
		v := p.next[i].Load()
		if v>>32 != gen || v>>16&0xffff >= v&0xffff {
			return
		}
		if !p.next[i].CompareAndSwap(v, v+1<<16) {
			continue
		}
		// The chunk is ours, so the job's fields stay put until we finish it.
		lo, hi := i*p.n/p.parts, (i+1)*p.n/p.parts
		if p.chunk > 0 {
			lo += int(v>>16&0xffff) * p.chunk
			hi = min(hi, lo+p.chunk)
		}
		p.runUnit(lo, hi, p.units)
	}
}

// runUnit runs one chunk and counts it done.
func (p *Pool) runUnit(lo, hi int, units int32) {
	defer p.finishPart(units)
	// A panic must neither kill the process from a goroutine the caller cannot see nor leave
	// other chunks running while the next job overwrites fn: hand it to the caller after the join.
	defer func() {
		if r := recover(); r != nil {
			p.panics.CompareAndSwap(nil, &workerPanic{v: r})
		}
	}()
	p.fn(lo, hi)
}

// finishPart counts a finished chunk and wakes the caller if it is blocked in join; units is
// the job's chunk count, read before the count (after it the job may be over).
func (p *Pool) finishPart(units int32) {
	// Dekker pairing with join: we count, then read callerAwait; join sets callerAwait, then
	// reads done.
	if p.done.Add(1) == units && p.callerAwait.Load() {
		p.joinMu.Lock()
		p.joined.Signal()
		p.joinMu.Unlock()
	}
}

// join waits until units chunks of the current job have finished: it polls for joinSpinFor,
// then blocks.
func (p *Pool) join(units int32) {
	var deadline time.Time
	for spins := 0; p.done.Load() < units; spins++ {
		if spins < hotSpins {
			continue
		}
		if spins%16 == 0 {
			now := time.Now()
			if deadline.IsZero() {
				deadline = now.Add(joinSpinFor)
			} else if now.After(deadline) {
				p.joinMu.Lock()
				p.callerAwait.Store(true)
				for p.done.Load() < units {
					p.joined.Wait()
				}
				p.callerAwait.Store(false)
				p.joinMu.Unlock()
				return
			}
		}
		runtime.Gosched()
		osYield()
	}
}

// worker runs part i of each job: it polls for spinFor after each job, then parks.
func (p *Pool) worker(i int) {
	defer p.wg.Done()
	// Not p.job.Load(): this goroutine may first run after jobs, or even Close, have been
	// published; the word at NewPool is 0.
	var seen uint64
	for {
		w := p.waitJob(seen)
		if p.stop.Load() {
			return
		}
		seen = w
		if parts := int(w & (1<<jobPartsBits - 1)); i < parts {
			p.work(i, parts, w>>jobPartsBits&(1<<32-1))
		}
	}
}

// waitJob returns the first job word after seen.
func (p *Pool) waitJob(seen uint64) uint64 {
	var deadline time.Time
	for spins := 0; ; spins++ {
		if w := p.job.Load(); w != seen {
			return w
		}
		if spins < hotSpins {
			continue // hot: within a step the next job follows in well under a µs
		}
		if spins%16 == 0 {
			now := time.Now()
			if deadline.IsZero() {
				deadline = now.Add(spinFor)
			} else if now.After(deadline) {
				return p.park(seen)
			}
		}
		// Let other goroutines, and other threads on this CPU, run between polls.
		runtime.Gosched()
		osYield()
	}
}

// park blocks until the job word moves past seen.
func (p *Pool) park(seen uint64) uint64 {
	p.sleepMu.Lock()
	defer p.sleepMu.Unlock()
	p.sleepers.Add(1)
	defer p.sleepers.Add(-1)
	for {
		if w := p.job.Load(); w != seen {
			return w
		}
		p.wake.Wait()
	}
}
