package kernels

import (
	"fmt"
	"math"
)

// The softmax kernels share the sampler's treatment of special values: NaN counts as -Inf (it
// never gets probability mass) and +Inf as the largest float32, so every shifted argument stays
// finite while such a value still takes all the mass.

// MaxF32 returns the largest element of x with NaN read as -Inf and +Inf as math.MaxFloat32;
// it is -Inf when x is empty or holds only NaN and -Inf, and +0 when the maximum is a zero of
// either sign. The maximum is exact, so every implementation returns the same bits.
func MaxF32(x []float32) float32 { return maxF32(x) }

// SumExpShifted returns Σ exp(x_i − shift) over the elements of x that are neither NaN nor
// -Inf, each term the canonical float32 exponential of the package doc (argument x_i − shift
// clamped to [-87, 0], relative error below 2.5e-7, plus the rounding of the float32
// difference) and the terms added in float64 in the canonical 16-lane order. shift is meant to
// be MaxF32(x): elements above it count as exp(0) = 1, and +Inf counts as 1; a NaN shift is
// read as -Inf and +Inf as MaxFloat32, like the elements. The result depends only on x and
// shift, bit for bit, on every kernel path.
func SumExpShifted(x []float32, shift float32) float64 { return expShifted(nil, x, cleanF32(shift)) }

// ExpShifted writes dst[i] = exp(x_i − shift) with SumExpShifted's clamping and special values
// (0 for NaN and -Inf) and returns the float64 sum of the float32 values written, in
// SumExpShifted's order (so it equals SumExpShifted(x, shift)). dst may be x (in place); it
// must be at least as long as x.
func ExpShifted(dst, x []float32, shift float32) float64 {
	if len(dst) < len(x) {
		panic(fmt.Sprintf("kernels: ExpShifted: len(dst)=%d < len(x)=%d", len(dst), len(x)))
	}
	if len(x) == 0 {
		return 0
	}
	return expShifted(dst[:len(x)], x, cleanF32(shift))
}

// cleanF32 maps NaN to -Inf and +Inf to MaxFloat32, the sampler's convention.
func cleanF32(x float32) float32 {
	if x != x {
		return float32(math.Inf(-1))
	}
	return min(x, math.MaxFloat32)
}

// maxF32Generic is MaxF32 in portable Go. A zero maximum is returned as +0 so that the result
// does not depend on which of -0 and +0 a vector lane met first.
func maxF32Generic(x []float32) float32 {
	m := float32(math.Inf(-1))
	for _, v := range x {
		if v > m { // false for NaN
			m = v
		}
	}
	if m == 0 {
		return 0
	}
	return min(m, math.MaxFloat32)
}

// The canonical float32 exponential (see the package doc): d = k·ln2 + r with
// k = roundeven(d·log2 e) and |r| <= ln2/2 (ln2 split in two so that k·ln2 is exact to float32
// precision), then Cephes' expf polynomial e^r ≈ 1 + r + r²·P(r) (about 1 ulp) by Horner's rule
// in fused multiply-adds, and an exact scale by 2^k. d is clamped to [-87, 0], so k is in
// [-126, 0] and the result is a normal float32 (k = -126 only when r > 0.3).
const (
	expLo   = -87
	expLn2H = 0.693359375
	expLn2L = -2.12194440e-4
	expP0   = 1.9875691500e-4
	expP1   = 1.3981999507e-3
	expP2   = 8.3334519073e-3
	expP3   = 4.1665795894e-2
	expP4   = 1.6666665459e-1
	expP5   = 5.0000001201e-1
)

// exp32 is the canonical exponential of d, which the caller has clamped to [-87, 0]. Every
// operation is one float32 rounding (fma32 for the fused ones; the explicit conversions keep
// the compiler from fusing anything else), which is what each vector lane does. The fused
// steps take fmaFast inline; if any of them is in doubt, exp32Exact redoes d with fma32.
func exp32(d float32) float32 {
	if e, ok := exp32Fast(d); ok {
		return e
	}
	return exp32Exact(d)
}

// exp32Fast is exp32 with fmaFast for every fused step, and whether all of them were sure.
func exp32Fast(d float32) (float32, bool) {
	k := float32(math.RoundToEven(float64(float32(d * float32(math.Log2E)))))
	r, ok0 := fmaFast(k, -expLn2H, d)
	r, ok1 := fmaFast(k, -expLn2L, r)
	p, ok2 := fmaFast(expP0, r, expP1)
	p, ok3 := fmaFast(p, r, expP2)
	p, ok4 := fmaFast(p, r, expP3)
	p, ok5 := fmaFast(p, r, expP4)
	p, ok6 := fmaFast(p, r, expP5)
	e, ok7 := fmaFast(p, float32(r*r), float32(r+1))
	return float32(e * math.Float32frombits(uint32(int32(k)+127)<<23)), ok0 && ok1 && ok2 && ok3 && ok4 && ok5 && ok6 && ok7
}

// exp32Exact is exp32 with fma32 for every fused step: the reference, and exp32's rare case.
//
//go:noinline
func exp32Exact(d float32) float32 {
	k := float32(math.RoundToEven(float64(float32(d * float32(math.Log2E)))))
	r := fma32(k, -expLn2H, d)
	r = fma32(k, -expLn2L, r)
	p := fma32(expP0, r, expP1)
	p = fma32(p, r, expP2)
	p = fma32(p, r, expP3)
	p = fma32(p, r, expP4)
	p = fma32(p, r, expP5)
	e := fma32(p, float32(r*r), float32(r+1))
	return float32(e * math.Float32frombits(uint32(int32(k)+127)<<23))
}

// expTerm is one canonical term of ExpShifted: 0 for NaN and -Inf, else exp32 of the clamped
// difference. shift is clean (never NaN or +Inf), so v - shift is never NaN.
func expTerm(v, shift float32) float32 {
	if !(v >= -math.MaxFloat32) { // NaN and -Inf
		return 0
	}
	return exp32(min(max(float32(v-shift), expLo), 0))
}

// fold16 adds 16 partial sums in the canonical tree: lanes j and j+8, then j and j+4, then j
// and j+2, then 0 and 1. It is what folding one AVX-512 vector in halves does, and what the
// narrower vector sets reproduce.
func fold16[F float32 | float64](a *[16]F) F {
	var b [8]F
	for j := range b {
		b[j] = a[j] + a[j+8]
	}
	for j := range 4 {
		b[j] += b[j+4]
	}
	return (b[0] + b[2]) + (b[1] + b[3])
}

// expShiftedGeneric is ExpShifted (dst != nil) or SumExpShifted (dst == nil) in portable Go:
// element i goes to partial sum i mod 16, and fold16 adds the partials.
func expShiftedGeneric(dst, x []float32, shift float32) float64 {
	var acc [16]float64
	if dst == nil {
		for i, v := range x {
			acc[i&15] += float64(expTerm(v, shift))
		}
		return fold16(&acc)
	}
	dst = dst[:len(x)]
	for i, v := range x {
		e := expTerm(v, shift)
		dst[i] = e
		acc[i&15] += float64(e)
	}
	return fold16(&acc)
}

// FirstAtLeast returns the lowest index i with x[i] >= v, or -1 if there is none (NaN is never
// at least v). With v = MaxF32(x) it is the argmax with ties to the lowest index, +Inf
// counting as MaxFloat32 like everywhere here.
func FirstAtLeast(x []float32, v float32) int { return firstAtLeast(x, v) }

// firstAtLeastGeneric is FirstAtLeast in portable Go.
func firstAtLeastGeneric(x []float32, v float32) int {
	for i, e := range x {
		if e >= v {
			return i
		}
	}
	return -1
}
