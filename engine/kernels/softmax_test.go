package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// vecImpl is one implementation of the softmax and attention kernels.
type vecImpl struct {
	name   string
	maxF32 func(x []float32) float32
	first  func(x []float32, v float32) int
	expSum func(dst, x []float32, shift float32) float64 // dst nil: sum only
	scores func(sc, q, k []float32, stride, off, n int, scale float32)
	accum  func(out, p, v []float32, stride, off, n int)
	sumSq  func(x []float32) float64
	scale  func(dst, x, g []float32, s float32)
	swiglu func(a, g, u []float32)
}

func genericVecImpl() vecImpl {
	return vecImpl{name: "generic", maxF32: maxF32Generic, first: firstAtLeastGeneric, expSum: expShiftedGeneric,
		scores: attnScoresGeneric, accum: attnAccumGeneric, sumSq: sumSquaresGeneric, scale: scaleMulGeneric,
		swiglu: swigluGeneric}
}

var (
	inf32  = float32(math.Inf(1))
	ninf32 = float32(math.Inf(-1))
	nan32  = float32(math.NaN())
)

// specialRow is a random row of n logits-like values (N(0, 3²)) with, when special is set,
// some NaN, ±Inf and far-below values sprinkled in.
func specialRow(r *rand.Rand, n int, special bool) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * 3)
		if special {
			switch r.IntN(16) {
			case 0:
				x[i] = nan32
			case 1:
				x[i] = ninf32
			case 2:
				x[i] = -200
			}
		}
	}
	return x
}

// refMax is MaxF32's definition.
func refMax(x []float32) float32 {
	m := ninf32
	for _, v := range x {
		if v == v && v > m {
			m = v
		}
	}
	return min(m, math.MaxFloat32)
}

// refTerm is exp(x - shift) in float64 under the kernels' rules.
func refTerm(x, shift float32) float64 {
	if x != x || x == ninf32 {
		return 0
	}
	x = min(x, math.MaxFloat32)
	return math.Exp(max(min(float64(x)-float64(shift), 0), -87))
}

func TestMaxF32(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, impl := range vecImpls() {
		t.Run(impl.name, func(t *testing.T) {
			assert.Equal(t, ninf32, impl.maxF32(nil))
			assert.Equal(t, ninf32, impl.maxF32(make([]float32, 40)[:0]))
			for trial := range 400 {
				n := r.IntN(200)
				if trial%50 == 0 {
					n = 32000 + r.IntN(17)
				}
				x := specialRow(r, n, trial%2 == 1)
				require.Equal(t, refMax(x), impl.maxF32(x), "trial %d n %d", trial, n)
			}
			// Special values anywhere in a row, head or tail.
			for _, n := range []int{1, 7, 16, 33, 64, 100} {
				for _, pos := range []int{0, n / 2, n - 1} {
					x := make([]float32, n)
					for i := range x {
						x[i] = nan32
					}
					assert.Equal(t, ninf32, impl.maxF32(x), "all NaN n=%d", n)
					x[pos] = -3
					assert.Equal(t, float32(-3), impl.maxF32(x), "NaN ignored n=%d pos=%d", n, pos)
					x[pos] = inf32
					assert.Equal(t, float32(math.MaxFloat32), impl.maxF32(x), "+Inf is MaxFloat32 n=%d pos=%d", n, pos)
					for i := range x {
						x[i] = ninf32
					}
					assert.Equal(t, ninf32, impl.maxF32(x))
				}
			}
		})
	}
}

func TestFirstAtLeast(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, impl := range vecImpls() {
		t.Run(impl.name, func(t *testing.T) {
			assert.Equal(t, -1, impl.first(nil, 0))
			for trial := range 400 {
				n := 1 + r.IntN(200)
				x := specialRow(r, n, trial%2 == 1)
				m := refMax(x)
				want := -1
				for i, v := range x {
					if v == v && min(v, math.MaxFloat32) == m {
						want = i
						break
					}
				}
				if m == ninf32 {
					want = firstAtLeastGeneric(x, m) // the first -Inf, or -1
				}
				require.Equal(t, want, impl.first(x, m), "argmax, trial %d", trial)
				require.Equal(t, -1, impl.first(x, inf32), "these rows hold no +Inf")
				v := float32(r.NormFloat64())
				require.Equal(t, firstAtLeastGeneric(x, v), impl.first(x, v))
			}
			x := []float32{nan32, 1, inf32, 2}
			assert.Equal(t, 2, impl.first(x, math.MaxFloat32), "+Inf is at least MaxFloat32")
			assert.Equal(t, -1, impl.first([]float32{nan32, nan32}, ninf32), "NaN is never at least v")
		})
	}
}

// expTol is the relative error allowed per exponential: the canonical float32 polynomial's,
// on every path.
func expTol(vecImpl) float64 { return 2.5e-7 }

func TestExpAccuracy(t *testing.T) {
	// Shift 0 makes x - shift exact, so this measures the exponential alone, over its whole
	// domain (a dense sweep of [-88, 0] plus runs of consecutive float32s near 0, ln2/2 and -87).
	xs := make([]float32, 0, 1<<19)
	for i := range 1 << 18 {
		xs = append(xs, float32(-88*float64(i)/(1<<18)))
	}
	for _, start := range []float32{-1e-3, -math.Ln2 / 2, -87} {
		v := start
		for range 1 << 16 {
			xs = append(xs, v)
			v = math.Nextafter32(v, 1)
		}
	}
	dst := make([]float32, len(xs))
	for _, impl := range vecImpls() {
		t.Run(impl.name, func(t *testing.T) {
			sum := impl.expSum(dst, xs, 0)
			worst, ref := 0.0, 0.0
			for i, x := range xs {
				want := refTerm(x, 0)
				ref += want
				worst = max(worst, math.Abs(float64(dst[i])-want)/want)
			}
			t.Logf("max relative error %.3g", worst)
			assert.Less(t, worst, expTol(impl))
			assert.InEpsilon(t, ref, sum, expTol(impl))
			assert.Equal(t, float32(1), dst[0], "exp(0) is exactly 1")
		})
	}
}

func TestSumExpShifted(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, impl := range vecImpls() {
		t.Run(impl.name, func(t *testing.T) {
			for trial := range 600 {
				n := 1 + r.IntN(150)
				if trial%60 == 0 {
					n = 32000 + r.IntN(17)
				}
				x := specialRow(r, n, trial%3 == 1)
				shift := refMax(x)
				if shift == ninf32 {
					continue
				}
				if trial%4 == 3 {
					shift += float32(r.Float64() * 5) // above the max: every term below 1
				}
				want, bound := 0.0, 0.0
				for _, v := range x {
					e := refTerm(v, shift)
					want += e
					// x - shift is rounded to float32 in the SIMD paths: e·|d|·2^-24 more.
					bound += e * (expTol(impl) + math.Abs(max(float64(v)-float64(shift), -87))*0x1p-24)
				}
				got := impl.expSum(nil, x, shift)
				require.InDelta(t, want, got, bound+1e-300, "trial %d n %d", trial, n)

				// ExpShifted: same sum, same terms, in place or not.
				dst := make([]float32, n+3)
				for i := range dst {
					dst[i] = -7
				}
				got2 := impl.expSum(dst[:n], x, shift)
				require.Equal(t, got, got2, "the sum does not depend on storing")
				for _, v := range dst[n:] {
					require.Equal(t, float32(-7), v, "no write past len(x)")
				}
				check := 0.0
				for i, v := range x {
					e := refTerm(v, shift)
					require.InDelta(t, e, dst[i], e*(expTol(impl)+math.Abs(max(float64(v)-float64(shift), -87))*0x1p-24)+1e-45,
						"trial %d elem %d x=%v", trial, i, v)
					if v != v || v == ninf32 {
						require.Equal(t, float32(0), dst[i], "NaN and -Inf weigh 0")
					}
					check += float64(dst[i])
				}
				require.InEpsilon(t, check, got2, 1e-12, "the sum is the sum of the written terms")
				inPlace := append([]float32(nil), x...)
				require.Equal(t, got2, impl.expSum(inPlace, inPlace, shift))
				require.Equal(t, dst[:n], inPlace)
			}
		})
	}
}

func TestSumExpShiftedSpecials(t *testing.T) {
	for _, impl := range vecImpls() {
		t.Run(impl.name, func(t *testing.T) {
			for _, n := range []int{1, 5, 16, 17, 40} {
				x := make([]float32, n)
				for i := range x {
					x[i] = ninf32
				}
				assert.Equal(t, 0.0, impl.expSum(nil, x, 0), "all -Inf")
				x[n-1] = inf32
				assert.Equal(t, 1.0, impl.expSum(nil, x, math.MaxFloat32), "+Inf is the max")
				x[0] = nan32
				x[n/2] = math.MaxFloat32
				want := 1.0
				if n/2 != n-1 && n/2 != 0 {
					want = 2
				}
				assert.Equal(t, want, impl.expSum(nil, x, math.MaxFloat32), "n=%d", n)
				for i := range x {
					x[i] = -1000
				}
				x[0] = 0
				assert.InDelta(t, 1, impl.expSum(nil, x, 0), float64(n)*2e-38, "far below the shift weighs ~0")
			}
		})
	}
}

func TestSoftmaxExported(t *testing.T) {
	x := []float32{1, 2, nan32, 3, ninf32}
	assert.Equal(t, float32(3), MaxF32(x))
	want := math.Exp(-2) + math.Exp(-1) + 1
	assert.InEpsilon(t, want, SumExpShifted(x, 3), 3e-7)
	dst := make([]float32, len(x))
	assert.InEpsilon(t, want, ExpShifted(dst, x, 3), 3e-7)
	assert.Equal(t, float32(1), dst[3])
	assert.Equal(t, float32(0), dst[2])
	assert.Equal(t, 0.0, ExpShifted(nil, nil, 0))
	assert.Panics(t, func() { ExpShifted(dst[:2], x, 3) })
}

func BenchmarkSoftmax(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	for _, n := range []int{1032, 32000} {
		x := specialRow(r, n, false)
		dst := make([]float32, n)
		shift := refMax(x)
		for _, impl := range vecImpls() {
			b.Run(fmt.Sprintf("max/%d/%s", n, impl.name), func(b *testing.B) {
				for b.Loop() {
					impl.maxF32(x)
				}
			})
			b.Run(fmt.Sprintf("sumexp/%d/%s", n, impl.name), func(b *testing.B) {
				for b.Loop() {
					impl.expSum(nil, x, shift)
				}
			})
			b.Run(fmt.Sprintf("exp/%d/%s", n, impl.name), func(b *testing.B) {
				for b.Loop() {
					impl.expSum(dst, x, shift)
				}
			})
		}
	}
}
