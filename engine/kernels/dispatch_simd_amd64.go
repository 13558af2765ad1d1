//go:build goexperiment.simd && amd64 && !purego

package kernels

import "simd/archsimd"

// This build runs the archsimd tiles (kernels_avx512_amd64.go, kernels_avx2_amd64.go).

var (
	avx512Kernel = simdKernel{name: "avx512", tiles: &k512Tiles, t1: 7, shape: avx512Shape}
	avx2Kernel   = simdKernel{name: "avx2", tiles: &k256Tiles, t1: 6, shape: avx2Shape}
)

// w8a8UseAVX2 selects the AVX2 W8A8 tiles (w8a8_avx2_amd64.s, Go assembly in this build
// too) on the CPUs w8a8UseVNNI leaves to them.
var w8a8UseAVX2 = archsimd.X86.AVX2() && archsimd.X86.FMA()

// activeKernel is chosen once from the CPU's features; nil means the portable kernel.
var activeKernel = selectKernel()

func selectKernel() *simdKernel {
	switch {
	case archsimd.X86.AVX512():
		return &avx512Kernel
	case archsimd.X86.AVX2() && archsimd.X86.FMA():
		return &avx2Kernel
	}
	return nil
}

// buildMode is what KernelBuild reports: the simd/archsimd experiment's kernels.
const buildMode = "archsimd, GOEXPERIMENT=simd"

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

// avx512Shape is the AVX-512 main tile for n tokens (32 registers: up to 4×2 or 2×4 accumulator
// groups, with several panels when n is small so independent chains hide the FMA latency).
func avx512Shape(n int) (p, t int) {
	if n <= 2 {
		return 4, n
	}
	return 2, min(n, 4)
}

// matmulLow runs a bf16 or int8 MatMul: the assembly tiles that read the precision directly
// (low_amd64.go) where the CPU has them, else the widening fallback (see matmulWidened).
func matmulLow(m *Matrix, y, x []float32, n, lo, hi int) {
	if k := lowKernel(m.Prec, archsimd.X86.AVX512(), archsimd.X86.AVX2() && archsimd.X86.FMA()); k != nil {
		matmulSIMD(k, m, y, x, n, lo, hi)
		return
	}
	matmulWidened(matmulGeneric, m, y, x, n, lo, hi)
}
