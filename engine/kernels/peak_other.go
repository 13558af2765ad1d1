//go:build purego || !(amd64 || arm64)

package kernels

// peakLoop returns the probe loop for the kernel in use and the float32 flops of one step.
func peakLoop() (func(iters int) float32, float64) { return fmaPeakGeneric, peakChainsGeneric * 2 }
