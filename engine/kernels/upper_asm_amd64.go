//go:build amd64 && !goexperiment.simd && !purego

package kernels

// ClearUpper is a no-op without the SIMD kernels (see the SIMD build's doc).
func ClearUpper() {}
