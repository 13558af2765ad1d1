package kernels

import (
	"runtime"
	"time"

	"github.com/rolloutkit/rollout/engine/hugepage"
)

// Bounds of StreamReadBandwidth's buffer.
const (
	minStreamBytes = 1 << 20
	maxStreamBytes = 16 << 30
	streamBlock    = 512 // bytes read per step of the read loop
)

// StreamReadBandwidth measures the machine's streaming read bandwidth in GB/s (1e9 bytes/s):
// it allocates a buffer of about bytes (clamped to [1 MiB, 16 GiB]; use several times the L3
// size to measure DRAM), splits it across pool's workers and times the fastest of three reads
// of the whole buffer after one warm-up pass. The read loop is the widest one this build has
// (AVX-512 or AVX2 on amd64, NEON on arm64, else unrolled 64-bit loads), the same instruction
// mix as the mat-vec kernels, so it is the ceiling a memory-bound decode can reach.
func StreamReadBandwidth(pool *Pool, bytes int) float64 {
	bytes = min(max(bytes, minStreamBytes), maxStreamBytes)
	workers := pool.Workers()
	blocks := bytes / streamBlock / workers * workers
	buf := make([]uint64, blocks*streamBlock/8)
	hugepage.Advise(buf) // as the packed weights: the ceiling of the same page size
	for i := range buf {
		buf[i] = uint64(i) * 0x9e3779b97f4a7c15 // touch every page; no zero-page sharing
	}
	sums := make([]uint64, workers)
	pass := func() time.Duration {
		start := time.Now()
		pool.Parallel(workers, func(lo, hi int) {
			for w := lo; w < hi; w++ {
				b0, b1 := w*blocks/workers, (w+1)*blocks/workers
				sums[w] += streamRead(buf[b0*streamBlock/8 : b1*streamBlock/8])
			}
		})
		return time.Since(start)
	}
	pass()
	best := time.Duration(1<<63 - 1)
	for range 3 {
		best = min(best, pass())
	}
	runtime.KeepAlive(sums)
	return float64(len(buf)*8) / best.Seconds() / 1e9
}

// streamReadGeneric folds buf (a whole number of streamBlocks) into a checksum with eight
// independent 64-bit loads per step.
func streamReadGeneric(buf []uint64) uint64 {
	var a0, a1, a2, a3, a4, a5, a6, a7 uint64
	for len(buf) >= 8 {
		b := buf[:8:8]
		a0 += b[0]
		a1 += b[1]
		a2 += b[2]
		a3 += b[3]
		a4 += b[4]
		a5 += b[5]
		a6 += b[6]
		a7 += b[7]
		buf = buf[8:]
	}
	return a0 ^ a1 ^ a2 ^ a3 ^ a4 ^ a5 ^ a6 ^ a7
}
