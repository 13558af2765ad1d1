//go:build amd64 && !purego

package kernels

import "fmt"

// lowSIMDImpls lists the kernels reading bf16 or int8 directly that this CPU can run.
func lowSIMDImpls() []impl {
	var out []impl
	avx512, avx2 := lowFeatures()
	add := func(name string, bf, i8 *simdKernel) {
		out = append(out, impl{name, func(m *Matrix, y, x []float32, n, lo, hi int) {
			k := bf
			if m.Prec == Int8 {
				k = i8
			}
			matmulSIMD(k, m, y, x, n, lo, hi)
		}})
	}
	if avx512 {
		add("avx512", &avx512BF16Kernel, &avx512Int8Kernel)
		// Both forms of the batch-1 tiles, whichever this CPU runs (batch1Prefetches).
		for _, pf := range []bool{false, true} {
			bf, i8 := avx512BF16Kernel, avx512Int8Kernel
			bf.tiles = batch1Table(&a512bf16Tiles, a512bf16P4T1Plain, pf)
			i8.tiles = batch1Table(&a512i8Tiles, a512i8P4T1Plain, pf)
			add(fmt.Sprintf("avx512-batch1-prefetch=%v", pf), &bf, &i8)
		}
	}
	if avx2 {
		add("avx2", &avx2BF16Kernel, &avx2Int8Kernel)
	}
	return out
}

// w8a8SIMDImpls lists the W8A8 kernels besides the Go one that this CPU can run: the AVX2
// tiles and, where the CPU has AVX-512 VNNI, the VNNI ones (both amd64 builds use them).
func w8a8SIMDImpls() []w8a8Impl {
	var impls []w8a8Impl
	if _, avx2 := lowFeatures(); avx2 {
		impls = append(impls, w8a8Impl{"avx2", w8a8AVX2.run})
	}
	if w8a8UseVNNI {
		impls = append(impls, w8a8Impl{"vnni-plain", w8a8VNNIPlain.run},
			w8a8Impl{"vnni-prefetch", w8a8VNNIPrefetch.run},
			w8a8Impl{"vnni-1panel", w8a8VNNIOnePanel.run})
	}
	if w8a8UseAMX {
		// amx-N sends only groups of at least N tokens to the AMX tiles: every tile width
		// (1), and the VNNI tiles for whatever is not a whole 16 tokens (16).
		for _, fewest := range []int{1, 16} {
			impls = append(impls, w8a8Impl{fmt.Sprintf("amx-%d", fewest), func(m *Matrix, a *w8a8Acts, y []float32, n, lo, hi int) {
				runW8A8AMX(&w8a8VNNI, fewest, m, a, y, n, lo, hi)
			}})
		}
	}
	return impls
}

// w8a8VNNIOnePanel is the VNNI tiles one panel at a time: the baseline of the two-panel
// tiles in BenchmarkW8A8Kernels.
var w8a8VNNIOnePanel = w8a8Tiles{one: w8a8VNNI.one}

// w8a8VNNIPlain and w8a8VNNIPrefetch are the VNNI tiles with each form of the two-panel
// tiles, whichever this CPU runs (batch1Prefetches), so that both are tested and timed on
// every machine.
var w8a8VNNIPlain, w8a8VNNIPrefetch = vnniTiles(false), vnniTiles(true)
