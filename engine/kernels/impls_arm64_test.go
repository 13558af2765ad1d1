//go:build arm64 && !purego

package kernels

// simdImpls is the NEON kernel, which every arm64 CPU can run.
func simdImpls() []impl { return []impl{{"neon", matmulNEON}} }

// lowSIMDImpls lists the kernels reading bf16 or int8 directly that this CPU can run: the
// NEON bf16 and int8 tiles.
func lowSIMDImpls() []impl { return []impl{{"neon", matmulLow}} }

// w8a8SIMDImpls is empty: arm64 runs the Go W8A8 kernel (no SDOT tiles yet).
func w8a8SIMDImpls() []w8a8Impl { return nil }
