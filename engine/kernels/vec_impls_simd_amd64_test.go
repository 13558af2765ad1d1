//go:build goexperiment.simd && amd64 && !purego

package kernels

// vecImpls lists the portable vector kernels and every SIMD set this CPU can run, so tests
// cover AVX2 on AVX-512 machines too.
func vecImpls() []vecImpl {
	out := []vecImpl{genericVecImpl()}
	add := func(name string, isa vecISA) {
		out = append(out, vecImpl{
			name:   name,
			maxF32: func(x []float32) float32 { return maxF32ISA(isa, x) },
			first:  func(x []float32, v float32) int { return firstAtLeastISA(isa, x, v) },
			expSum: func(dst, x []float32, shift float32) float64 { return expShiftedISA(isa, dst, x, shift) },
			scores: func(sc, q, k []float32, stride, off, n int, scale float32) {
				attnScoresISA(isa, sc, q, k, stride, off, n, scale)
			},
			accum:  func(out, p, v []float32, stride, off, n int) { attnAccumISA(isa, out, p, v, stride, off, n) },
			sumSq:  func(x []float32) float64 { return sumSquaresISA(isa, x) },
			scale:  func(dst, x, g []float32, s float32) { scaleMulISA(isa, dst, x, g, s) },
			swiglu: func(a, g, u []float32) { swigluISA(isa, a, g, u) },
		})
	}
	if vecActive >= isaAVX2 {
		add("avx2", isaAVX2)
	}
	if vecActive >= isaAVX512 {
		add("avx512", isaAVX512)
	}
	return out
}
