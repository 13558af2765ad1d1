package offload

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// spinYields is how many times a copy goroutine yields, looking for work, before it blocks:
// about a quarter of a millisecond when nothing else is runnable. A blocked goroutine takes tens
// of microseconds to wake on a virtual machine, which on a 2-core machine left the helper idle
// for a third of every transfer's copy; yielding gives the core to any runnable goroutine
// (the kernel pool's workers) meanwhile.
const spinYields = 1000

// DefaultSplitBytes is the transfer size (Config.SplitBytes) from which the worker side splits
// a transfer's copy across Config.CopyThreads goroutines: below it, waking helpers costs more
// than the copy they would share.
const DefaultSplitBytes = 256 << 10

// piece is one block of a transfer's copy: src copied into dst (or, with dst nil, only
// checksummed), with the three part checksums it yields (see checksumUpdate).
type piece struct {
	dst, src []float32
	a, b, c  uint32
}

// do copies and checksums the piece.
func (p *piece) do() {
	if len(p.src) == 0 {
		return
	}
	if p.dst == nil {
		p.a, p.b, p.c = sum3(p.src)
		return
	}
	p.a, p.b, p.c = copySum3(p.dst, p.src)
}

// fold extends crc by the block checksums of ps, in order: the same value as copying the
// pieces one after the other with copySum.
func fold(crc uint32, ps []piece) uint32 {
	for i := range ps {
		if len(ps[i].src) > 0 {
			crc = combineSums(crc, ps[i].a, ps[i].b, ps[i].c)
		}
	}
	return crc
}

// copyPool runs the pieces of large transfers on several goroutines: the transfer's own and
// up to helpers more. The helpers are started when the first transfer is submitted and stop
// when the last in-flight one completes (acquire and release bracket each transfer), so a
// busy worker side keeps them across transfers and steps, while an idle one holds no
// goroutine: the connector has no Close, and nothing outlives the copies.
type copyPool struct {
	helpers int // 0: every copy runs on its transfer's goroutine

	shared atomic.Int64 // jobs offered to the helpers, for tests

	mu    sync.Mutex
	users int
	tasks chan *splitJob // nil while no transfer is in flight
}

// splitJob is one transfer's batch of pieces, shared by the goroutines that copy it: each
// takes the next piece until none is left.
type splitJob struct {
	ps   []piece
	next atomic.Int64
	left atomic.Int64 // pieces not yet done
}

func (j *splitJob) work() {
	for {
		i := int(j.next.Add(1) - 1)
		if i >= len(j.ps) {
			return
		}
		j.ps[i].do()
		j.left.Add(-1)
	}
}

// wait returns once every piece is done: at most the one piece each helper holds, so the
// caller yields rather than blocks (see spinYields).
func (j *splitJob) wait() {
	for j.left.Load() > 0 {
		runtime.Gosched()
	}
}

func newCopyPool(threads int) *copyPool { return &copyPool{helpers: max(threads-1, 0)} }

// acquire registers a transfer in flight, starting the helpers for the first one.
func (p *copyPool) acquire() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.users++
	if p.users == 1 && p.helpers > 0 {
		p.tasks = make(chan *splitJob, p.helpers)
		for range p.helpers {
			go helper(p.tasks)
		}
	}
}

// release ends a transfer; after the last one the helpers finish what they hold and exit.
func (p *copyPool) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.users--
	if p.users == 0 && p.tasks != nil {
		close(p.tasks)
		p.tasks = nil
	}
}

func helper(tasks <-chan *splitJob) {
	for {
		j, ok := nextJob(tasks)
		if !ok {
			return
		}
		j.work()
	}
}

// nextJob receives the next job, yielding for a while before it blocks (see spinYields); ok is
// false once tasks is closed.
func nextJob(tasks <-chan *splitJob) (*splitJob, bool) {
	for range spinYields {
		select {
		case j, ok := <-tasks:
			return j, ok
		default:
			runtime.Gosched()
		}
	}
	j, ok := <-tasks
	return j, ok
}

// run copies ps, split across the helpers when split is set; the caller must hold an acquire.
// It returns once every piece is done. A helper that is busy elsewhere (the other direction's
// transfer) and gets to the job late finds no piece left and touches nothing.
func (p *copyPool) run(ps []piece, split bool) {
	if !split || p.helpers == 0 || len(ps) < 2 {
		for i := range ps {
			ps[i].do()
		}
		return
	}
	j := &splitJob{ps: ps}
	j.left.Store(int64(len(ps)))
	p.shared.Add(1)
	p.mu.Lock()
	tasks := p.tasks
	p.mu.Unlock()
	for range min(p.helpers, len(ps)-1) {
		select {
		case tasks <- j:
		default: // every helper has work queued: the caller copies more itself
		}
	}
	j.work()
	j.wait()
}
