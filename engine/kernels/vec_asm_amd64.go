//go:build amd64 && !goexperiment.simd && !purego

package kernels

func maxF32(x []float32) float32 { return maxF32Generic(x) }

func expShifted(dst, x []float32, shift float32) float64 { return expShiftedGeneric(dst, x, shift) }

func attnScores(scores, q, k []float32, stride, off, n int, scale float32) {
	attnScoresGeneric(scores, q, k, stride, off, n, scale)
}

func attnAccum(out, p, v []float32, stride, off, n int) { attnAccumGeneric(out, p, v, stride, off, n) }

func firstAtLeast(x []float32, v float32) int { return firstAtLeastGeneric(x, v) }

func sumSquares(x []float32) float64 { return sumSquaresGeneric(x) }

func scaleMul(dst, x, g []float32, s float32) { scaleMulGeneric(dst, x, g, s) }

func swiglu(a, g, u []float32) { swigluGeneric(a, g, u) }
