//go:build arm64 && !purego

package kernels

import "unsafe"

// The NEON vector kernels cover the attention inner loops for head widths that are whole
// 16-element blocks (every preset's) and RMSNorm's sum of squares and scaling (whole blocks,
// the tail in Go); other widths, and the exponential, SwiGLU, MaxF32 and FirstAtLeast, run the
// portable code, which computes the same canonical bits (see the package doc).

func maxF32(x []float32) float32 { return maxF32Generic(x) }

func expShifted(dst, x []float32, shift float32) float64 { return expShiftedGeneric(dst, x, shift) }

func attnScores(scores, q, k []float32, stride, off, n int, scale float32) {
	hd := len(q)
	if n <= 0 {
		return
	}
	if hd%16 != 0 {
		attnScoresGeneric(scores, q, k, stride, off, n, scale)
		return
	}
	// AttnScores has checked that n rows of hd values at stride from off fit in k.
	attnScoresNEON(unsafe.Pointer(unsafe.SliceData(scores)), unsafe.Pointer(unsafe.SliceData(q)),
		unsafe.Pointer(&k[off]), stride*4, n, hd/16, scale)
}

func attnAccum(out, p, v []float32, stride, off, n int) {
	hd := len(out)
	if n <= 0 {
		return
	}
	if hd%16 != 0 {
		attnAccumGeneric(out, p, v, stride, off, n)
		return
	}
	// AttnAccum has checked that n rows of hd values at stride from off fit in v.
	attnAccumNEON(unsafe.Pointer(unsafe.SliceData(out)), unsafe.Pointer(unsafe.SliceData(p)),
		unsafe.Pointer(&v[off]), stride*4, n, hd/16)
}

func firstAtLeast(x []float32, v float32) int { return firstAtLeastGeneric(x, v) }

func sumSquares(x []float32) float64 {
	blocks := len(x) / 16
	if blocks == 0 {
		return sumSquaresGeneric(x)
	}
	var acc [16]float64
	sumSquaresNEON(unsafe.Pointer(unsafe.SliceData(x)), blocks, &acc)
	for j, v := range x[blocks*16:] { // the tail, as in sumSquaresGeneric
		acc[j] += float64(v) * float64(v)
	}
	return fold16(&acc)
}

func scaleMul(dst, x, g []float32, s float32) {
	blocks := len(dst) / 16
	if blocks > 0 {
		x, g = x[:len(dst)], g[:len(dst)]
		scaleMulNEON(unsafe.Pointer(unsafe.SliceData(dst)), unsafe.Pointer(unsafe.SliceData(x)),
			unsafe.Pointer(unsafe.SliceData(g)), blocks, s)
	}
	if i := blocks * 16; i < len(dst) {
		scaleMulGeneric(dst[i:], x[i:], g[i:], s)
	}
}

func swiglu(a, g, u []float32) { swigluGeneric(a, g, u) }

// attnScoresNEON is attnScores for n >= 1 rows of blocks×16 values, strides in bytes.
//
//go:noescape
func attnScoresNEON(scores, q, k unsafe.Pointer, stride, n, blocks int, scale float32)

// sumSquaresNEON adds the squares of blocks×16 values at x into acc[i mod 16], from zero.
//
//go:noescape
func sumSquaresNEON(x unsafe.Pointer, blocks int, acc *[16]float64)

// scaleMulNEON is scaleMul for blocks×16 values.
//
//go:noescape
func scaleMulNEON(dst, x, gain unsafe.Pointer, blocks int, s float32)

// attnAccumNEON is attnAccum for n >= 1 slots of blocks×16 values, strides in bytes.
//
//go:noescape
func attnAccumNEON(out, p, v unsafe.Pointer, stride, n, blocks int)
