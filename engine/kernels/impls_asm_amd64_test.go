//go:build amd64 && !goexperiment.simd && !purego

package kernels

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"
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

// BenchmarkMainTileInL1 is the float32 main tile's compute ceiling, beside the FMA probe in the
// same run: each kernel's main tile of a 64-token batch (AVX-512 4 panels × 6 tokens, AVX2 1 ×
// 6) over one column block (its kc columns) and its tokens' inputs, both in L1, on every
// worker. The batched matmul cannot beat its of-peak figure, whatever the memory does: on a
// 2-vCPU Xeon (family 6 model 167) the AVX-512 tile read 0.77-0.83 of the probe, where the
// whole matmul reads 0.61-0.68 with W from memory.
func BenchmarkMainTileInL1(b *testing.B) {
	const calls = 1000
	pool := NewPool(runtime.GOMAXPROCS(0))
	defer pool.Close()
	workers := pool.Workers()
	for _, k := range tileKernels() {
		P, T := k.shape(tokenBlock)
		kc := k.kc
		if kc == 0 {
			kc = 256
		}
		b.Run(k.name, func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 1))
			ws, xs, ys := make([][]float32, workers), make([][]float32, workers), make([][]float32, workers)
			for i := range workers {
				ws[i], xs[i], ys[i] = randSlice(r, P*PanelRows*kc), randSlice(r, T*kc), make([]float32, T*P*PanelRows)
			}
			peak := PeakFMA(pool, 100*time.Millisecond)
			tile := k.tiles[P][T]
			for b.Loop() {
				pool.Parallel(workers, func(lo, hi int) {
					for i := lo; i < hi; i++ {
						w, x, y := unsafe.Pointer(&ws[i][0]), unsafe.Pointer(&xs[i][0]), unsafe.Pointer(&ys[i][0])
						for range calls {
							tile(w, kc*PanelRows*4, x, kc*4, kc, y, P*PanelRows*4)
						}
					}
				})
			}
			rate := float64(2*P*PanelRows*T*kc*calls*workers) * float64(b.N) / b.Elapsed().Seconds() / 1e9
			b.ReportMetric(rate, "GFLOP/s")
			b.ReportMetric(peak, "peak-GFLOP/s")
			b.ReportMetric(rate/peak, "of-peak")
		})
	}
}
