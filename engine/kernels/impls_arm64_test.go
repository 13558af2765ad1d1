//go:build arm64 && !purego

package kernels

// simdImpls is the NEON kernel, which every arm64 CPU can run.
func simdImpls() []impl { return []impl{{"neon", matmulNEON}} }
