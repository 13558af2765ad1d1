package kernels

import (
	"runtime"
	"time"
)

// peakStepsPerCall bounds one call of a probe loop: assembly is not preempted, so a call must
// stay short (about a millisecond) for the scheduler and the GC.
const peakStepsPerCall = 1 << 18

// PeakFMA measures the machine's float32 FMA throughput in GFLOP/s (1e9 flops/s, an FMA is
// two) for the MatMul kernel in use, on all of pool's workers at once: independent FMA chains
// on registers only, no memory traffic, the ceiling a compute-bound batched MatMul can reach.
// It reports the fastest of three passes of about d each, after one warm-up pass.
func PeakFMA(pool *Pool, d time.Duration) float64 {
	loop, flops := peakLoop()
	workers := pool.Workers()
	// Size a pass from one timed call, so that a pass lasts about d.
	start := time.Now()
	loop(peakStepsPerCall)
	calls := max(1, int(d/max(time.Since(start), time.Microsecond)))
	sums := make([]float32, workers)
	pass := func() time.Duration {
		start := time.Now()
		pool.Parallel(workers, func(lo, hi int) {
			for w := lo; w < hi; w++ {
				for range calls {
					sums[w] += loop(peakStepsPerCall)
				}
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
	return float64(workers*calls*peakStepsPerCall) * flops / best.Seconds() / 1e9
}

// peakChainsGeneric is the independent chains of the portable probe, as many as the portable
// kernel keeps per panel half.
const peakChainsGeneric = 8

// fmaPeakGeneric runs iters steps of peakChainsGeneric fma32 chains, the portable kernel's
// rounding emulation included (fmaFast inline, as in the matmul loop; its rare case never
// arises here), so its figure is the portable kernel's ceiling. Each step loads and converts
// its weights like a MatMul step does; x and the weights are not constants (the branch never
// runs), so the compiler can neither fold nor share the products.
func fmaPeakGeneric(iters int) float32 {
	var a0, a1, a2, a3, a4, a5, a6, a7 float32
	w := [peakChainsGeneric]float32{1, 1, 1, 1, 1, 1, 1, 1}
	x := float32(0.5)
	if iters < 0 {
		w, x = [peakChainsGeneric]float32{}, 0
	}
	for range iters {
		a0, _ = fmaFast(w[0], x, a0)
		a1, _ = fmaFast(w[1], x, a1)
		a2, _ = fmaFast(w[2], x, a2)
		a3, _ = fmaFast(w[3], x, a3)
		a4, _ = fmaFast(w[4], x, a4)
		a5, _ = fmaFast(w[5], x, a5)
		a6, _ = fmaFast(w[6], x, a6)
		a7, _ = fmaFast(w[7], x, a7)
	}
	return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7
}
