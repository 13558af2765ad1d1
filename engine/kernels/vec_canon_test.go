package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sameBits32 reports whether a and b hold the same float32 bits, every NaN counting as one
// value (NaN payloads are unspecified).
func sameBits32(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != a[i] && b[i] != b[i] {
			continue
		}
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// canonRow is a row of n values at an odd offset inside a larger buffer, so that the vector
// paths meet unaligned data; kind picks the distribution (plain, with specials, huge/tiny,
// float32 subnormals).
func canonRow(r *rand.Rand, n, kind int) []float32 {
	buf := make([]float32, n+7)
	x := buf[1+2*r.IntN(3):][:n]
	for i := range x {
		switch kind {
		case 0:
			x[i] = float32(r.NormFloat64() * 3)
		case 1:
			x[i] = specialRow(r, 1, true)[0]
		case 2: // -Inf scores from masks, zeros of both signs, far-below values
			switch r.IntN(5) {
			case 0:
				x[i] = ninf32
			case 1:
				x[i] = float32(math.Copysign(0, -1))
			case 2:
				x[i] = 0
			case 3:
				x[i] = float32(-100 * r.Float64())
			default:
				x[i] = float32(r.NormFloat64())
			}
		case 3:
			x[i] = float32(math.Ldexp(r.NormFloat64(), r.IntN(120)-60))
		default: // subnormals of both signs (below 2^-126), the smallest normals, plain values
			switch r.IntN(3) {
			case 0:
				x[i] = math.Float32frombits(uint32(r.IntN(1<<23)) | uint32(r.IntN(2))<<31)
			case 1:
				x[i] = float32(math.Copysign(0x1p-126, r.NormFloat64()))
			default:
				x[i] = float32(r.NormFloat64())
			}
		}
	}
	return x
}

// TestVecPathsBitIdentical runs every vector kernel path on rows of every length 0..300 (odd
// offsets, special values) and requires the portable path's bits exactly.
func TestVecPathsBitIdentical(t *testing.T) {
	impls := vecImpls()
	gen := impls[0]
	r := rand.New(rand.NewPCG(21, 22))
	shifts := []float32{0, 3, -1e30, 1e30, math.MaxFloat32, ninf32, 1e-30, -math.SmallestNonzeroFloat32}
	for _, impl := range impls[1:] {
		t.Run(impl.name, func(t *testing.T) {
			for n := 0; n <= 300; n++ {
				for kind := range 5 {
					x := canonRow(r, n, kind)
					require.Equal(t, math.Float32bits(gen.maxF32(x)), math.Float32bits(impl.maxF32(x)), "max n=%d kind=%d", n, kind)
					m := cleanF32(gen.maxF32(x))
					require.Equal(t, gen.first(x, m), impl.first(x, m), "first n=%d", n)
					for _, sh := range append(shifts, m) {
						want, got := make([]float32, n), make([]float32, n)
						ws := gen.expSum(want, x, sh)
						gs := impl.expSum(got, x, sh)
						require.True(t, sameBits32(want, got), "exp n=%d kind=%d shift=%v", n, kind, sh)
						require.Equal(t, math.Float64bits(ws), math.Float64bits(gs), "exp sum n=%d kind=%d shift=%v", n, kind, sh)
						require.Equal(t, math.Float64bits(ws), math.Float64bits(impl.expSum(nil, x, sh)), "sum only n=%d", n)
					}
					require.Equal(t, math.Float64bits(gen.sumSq(x)), math.Float64bits(impl.sumSq(x)), "sumsq n=%d kind=%d", n, kind)
					g, u := canonRow(r, n, 0), canonRow(r, n, kind)
					want, got := make([]float32, n), make([]float32, n)
					gen.scale(want, x, g, 0.37)
					impl.scale(got, x, g, 0.37)
					require.True(t, sameBits32(want, got), "scale n=%d kind=%d", n, kind)
					gen.swiglu(want, x, u)
					impl.swiglu(got, x, u)
					require.True(t, sameBits32(want, got), "swiglu n=%d kind=%d", n, kind)
				}
			}
		})
	}
}

// TestAttnPathsBitIdentical covers the attention kernels at every head width the models use
// (48: stories15m, 64: stories110m and the 1B-class models, 128) and odd ones, with odd
// strides and offsets, every block length up to 40 and -Inf-free random data.
func TestAttnPathsBitIdentical(t *testing.T) {
	impls := vecImpls()
	gen := impls[0]
	r := rand.New(rand.NewPCG(23, 24))
	widths := append([]int{1, 3, 15, 17, 31, 33, 40, 96, 112}, attnWidths...)
	for _, impl := range impls[1:] {
		t.Run(impl.name, func(t *testing.T) {
			for _, hd := range widths {
				for n := 1; n <= 40; n++ {
					stride := hd + r.IntN(3)*hd + r.IntN(2)*(1+2*r.IntN(4)) // odd extra sometimes
					off := r.IntN(stride - hd + 1)
					rows := randSlice(r, (n-1)*stride+off+hd+r.IntN(5))
					q := canonRow(r, hd, 3*(n%2))
					scale := float32(1 / math.Sqrt(float64(hd)))
					want, got := make([]float32, n), make([]float32, n)
					gen.scores(want, q, rows, stride, off, n, scale)
					impl.scores(got, q, rows, stride, off, n, scale)
					require.True(t, sameBits32(want, got), "scores hd=%d n=%d stride=%d off=%d", hd, n, stride, off)
					p := make([]float32, n)
					gen.expSum(p, want, gen.maxF32(want))
					o1 := randSlice(r, hd)
					o2 := append([]float32(nil), o1...)
					gen.accum(o1, p, rows, stride, off, n)
					impl.accum(o2, p, rows, stride, off, n)
					require.True(t, sameBits32(o1, o2), "accum hd=%d n=%d stride=%d off=%d", hd, n, stride, off)
				}
			}
		})
	}
}

// TestExpCanonicalDefinition pins the canonical exponential: exp(0) is 1, the clamp floor
// gives a normal float32, and a few values are fixed (a change of polynomial or rounding
// would move them).
func TestExpCanonicalDefinition(t *testing.T) {
	assert.Equal(t, float32(1), exp32(0))
	assert.Equal(t, float32(1), exp32(float32(math.Copysign(0, -1))))
	lo := exp32(expLo)
	assert.GreaterOrEqual(t, lo, float32(math.SmallestNonzeroFloat32)*(1<<23), "normal at the floor")
	assert.InEpsilon(t, math.Exp(-87), float64(lo), 2.5e-7)
	for _, d := range []float32{-1, -0.5, -10, -0.346573} {
		assert.InEpsilon(t, math.Exp(float64(d)), float64(exp32(d)), 2.5e-7, "d=%v", d)
	}
	// ExpShifted reads a NaN shift as -Inf and +Inf as MaxFloat32, like the elements.
	x := []float32{1, 2, nan32}
	assert.Equal(t, 2.0, SumExpShifted(x, nan32))
	assert.Equal(t, SumExpShifted(x, math.MaxFloat32), SumExpShifted(x, inf32))
	assert.Equal(t, float32(0), MaxF32([]float32{float32(math.Copysign(0, -1)), 0}))
	assert.False(t, math.Signbit(float64(MaxF32([]float32{float32(math.Copysign(0, -1))}))), "a zero max is +0")
}

func TestRMSNorm(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 26))
	for _, n := range []int{1, 7, 16, 33, 288, 768} {
		x, g := randSlice(r, n), randSlice(r, n)
		dst := make([]float32, n)
		inv := RMSNorm(dst, x, g, 1e-5)
		ss := 0.0
		for _, v := range x {
			ss += float64(v) * float64(v)
		}
		ref := 1 / math.Sqrt(ss/float64(n)+float64(float32(1e-5)))
		assert.InEpsilon(t, ref, float64(inv), 1e-7, "n=%d", n)
		for i := range x {
			assert.InDelta(t, float64(x[i])*ref*float64(g[i]), float64(dst[i]), 3e-7*math.Abs(float64(x[i])*ref*float64(g[i]))+1e-30)
		}
		inPlace := append([]float32(nil), x...)
		assert.Equal(t, inv, RMSNorm(inPlace, inPlace, g, 1e-5))
		assert.Equal(t, dst, inPlace, "in place")
	}
	assert.Equal(t, float32(0), RMSNorm(nil, nil, nil, 1e-5))
	assert.Panics(t, func() { RMSNorm(make([]float32, 2), make([]float32, 3), make([]float32, 3), 1e-5) })
	assert.Panics(t, func() { RMSNorm(make([]float32, 3), make([]float32, 3), make([]float32, 2), 1e-5) })
}

func TestSwiGLU(t *testing.T) {
	r := rand.New(rand.NewPCG(27, 28))
	for _, n := range []int{1, 9, 16, 50, 768, 2048} {
		g, u := randSlice(r, n), randSlice(r, n)
		for i := range g {
			g[i] *= 8
		}
		g[0] = 100
		if n > 1 {
			g[1] = -100
		}
		a := make([]float32, n)
		SwiGLU(a, g, u)
		for i, x := range g {
			want := float64(x) / (1 + math.Exp(-float64(x))) * float64(u[i])
			assert.InDelta(t, want, float64(a[i]), 1e-6*math.Abs(want)+1e-30, "x=%v", x)
		}
		inPlace := append([]float32(nil), g...)
		SwiGLU(inPlace, inPlace, u)
		assert.Equal(t, a, inPlace, "a may alias g")
	}
	a := []float32{0, 0, 0}
	SwiGLU(a, []float32{inf32, ninf32, nan32}, []float32{1, 1, 1})
	assert.Equal(t, inf32, a[0])
	assert.True(t, a[1] != a[1], "-Inf·e with e = 0 is NaN, as before the kernel existed")
	assert.True(t, a[2] != a[2], "NaN in, NaN out")
	assert.Panics(t, func() { SwiGLU(make([]float32, 3), make([]float32, 2), make([]float32, 3)) })
}

func BenchmarkNormSwiGLU(b *testing.B) {
	// Row widths of stories15m (288, ffn 768) and stories110m (768, ffn 2048).
	r := rand.New(rand.NewPCG(1, 1))
	for _, n := range []int{288, 768, 2048} {
		x, g, u := randSlice(r, n), randSlice(r, n), randSlice(r, n)
		dst := make([]float32, n)
		for _, impl := range vecImpls() {
			b.Run(fmt.Sprintf("rmsnorm/%d/%s", n, impl.name), func(b *testing.B) {
				for b.Loop() {
					ss := impl.sumSq(x)
					impl.scale(dst, x, g, float32(1/math.Sqrt(ss/float64(n)+1e-5)))
				}
			})
			b.Run(fmt.Sprintf("swiglu/%d/%s", n, impl.name), func(b *testing.B) {
				for b.Loop() {
					impl.swiglu(dst, x, u)
				}
			})
		}
	}
}

// TestExpRareStepMatchesEveryPath takes exp32 through its rare case: at these two inputs (found
// by a search over every float32 in [-1, 0)) one fused step's float64 sum has its low bits zero
// and is neither a float32 nor exact, so exp32 hands the element to exp32Exact. Every path must
// give the same bits there.
func TestExpRareStepMatchesEveryPath(t *testing.T) {
	x := []float32{math.Float32frombits(0xb51000c6), math.Float32frombits(0xb945d2f8)}
	for _, d := range x {
		require.True(t, expInDoubt(d), "d=%v must take the rare case", d)
		require.Equal(t, math.Float32bits(exp32Exact(d)), math.Float32bits(exp32(d)))
	}
	want := []float32{exp32Exact(x[0]), exp32Exact(x[1])}
	for _, impl := range vecImpls() {
		got := make([]float32, len(x))
		impl.expSum(got, x, 0)
		require.True(t, sameBits32(want, got), "%s: %v, want %v", impl.name, got, want)
	}
}

// expInDoubt reports whether some fused step of exp32(d) fails fmaFast's test.
func expInDoubt(d float32) bool {
	_, ok := exp32Fast(d)
	return !ok
}
