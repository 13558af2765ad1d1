package trainer

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// withEnvTail returns s with env appended to each completion as masked environment tokens
// whose logprobs and versions are junk a trainer must not read.
func withEnvTail(s []Sample, env []int) []Sample {
	out := make([]Sample, len(s))
	for i, x := range s {
		y := x
		y.Completion = append(append([]int(nil), x.Completion...), env...)
		y.Logprobs = append([]float32(nil), x.Logprobs...)
		y.Versions = append([]int64(nil), x.Versions...)
		y.LossMask = make([]uint8, len(y.Completion))
		for j := range x.Completion {
			y.LossMask[j] = 1
		}
		for range env {
			// A positive "logprob" and a future version would be refused on a trained token.
			y.Logprobs = append(y.Logprobs, 5)
			y.Versions = append(y.Versions, 1<<40)
		}
		out[i] = y
	}
	return out
}

// TestLossMaskExcludesEnvironmentTokens checks that masked tokens contribute nothing: a
// trajectory with environment tokens after the model's gives the update of the model tokens
// alone (attention is causal, so later tokens do not change earlier logprobs). Without the
// mask the same trajectory trains on the environment tokens and the update differs.
func TestLossMaskExcludesEnvironmentTokens(t *testing.T) {
	w := randomWeights(t, tinyConfig(true), 4)
	newTrainer := func() *Trainer {
		tr, err := New(w, Config{Workers: 1})
		require.NoError(t, err)
		t.Cleanup(tr.Close)
		return tr
	}
	plain, masked, unmasked := newTrainer(), newTrainer(), newTrainer()
	base := testSamples(t, plain, 7)
	env := []int{1, 2, 3, 1}

	a, err := plain.Step(t.Context(), base)
	require.NoError(t, err)
	ms := withEnvTail(base, env)
	b, err := masked.Step(t.Context(), ms)
	require.NoError(t, err)
	require.Equal(t, a.Tokens, b.Tokens, "masked tokens are not counted")
	require.InDelta(t, a.Loss, b.Loss, 1e-9)
	require.InDelta(t, a.Entropy, b.Entropy, 1e-9)
	ta, tb := plain.Weights().Tensors(), masked.Weights().Tensors()
	for i := range ta {
		require.InDeltaSlice(t, *ta[i].Data, *tb[i].Data, 1e-7, ta[i].Name)
	}

	// Without the mask the environment tokens would be trained on: give them valid rollout
	// logprobs and versions so the step runs, and the update must differ.
	um := withEnvTail(base, env)
	for i := range um {
		for j, m := range um[i].LossMask {
			if m == 0 {
				um[i].Logprobs[j], um[i].Versions[j] = -1, 0
			}
		}
		um[i].LossMask = nil
	}
	c, err := unmasked.Step(t.Context(), um)
	require.NoError(t, err)
	require.Equal(t, a.Tokens+len(env)*len(base), c.Tokens)
	require.NotEqual(t, a.Loss, c.Loss)
	tc := unmasked.Weights().Tensors()
	differs := false
	for i := range ta {
		for j, v := range *ta[i].Data {
			differs = differs || v != (*tc[i].Data)[j]
		}
	}
	require.True(t, differs, "training on environment tokens must change the update")
}

// TestLossMaskInTheMiddle checks a multi-turn shape (model, environment, model tokens): the
// environment tokens' junk logprobs are not read and a fully masked batch is refused.
func TestLossMaskInTheMiddle(t *testing.T) {
	w := randomWeights(t, tinyConfig(true), 5)
	tr, err := New(w, Config{Workers: 1})
	require.NoError(t, err)
	defer tr.Close()
	r := rand.New(rand.NewPCG(3, 3))
	var s []Sample
	for i := range 4 {
		c1, l1 := sampleFrom(t, w, r, []int{0, 5}, 3)
		prompt2 := append(append([]int{0, 5}, c1...), 2, 2)
		c2, l2 := sampleFrom(t, w, r, prompt2, 3)
		comp := append(append(append([]int(nil), c1...), 2, 2), c2...)
		lps := append(append(append([]float32(nil), l1...), 9, 9), l2...)
		s = append(s, Sample{Prompt: []int{0, 5}, Completion: comp, Logprobs: lps, Versions: make([]int64, len(comp)),
			LossMask: []uint8{1, 1, 1, 0, 0, 1, 1, 1}, Reward: float64(i % 2), Group: 0})
	}
	st, err := tr.Step(t.Context(), s)
	require.NoError(t, err)
	require.Equal(t, 4*6, st.Tokens)
	require.Equal(t, 4*6, st.OnPolicyTokens)
	require.Less(t, st.MismatchMax, 1e-4, "only model tokens enter the mismatch")

	bad := append([]Sample(nil), s...)
	bad[0].LossMask = []uint8{1, 2, 1, 0, 0, 1, 1, 1}
	_, err = tr.Step(t.Context(), bad)
	require.ErrorIs(t, err, ErrInvalidSample)
	bad[0].LossMask = []uint8{1, 1}
	_, err = tr.Step(t.Context(), bad)
	require.ErrorIs(t, err, ErrInvalidSample)
	none := append([]Sample(nil), s...)
	for i := range none {
		none[i].LossMask = make([]uint8, len(none[i].Completion))
	}
	_, err = tr.Step(t.Context(), none)
	require.ErrorIs(t, err, ErrEmptyBatch)
}
