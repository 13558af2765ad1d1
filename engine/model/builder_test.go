package model

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/kernels"
)

// feed puts w's tensors into b in order (indices into w.Tensors()), through b's buffers.
func feed(t *testing.T, b *Builder, w *Weights, order []int) {
	t.Helper()
	ts := w.Tensors()
	for _, i := range order {
		n, ok := b.Len(ts[i].Name)
		require.True(t, ok, ts[i].Name)
		buf := b.Buffer(n)
		copy(buf, *ts[i].Data)
		require.NoError(t, b.Put(ts[i].Name, buf))
	}
}

// TestBuilderEqualsNewAs: a model built one tensor at a time, in any order, tied or not, into
// new memory or a retired model's, is the model NewAs packs (the same effective weights and
// logits, bit for bit), and its scratch stays within the embedding and one layer's float32
// tensors.
func TestBuilderEqualsNewAs(t *testing.T) {
	toks := randomTokens(rand.New(rand.NewPCG(8, 8)), 10, 256)
	for _, tied := range []bool{true, false} {
		w, err := Preset("tiny", 5)
		require.NoError(t, err)
		if !tied && w.Config.TieWordEmbeddings {
			w.Config.TieWordEmbeddings, w.LMHead = false, append([]float32(nil), w.Embed...)
			w.LMHead[3] = -w.LMHead[3]
			withBias(w) // and q, k, v biases (Qwen2)
		}
		n := len(w.Tensors())
		for _, prec := range allPrecisions {
			want, err := NewAs(w, nil, nil, prec)
			require.NoError(t, err)
			var reuse *Model
			for _, order := range [][]int{seq(n), rand.New(rand.NewPCG(uint64(prec), 1)).Perm(n)} {
				b, err := NewBuilder(w.Config, prec, reuse)
				require.NoError(t, err)
				feed(t, b, w, order)
				got, err := b.Model(nil)
				require.NoError(t, err)
				if reuse != nil {
					require.Same(t, reuse.cls, got.cls, "packed into the retired model")
				}
				require.Equal(t, want.ResidentBytes(), got.ResidentBytes())
				require.Equal(t, want.Weights(), got.Weights(), "tied %v %s", tied, prec)
				require.Equal(t, logitsOf(t, want, toks), logitsOf(t, got, toks), "tied %v %s", tied, prec)
				reuse = got
			}
		}
	}
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// TestBuilderScratchIsBounded: building the stories15m shape in the loader's order (the
// order of Weights.Tensors, layer by layer) holds at most the embedding's and one layer's
// float32 tensors beside the packed model, not a float32 set.
func TestBuilderScratchIsBounded(t *testing.T) {
	w, err := Preset("stories15m", 1)
	require.NoError(t, err)
	c := w.Config
	h, f, kvd := c.HiddenSize, c.IntermediateSize, c.KVDim()
	layer := int64(2*h*h+2*kvd*h+3*f*h+2*h) * 4
	set := int64(0)
	for _, t := range w.Tensors() {
		set += int64(t.Len()) * 4
	}
	for _, prec := range []kernels.Precision{kernels.BF16, kernels.Int8} {
		b, err := NewBuilder(c, prec, nil)
		require.NoError(t, err)
		feed(t, b, w, seq(len(w.Tensors())))
		_, err = b.Model(nil)
		require.NoError(t, err)
		t.Logf("%s: scratch peak %.1f MiB (embedding %.1f, a layer %.1f, the float32 set %.1f)", prec,
			float64(b.ScratchPeak())/(1<<20), float64(c.VocabSize*h*4)/(1<<20), float64(layer)/(1<<20), float64(set)/(1<<20))
		require.LessOrEqual(t, b.ScratchPeak(), int64(c.VocabSize*h*4)+layer)
	}
}

// TestBuilderRefusesWhatIsNotTheModel: unknown, repeated and missing tensors, a wrong size,
// and a tied lm_head.weight that is not the embedding are errors, not a model.
func TestBuilderRefusesWhatIsNotTheModel(t *testing.T) {
	w, err := Preset("tiny", 1)
	require.NoError(t, err)
	require.True(t, w.Config.TieWordEmbeddings, "the tied case below")
	b, err := NewBuilder(w.Config, kernels.BF16, nil)
	require.NoError(t, err)
	require.ErrorContains(t, b.Put("model.layers.99.mlp.up_proj.weight", nil), "unexpected tensor")
	require.ErrorContains(t, b.Put("model.norm.weight", b.Buffer(3)), "has 3 values")
	require.NoError(t, b.Put("model.norm.weight", append([]float32(nil), w.FinalNorm...)))
	require.ErrorContains(t, b.Put("model.norm.weight", append([]float32(nil), w.FinalNorm...)), "unexpected tensor")
	_, err = b.Model(nil)
	require.ErrorIs(t, err, ErrIncomplete)

	head := append([]float32(nil), w.Embed...)
	head[7]++
	b, err = NewBuilder(w.Config, kernels.BF16, nil)
	require.NoError(t, err)
	require.NoError(t, b.Put("lm_head.weight", head)) // before the embedding: compared then
	require.ErrorContains(t, b.Put("model.embed_tokens.weight", append([]float32(nil), w.Embed...)), "differs")

	_, err = NewBuilder(w.Config, kernels.Precision(9), nil)
	require.ErrorIs(t, err, kernels.ErrPrecision)
}

// withBias gives w's q, k and v projections biases.
func withBias(w *Weights) {
	w.Config.AttentionBias = true
	r := rand.New(rand.NewPCG(11, 11))
	for i := range w.Layers {
		l := &w.Layers[i]
		for _, b := range []*[]float32{&l.Bq, &l.Bk, &l.Bv} {
			n := w.Config.KVDim()
			if b == &l.Bq {
				n = w.Config.HiddenSize
			}
			*b = make([]float32, n)
			for j := range *b {
				(*b)[j] = float32(r.NormFloat64() * 0.1)
			}
		}
	}
}
