//go:build amd64 && !goexperiment.simd && !purego

package kernels

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
)

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

// BenchmarkColumnBlockPrefetch compares, in one run, the column-block prefetch as shipped
// (spread over the block's token tiles at half a line a step, where it has eight) with one line
// a step in the first four tiles, on the 1B shape's FFN matrices with W from memory (four
// copies, 256 MB, cycled). Only this build's AVX-512 kernel has column blocks.
func BenchmarkColumnBlockPrefetch(b *testing.B) {
	if !hasAVX512 {
		b.Skip("no AVX-512")
	}
	for _, shape := range [][2]int{{8192, 2048}, {2048, 8192}} {
		r := rand.New(rand.NewPCG(1, 1))
		w := randSlice(r, shape[0]*shape[1])
		ms := packCopies(b, F32, w, shape[0], shape[1], 4)
		for _, n := range []int{64, 32} {
			for _, dense := range []bool{true, false} {
				k := avx512Kernel
				k.kcPrefetchDense = dense
				name := map[bool]string{true: "dense", false: "spread"}[dense]
				b.Run(fmt.Sprintf("%dx%d/n=%d/%s", shape[0], shape[1], n, name), func(b *testing.B) {
					pool := NewPool(runtime.GOMAXPROCS(0))
					defer pool.Close()
					x, y := randSlice(r, n*shape[1]), make([]float32, n*shape[0])
					run := impl{name, func(m *Matrix, y, x []float32, n, lo, hi int) { matmulSIMD(&k, m, y, x, n, lo, hi) }}
					for i := 0; b.Loop(); i++ {
						matMulWith(run, pool, ms[i%len(ms)], y, x, n)
					}
					reportMatMul(b, shape[0], shape[1], n, ms[0].Bytes())
				})
			}
		}
	}
}

// BenchmarkBatch1Prefetch times both forms of the float32, bf16 and int8 batch-1 tiles, with
// and without their prefetch ahead, one after the other in one run, on the 1B shape's FFN
// matrices with W from memory (four copies cycled, 75-256 MB), so that any machine can check
// batch1Prefetches' choice for its CPU. W-GB/s is the figure to hold against the read
// bandwidth.
func BenchmarkBatch1Prefetch(b *testing.B) {
	if !hasAVX512 {
		b.Skip("no AVX-512")
	}
	pool := NewPool(runtime.GOMAXPROCS(0))
	defer pool.Close()
	for _, shape := range [][2]int{{2048, 8192}, {8192, 2048}} {
		r := rand.New(rand.NewPCG(1, 1))
		w := randSlice(r, shape[0]*shape[1])
		for _, prec := range []Precision{F32, BF16, Int8} {
			ms := packCopies(b, prec, w, shape[0], shape[1], 4)
			impls := simdImpls()
			if prec != F32 {
				impls = lowSIMDImpls()
			}
			for _, k := range impls {
				name, ok := strings.CutPrefix(k.name, "avx512-batch1-")
				if !ok {
					continue
				}
				b.Run(fmt.Sprintf("%dx%d/%s/%s", shape[0], shape[1], prec, name), func(b *testing.B) {
					x, y := randSlice(r, shape[1]), make([]float32, shape[0])
					for i := 0; b.Loop(); i++ {
						matMulWith(k, pool, ms[i%len(ms)], y, x, 1)
					}
					reportMatMul(b, shape[0], shape[1], 1, ms[0].Bytes())
				})
			}
		}
	}
}
