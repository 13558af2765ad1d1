//go:build amd64 && !goexperiment.simd && !purego

package kernels

import "fmt"

// simdImpls lists the assembly kernels this CPU can run, so tests cover AVX2 on AVX-512
// machines too.
func simdImpls() []impl {
	var out []impl
	if hasAVX512 {
		out = append(out, impl{"avx512", func(m *Matrix, y, x []float32, n, lo, hi int) { matmulSIMD(&avx512Kernel, m, y, x, n, lo, hi) }})
		// Both forms of the batch-1 tile, whichever this CPU runs (batch1Prefetches).
		for _, pf := range []bool{false, true} {
			k := avx512Kernel
			k.tiles = batch1Table(&a512Tiles, a512P4T1Plain, pf)
			out = append(out, impl{fmt.Sprintf("avx512-batch1-prefetch=%v", pf), func(m *Matrix, y, x []float32, n, lo, hi int) { matmulSIMD(&k, m, y, x, n, lo, hi) }})
		}
	}
	if hasAVX2FMA {
		out = append(out, impl{"avx2", func(m *Matrix, y, x []float32, n, lo, hi int) { matmulSIMD(&avx2Kernel, m, y, x, n, lo, hi) }})
	}
	return out
}

// tileKernels lists the tile tables this CPU can run.
func tileKernels() []*simdKernel {
	var out []*simdKernel
	if hasAVX512 {
		out = append(out, &avx512Kernel)
	}
	if hasAVX2FMA {
		out = append(out, &avx2Kernel)
	}
	return out
}

// lowFeatures reports the CPU features the bf16 and int8 tiles select on.
func lowFeatures() (avx512, avx2 bool) { return hasAVX512, hasAVX2FMA }
