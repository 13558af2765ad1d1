//go:build arm64 && !purego

package kernels

import (
	"math"
	"unsafe"
)

// The NEON vector kernels: the attention inner loops for head widths that are whole
// 16-element blocks (every preset's; other widths run the portable code), RMSNorm's sum of
// squares and scaling, the exponential (ExpShifted, SumExpShifted), SwiGLU, MaxF32 and
// FirstAtLeast. The assembly (neon_arm64.s, and vec_neon_arm64.s from gen_neon.go) works on
// whole blocks of 16 float32s, the canonical lane count; the wrappers below handle the tails
// and the final folds as the portable code defines them, so every path gives the same bits
// (see the package doc).

// maxF32 is MaxF32: the blocks' lane maxima, then the tail, in portable code (max is exact,
// and maxF32Generic makes a zero +0).
func maxF32(x []float32) float32 {
	blocks := len(x) / 16
	if blocks == 0 {
		return maxF32Generic(x)
	}
	var out [16]float32
	maxNEON(unsafe.Pointer(unsafe.SliceData(x)), blocks, &out)
	return max(maxF32Generic(out[:]), maxF32Generic(x[blocks*16:]))
}

// expShifted is ExpShifted (dst != nil) or SumExpShifted (dst == nil). A tail shorter than 16
// is padded with -Inf (which contributes exactly 0) and goes through the same kernel, so every
// element gets the same exponential and partial sum wherever it sits.
func expShifted(dst, x []float32, shift float32) float64 {
	blocks := len(x) / 16
	var acc [16]float64
	if blocks > 0 {
		var dp unsafe.Pointer
		if dst != nil {
			dst = dst[:len(x)] // the kernel writes whole blocks unchecked
			dp = unsafe.Pointer(unsafe.SliceData(dst))
		}
		expNEON(unsafe.Pointer(unsafe.SliceData(x)), dp, blocks, shift, &acc)
	}
	if rest := x[blocks*16:]; len(rest) > 0 {
		var buf [16]float32
		for i := range buf {
			buf[i] = float32(math.Inf(-1))
		}
		copy(buf[:], rest)
		bp := unsafe.Pointer(&buf)
		if dst == nil {
			expNEON(bp, nil, 1, shift, &acc)
		} else {
			expNEON(bp, bp, 1, shift, &acc)
			copy(dst[blocks*16:len(x)], buf[:len(rest)])
		}
	}
	return fold16(&acc)
}

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

// firstAtLeast is FirstAtLeast: the vector loop finds the first block with a hit (or none),
// the exact index is then found in portable code.
func firstAtLeast(x []float32, v float32) int {
	blocks := len(x) / 16
	if blocks == 0 {
		return firstAtLeastGeneric(x, v)
	}
	lo := 16 * firstGENEON(unsafe.Pointer(unsafe.SliceData(x)), blocks, v) // the tail when no block hits
	if i := firstAtLeastGeneric(x[lo:], v); i >= 0 {
		return lo + i
	}
	return -1
}

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

// swiglu is SwiGLU (lengths checked): whole blocks in NEON, the tail in portable code
// (elementwise, so the split does not enter the bits).
func swiglu(a, g, u []float32) {
	blocks := len(a) / 16
	if blocks > 0 {
		g, u = g[:len(a)], u[:len(a)]
		swigluNEON(unsafe.Pointer(unsafe.SliceData(a)), unsafe.Pointer(unsafe.SliceData(g)),
			unsafe.Pointer(unsafe.SliceData(u)), blocks)
	}
	n := blocks * 16
	swigluGeneric(a[n:], g[n:], u[n:])
}

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

// The kernels of vec_neon_arm64.s (generated by gen_neon.go); blocks >= 1 everywhere.

// maxNEON writes the lane maxima of blocks×16 values at p to out (element i into lane i mod
// 16, NaN never taken, from -Inf).
//
//go:noescape
func maxNEON(p unsafe.Pointer, blocks int, out *[16]float32)

// firstGENEON returns the first 16-element block at p holding an element >= v, or blocks.
//
//go:noescape
func firstGENEON(p unsafe.Pointer, blocks int, v float32) int

// expNEON writes the canonical exp(x_i − shift) of blocks×16 values at x to dst (unless dst is
// nil) and adds element i to acc[i mod 16] in float64; shift is clean (never NaN or +Inf).
//
//go:noescape
func expNEON(x, dst unsafe.Pointer, blocks int, shift float32, acc *[16]float64)

// swigluNEON is swiglu for blocks×16 elements; a may be gate or up.
//
//go:noescape
func swigluNEON(a, gate, up unsafe.Pointer, blocks int)
