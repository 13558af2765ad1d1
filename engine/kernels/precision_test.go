package kernels

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/x448/float16"
)

// lowImpls is every kernel that runs a bf16 or int8 MatMul here: the widening fallback over
// each float32 kernel, then the kernels that read the precision directly.
func lowImpls() []impl {
	var out []impl
	for _, k := range allImpls() {
		out = append(out, impl{"widened/" + k.name, func(m *Matrix, y, x []float32, n, lo, hi int) { matmulWidened(k.run, m, y, x, n, lo, hi) }})
	}
	return append(out, lowSIMDImpls()...)
}

func TestBF16Rounding(t *testing.T) {
	for _, tc := range []struct {
		in   float32
		want uint16
	}{
		{1, 0x3f80}, {-2, 0xc000}, {0, 0}, {float32(math.Copysign(0, -1)), 0x8000},
		{math.Float32frombits(0x3f808000), 0x3f80}, // tie, to even (down)
		{math.Float32frombits(0x3f818000), 0x3f82}, // tie, to even (up)
		{math.Float32frombits(0x3f808001), 0x3f81}, // above the tie
		{math.MaxFloat32, 0x7f80},                  // rounds to +Inf, as the float conversion does
		{float32(math.Inf(-1)), 0xff80},
	} {
		assert.Equal(t, tc.want, ToBF16(tc.in), "%g (%#x)", tc.in, math.Float32bits(tc.in))
	}
	nan := ToBF16(float32(math.NaN()))
	assert.True(t, math.IsNaN(float64(FromBF16(nan))))
	assert.True(t, math.IsNaN(float64(FromBF16(ToBF16(math.Float32frombits(0x7f800001))))), "a NaN whose payload is in the low half")
	r := rand.New(rand.NewPCG(1, 1))
	for range 10000 {
		f := float32(r.NormFloat64())
		g := RoundBF16(f)
		assert.LessOrEqual(t, math.Abs(float64(g-f)), math.Abs(float64(f))*0x1p-8, "%g", f)
	}
}

func TestQuantizeInt8(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	w := randSlice(r, Int8Block)
	var q [Int8Block]int8
	s, err := QuantizeInt8(q[:], w)
	require.NoError(t, err)
	var amax float64
	for _, v := range w {
		amax = max(amax, math.Abs(float64(v)))
	}
	// The scale is max|w|/127 rounded up to a float16 value: at least it, within one float16
	// step above.
	f16 := float16.Fromfloat32(s)
	assert.Equal(t, s, f16.Float32(), "a float16 value")
	assert.GreaterOrEqual(t, s, float32(amax)/127)
	assert.Less(t, float16.Frombits(f16.Bits()-1).Float32(), float32(amax)/127)
	for i, v := range w {
		eff := float32(q[i]) * s
		assert.LessOrEqual(t, math.Abs(float64(eff-v)), float64(s)*0.5001, "weight %d", i)
	}
	// Blocks whose scale is a float16 subnormal keep the half-step bound, down to the smallest
	// one; one beyond float16's range times 127 is refused.
	for _, c := range []struct {
		amax float32
		zero bool
	}{{1e-4, false}, {1e-6, false}, {1e-9, false}, {0, true}} {
		ws := make([]float32, Int8Block)
		for i := range ws {
			ws[i] = c.amax * float32(i-16) / 16
		}
		s, err := QuantizeInt8(q[:], ws)
		require.NoError(t, err)
		if c.zero {
			assert.Zero(t, s)
			assert.Equal(t, [Int8Block]int8{}, q)
			continue
		}
		for i, v := range ws {
			assert.LessOrEqual(t, math.Abs(float64(float32(q[i])*s-v)), float64(s)*0.5001, "max %g weight %d", c.amax, i)
		}
	}
	ws := make([]float32, Int8Block)
	ws[5] = 1e7
	_, err = QuantizeInt8(q[:], ws)
	require.ErrorIs(t, err, ErrPrecision)
	s, err = QuantizeInt8(q[:], make([]float32, Int8Block))
	require.NoError(t, err)
	assert.Zero(t, s)
	assert.Equal(t, [Int8Block]int8{}, q)
	w[3] = float32(math.NaN())
	_, err = QuantizeInt8(q[:], w)
	require.ErrorIs(t, err, ErrPrecision)
	w[3] = float32(math.Inf(1))
	_, err = QuantizeInt8(q[:], w)
	require.ErrorIs(t, err, ErrPrecision)
}

func TestParsePrecision(t *testing.T) {
	for _, p := range []Precision{F32, BF16, Int8, W8A8} {
		got, err := ParsePrecision(p.String())
		require.NoError(t, err)
		assert.Equal(t, p, got)
	}
	got, err := ParsePrecision("int8-dot")
	require.NoError(t, err)
	assert.Equal(t, W8A8, got)
	_, err = ParsePrecision("fp8")
	require.ErrorIs(t, err, ErrPrecision)
	assert.ErrorContains(t, err, "w8a8")
	assert.InDelta(t, 1.125, Int8.BytesPerWeight(), 1e-9)
	assert.InDelta(t, 1.0625, W8A8.BytesPerWeight(), 1e-9)
	assert.Equal(t, 2.0, BF16.BytesPerWeight())
}

// effective returns the row-major effective weights of m.
func effective(m *Matrix) []float32 {
	w := make([]float32, m.Rows*m.Cols)
	for r := range m.Rows {
		m.Row(w[r*m.Cols:(r+1)*m.Cols], r)
	}
	return w
}

func TestLowPrecisionPacking(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	for _, sh := range [][2]int{{1, 32}, {5, 64}, {16, 2}, {17, 96}, {40, 176}, {3, 36}} {
		rows, cols := sh[0], sh[1]
		a, b := randSlice(r, (rows/2)*cols), randSlice(r, (rows-rows/2)*cols)
		w := append(append([]float32(nil), a...), b...)
		bf, err := PackStackedAs(BF16, nil, rows, cols, a, b)
		require.NoError(t, err)
		assert.Equal(t, int64(bf.Panels()*PanelRows*cols*2), bf.Bytes())
		got := effective(bf)
		for i := range w {
			require.Equal(t, RoundBF16(w[i]), got[i], "bf16 %dx%d value %d", rows, cols, i)
		}
		q, err := PackStackedAs(Int8, nil, rows, cols, a, b)
		require.NoError(t, err)
		assert.Equal(t, int64(q.Panels()*((cols+31)/32*64+cols*16)), q.Bytes())
		got = effective(q)
		var qb [Int8Block]int8
		for r := range rows {
			for blk := 0; blk*Int8Block < cols; blk++ {
				src := w[r*cols+blk*Int8Block : r*cols+min(cols, (blk+1)*Int8Block)]
				s, err := QuantizeInt8(qb[:], src)
				require.NoError(t, err)
				for k := range src {
					require.Equal(t, float32(qb[k])*s, got[r*cols+blk*Int8Block+k], "int8 %dx%d row %d col %d", rows, cols, r, blk*Int8Block+k)
				}
			}
		}
		// Repacking reuses the memory of the same precision only.
		again, err := PackStackedAs(BF16, bf, rows, cols, w)
		require.NoError(t, err)
		assert.Same(t, bf, again)
		other, err := PackStackedAs(Int8, bf, rows, cols, w)
		require.NoError(t, err)
		assert.NotSame(t, bf, other)
	}
}

func TestLowPrecisionRejectsShapesAndValues(t *testing.T) {
	_, err := PackStackedAs(BF16, nil, 2, 3, make([]float32, 6))
	require.ErrorIs(t, err, ErrPrecision, "odd columns")
	w := make([]float32, 64)
	w[40] = float32(math.Inf(-1))
	_, err = PackStackedAs(Int8, nil, 2, 32, w)
	require.ErrorIs(t, err, ErrPrecision, "a non-finite weight")
	_, err = PackStackedAs(Precision(9), nil, 2, 32, make([]float32, 64))
	require.ErrorIs(t, err, ErrPrecision)
}

// lowShapes have even columns (bf16 needs pairs), with and without a short last int8 block,
// rows around panel multiples.
var lowShapes = [][2]int{{1, 32}, {3, 2}, {16, 30}, {17, 96}, {31, 64}, {50, 176}, {64, 34}, {97, 128}, {5, 66}}

func TestLowPrecisionMatMulIsFloat32OfEffectiveWeights(t *testing.T) {
	// Every kernel of a low precision gives the float32 kernels' bits on the effective weights.
	r := rand.New(rand.NewPCG(4, 4))
	impls := lowImpls()
	t.Logf("low-precision kernels under test: %d", len(impls))
	for _, prec := range []Precision{BF16, Int8} {
		// 320 and 300 columns take three column blocks on AVX-512, the last one short (by a
		// whole int8 block and by part of one).
		for _, sh := range append(lowShapes, [2]int{200, 320}, [2]int{72, 300}) {
			rows, cols := sh[0], sh[1]
			w := randSlice(r, rows*cols)
			m, err := PackStackedAs(prec, nil, rows, cols, w)
			require.NoError(t, err)
			ref, err := NewMatrix(effective(m), rows, cols)
			require.NoError(t, err)
			for _, n := range batchSizes {
				x := randSlice(r, n*cols)
				want := make([]float32, n*rows)
				matMulWith(impl{"generic", matmulGeneric}, nil, ref, want, x, n)
				for _, k := range impls {
					got := make([]float32, n*rows+3)
					matMulWith(k, nil, m, got, x, n)
					requireSameBits(t, want, got[:n*rows], "%s %s %dx%d n=%d", prec, k.name, rows, cols, n)
					require.Equal(t, make([]float32, 3), got[n*rows:], "%s wrote past its outputs", k.name)
				}
			}
		}
	}
}

func TestLowPrecisionMatMulIsBatchInvariant(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	for _, workers := range []int{1, 3} {
		pool := NewPool(workers)
		for _, prec := range []Precision{BF16, Int8} {
			for _, sh := range [][2]int{{17, 32}, {130, 64}, {200, 96}} {
				rows, cols := sh[0], sh[1]
				m, err := PackStackedAs(prec, nil, rows, cols, randSlice(r, rows*cols))
				require.NoError(t, err)
				for _, n := range []int{1, 2, 5, 7, 13, 64, 65} {
					requireBatchInvariant(t, r, pool, m, n, prec.String())
				}
			}
		}
		pool.Close()
	}
}
