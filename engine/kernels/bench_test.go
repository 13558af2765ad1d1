package kernels

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
)

// packCopies packs copies copies of the row-major w at precision prec, for benchmarks that
// cycle through them so that W comes from further out in the memory hierarchy.
func packCopies(b *testing.B, prec Precision, w []float32, rows, cols, copies int) []*Matrix {
	b.Helper()
	ms := make([]*Matrix, copies)
	for i := range ms {
		var err error
		if ms[i], err = PackStackedAs(prec, nil, rows, cols, w); err != nil {
			b.Fatal(err)
		}
	}
	return ms
}

// benchMatMul reports GFLOP/s (2·rows·cols·n flops per call) of kernel k. With copies > 1 it
// cycles through that many copies of W, so each call reads W from further out in the memory
// hierarchy ("cold"); 1 keeps W in cache ("hot").
func benchMatMul(b *testing.B, k impl, workers, rows, cols, n, copies int) {
	r := rand.New(rand.NewPCG(1, 1))
	ms := packCopies(b, F32, randSlice(r, rows*cols), rows, cols, copies)
	x, y := randSlice(r, n*cols), make([]float32, n*rows)
	pool := NewPool(workers)
	defer pool.Close()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		matMulWith(k, pool, ms[i%copies], y, x, n)
	}
	reportMatMul(b, rows, cols, n, ms[0].Bytes())
}

func BenchmarkMatMul(b *testing.B) {
	cases := []struct {
		name                  string
		rows, cols, n, copies int
	}{
		{"matvec/32000x768", 32000, 768, 1, 2}, // 2×98 MB: past L2, partly past L3's share
		{"matvec/2048x768-cold", 2048, 768, 1, 64},
		{"matvec/768x768-hot", 768, 768, 1, 1},
		{"batch32/768x768", 768, 768, 32, 1},
		{"batch64/2048x768-cold", 2048, 768, 64, 32}, // stories110m's FFN at 64 concurrent, W from DRAM
		{"batch64/32000x768", 32000, 768, 64, 2},     // its classifier
	}
	for _, c := range cases {
		for _, k := range allImpls() {
			if k.name == "generic" && c.rows > 2048 {
				continue // minutes of scalar work for nothing new
			}
			for _, workers := range []int{1, 2} {
				b.Run(fmt.Sprintf("%s/%s/%dT", c.name, k.name, workers), func(b *testing.B) {
					benchMatMul(b, k, workers, c.rows, c.cols, c.n, c.copies)
				})
			}
		}
	}
}

func BenchmarkParallelForkJoin(b *testing.B) {
	pool := NewPool(2)
	defer pool.Close()
	for b.Loop() {
		pool.Parallel(2, func(int, int) {})
	}
}

func BenchmarkStreamReadBandwidth(b *testing.B) {
	for _, workers := range []int{1, 2} {
		b.Run(fmt.Sprintf("%dT", workers), func(b *testing.B) {
			pool := NewPool(workers)
			defer pool.Close()
			var gbs float64
			for b.Loop() {
				gbs = StreamReadBandwidth(pool, 512<<20)
			}
			b.ReportMetric(gbs, "GB/s")
		})
	}
}

// BenchmarkMatMulPrecision measures the active MatMul for each precision at the 1B shape's FFN
// down-projection (2048×8192, 64 MB in float32, so W comes from DRAM) for one token and for 64.
// W-GB/s is the stored bytes read per second, the figure to hold against StreamReadBandwidth.
// W8A8's figure includes quantizing the input, once per token and call.
// reportMatMul reports GFLOP/s (2·rows·cols·n per call) and W-GB/s (bytes of W per call).
func reportMatMul(b *testing.B, rows, cols, n int, bytes int64) {
	s := b.Elapsed().Seconds()
	b.ReportMetric(2*float64(rows*cols*n)*float64(b.N)/s/1e9, "GFLOP/s")
	b.ReportMetric(float64(bytes)*float64(b.N)/s/1e9, "W-GB/s")
}

func BenchmarkMatMulPrecision(b *testing.B) {
	const rows, cols = 2048, 8192
	r := rand.New(rand.NewPCG(1, 1))
	w := randSlice(r, rows*cols)
	pool := NewPool(runtime.GOMAXPROCS(0))
	defer pool.Close()
	for _, prec := range []Precision{F32, BF16, Int8, W8A8} {
		// Two copies, so that no call finds W in the last-level cache.
		ms := packCopies(b, prec, w, rows, cols, 2)
		for _, n := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/n=%d", prec, n), func(b *testing.B) {
				x, y := randSlice(r, n*cols), make([]float32, n*rows)
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					ms[i%2].MatMul(pool, y, x, n)
				}
				reportMatMul(b, rows, cols, n, ms[0].Bytes())
			})
		}
	}
}

// BenchmarkW8A8Kernels runs every W8A8 kernel this CPU has on the 1B shape's FFN
// down-projection (2048×8192), one after the other in one run, so each figure stands beside
// the others: up to 16 tokens cycle through enough copies of W to read it from memory (W-GB/s
// is the weight stream), 64 tokens keep W in cache (GFLOP/s).
func BenchmarkW8A8Kernels(b *testing.B) {
	const rows, cols = 2048, 8192
	r := rand.New(rand.NewPCG(1, 1))
	w := randSlice(r, rows*cols)
	pool := NewPool(runtime.GOMAXPROCS(0))
	defer pool.Close()
	// 32 copies (600 MB) pass any last-level cache a 2-core machine shares.
	ms := packCopies(b, W8A8, w, rows, cols, 32)
	for _, k := range w8a8Impls()[1:] {
		for _, n := range []int{1, 2, 4, 8, 12, 16, 64} {
			b.Run(fmt.Sprintf("%s/n=%d", k.name, n), func(b *testing.B) {
				x, y := randSlice(r, n*cols), make([]float32, n*rows)
				copies := len(ms)
				if n > 16 {
					copies = 1
				}
				for i := 0; b.Loop(); i++ {
					matmulW8A8(pool, ms[i%copies], y, x, n, k.run)
				}
				reportMatMul(b, rows, cols, n, ms[0].Bytes())
			})
		}
	}
}
