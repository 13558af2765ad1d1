//go:build amd64 && !purego

package kernels

// Chains per step of the assembly probes: more than FMA units × FMA latency on every x86 core
// (2 × 4 or 5), so the loop is throughput-bound.
const (
	peakChains256 = 12
	peakChains512 = 24
)

// fmaPeak256 runs iters steps of peakChains256 register-only 8-lane FMA chains.
//
//go:noescape
func fmaPeak256(iters int)

// fmaPeak512 runs iters steps of peakChains512 register-only 16-lane FMA chains.
//
//go:noescape
func fmaPeak512(iters int)

// peakLoop returns the probe loop for the kernel in use and the float32 flops of one step.
func peakLoop() (func(iters int) float32, float64) {
	switch KernelName() {
	case "avx512":
		return func(n int) float32 { fmaPeak512(n); return 0 }, peakChains512 * 16 * 2
	case "avx2":
		return func(n int) float32 { fmaPeak256(n); return 0 }, peakChains256 * 8 * 2
	}
	return fmaPeakGeneric, peakChainsGeneric * 2
}
