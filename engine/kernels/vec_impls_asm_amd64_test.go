//go:build amd64 && !goexperiment.simd && !purego

package kernels

import "testing"

// vecImpls lists the portable vector kernels, the assembly build's wrappers without vector
// features, and every assembly set this CPU can run, so tests cover AVX2 on AVX-512 machines
// too.
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
	add("asm-nofeature", isaGeneric) // the wrappers on a CPU without AVX2+FMA
	if vecActive >= isaAVX2 {
		add("asm-avx2", isaAVX2)
	}
	if vecActive >= isaAVX512 {
		add("asm-avx512", isaAVX512)
	}
	return out
}

// TestVecSelfCheck runs the start-up self-check that gates the AVX-512 kernels on every set
// this CPU has; it must pass wherever they run, and the AVX2 set must pass it too.
func TestVecSelfCheck(t *testing.T) {
	if hasAVX2FMA && !vecSelfCheck(isaAVX2) {
		t.Error("AVX2 kernels fail the self-check")
	}
	if hasAVX512 && !vecSelfCheck(isaAVX512) {
		t.Error("AVX-512 kernels fail the self-check")
	}
	if !vecSelfCheck(isaGeneric) {
		t.Error("the portable kernels fail their own check")
	}
}
