//go:build !(goexperiment.simd && amd64)

package main

const simdExperiment = false

// simdState says that the experiment is not compiled in, and that nothing needs it: the
// kernels line names the kernels in use (assembly on amd64 and arm64).
func simdState() string {
	return "off (GOEXPERIMENT=simd not set; not needed, see kernels)"
}
