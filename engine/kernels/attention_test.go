package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// attnCase is a block of n cached rows of width hd at stride, head offset off.
type attnCase struct {
	hd, stride, off, n int
	q, rows            []float32
}

func randAttnCase(r *rand.Rand, hd int) attnCase {
	heads := 1 + r.IntN(3)
	c := attnCase{hd: hd, stride: heads * hd, n: 1 + r.IntN(40)}
	c.off = r.IntN(heads) * hd
	c.q = randSlice(r, hd)
	c.rows = randSlice(r, (c.n-1)*c.stride+c.off+hd)
	return c
}

func (c attnCase) row(s int) []float32 { return c.rows[s*c.stride+c.off : s*c.stride+c.off+c.hd] }

// attnWidths covers the SIMD widths (multiples of 16 and of 8) and odd ones for the portable path.
var attnWidths = []int{8, 16, 24, 32, 48, 64, 80, 128, 2, 6, 12, 18, 50}

func TestAttnScores(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, impl := range vecImpls() {
		t.Run(impl.name, func(t *testing.T) {
			for trial := range 300 {
				c := randAttnCase(r, attnWidths[trial%len(attnWidths)])
				scale := float32(1 / math.Sqrt(float64(c.hd)))
				sc := make([]float32, c.n+5)
				for i := range sc {
					sc[i] = 99
				}
				impl.scores(sc, c.q, c.rows, c.stride, c.off, c.n, scale)
				for s := range c.n {
					want, bound := 0.0, 0.0
					for i, qv := range c.q {
						p := float64(qv) * float64(c.row(s)[i])
						want += p
						bound += math.Abs(p)
					}
					want *= float64(scale)
					require.InDelta(t, want, sc[s], 1e-6*bound+1e-7, "trial %d hd %d slot %d", trial, c.hd, s)
				}
				for _, v := range sc[c.n:] {
					require.Equal(t, float32(99), v, "no write past n")
				}
				// A score does not depend on where its row sits in the block (head, middle or
				// the padded last group) nor on n: every sub-range gives the same bits.
				lo := r.IntN(c.n)
				hi := lo + 1 + r.IntN(c.n-lo)
				sub := make([]float32, hi-lo)
				impl.scores(sub, c.q, c.rows[lo*c.stride:], c.stride, c.off, hi-lo, scale)
				require.Equal(t, sc[lo:hi], sub, "trial %d", trial)
			}
		})
	}
}

func TestAttnAccum(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, impl := range vecImpls() {
		t.Run(impl.name, func(t *testing.T) {
			for trial := range 300 {
				c := randAttnCase(r, attnWidths[trial%len(attnWidths)])
				p := make([]float32, c.n)
				for i := range p {
					p[i] = float32(r.Float64())
				}
				out := randSlice(r, c.hd)
				init := append([]float32(nil), out...)
				impl.accum(out, p, c.rows, c.stride, c.off, c.n)
				for i := range c.hd {
					want, bound := float64(init[i]), math.Abs(float64(init[i]))
					for s := range c.n {
						v := float64(p[s]) * float64(c.row(s)[i])
						want += v
						bound += math.Abs(v)
					}
					require.InDelta(t, want, out[i], 1e-6*bound+1e-7, "trial %d hd %d lane %d", trial, c.hd, i)
				}
				again := append([]float32(nil), init...)
				impl.accum(again, p, c.rows, c.stride, c.off, c.n)
				require.Equal(t, out, again, "deterministic")
			}
		})
	}
}

// TestAttnSIMDMatchesGeneric runs a whole softmax(q·K)·V the way the model does, block by
// block, and compares every implementation with the portable one.
func TestAttnSIMDMatchesGeneric(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	impls := vecImpls()
	for _, hd := range []int{16, 48, 64, 24, 12} {
		const blockSize, npos = 16, 150
		stride := 2 * hd
		k, v := randSlice(r, npos*stride), randSlice(r, npos*stride)
		q := randSlice(r, hd)
		scale := float32(1 / math.Sqrt(float64(hd)))
		var ref []float32
		for _, impl := range impls {
			sc := make([]float32, npos)
			for b0 := 0; b0 < npos; b0 += blockSize {
				n := min(blockSize, npos-b0)
				impl.scores(sc[b0:b0+n], q, k[b0*stride:], stride, hd, n, scale)
			}
			m := impl.maxF32(sc)
			sum := impl.expSum(sc, sc, m)
			out := make([]float32, hd)
			for b0 := 0; b0 < npos; b0 += blockSize {
				n := min(blockSize, npos-b0)
				impl.accum(out, sc[b0:b0+n], v[b0*stride:], stride, hd, n)
			}
			for i := range out {
				out[i] *= float32(1 / sum)
			}
			if ref == nil {
				ref = out
				continue
			}
			assert.Equal(t, ref, out, "%s hd %d: bit-identical to the portable path", impl.name, hd)
		}
	}
}

func TestAttnExportedChecks(t *testing.T) {
	q, k := make([]float32, 16), make([]float32, 64)
	sc := make([]float32, 4)
	assert.NotPanics(t, func() { AttnScores(sc, q, k, 16, 0, 4, 1) })
	assert.NotPanics(t, func() { AttnScores(sc, q, k, 16, 0, 0, 1) }, "n = 0 is a no-op")
	assert.Panics(t, func() { AttnScores(sc, q, k, 16, 1, 4, 1) }, "rows past k")
	assert.Panics(t, func() { AttnScores(sc[:3], q, k, 16, 0, 4, 1) }, "scores too short")
	assert.Panics(t, func() { AttnScores(sc, q, k, 8, 0, 4, 1) }, "rows overlap")
	assert.NotPanics(t, func() { AttnAccum(q, sc, k, 16, 0, 4) })
	assert.Panics(t, func() { AttnAccum(q, sc, k[:63], 16, 0, 4) })
	assert.Panics(t, func() { AttnAccum(q, sc[:2], k, 16, 0, 4) })
	// Exported = internal: ones everywhere give hd per score and n per lane.
	for i := range q {
		q[i] = 1
	}
	for i := range k {
		k[i] = 1
	}
	AttnScores(sc, q, k, 16, 0, 4, 0.5)
	assert.Equal(t, []float32{8, 8, 8, 8}, sc)
	out := make([]float32, 16)
	AttnAccum(out, []float32{1, 1, 1, 1}, k, 16, 0, 4)
	assert.Equal(t, float32(4), out[15])
}

func BenchmarkAttention(b *testing.B) {
	// One (token, head) over 1032 cached positions in blocks of 16: a long prefill's last token.
	r := rand.New(rand.NewPCG(1, 1))
	for _, hd := range []int{48, 64} {
		const blockSize, npos = 16, 1032
		stride := 6 * hd
		k, v := randSlice(r, npos*stride), randSlice(r, npos*stride)
		q := randSlice(r, hd)
		sc := make([]float32, npos)
		out := make([]float32, hd)
		for _, impl := range vecImpls() {
			b.Run(fmt.Sprintf("hd%d/%s", hd, impl.name), func(b *testing.B) {
				for b.Loop() {
					for b0 := 0; b0 < npos; b0 += blockSize {
						n := min(blockSize, npos-b0)
						impl.scores(sc[b0:b0+n], q, k[b0*stride:], stride, 2*hd, n, 0.1)
					}
					m := impl.maxF32(sc)
					impl.expSum(sc, sc, m)
					clear(out)
					for b0 := 0; b0 < npos; b0 += blockSize {
						n := min(blockSize, npos-b0)
						impl.accum(out, sc[b0:b0+n], v[b0*stride:], stride, 2*hd, n)
					}
				}
			})
		}
	}
}

// TestAttnRoundsOnceAtHalfwayPoints puts a halfway point into one FMA chain of each attention
// kernel: AttnScores' chain 0 gets q[0]·k[0] = tiny, then q[16]·k[16] = a·1.5, a product on a
// float32 halfway point; AttnAccum's chain 0 gets slot 0 (tiny) and slot 4 (a·1.5), the other
// slots weigh zero. Each result is that chain alone, which must be the single rounding.
func TestAttnRoundsOnceAtHalfwayPoints(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	for range 50 {
		a := float32(1 + float64(r.Uint32()>>9|1)*0x1p-23)
		tiny := float32(math.Ldexp(1+r.Float64(), -60))
		if r.IntN(2) == 0 {
			tiny = -tiny
		}
		want := exactFMA32(a, 1.5, tiny)
		q, k := make([]float32, 32), make([]float32, 32)
		q[0], k[0], q[16], k[16] = tiny, 1, a, 1.5
		v := make([]float32, 5*16)
		v[0], v[4*16] = tiny, a
		p := []float32{1, 0, 0, 0, 1.5}
		for _, impl := range vecImpls() {
			sc := make([]float32, 1)
			impl.scores(sc, q, k, 32, 0, 1, 1)
			require.Equal(t, math.Float32bits(want), math.Float32bits(sc[0]), "%s scores", impl.name)
			out := make([]float32, 16)
			impl.accum(out, p, v, 16, 0, 5)
			require.Equal(t, math.Float32bits(want), math.Float32bits(out[0]), "%s accum", impl.name)
		}
	}
}

// TestPrefetchRows runs the hint over every shape the attention loop gives it (head widths of
// whole and partial lines, rows in and out of line alignment, the last row at the slice's end)
// and checks that it changes nothing and refuses rows outside the slice, as AttnScores does.
func TestPrefetchRows(t *testing.T) {
	x := make([]float32, 4096)
	for i := range x {
		x[i] = float32(i)
	}
	want := append([]float32(nil), x...)
	for _, width := range []int{1, 15, 16, 48, 64, 128} {
		for _, stride := range []int{width, width + 1, 6 * width} {
			for _, n := range []int{1, 2, 16} {
				for _, off := range []int{0, 3, width} {
					end := (n-1)*stride + off + width
					if end > len(x) {
						continue
					}
					PrefetchRows(x[:end], stride, off, n, width)
				}
			}
		}
	}
	require.Equal(t, want, x, "a prefetch changes no value")
	assert.NotPanics(t, func() { PrefetchRows(x, 16, 0, 0, 16) }, "n = 0 is a no-op")
	assert.NotPanics(t, func() { PrefetchRows(x[:64], 16, 0, 4, 16) })
	assert.Panics(t, func() { PrefetchRows(x[:63], 16, 0, 4, 16) }, "last row past the slice")
	assert.Panics(t, func() { PrefetchRows(x, 16, -1, 4, 16) }, "negative offset")
	assert.Panics(t, func() { PrefetchRows(x, 8, 0, 4, 16) }, "rows overlap")
	assert.Panics(t, func() { PrefetchRows(x, 16, 0, 4, 0) }, "no width")
}
