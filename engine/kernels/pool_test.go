package kernels

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParallelCoversEveryIndexOnce(t *testing.T) {
	for _, workers := range []int{0, 1, 2, 3, 4} {
		pool := NewPool(workers)
		require.Equal(t, max(1, workers), pool.Workers())
		for n := range 50 {
			for rep := range 3 {
				hits := make([]atomic.Int32, n)
				var calls atomic.Int32
				pool.Parallel(n, func(lo, hi int) {
					calls.Add(1)
					assert.Less(t, lo, hi)
					for i := lo; i < hi; i++ {
						hits[i].Add(1)
					}
				})
				for i := range hits {
					require.Equal(t, int32(1), hits[i].Load(), "workers=%d n=%d rep=%d index %d", workers, n, rep, i)
				}
				require.Equal(t, int32(min(max(1, workers), n)), calls.Load(), "one call per part")
			}
		}
		pool.Close()
	}
}

func TestParallelSplitIsFixed(t *testing.T) {
	pool := NewPool(3)
	defer pool.Close()
	var mu sync.Mutex
	got := map[[2]int]bool{}
	pool.Parallel(10, func(lo, hi int) { mu.Lock(); got[[2]int{lo, hi}] = true; mu.Unlock() })
	assert.Equal(t, map[[2]int]bool{{0, 3}: true, {3, 6}: true, {6, 10}: true}, got)
}

func TestParallelConcurrentCallers(t *testing.T) {
	pool := NewPool(2)
	defer pool.Close()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rep := range 200 {
				n := 1 + (g*7+rep)%40
				var sum atomic.Int64
				pool.Parallel(n, func(lo, hi int) {
					for i := lo; i < hi; i++ {
						sum.Add(int64(i))
					}
				})
				assert.Equal(t, int64(n*(n-1)/2), sum.Load())
			}
		}()
	}
	wg.Wait()
}

func TestParallelReraisesPanics(t *testing.T) {
	pool := NewPool(2)
	defer pool.Close()
	for _, part := range []int{0, 1} {
		assert.PanicsWithValue(t, "boom", func() {
			pool.Parallel(2, func(lo, hi int) {
				if lo == part {
					panic("boom")
				}
			})
		}, "panic in part %d", part)
		// The pool still works afterwards.
		var sum atomic.Int64
		pool.Parallel(4, func(lo, hi int) { sum.Add(int64(hi - lo)) })
		assert.Equal(t, int64(4), sum.Load())
	}
}

func TestCloseIsIdempotentAndParallelStillRuns(t *testing.T) {
	pool := NewPool(3)
	pool.Close()
	pool.Close()
	var sum atomic.Int64
	pool.Parallel(10, func(lo, hi int) { sum.Add(int64(hi - lo)) })
	assert.Equal(t, int64(10), sum.Load())
	var nilPool *Pool
	nilPool.Close()
	assert.Equal(t, 1, nilPool.Workers())
	nilPool.Parallel(3, func(lo, hi int) { sum.Add(int64(hi - lo)) })
	assert.Equal(t, int64(13), sum.Load())
}

func TestIdleWorkersParkAndWake(t *testing.T) {
	// An idle engine must not burn CPU: after spinFor the workers block on the condition
	// variable. A new job must still wake them: part 0 (the caller) waits for the other parts
	// to start, which only the workers can do while the caller is busy.
	pool := NewPool(3)
	defer pool.Close()
	pool.Parallel(3, func(int, int) {})
	require.Eventually(t, func() bool { return pool.sleepers.Load() == 2 }, 5*time.Second, time.Millisecond)
	var started [3]atomic.Bool
	var woke atomic.Bool
	pool.Parallel(3, func(lo, _ int) {
		started[lo].Store(true)
		if lo != 0 {
			return
		}
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if started[1].Load() && started[2].Load() {
				woke.Store(true)
				return
			}
			time.Sleep(10 * time.Microsecond)
		}
	})
	assert.True(t, woke.Load(), "parked workers did not wake for a new job")
}

func TestParallelWaitsForSlowParts(t *testing.T) {
	// Parts much longer than joinSpinFor make the caller block in join; the last part to finish
	// must wake it, whichever goroutine runs it.
	pool := NewPool(3)
	defer pool.Close()
	for rep := range 20 {
		var done [3]atomic.Bool
		pool.Parallel(3, func(lo, _ int) {
			if (lo+rep)%3 != 0 {
				time.Sleep(time.Duration(1+rep%3) * time.Millisecond)
			}
			done[lo].Store(true)
		})
		for i := range done {
			require.True(t, done[i].Load(), "rep %d part %d not finished when Parallel returned", rep, i)
		}
	}
}

func TestParallelChunksCoversEveryIndexOnce(t *testing.T) {
	for _, workers := range []int{1, 2, 3} {
		pool := NewPool(workers)
		for _, n := range []int{0, 1, 2, 5, 17, 64, 100} {
			for _, chunk := range []int{-1, 0, 1, 3, 8, 1000} {
				hits := make([]atomic.Int32, n)
				pool.ParallelChunks(n, chunk, func(lo, hi int) {
					assert.Less(t, lo, hi)
					if chunk > 0 && workers > 1 && n > 1 {
						assert.LessOrEqual(t, hi-lo, chunk)
					}
					for i := lo; i < hi; i++ {
						hits[i].Add(1)
					}
				})
				for i := range hits {
					require.Equal(t, int32(1), hits[i].Load(), "workers=%d n=%d chunk=%d index %d", workers, n, chunk, i)
				}
			}
		}
		pool.Close()
	}
}

func TestParallelChunksRebalancesAroundASlowWorker(t *testing.T) {
	// The chunk that the first goroutine in runs blocks until every other chunk is done: only
	// possible if other goroutines take over the rest of its part.
	pool := NewPool(2)
	defer pool.Close()
	const n, chunk = 40, 2
	var done atomic.Int32
	var first atomic.Bool
	pool.ParallelChunks(n, chunk, func(lo, hi int) {
		if first.CompareAndSwap(false, true) {
			deadline := time.Now().Add(5 * time.Second)
			for done.Load() < n/chunk-1 && time.Now().Before(deadline) {
				time.Sleep(50 * time.Microsecond)
			}
		}
		done.Add(1)
	})
	assert.Equal(t, int32(n/chunk), done.Load())
	assert.True(t, first.Load())
}

func TestMatmulChunkKeepsWholeTiles(t *testing.T) {
	for _, panels := range []int{1, 7, 48, 128, 2000} {
		for _, workers := range []int{1, 2, 3} {
			c := matmulChunk(panels, workers)
			assert.GreaterOrEqual(t, c, 4)
			assert.Zero(t, c%4)
		}
	}
}
