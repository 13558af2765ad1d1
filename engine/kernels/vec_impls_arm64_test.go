//go:build arm64 && !purego

package kernels

// vecImpls is the portable kernels and this build's dispatch, which runs NEON for every vector
// kernel (the attention ones at head widths of whole 16-element blocks).
func vecImpls() []vecImpl {
	neon := vecImpl{name: "neon", maxF32: maxF32, first: firstAtLeast, expSum: expShifted,
		scores: attnScores, accum: attnAccum, sumSq: sumSquares, scale: scaleMul, swiglu: swiglu}
	return []vecImpl{genericVecImpl(), neon}
}
