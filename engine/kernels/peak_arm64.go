//go:build arm64 && !purego

package kernels

// peakChainsNEON is the chains per step of the NEON probe: more than FMA pipes × FMA latency on
// current arm64 cores (up to 4 × 4), so the loop is throughput-bound.
const peakChainsNEON = 24

// fmaPeakNEON runs iters steps of peakChainsNEON register-only 4-lane VFMLA chains.
//
//go:noescape
func fmaPeakNEON(iters int)

// peakLoop returns the probe loop for the kernel in use and the float32 flops of one step.
func peakLoop() (func(iters int) float32, float64) {
	return func(n int) float32 { fmaPeakNEON(n); return 0 }, peakChainsNEON * 4 * 2
}
