//go:build arm64 && !purego

package kernels

// simdImpls is the NEON kernel, which every arm64 CPU can run.
func simdImpls() []impl { return []impl{{"neon", matmulNEON}} }

// lowSIMDImpls lists the kernels reading bf16 or int8 directly that this CPU can run: the
// NEON bf16 and int8 tiles.
func lowSIMDImpls() []impl { return []impl{{"neon", matmulLow}} }

// w8a8SIMDImpls is the SDOT tiles where the CPU has the dot-product extension (qemu-user's
// default CPU has it).
func w8a8SIMDImpls() []w8a8Impl {
	if !w8a8UseSDOT {
		return nil
	}
	return []w8a8Impl{{"sdot", w8a8SDOT.run}}
}
