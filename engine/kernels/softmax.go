package kernels

import (
	"fmt"
	"math"
)

// The softmax kernels share the sampler's treatment of special values: NaN counts as -Inf (it
// never gets probability mass) and +Inf as the largest float32, so every shifted argument stays
// finite while such a value still takes all the mass.

// MaxF32 returns the largest element of x with NaN read as -Inf and +Inf as math.MaxFloat32;
// it is -Inf when x is empty or holds only NaN and -Inf. The maximum is exact, so every
// implementation returns the same bits.
func MaxF32(x []float32) float32 { return maxF32(x) }

// SumExpShifted returns Σ exp(x_i − shift) over the elements of x that are neither NaN nor
// -Inf, each argument clamped to [-87, 0] as ExpNeg clamps it (a term 87 below the shift weighs
// under 2e-38 and cannot move a sum that includes the maximum). shift is meant to be MaxF32(x):
// elements above it count as exp(0) = 1, and +Inf counts as 1. The SIMD paths evaluate the
// exponential in float32 (relative error below 2.5e-7 per term, plus the rounding of the
// float32 difference x_i − shift) and add the terms in float64; the portable path is
// ExpNeg's float64 loop. The summation order depends only on len(x), so the result does too.
func SumExpShifted(x []float32, shift float32) float64 { return expShifted(nil, x, shift) }

// ExpShifted writes dst[i] = exp(x_i − shift) with SumExpShifted's clamping and special values
// (0 for NaN and -Inf) and returns the float64 sum of the float32 values written. dst may be x
// (in place); it must be at least as long as x.
func ExpShifted(dst, x []float32, shift float32) float64 {
	if len(dst) < len(x) {
		panic(fmt.Sprintf("kernels: ExpShifted: len(dst)=%d < len(x)=%d", len(dst), len(x)))
	}
	if len(x) == 0 {
		return 0
	}
	return expShifted(dst[:len(x)], x, shift)
}

// cleanF32 maps NaN to -Inf and +Inf to MaxFloat32, the sampler's convention.
func cleanF32(x float32) float32 {
	if x != x {
		return float32(math.Inf(-1))
	}
	return min(x, math.MaxFloat32)
}

// maxF32Generic is MaxF32 in portable Go.
func maxF32Generic(x []float32) float32 {
	m := float32(math.Inf(-1))
	for _, v := range x {
		if v > m { // false for NaN
			m = v
		}
	}
	return min(m, math.MaxFloat32)
}

// expShiftedGeneric is ExpShifted (dst != nil) or SumExpShifted (dst == nil) in portable Go:
// the float64 difference and ExpNeg, summed left to right (the float64 terms for
// SumExpShifted, the stored float32 ones for ExpShifted).
func expShiftedGeneric(dst, x []float32, shift float32) float64 {
	m := float64(shift)
	ninf := float32(math.Inf(-1))
	sum := 0.0
	if dst == nil {
		for _, v := range x {
			if v = cleanF32(v); v != ninf {
				sum += ExpNeg(min(float64(v)-m, 0))
			}
		}
		return sum
	}
	for i, v := range x {
		e := float32(0)
		if v = cleanF32(v); v != ninf {
			e = float32(ExpNeg(min(float64(v)-m, 0)))
		}
		dst[i] = e
		sum += float64(e)
	}
	return sum
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
