package trainer

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/weights"
)

// TestStepRejectsBadInput checks every kind of unusable batch returns its sentinel before any
// work and leaves the weights and version unchanged.
func TestStepRejectsBadInput(t *testing.T) {
	c := tinyConfig(true)
	tr, err := New(randomWeights(t, c, 1), Config{Workers: 1, Version: 2})
	require.NoError(t, err)
	defer tr.Close()
	good := func() []Sample {
		mk := func(g int, r float64) Sample {
			return Sample{Prompt: []int{1, 2}, Completion: []int{3, 4, 5}, Logprobs: []float32{-1, -2, -3},
				Versions: []int64{2, 2, 1}, Reward: r, Group: g}
		}
		return []Sample{mk(0, 1), mk(0, 0), mk(1, 0.5), mk(1, 0.2)}
	}
	cases := []struct {
		name  string
		edit  func([]Sample) []Sample
		want  error
		field string
	}{
		{"empty batch", func([]Sample) []Sample { return nil }, ErrEmptyBatch, ""},
		{"group of one", func(s []Sample) []Sample { return s[:3] }, ErrGroupTooSmall, "group 1"},
		{"empty prompt", func(s []Sample) []Sample { s[1].Prompt = nil; return s }, ErrInvalidSample, "empty prompt"},
		{"empty completion", func(s []Sample) []Sample {
			s[2].Completion, s[2].Logprobs, s[2].Versions = nil, nil, nil
			return s
		}, ErrInvalidSample, "empty completion"},
		{"logprobs length", func(s []Sample) []Sample { s[0].Logprobs = s[0].Logprobs[:2]; return s }, ErrInvalidSample, "2 logprobs for 3"},
		{"versions length", func(s []Sample) []Sample { s[3].Versions = nil; return s }, ErrInvalidSample, "0 versions for 3"},
		{"token outside vocab", func(s []Sample) []Sample { s[0].Completion[1] = c.VocabSize; return s }, ErrInvalidSample, "outside vocab"},
		{"negative prompt token", func(s []Sample) []Sample { s[0].Prompt[0] = -1; return s }, ErrInvalidSample, "outside vocab"},
		{"too long", func(s []Sample) []Sample { s[0].Prompt = make([]int, c.MaxPositionEmbeddings); return s }, ErrInvalidSample, "the context has 64"},
		{"future version", func(s []Sample) []Sample { s[0].Versions[0] = 3; return s }, ErrInvalidSample, "newer than the trainer's 2"},
		{"NaN logprob", func(s []Sample) []Sample { s[0].Logprobs[0] = float32(math.NaN()); return s }, ErrInvalidSample, "logprob"},
		{"positive logprob", func(s []Sample) []Sample { s[0].Logprobs[0] = 2; return s }, ErrInvalidSample, "logprob"},
		{"infinite reward", func(s []Sample) []Sample { s[0].Reward = math.Inf(1); return s }, ErrInvalidSample, "reward"},
	}
	before := tr.Weights()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tr.Step(t.Context(), tc.edit(good()))
			require.ErrorIs(t, err, tc.want)
			require.ErrorContains(t, err, tc.field)
		})
	}
	require.Equal(t, int64(2), tr.Version())
	require.Equal(t, 0, tr.Steps())
	require.True(t, slices.Equal(before.Embed, tr.Weights().Embed))
	_, err = tr.Step(t.Context(), good()) // and the good batch trains
	require.NoError(t, err)
}

func TestNewRejectsBadConfig(t *testing.T) {
	w := randomWeights(t, tinyConfig(true), 1)
	for _, cfg := range []Config{
		{LR: -1}, {LR: math.NaN()}, {MinLR: 1, LR: 0.1}, {WarmupSteps: -1}, {Schedule: "linear"},
		{Schedule: ScheduleCosine}, {Beta1: 1}, {Beta2: -0.5}, {AdamEps: -1}, {WeightDecay: -1},
		{ClipLow: 1.5}, {ClipHigh: -1}, {TISCap: 0.5}, {KLCoef: -1}, {MicroBatchTokens: -5}, {Workers: -1},
		{Sampling: Sampling{Temperature: 1e-7}}, {Sampling: Sampling{Temperature: -1}}, {Sampling: Sampling{TopP: 1.5}},
		{Sampling: Sampling{MinP: 2}}, {Sampling: Sampling{TopK: -3}},
	} {
		_, err := New(w, cfg)
		require.ErrorIs(t, err, ErrInvalidConfig, "%+v", cfg)
	}
	_, err := New(nil, Config{})
	require.ErrorIs(t, err, ErrInvalidConfig)
	broken := randomWeights(t, tinyConfig(true), 1)
	broken.Layers[1].Wq = broken.Layers[1].Wq[:3]
	_, err = New(broken, Config{})
	require.ErrorIs(t, err, ErrInvalidConfig)
	other := randomWeights(t, tinyConfig(false), 1)
	_, err = New(w, Config{KLCoef: 0.1, Reference: other})
	require.ErrorIs(t, err, ErrShapeMismatch)
	// The backward pass has no q/k/v biases and no RoPE scaling.
	biased := tinyConfig(true)
	biased.AttentionBias = true
	scaled := tinyConfig(true)
	scaled.RopeScaling = model.Llama3RopeScaling()
	for _, c := range []model.Config{biased, scaled} {
		_, err = New(randomWeights(t, c, 1), Config{})
		require.ErrorIs(t, err, ErrInvalidConfig)
	}

	tr, err := New(w, Config{Workers: 1})
	require.NoError(t, err)
	tr.Close()
	_, err = tr.Step(t.Context(), nil)
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, tr.Save(t.TempDir()), ErrClosed)
}

// TestResumeRejectsBadCheckpoint covers a missing checkpoint, a malformed state file and
// optimizer state of another shape than the weights.
func TestResumeRejectsBadCheckpoint(t *testing.T) {
	_, err := Resume(filepath.Join(t.TempDir(), "nothing"), Config{})
	require.ErrorIs(t, err, ErrBadCheckpoint)

	tr, err := New(randomWeights(t, tinyConfig(true), 1), Config{Workers: 1})
	require.NoError(t, err)
	defer tr.Close()
	dir := t.TempDir()
	require.NoError(t, tr.Save(dir))

	state := filepath.Join(dir, StateDir, StateFile)
	good, err := os.ReadFile(state)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(state, []byte("{not json"), 0o644))
	_, err = Resume(dir, Config{})
	require.ErrorIs(t, err, ErrBadCheckpoint)
	require.NoError(t, os.WriteFile(state, good, 0o644))

	bigger := tinyConfig(true)
	bigger.HiddenSize = 32
	wb, err := model.Random(bigger, 1)
	require.NoError(t, err)
	require.NoError(t, weights.SaveHF(filepath.Join(dir, StateDir, adamVDir), wb, weights.F32))
	_, err = Resume(dir, Config{})
	require.ErrorIs(t, err, ErrShapeMismatch)
	require.ErrorContains(t, err, "hidden 16")

	require.NoError(t, os.RemoveAll(filepath.Join(dir, StateDir, adamMDir)))
	_, err = Resume(dir, Config{})
	require.ErrorIs(t, err, ErrBadCheckpoint)

	_, err = Resume(dir, Config{KLCoef: 0.1})
	require.ErrorIs(t, err, ErrInvalidConfig, "KL on resume needs the reference")

	require.NoError(t, CheckShape(tinyConfig(true), tinyConfig(true)))
	require.ErrorIs(t, CheckShape(tinyConfig(true), bigger), ErrShapeMismatch)
}

func TestStepCancelled(t *testing.T) {
	tr, err := New(randomWeights(t, tinyConfig(true), 1), Config{Workers: 1})
	require.NoError(t, err)
	defer tr.Close()
	s := testSamples(t, tr, 1)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	before := tr.Weights()
	_, err = tr.Step(ctx, s)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, int64(0), tr.Version())
	require.True(t, slices.Equal(before.Embed, tr.Weights().Embed))
}
