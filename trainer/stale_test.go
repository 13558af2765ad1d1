package trainer

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDropStaleLeavesOldTokensOutOfTheLoss: with DropStale, a token more than MaxStaleness
// versions older than the trainer is context only, exactly like a masked token: the update
// equals that of the same batch with those tokens masked, and the step counts them. Without
// DropStale they are trained on (with truncated importance sampling).
func TestDropStaleLeavesOldTokensOutOfTheLoss(t *testing.T) {
	w := randomWeights(t, tinyConfig(true), 4)
	newTrainer := func(c Config) *Trainer {
		c.Workers, c.Version = 1, 3
		tr, err := New(w, c)
		require.NoError(t, err)
		t.Cleanup(tr.Close)
		return tr
	}
	dropping := newTrainer(Config{DropStale: true, MaxStaleness: 1})
	masking, keeping := newTrainer(Config{}), newTrainer(Config{})
	base := testSamples(t, dropping, 9)
	stale, masked := make([]Sample, len(base)), make([]Sample, len(base))
	old := 0
	for i, s := range base {
		s.Versions = make([]int64, len(s.Completion))
		for j := range s.Versions {
			s.Versions[j] = 3
		}
		// The last token of every other sample is 2 versions old: past a bound of 1.
		m := make([]uint8, len(s.Completion))
		for j := range m {
			m[j] = 1
		}
		if i%2 == 0 {
			s.Versions[len(s.Versions)-1] = 1
			m[len(m)-1] = 0
			old++
		}
		// One token exactly at the bound (version 2) stays.
		if len(s.Versions) > 1 {
			s.Versions[0] = 2
		}
		stale[i] = s
		ms := s
		ms.LossMask = m
		masked[i] = ms
	}
	a, err := dropping.Step(t.Context(), stale)
	require.NoError(t, err)
	b, err := masking.Step(t.Context(), masked)
	require.NoError(t, err)
	require.Equal(t, old, a.DroppedStaleTokens)
	require.Equal(t, b.Tokens, a.Tokens)
	require.InDelta(t, b.Loss, a.Loss, 1e-9)
	ta, tb := dropping.Weights().Tensors(), masking.Weights().Tensors()
	for i := range ta {
		require.InDeltaSlice(t, *tb[i].Data, *ta[i].Data, 1e-7, ta[i].Name)
	}

	c, err := keeping.Step(t.Context(), stale)
	require.NoError(t, err)
	require.Zero(t, c.DroppedStaleTokens)
	require.Equal(t, a.Tokens+old, c.Tokens, "without DropStale the old tokens are trained on")
}

func TestMaxStalenessMustNotBeNegative(t *testing.T) {
	require.ErrorIs(t, Config{DropStale: true, MaxStaleness: -1}.Validate(), ErrInvalidConfig)
}
