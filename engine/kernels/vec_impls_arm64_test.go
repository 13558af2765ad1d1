//go:build arm64 && !purego

package kernels

// vecImpls is the portable kernels and this build's dispatch (NEON where it has a kernel).
func vecImpls() []vecImpl {
	neon := genericVecImpl()
	neon.name = "neon"
	neon.scores, neon.accum = attnScores, attnAccum
	neon.sumSq, neon.scale = sumSquares, scaleMul
	return []vecImpl{genericVecImpl(), neon}
}
