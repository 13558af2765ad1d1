package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/kernels"
)

// lowPrecisions are the precisions whose MatMul is the float32 one of their effective weights.
var lowPrecisions = []kernels.Precision{kernels.BF16, kernels.Int8}

// allPrecisions is every precision a model can be packed at.
var allPrecisions = []kernels.Precision{kernels.F32, kernels.BF16, kernels.Int8, kernels.W8A8}

// logitsOf runs toks through m as one prefill and returns every position's logits.
func logitsOf(t *testing.T, m *Model, toks []int) [][]float32 {
	t.Helper()
	h := newHarness(t, m, 64, 16)
	id := h.newSeq(len(toks))
	var b Batch
	b.BlockTables = h.tables
	for i, tok := range toks {
		b.Tokens, b.Positions, b.Seq = append(b.Tokens, int32(tok)), append(b.Positions, int32(i)), append(b.Seq, id)
		b.Logits = append(b.Logits, int32(i))
	}
	v := m.Config.VocabSize
	out := make([]float32, len(toks)*v)
	require.NoError(t, m.Forward(&b, h.kv, out))
	rows := make([][]float32, len(toks))
	for i := range rows {
		rows[i] = out[i*v : (i+1)*v]
	}
	return rows
}

// logSoftmax returns log p for logits x, in float64.
func logSoftmax(x []float32) []float64 {
	mx := math.Inf(-1)
	for _, v := range x {
		mx = math.Max(mx, float64(v))
	}
	var s float64
	for _, v := range x {
		s += math.Exp(float64(v) - mx)
	}
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v) - mx - math.Log(s)
	}
	return out
}

// kl is KL(p‖q) from log-probabilities.
func kl(lp, lq []float64) float64 {
	d := 0.0
	for i := range lp {
		d += math.Exp(lp[i]) * (lp[i] - lq[i])
	}
	return d
}

// TestLowPrecisionForwardIsFloat32OfEffectiveWeights: a bf16 or int8 model gives the logits of
// a float32 model of its effective weights (Weights.Effective) bit for bit, and both stay
// within 1e-3 (relative to the largest logit) of the float64 reference of those weights.
func TestLowPrecisionForwardIsFloat32OfEffectiveWeights(t *testing.T) {
	w, err := Preset("tiny", 1)
	require.NoError(t, err)
	pool := kernels.NewPool(2)
	defer pool.Close()
	toks := randomTokens(rand.New(rand.NewPCG(5, 5)), 24, w.Config.VocabSize)
	for _, prec := range lowPrecisions {
		m, err := NewAs(w, pool, nil, prec)
		require.NoError(t, err)
		eff, err := w.Effective(prec)
		require.NoError(t, err)
		ref, err := New(eff, pool)
		require.NoError(t, err)
		got, want := logitsOf(t, m, toks), logitsOf(t, ref, toks)
		exact, err := Reference(eff, toks)
		require.NoError(t, err)
		for p := range toks {
			for i := range want[p] {
				require.Equal(t, math.Float32bits(want[p][i]), math.Float32bits(got[p][i]), "%s position %d logit %d", prec, p, i)
			}
			scale := 0.0
			for _, v := range exact[p] {
				scale = math.Max(scale, math.Abs(float64(v)))
			}
			rel := maxAbsDiff(got[p], exact[p]) / scale
			require.LessOrEqual(t, rel, 1e-3, "%s position %d: relative error against the float64 reference", prec, p)
		}
	}
}

// TestLowPrecisionAgainstFloat32 reports how far bf16, int8 and w8a8 move the policy of a float32
// checkpoint: the mean KL(f32‖prec) of the next-token distributions and the greedy agreement,
// on the stories15m shape with random weights. The bounds are loose (random weights make
// sharper distributions than trained ones); the figures are the point, logged for docs.
func TestLowPrecisionAgainstFloat32(t *testing.T) {
	if testing.Short() {
		t.Skip("packs stories15m three times")
	}
	w, err := Preset("stories15m", 1)
	require.NoError(t, err)
	pool := kernels.NewPool(2)
	defer pool.Close()
	toks := randomTokens(rand.New(rand.NewPCG(9, 9)), 64, w.Config.VocabSize)
	f32, err := New(w, pool)
	require.NoError(t, err)
	base := logitsOf(t, f32, toks)
	for _, prec := range allPrecisions[1:] {
		m, err := NewAs(w, pool, nil, prec)
		require.NoError(t, err)
		got := logitsOf(t, m, toks)
		var sum, worst float64
		agree := 0
		for p := range toks {
			d := kl(logSoftmax(base[p]), logSoftmax(got[p]))
			sum, worst = sum+d, math.Max(worst, d)
			if argmaxOf(base[p]) == argmaxOf(got[p]) {
				agree++
			}
		}
		mean := sum / float64(len(toks))
		t.Logf("%s vs f32 (stories15m, random weights, %d positions): mean KL %.2e, max %.2e, greedy agreement %d/%d",
			prec, len(toks), mean, worst, agree, len(toks))
		limit := map[kernels.Precision]float64{kernels.BF16: 1e-3, kernels.Int8: 1e-2, kernels.W8A8: 3e-2}[prec]
		require.Less(t, mean, limit, "%s mean KL", prec)
		require.Greater(t, mean, 0.0, "%s must change something", prec)
	}
}

// TestW8A8ForwardIsCloseToItsWeights: a w8a8 model stores int8's weights (Effective(W8A8) is
// Effective(Int8)) but also rounds every MatMul's input, so its logits are near, not equal
// to, a float32 model's of those weights; and they are what the W8A8 MatMul defines, the
// same under every pool (the kernels' own tests hold the MatMul to the definition bit for
// bit).
func TestW8A8ForwardIsCloseToItsWeights(t *testing.T) {
	w, err := Preset("tiny", 1)
	require.NoError(t, err)
	toks := randomTokens(rand.New(rand.NewPCG(5, 5)), 24, w.Config.VocabSize)
	eff, err := w.Effective(kernels.W8A8)
	require.NoError(t, err)
	i8, err := w.Effective(kernels.Int8)
	require.NoError(t, err)
	require.Equal(t, i8, eff, "Effective(W8A8) is Effective(Int8)")
	ref, err := New(eff, nil)
	require.NoError(t, err)
	want := logitsOf(t, ref, toks)
	var got [][]float32
	for _, workers := range []int{1, 2, 3} {
		pool := kernels.NewPool(workers)
		m, err := NewAs(w, pool, nil, kernels.W8A8)
		require.NoError(t, err)
		g := logitsOf(t, m, toks)
		pool.Close()
		if got != nil {
			require.Equal(t, got, g, "workers=%d", workers)
		}
		got = g
	}
	same, worst := 0, 0.0
	for p := range toks {
		worst = math.Max(worst, kl(logSoftmax(want[p]), logSoftmax(got[p])))
		for i := range want[p] {
			if want[p][i] == got[p][i] {
				same++
			}
		}
	}
	t.Logf("w8a8 vs f32 of its weights (tiny): max KL %.2e, %d of %d logits equal", worst, same, len(toks)*len(want[0]))
	require.Less(t, same, len(toks)*len(want[0])/2, "the inputs are rounded: most logits must move")
	require.Less(t, worst, 1e-2)
}

func argmaxOf(x []float32) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}

// TestLowPrecisionResidentBytes: bf16 halves the float32 model's resident bytes, int8 takes
// 1.125/4 of it and w8a8 about 1.0625/4 (its embedding table is int8's; the norms stay float32).
func TestLowPrecisionResidentBytes(t *testing.T) {
	w, err := Preset("stories15m", 1)
	require.NoError(t, err)
	sizes := map[kernels.Precision]int64{}
	for _, prec := range allPrecisions {
		m, err := NewAs(w, nil, nil, prec)
		require.NoError(t, err)
		sizes[prec] = m.ResidentBytes() - int64(len(m.ropeCos)+len(m.ropeSin))*4
		require.Equal(t, m.ResidentBytes(), w.Config.ModelBytes(prec), "%s: ModelBytes without packing", prec)
		t.Logf("%s: weights %d bytes, resident %d bytes", prec, m.WeightBytes(), m.ResidentBytes())
	}
	for _, prec := range allPrecisions[1:] {
		ratio := float64(sizes[prec]) / float64(sizes[kernels.F32])
		want := prec.BytesPerWeight() / 4
		require.InDelta(t, want, ratio, 0.01, fmt.Sprintf("%s resident bytes over f32's", prec))
	}
}

func TestNewAsRejectsWhatAPrecisionCannotHold(t *testing.T) {
	w, err := Preset("tiny", 1)
	require.NoError(t, err)
	w.Layers[1].Wo[7] = float32(math.NaN())
	_, err = NewAs(w, nil, nil, kernels.Int8)
	require.ErrorIs(t, err, kernels.ErrPrecision)
	_, err = NewAs(w, nil, nil, kernels.W8A8)
	require.ErrorIs(t, err, kernels.ErrPrecision)
	_, err = NewAs(w, nil, nil, kernels.Precision(7))
	require.ErrorIs(t, err, kernels.ErrPrecision)
}

// TestNewAsReusesOnlyTheSamePrecision: a weight update packs into the retired model's memory
// when it has the same precision, and gives the logits of a fresh pack.
func TestNewAsReusesOnlyTheSamePrecision(t *testing.T) {
	w1, err := Preset("tiny", 1)
	require.NoError(t, err)
	w2, err := Preset("tiny", 2)
	require.NoError(t, err)
	toks := randomTokens(rand.New(rand.NewPCG(4, 4)), 12, w1.Config.VocabSize)
	for _, prec := range allPrecisions[1:] {
		old, err := NewAs(w1, nil, nil, prec)
		require.NoError(t, err)
		fresh, err := NewAs(w2, nil, nil, prec)
		require.NoError(t, err)
		reused, err := NewAs(w2, nil, old, prec)
		require.NoError(t, err)
		require.Same(t, old.cls, reused.cls, "%s: packed into the retired memory", prec)
		want, got := logitsOf(t, fresh, toks), logitsOf(t, reused, toks)
		require.Equal(t, want, got, "%s", prec)
		f32, err := NewAs(w2, nil, reused, kernels.F32)
		require.NoError(t, err)
		require.NotSame(t, reused.cls, f32.cls, "%s: another precision packs into new memory", prec)
	}
}

// TestModelWeightsAreTheEffectiveWeights: Model.Weights rebuilds, bit for bit, the effective
// weights of the set a model was packed from, at every precision, tied or not; and a
// low-precision model keeps no slice of that set (the caller may drop it).
func TestModelWeightsAreTheEffectiveWeights(t *testing.T) {
	for _, tied := range []bool{false, true} {
		w, err := Preset("tiny", 3)
		require.NoError(t, err)
		if tied != w.Config.TieWordEmbeddings {
			w.Config.TieWordEmbeddings = tied
			if tied {
				w.LMHead = nil
			} else {
				w.LMHead = append([]float32(nil), w.Embed...)
				w.LMHead[5] += 0.25 // not the embedding
				withBias(w)
			}
		}
		for _, prec := range allPrecisions {
			m, err := NewAs(w, nil, nil, prec)
			require.NoError(t, err)
			want, err := w.Effective(prec)
			require.NoError(t, err)
			got := m.Weights()
			require.NoError(t, got.Check())
			wt, gt := want.Tensors(), got.Tensors()
			require.Len(t, gt, len(wt))
			for i := range wt {
				require.Equal(t, wt[i].Name, gt[i].Name)
				require.Equal(t, bitsOf(*wt[i].Data), bitsOf(*gt[i].Data), "tied %v %s %s", tied, prec, wt[i].Name)
			}
			if prec == kernels.F32 {
				continue
			}
			before := w.Layers[0].AttnNorm[0]
			w.Layers[0].AttnNorm[0], w.FinalNorm[0] = 7, 7
			require.NotEqual(t, float32(7), m.layers[0].attnNorm[0], "%s: the model shares the set's norms", prec)
			require.NotEqual(t, float32(7), m.finalNorm[0], "%s: the model shares the set's final norm", prec)
			w.Layers[0].AttnNorm[0], w.FinalNorm[0] = before, want.FinalNorm[0]
		}
	}
}

func bitsOf(s []float32) []uint32 {
	out := make([]uint32, len(s))
	for i, v := range s {
		out[i] = math.Float32bits(v)
	}
	return out
}
