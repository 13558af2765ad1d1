package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// w8a8Impl is one W8A8 panel kernel.
type w8a8Impl struct {
	name string
	run  func(m *Matrix, a *w8a8Acts, y []float32, n, lo, hi int)
}

// w8a8Impls is the Go kernel followed by every other one this CPU runs.
func w8a8Impls() []w8a8Impl {
	return append([]w8a8Impl{{"generic", matmulW8A8Generic}}, w8a8SIMDImpls()...)
}

// w8a8Reference is W8A8's definition written out from the row-major weights, independently of
// the packing and the kernels: the weights quantized per block by QuantizeInt8 and each token's
// input by quantizeActRef (float32 scales; inputs here are finite), integer dot products, one
// float32 multiply of the scales and an fma per block, in block order from zero.
func w8a8Reference(t *testing.T, w, x []float32, rows, cols, n int) []float32 {
	t.Helper()
	var qw, qx [Int8Block]int8
	y := make([]float32, n*rows)
	for tok := range n {
		for r := range rows {
			var acc float32
			for k0 := 0; k0 < cols; k0 += Int8Block {
				k1 := min(cols, k0+Int8Block)
				ws, err := QuantizeInt8(qw[:], w[r*cols+k0:r*cols+k1])
				require.NoError(t, err)
				xs, err := quantizeActRef(qx[:], x[tok*cols+k0:tok*cols+k1])
				require.NoError(t, err)
				var isum int32
				for k := range k1 - k0 {
					isum += int32(qw[k]) * int32(qx[k])
				}
				acc = fma32(float32(isum), float32(ws*xs), acc)
			}
			y[tok*rows+r] = acc
		}
	}
	return y
}

// requireSameBitsOrNaN is requireSameBits with every NaN equal to every other: the hardware's
// NaN payloads are not part of W8A8's definition.
func requireSameBitsOrNaN(t *testing.T, want, got []float32, msg string, args ...any) {
	t.Helper()
	require.Len(t, got, len(want))
	for i := range want {
		w, g := want[i], got[i]
		if math.IsNaN(float64(w)) && math.IsNaN(float64(g)) {
			continue
		}
		if math.Float32bits(w) != math.Float32bits(g) {
			t.Fatalf("%s: element %d: %g (%#x) != %g (%#x)", fmt.Sprintf(msg, args...), i, g, math.Float32bits(g), w, math.Float32bits(w))
		}
	}
}

// w8a8Data is a named way of filling weights or inputs.
type w8a8Data struct {
	name string
	fill func(r *rand.Rand, s []float32)
}

var w8a8Fills = []w8a8Data{
	{"normal", func(r *rand.Rand, s []float32) {
		for i := range s {
			s[i] = float32(r.NormFloat64())
		}
	}},
	// Every value ±max of its block: all quantized values ±127, the largest sums.
	{"pm127", func(r *rand.Rand, s []float32) {
		for i := range s {
			s[i] = float32(1 - 2*r.IntN(2))
		}
	}},
	{"plus127", func(r *rand.Rand, s []float32) {
		for i := range s {
			s[i] = 3
		}
	}},
	// Zero blocks between random ones, and single outliers.
	{"sparse", func(r *rand.Rand, s []float32) {
		for i := range s {
			s[i] = 0
			if (i/Int8Block)%3 == 1 {
				s[i] = float32(r.NormFloat64())
			}
			if r.IntN(50) == 0 {
				s[i] = float32(r.NormFloat64() * 1e3)
			}
		}
	}},
	{"huge", func(r *rand.Rand, s []float32) {
		for i := range s {
			s[i] = float32(r.NormFloat64() * 1e18)
		}
	}},
	{"tiny", func(r *rand.Rand, s []float32) {
		for i := range s {
			s[i] = float32(r.NormFloat64() * 1e-19)
		}
	}},
}

// w8a8WeightFills are the weights of TestW8A8MatMulMatchesDefinition: w8a8Fills within the
// range of float16 scales (max|w| up to 127·65504), with blocks whose scales are float16
// subnormals, down to the smallest.
var w8a8WeightFills = append(w8a8Fills[:4:4],
	w8a8Data{"huge", func(r *rand.Rand, s []float32) {
		for i := range s {
			s[i] = float32(r.NormFloat64() * 1e6)
		}
	}},
	w8a8Data{"subnormal-scales", func(r *rand.Rand, s []float32) {
		for i := range s {
			s[i] = float32(r.NormFloat64() * 1e-4)
		}
	}},
	w8a8Data{"smallest-scales", func(r *rand.Rand, s []float32) {
		for i := range s {
			s[i] = float32(r.NormFloat64() * 1e-9)
		}
	}},
)

func TestW8A8MatMulMatchesDefinition(t *testing.T) {
	// Every W8A8 kernel gives the definition's bits, for any batch, tile split and pool.
	r := rand.New(rand.NewPCG(11, 11))
	impls := w8a8Impls()
	t.Logf("W8A8 kernels under test: %d", len(impls))
	pools := []*Pool{nil, NewPool(2), NewPool(3)}
	defer func() {
		for _, p := range pools {
			p.Close()
		}
	}()
	shapes := [][2]int{{1, 1}, {1, 32}, {3, 4}, {15, 31}, {16, 32}, {17, 33}, {33, 64}, {50, 100}, {97, 176}, {40, 320}, {130, 36}}
	ns := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 32, 35, 64, 80}
	for i, sh := range shapes {
		rows, cols := sh[0], sh[1]
		for j, wf := range w8a8WeightFills {
			xf := w8a8Fills[(i+j)%len(w8a8Fills)]
			w := make([]float32, rows*cols)
			wf.fill(r, w)
			m, err := PackStackedAs(W8A8, nil, rows, cols, w)
			require.NoError(t, err)
			for _, n := range ns {
				x := make([]float32, n*cols)
				xf.fill(r, x)
				want := w8a8Reference(t, w, x, rows, cols, n)
				for _, k := range impls {
					pool := pools[(n+j)%len(pools)]
					got := make([]float32, n*rows+3)
					matmulW8A8(pool, m, got, x, n, k.run)
					requireSameBitsOrNaN(t, want, got[:n*rows], "%s %dx%d w=%s x=%s n=%d workers=%d", k.name, rows, cols, wf.name, xf.name, n, pool.Workers())
					require.Equal(t, make([]float32, 3), got[n*rows:], "%s wrote past its outputs", k.name)
				}
			}
		}
	}
}

func TestW8A8MatMulIsBatchInvariant(t *testing.T) {
	// Through MatMul (the build's kernel): a token's outputs do not depend on the batch, the
	// token block (64) or the pool.
	r := rand.New(rand.NewPCG(12, 12))
	for _, workers := range []int{1, 3} {
		pool := NewPool(workers)
		for _, sh := range [][2]int{{17, 32}, {130, 70}, {200, 96}} {
			rows, cols := sh[0], sh[1]
			m, err := PackStackedAs(W8A8, nil, rows, cols, randSlice(r, rows*cols))
			require.NoError(t, err)
			for _, n := range []int{1, 2, 5, 7, 13, 64, 65, 131} {
				requireBatchInvariant(t, r, pool, m, n, "w8a8")
			}
		}
		pool.Close()
	}
}

func TestW8A8NonFiniteInput(t *testing.T) {
	// A non-finite input makes its token's outputs NaN (as a float32 MatMul's would be NaN or
	// infinite), on every kernel, and leaves the other tokens alone.
	r := rand.New(rand.NewPCG(13, 13))
	rows, cols := 20, 70
	w := randSlice(r, rows*cols)
	m, err := PackStackedAs(W8A8, nil, rows, cols, w)
	require.NoError(t, err)
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
		x := randSlice(r, 2*cols)
		clean := w8a8Reference(t, w, x[cols:], rows, cols, 1)
		x[40] = bad
		for _, k := range w8a8Impls() {
			y := make([]float32, 2*rows)
			matmulW8A8(nil, m, y, x, 2, k.run)
			for i := range rows {
				require.True(t, math.IsNaN(float64(y[i])), "%s %v: output %d is %v", k.name, bad, i, y[i])
			}
			requireSameBits(t, clean, y[rows:], "%s %v: the other token", k.name, bad)
		}
	}
}

func TestQuantizeActs(t *testing.T) {
	// The input quantizer is quantizeActRef on finite blocks, NaN scale and zeros on the others,
	// with zero padding past the row.
	r := rand.New(rand.NewPCG(14, 14))
	// Scale 1 with halfway quotients: ties go to even.
	x := []float32{127, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -127}
	q, s := make([]int8, Int8Block), make([]float32, 1)
	quantizeActs(q, s, x)
	assert.Equal(t, float32(1), s[0])
	assert.Equal(t, []int8{127, 0, 2, 2, 0, -2, -2, 126, -127}, q[:len(x)])
	checkQuantizedActs(t, q, s, x)
	for range 300 {
		cols := 1 + r.IntN(200)
		nb := (cols + Int8Block - 1) / Int8Block
		x := make([]float32, cols)
		w8a8Fills[r.IntN(len(w8a8Fills))].fill(r, x)
		if r.IntN(4) == 0 {
			x[r.IntN(cols)] = []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), 0}[r.IntN(4)]
		}
		q := make([]int8, nb*Int8Block)
		for i := range q {
			q[i] = int8(r.IntN(256) - 128) // stale scratch
		}
		s := make([]float32, nb)
		quantizeActs(q, s, x)
		checkQuantizedActs(t, q, s, x)
	}
}

// checkQuantizedActs checks what quantizeActs made of x.
func checkQuantizedActs(t *testing.T, q []int8, s, x []float32) {
	t.Helper()
	var want [Int8Block]int8
	for b := range s {
		k0 := b * Int8Block
		k1 := min(len(x), k0+Int8Block)
		ws, err := quantizeActRef(want[:], x[k0:k1])
		if err != nil {
			require.True(t, math.IsNaN(float64(s[b])), "block %d of %v: scale %v", b, x[k0:k1], s[b])
			require.Equal(t, make([]int8, Int8Block), q[k0:k0+Int8Block], "block %d", b)
			continue
		}
		require.Equal(t, math.Float32bits(ws), math.Float32bits(s[b]), "block %d scale", b)
		require.Equal(t, want[:k1-k0], q[k0:k1], "block %d", b)
		require.Equal(t, make([]int8, k0+Int8Block-k1), q[k1:k0+Int8Block], "block %d padding", b)
	}
}

func FuzzQuantizeActs(f *testing.F) {
	f.Add(float32(1), float32(-2), float32(0.5), uint8(3))
	f.Add(float32(0), float32(0), float32(0), uint8(40))
	f.Add(float32(1e-45), float32(3e38), float32(-3e38), uint8(64))
	f.Add(float32(math.NaN()), float32(1), float32(2), uint8(1))
	f.Fuzz(func(t *testing.T, a, b, c float32, n uint8) {
		cols := 1 + int(n)%100
		x := make([]float32, cols)
		for i := range x {
			x[i] = []float32{a, b, c, a * float32(i), b / float32(i+1)}[i%5]
		}
		nb := (cols + Int8Block - 1) / Int8Block
		q, s := make([]int8, nb*Int8Block), make([]float32, nb)
		quantizeActs(q, s, x)
		checkQuantizedActs(t, q, s, x)
	})
}

func TestW8A8WeightsAreInt8s(t *testing.T) {
	// W8A8 stores Int8's values: the same effective weights, in 544 bytes a block where Int8
	// takes 576 (float16 scales), and a short last block padded.
	r := rand.New(rand.NewPCG(15, 15))
	for _, sh := range [][2]int{{1, 32}, {17, 33}, {40, 176}, {3, 4}} {
		rows, cols := sh[0], sh[1]
		w := randSlice(r, rows*cols)
		a, err := PackStackedAs(Int8, nil, rows, cols, w)
		require.NoError(t, err)
		b, err := PackStackedAs(W8A8, nil, rows, cols, w)
		require.NoError(t, err)
		requireSameBits(t, effective(a), effective(b), "%dx%d", rows, cols)
		blocks := (cols + Int8Block - 1) / Int8Block
		assert.Equal(t, int64(b.Panels()*blocks*544), b.Bytes())
		assert.Equal(t, b.Bytes(), PackedBytes(W8A8, rows, cols))
		if cols%Int8Block == 0 {
			assert.Equal(t, a.Bytes()*544/576, b.Bytes())
		}
		// Unpack gives those weights too (Engine.Weights of a W8A8 model).
		u := make([]float32, rows*cols)
		b.Unpack(u)
		requireSameBits(t, effective(a), u, "Unpack %dx%d", rows, cols)
	}
}

// quantizeActRef is W8A8's input quantization as its definition states it: QuantizeInt8 with
// the scale max|x|/127 kept in float32 (only stored weight scales are float16 values).
func quantizeActRef(q []int8, x []float32) (float32, error) {
	amax, err := finiteMax(x)
	if err != nil {
		return 0, err
	}
	quantizeWith(q, x, amax/127)
	return amax / 127, nil
}
