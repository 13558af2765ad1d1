//go:build purego || !(amd64 || arm64)

package kernels

// Prefetch is a no-op in the portable build (Go has no prefetch hint); see the SIMD builds.
func Prefetch(x []float32) {}
