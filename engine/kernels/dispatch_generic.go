//go:build purego || !(amd64 || arm64)

package kernels

// KernelName names the MatMul implementation this process uses: "avx512", "avx2" or "generic".
// The purego tag, and architectures without assembly kernels, always use the portable kernel.
func KernelName() string { return "generic" }

func matmulPanels(m *Matrix, y, x []float32, n, lo, hi int) { matmulGeneric(m, y, x, n, lo, hi) }

func streamRead(buf []uint64) uint64 { return streamReadGeneric(buf) }

// matmulLow runs a bf16 or int8 MatMul: here the widening fallback (see matmulWidened).
func matmulLow(m *Matrix, y, x []float32, n, lo, hi int) {
	matmulWidened(matmulGeneric, m, y, x, n, lo, hi)
}
