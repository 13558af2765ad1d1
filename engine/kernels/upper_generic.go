//go:build !(goexperiment.simd && amd64)

package kernels

// ClearUpper is a no-op without the SIMD kernels (see the SIMD build's doc).
func ClearUpper() {}
