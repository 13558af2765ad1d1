//go:build purego || !(amd64 || arm64)

package kernels

// ClearUpper is a no-op without the SIMD kernels (see the SIMD build's doc).
func ClearUpper() {}
