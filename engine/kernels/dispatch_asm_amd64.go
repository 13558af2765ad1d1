//go:build amd64 && !goexperiment.simd && !purego

package kernels

// This build runs the generated assembly tiles (kernels_asm_avx512_amd64.s,
// kernels_asm_avx2_amd64.s), which need no GOEXPERIMENT: the default for `go build` and
// `go install` on amd64.

var (
	avx512Kernel = simdKernel{name: "avx512", tiles: batch1Table(&a512Tiles, a512P4T1Plain, prefetchBatch1), t1: 7, shape: avx512AsmShape, pf: a512P4T6PF, pfP: 4, pfT: 6,
		kc: avx512KC, acc: &a512TilesAcc, pfAcc: a512P4T6PFAcc}
	avx2Kernel = simdKernel{name: "avx2", tiles: &a256Tiles, t1: 6, shape: avx2Shape, pf: a256P1T6PF, pfP: 1, pfT: 6}
)

// avx512KC is the AVX-512 float32 main tile's column block: 4 panels × 128 columns are 32 KB
// of weights, which stay in a 48 KB L1 while the token tiles sweep them (bf16's is
// avx512BF16KC).
const avx512KC = 128

// avx512AsmShape is the assembly build's AVX-512 main tile for n tokens. Hand-allocated
// registers fit 4 panels × 6 tokens (24 accumulators, 4 weight and 2 broadcast registers of
// 32), three times the chains the FMA latency needs on two FMA ports, which the compiler's
// allocation of the archsimd tiles cannot hold without spilling.
func avx512AsmShape(n int) (p, t int) {
	if n <= 2 {
		return 4, n
	}
	return 4, min(n, 6)
}

// w8a8UseAVX2 selects the AVX2 W8A8 tiles (w8a8_avx2_amd64.s) on the CPUs w8a8UseVNNI
// leaves to them.
var w8a8UseAVX2 = hasAVX2FMA

// activeKernel is chosen once from the CPU's features; nil means the portable kernel.
var activeKernel = selectKernel()

func selectKernel() *simdKernel {
	switch {
	case hasAVX512:
		return &avx512Kernel
	case hasAVX2FMA:
		return &avx2Kernel
	}
	return nil
}

// buildMode is what KernelBuild reports: the generated Go assembly, no GOEXPERIMENT needed.
const buildMode = "assembly"

// KernelName names the MatMul implementation this process uses: "avx512", "avx2" or "generic".
func KernelName() string {
	if activeKernel == nil {
		return "generic"
	}
	return activeKernel.name
}

func matmulPanels(m *Matrix, y, x []float32, n, lo, hi int) {
	if activeKernel == nil {
		matmulGeneric(m, y, x, n, lo, hi)
		return
	}
	matmulSIMD(activeKernel, m, y, x, n, lo, hi)
}

// matmulLow runs a bf16 or int8 MatMul: the assembly tiles that read the precision directly
// where the CPU has them, else the widening fallback (see matmulWidened).
func matmulLow(m *Matrix, y, x []float32, n, lo, hi int) {
	if k := lowKernel(m.Prec, hasAVX512, hasAVX2FMA); k != nil {
		matmulSIMD(k, m, y, x, n, lo, hi)
		return
	}
	matmulWidened(matmulGeneric, m, y, x, n, lo, hi)
}
