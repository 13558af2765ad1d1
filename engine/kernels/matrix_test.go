package kernels

import (
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func randSlice(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

// refMatMul is y = W·x in float64, with bound[t*rows+r] = Σ_k |W[r][k]·x[t][k]|.
func refMatMul(w, x []float32, rows, cols, n int) (y, bound []float64) {
	y, bound = make([]float64, n*rows), make([]float64, n*rows)
	for t := range n {
		for r := range rows {
			var s, b float64
			for k := range cols {
				p := float64(w[r*cols+k]) * float64(x[t*cols+k])
				s += p
				b += math.Abs(p)
			}
			y[t*rows+r], bound[t*rows+r] = s, b
		}
	}
	return y, bound
}

// exactFMA32 is a*b+c rounded once to float32, computed with big.Float.
func exactFMA32(a, b, c float32) float32 {
	var p, s big.Float
	p.SetPrec(200).Mul(big.NewFloat(float64(a)).SetPrec(200), big.NewFloat(float64(b)).SetPrec(200))
	s.SetPrec(200).Add(&p, big.NewFloat(float64(c)).SetPrec(200))
	f, _ := s.Float32()
	return f
}

func TestFMA32IsSingleRounding(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	check := func(a, b, c float32) {
		t.Helper()
		got, want := fma32(a, b, c), exactFMA32(a, b, c)
		if math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("fma32(%g, %g, %g) = %g (%#x), want %g (%#x)", a, b, c, got, math.Float32bits(got), want, math.Float32bits(want))
		}
	}
	for range 100000 {
		check(float32(r.NormFloat64()), float32(r.NormFloat64()), float32(r.NormFloat64()))
	}
	// Products that fall exactly on a float32 halfway point plus a tiny addend of either sign:
	// the float64 sum rounds back onto the halfway point, where a second rounding to float32
	// would go the wrong way for one of the signs.
	halfway := 0
	for range 20000 {
		a := float32(1 + float64(r.Uint32()>>9)*0x1p-23) // 24-bit mantissa
		b := float32(1.5)
		p := float64(a) * float64(b)
		if math.Float64bits(p)&(1<<29-1) == 1<<28 {
			halfway++
		}
		tiny := float32(math.Ldexp(1+r.Float64(), -60))
		check(a, b, tiny)
		check(a, b, -tiny)
		check(-a, b, tiny)
	}
	require.Greater(t, halfway, 1000, "the adversarial case must actually hit halfway points")
	// Float32 subnormal results, zeros, infinities and NaN.
	for range 20000 {
		a := float32(math.Ldexp(r.Float64()+0.5, -70-r.IntN(20)))
		b := float32(math.Ldexp(r.Float64()+0.5, -60))
		c := float32(math.Ldexp(r.NormFloat64(), -130-r.IntN(18)))
		check(a, b, c)
	}
	// Halfway points of float32's subnormal range (odd multiples of 2^-150), reached from an
	// inexact float64 sum: the low 29 bits are zero there, not 1<<28, and a second rounding
	// ties to even where the single rounding goes the other way.
	for i := range 2000 {
		c, a, b := subnormalHalfwayCase(r, i%2 == 1)
		require.False(t, roundsOnce(float64(a)*float64(b)+float64(c), float32(float64(a)*float64(b)+float64(c))))
		check(a, b, c)
		check(-a, b, -c)
	}
	inf := float32(math.Inf(1))
	check(0, 0, 0)
	check(-1, 0, 0)
	check(inf, 1, 1)
	check(math.MaxFloat32, 2, -math.MaxFloat32)
	assert.True(t, math.IsNaN(float64(fma32(float32(math.NaN()), 1, 1))))
	assert.True(t, math.IsNaN(float64(fma32(inf, 0, 1))))
}

func TestNewMatrixRejectsBadShapes(t *testing.T) {
	for _, tc := range []struct{ rows, cols, n int }{{0, 4, 0}, {4, 0, 0}, {-1, 4, 4}, {2, 3, 5}, {2, 3, 7}} {
		_, err := NewMatrix(make([]float32, tc.n), tc.rows, tc.cols)
		require.Error(t, err, "%dx%d with %d values", tc.rows, tc.cols, tc.n)
	}
}

func TestMatrixPackingRoundTrips(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, sh := range [][2]int{{1, 1}, {5, 3}, {16, 7}, {17, 16}, {40, 33}} {
		rows, cols := sh[0], sh[1]
		w := randSlice(r, rows*cols)
		m, err := NewMatrix(w, rows, cols)
		require.NoError(t, err)
		assert.Equal(t, (rows+15)/16, m.Panels())
		assert.Equal(t, int64(m.Panels()*16*cols*4), m.Bytes())
		row := make([]float32, cols)
		for i := range rows {
			m.Row(row, i)
			require.Equal(t, w[i*cols:(i+1)*cols], row, "row %d of %dx%d", i, rows, cols)
		}
	}
}

func TestStackedMatrixEqualsConcatenated(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, sh := range [][3]int{{16, 5, 3}, {7, 3, 2}, {40, 33, 1}, {33, 16, 17}} {
		a, b, cols := sh[0], sh[1], sh[2]
		pa, pb := randSlice(r, a*cols), randSlice(r, b*cols)
		want, err := NewMatrix(append(append([]float32(nil), pa...), pb...), a+b, cols)
		require.NoError(t, err)
		got, err := NewStackedMatrix(a+b, cols, pa, pb)
		require.NoError(t, err)
		require.Equal(t, want.data, got.data, "%dx%d + %dx%d", a, cols, b, cols)
	}
	_, err := NewStackedMatrix(2, 3, make([]float32, 4), make([]float32, 2))
	require.Error(t, err, "a part that is not whole rows")
	_, err = NewStackedMatrix(2, 3, make([]float32, 3))
	require.Error(t, err, "too few values")
}

// shapes covers rows and cols at, below and above multiples of 16 and of every tile size.
var shapes = [][2]int{{1, 1}, {3, 5}, {16, 16}, {17, 3}, {31, 64}, {48, 1}, {50, 37}, {64, 130}, {97, 20}, {130, 2}}

var batchSizes = []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 32, 49, 64}

func TestMatMulMatchesFloat64Reference(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	pool := NewPool(2)
	defer pool.Close()
	for _, sh := range shapes {
		rows, cols := sh[0], sh[1]
		w := randSlice(r, rows*cols)
		m, err := NewMatrix(w, rows, cols)
		require.NoError(t, err)
		for _, n := range batchSizes {
			x := randSlice(r, n*cols)
			want, bound := refMatMul(w, x, rows, cols, n)
			for _, k := range allImpls() {
				y := make([]float32, n*rows)
				matMulWith(k, pool, m, y, x, n)
				for i := range y {
					tol := 1e-5*bound[i] + 1e-30
					if d := math.Abs(float64(y[i]) - want[i]); d > tol {
						t.Fatalf("%s %dx%d n=%d: y[%d] = %g, want %g (|diff| %g > %g)", k.name, rows, cols, n, i, y[i], want[i], d, tol)
					}
				}
			}
		}
	}
}

func TestKernelsAreBitwiseIdentical(t *testing.T) {
	// Every path computes the same FMA chain per output, so they agree exactly, not just within
	// rounding: the generic kernel's fma32 rounds once, like VFMADD.
	r := rand.New(rand.NewPCG(7, 8))
	impls := allImpls()
	t.Logf("kernels under test: %d (active: %s)", len(impls), KernelName())
	for _, sh := range append(shapes, [2]int{200, 300}) {
		rows, cols := sh[0], sh[1]
		m, err := NewMatrix(randSlice(r, rows*cols), rows, cols)
		require.NoError(t, err)
		for _, n := range batchSizes {
			x := randSlice(r, n*cols)
			want := make([]float32, n*rows)
			matMulWith(impls[0], nil, m, want, x, n)
			for _, k := range impls[1:] {
				got := make([]float32, n*rows)
				matMulWith(k, nil, m, got, x, n)
				requireSameBits(t, want, got, "%s vs generic, %dx%d n=%d", k.name, rows, cols, n)
			}
		}
	}
}

// requireBatchInvariant multiplies n random tokens by m at once on pool and then each token
// alone (no pool), and requires the same bits for every token: what (the precision) names
// the case in a failure.
func requireBatchInvariant(t *testing.T, r *rand.Rand, pool *Pool, m *Matrix, n int, what string) {
	t.Helper()
	rows, cols := m.Rows, m.Cols
	x := randSlice(r, n*cols)
	y := make([]float32, n*rows)
	m.MatMul(pool, y, x, n)
	one := make([]float32, rows)
	for tok := range n {
		m.MatMul(nil, one, x[tok*cols:(tok+1)*cols], 1)
		requireSameBits(t, one, y[tok*rows:(tok+1)*rows], "%s workers=%d %dx%d n=%d token %d", what, pool.Workers(), rows, cols, n, tok)
	}
}

func requireSameBits(t *testing.T, want, got []float32, msg string, args ...any) {
	t.Helper()
	require.Len(t, got, len(want))
	for i := range want {
		if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
			t.Fatalf("%s: element %d: %g (%#x) != %g (%#x)", fmt.Sprintf(msg, args...), i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
}

func TestMatMulIsBatchInvariant(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for _, workers := range []int{1, 2, 3} {
		pool := NewPool(workers)
		for _, sh := range [][2]int{{17, 3}, {50, 37}, {130, 64}, {200, 33}} {
			rows, cols := sh[0], sh[1]
			m, err := NewMatrix(randSlice(r, rows*cols), rows, cols)
			require.NoError(t, err)
			for _, n := range batchSizes {
				requireBatchInvariant(t, r, pool, m, n, "f32")
			}
		}
		pool.Close()
	}
}

func TestMatMulWritesOnlyItsOutputs(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	pool := NewPool(2)
	defer pool.Close()
	const guard = 12345.5
	for _, sh := range [][2]int{{1, 4}, {17, 5}, {33, 9}} {
		rows, cols := sh[0], sh[1]
		m, err := NewMatrix(randSlice(r, rows*cols), rows, cols)
		require.NoError(t, err)
		for _, n := range []int{1, 3, 9} {
			x := randSlice(r, n*cols)
			y := make([]float32, n*rows+40)
			for i := range y {
				y[i] = guard
			}
			m.MatMul(pool, y, x, n)
			for i := n * rows; i < len(y); i++ {
				require.Equal(t, float32(guard), y[i], "%dx%d n=%d wrote y[%d]", rows, cols, n, i)
			}
			for i := range n * rows {
				require.NotEqual(t, float32(guard), y[i])
			}
		}
	}
}

func TestMatMulEdgeCases(t *testing.T) {
	m, err := NewMatrix([]float32{1, 2, 3, 4, 5, 6}, 2, 3)
	require.NoError(t, err)
	y := []float32{7, 7}
	m.MatMul(nil, y, nil, 0) // n=0 is a no-op
	assert.Equal(t, []float32{7, 7}, y)
	m.MatMul(nil, y, []float32{1, 0, -1}, 1)
	assert.Equal(t, []float32{-2, -2}, y)
	assert.Panics(t, func() { m.MatMul(nil, y, []float32{1, 2}, 1) }, "short x")
	assert.Panics(t, func() { m.MatMul(nil, y[:1], []float32{1, 2, 3}, 1) }, "short y")
	assert.Contains(t, []string{"generic", "avx2", "avx512", "neon"}, KernelName())
}

func TestMatMulRoundsOnceAtHalfwayPoints(t *testing.T) {
	// Row r is [tiny_r, a_r] and x is [1, 1.5]: the chain's second FMA adds a product that lies
	// exactly on a float32 halfway point to a tiny accumulator, the case where rounding through
	// float64 would double-round. Every kernel must give the single-rounded result.
	r := rand.New(rand.NewPCG(13, 14))
	const rows = 37
	w := make([]float32, rows*2)
	want := make([]float32, rows)
	for i := range rows {
		a := float32(1 + float64(r.Uint32()>>9|1)*0x1p-23)
		tiny := float32(math.Ldexp(1+r.Float64(), -60))
		if i%2 == 1 {
			tiny = -tiny
		}
		w[2*i], w[2*i+1] = tiny, a
		want[i] = exactFMA32(a, 1.5, tiny)
	}
	m, err := NewMatrix(w, rows, 2)
	require.NoError(t, err)
	x := []float32{1, 1.5}
	for _, k := range allImpls() {
		y := make([]float32, rows)
		matMulWith(k, nil, m, y, x, 1)
		requireSameBits(t, want, y, "%s", k.name)
	}
}

// subnormalHalfwayCase returns c, a, b with a·b+c just off a halfway point of float32's
// subnormal grid, onto which its float64 rounding falls, where ties-to-even picks the wrong
// neighbour. c = (2^22+j)·2^-149 with j odd lies in [2^-127, 2^-126), where float64's spacing
// is 2^-179. Down: a·b = 2^-150 − 2^-196, so the exact sum is just below the halfway point above
// c and rounds down to the odd c, while the tie goes up to the even neighbour. Up: a·b =
// 3·2^-150 + 19·2^-196 (14200343·14866277 = 3·2^46+19), just above the halfway point between
// c+2^-149 (even) and c+2^-148, so the single rounding goes up and the tie down.
func subnormalHalfwayCase(r *rand.Rand, up bool) (c, a, b float32) {
	c = float32(math.Ldexp(float64(1<<22+r.IntN(1<<21)*2+1), -149))
	if up {
		return c, float32(math.Ldexp(14200343, -98)), float32(math.Ldexp(14866277, -98))
	}
	return c, float32(math.Ldexp(1+0x1p-23, -75)), float32(math.Ldexp(1-0x1p-23, -75))
}

func TestMatMulRoundsOnceAtSubnormalHalfwayPoints(t *testing.T) {
	// Row r is [c_r, a] and x is [1, b]: the chain's second FMA lands on a subnormal halfway
	// point (see subnormalHalfwayCase); each direction has its own a and b, so its own matrix.
	r := rand.New(rand.NewPCG(15, 16))
	for _, up := range []bool{false, true} {
		const rows = 37
		w := make([]float32, rows*2)
		want := make([]float32, rows)
		var b float32
		for i := range rows {
			var c, a float32
			c, a, b = subnormalHalfwayCase(r, up)
			w[2*i], w[2*i+1] = c, a
			want[i] = exactFMA32(a, b, c)
			require.NotEqual(t, math.Float32bits(want[i]), math.Float32bits(float32(float64(a)*float64(b)+float64(c))), "a double rounding case")
		}
		m, err := NewMatrix(w, rows, 2)
		require.NoError(t, err)
		x := []float32{1, b}
		for _, k := range allImpls() {
			y := make([]float32, rows)
			matMulWith(k, nil, m, y, x, 1)
			requireSameBits(t, want, y, "%s up=%v", k.name, up)
		}
	}
}

func TestChain8StopsOnlyWhereTheRoundingIsInDoubt(t *testing.T) {
	// chain8 must leave a step whose float64 sum is a float32 halfway point to fma32, and run
	// through the steps of structured inputs whose sums are float32 values (zero weights, zero
	// inputs, exact sums), where the cheap low-bits test alone would stop.
	r := rand.New(rand.NewPCG(17, 18))
	const cols = 40
	w := make([]float32, cols*PanelRows)
	x := make([]float32, cols)
	for k := range cols {
		x[k] = float32(r.NormFloat64())
		if k%5 == 0 {
			x[k] = 0
		}
		for i := range PanelRows {
			if i%3 != 0 && k%7 != 3 { // whole zero rows (i%3 == 0) and zero steps
				w[k*PanelRows+i] = float32(r.NormFloat64())
			}
		}
	}
	x[11] = 1 // sums of float32 values that are often exact
	for _, off := range []int{0, 8} {
		var acc [8]float32
		require.Equal(t, cols, chain8(w, x, &acc, off), "off %d: no step is in doubt", off)
		for j := range acc {
			want := float32(0)
			for k := range cols {
				want = fma32(w[k*PanelRows+off+j], x[k], want)
			}
			require.Equal(t, math.Float32bits(want), math.Float32bits(acc[j]), "off %d lane %d", off, j)
		}
	}
	// Lane 5 of step 2 adds a product on a float32 halfway point to a tiny partial sum: the
	// float64 sum is the halfway point, so chain8 stops before step 2 with steps 0 and 1 done.
	hw := make([]float32, 4*PanelRows)
	hx := []float32{1, 1, 1.5, 1}
	for i := range hw {
		hw[i] = 0.25
	}
	hw[0*PanelRows+5] = float32(math.Ldexp(1.5, -60))
	hw[1*PanelRows+5] = 0
	hw[2*PanelRows+5] = float32(1 + 3*0x1p-23) // ·1.5 ends in a 1 just past float32's bits
	var acc [8]float32
	require.Equal(t, 2, chain8(hw, hx, &acc, 0))
	assert.Equal(t, [8]float32{0.5, 0.5, 0.5, 0.5, 0.5, float32(math.Ldexp(1.5, -60)), 0.5, 0.5}, acc)
	assert.Equal(t, 2, chain8(hw[2*PanelRows:], hx[2:], &acc, 8)-0+0*len(acc), "the other half has no halfway step")
}

func TestPackStackedReusesSameShapeOnly(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	a, err := NewMatrix(randSlice(r, 33*7), 33, 7)
	require.NoError(t, err)
	w := randSlice(r, 33*7)
	want, err := NewMatrix(w, 33, 7)
	require.NoError(t, err)
	got, err := PackStacked(a, 33, 7, w)
	require.NoError(t, err)
	assert.Same(t, a, got, "same shape: packed in place")
	assert.Equal(t, want.data, got.data, "every value overwritten, padding rows still zero")
	other, err := PackStacked(a, 32, 7, w[:32*7])
	require.NoError(t, err)
	assert.NotSame(t, a, other, "another shape gets new memory")
}

// TestMatMulAllocatesNothing: a MatMul allocates nothing in steady state at any precision, at
// batch 1 and batched.
func TestMatMulAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop buffers")
	}
	r := rand.New(rand.NewPCG(16, 16))
	pool := NewPool(2)
	defer pool.Close()
	rows, cols := 64, 256
	for _, prec := range []Precision{F32, BF16, Int8, W8A8} {
		m, err := PackStackedAs(prec, nil, rows, cols, randSlice(r, rows*cols))
		require.NoError(t, err)
		for _, n := range []int{1, 7} {
			x, y := randSlice(r, n*cols), make([]float32, n*rows)
			m.MatMul(pool, y, x, n)
			allocs := testing.AllocsPerRun(100, func() { m.MatMul(pool, y, x, n) })
			assert.Zero(t, allocs, "%v n=%d", prec, n)
		}
	}
}
