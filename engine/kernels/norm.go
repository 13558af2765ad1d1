package kernels

import (
	"fmt"
	"math"
)

// RMSNorm writes dst[i] = (x[i]·inv)·g[i] with inv = 1/sqrt(mean(x²)+eps) and returns inv. The
// sum of squares is taken in float64 (each square exact) in the canonical 16-lane order of the
// package doc, and inv is rounded once to float32; so the result is bit-identical on every
// kernel path. dst may be x; g must be at least as long as x, and dst too.
func RMSNorm(dst, x, g []float32, eps float32) float32 {
	if len(dst) < len(x) || len(g) < len(x) {
		panic(fmt.Sprintf("kernels: RMSNorm: len(x)=%d, len(dst)=%d, len(g)=%d", len(x), len(dst), len(g)))
	}
	if len(x) == 0 {
		return 0
	}
	ss := sumSquares(x)
	inv := float32(1 / math.Sqrt(ss/float64(len(x))+float64(eps)))
	scaleMul(dst[:len(x)], x, g[:len(x)], inv)
	return inv
}

// SwiGLU writes a[i] = silu(g[i])·u[i] with silu(x) = x·sigmoid(x), from e = exp(-|x|) (the
// canonical float32 exponential, so no overflow for either sign): x/(1+e)·u for x >= 0, else
// (x·e)/(1+e)·u, each operation one float32 rounding. a may alias g or u; g and u must be at
// least as long as a. A NaN gate gives NaN (payload unspecified).
func SwiGLU(a, g, u []float32) {
	if len(g) < len(a) || len(u) < len(a) {
		panic(fmt.Sprintf("kernels: SwiGLU: len(a)=%d, len(g)=%d, len(u)=%d", len(a), len(g), len(u)))
	}
	if len(a) == 0 {
		return
	}
	swiglu(a, g[:len(a)], u[:len(a)])
}

// sumSquaresGeneric is Σ x[i]² in float64: element i into partial sum i mod 16, folded by
// fold16. (A fused multiply-add here is harmless: the float64 square of a float32 is exact.)
func sumSquaresGeneric(x []float32) float64 {
	var acc [16]float64
	i := 0
	for ; i+16 <= len(x); i += 16 {
		c := (*[16]float32)(x[i:])
		for j, v := range c {
			acc[j] += float64(v) * float64(v)
		}
	}
	for j, v := range x[i:] {
		acc[j] += float64(v) * float64(v)
	}
	return fold16(&acc)
}

// scaleMulGeneric writes dst[i] = (x[i]·s)·g[i] (two float32 roundings).
func scaleMulGeneric(dst, x, g []float32, s float32) {
	x, g = x[:len(dst)], g[:len(dst)]
	for i := range dst {
		dst[i] = float32(x[i]*s) * g[i]
	}
}

// swigluGeneric is SwiGLU in portable Go (lengths checked).
func swigluGeneric(a, g, u []float32) {
	g, u = g[:len(a)], u[:len(a)]
	for i, x := range g {
		e := expTerm(-float32(math.Abs(float64(x))), 0)
		den := 1 + e
		if x >= 0 {
			a[i] = float32(x/den) * u[i]
		} else {
			a[i] = float32(float32(x*e)/den) * u[i]
		}
	}
}
