//go:build arm64 && !purego

package kernels

// simdImpls is the NEON kernel, which every arm64 CPU can run.
func simdImpls() []impl { return []impl{{"neon", matmulNEON}} }

// lowSIMDImpls lists the kernels reading bf16 or int8 directly that this CPU can run: the
// NEON bf16 and int8 tiles.
func lowSIMDImpls() []impl { return []impl{{"neon", matmulLow}} }
