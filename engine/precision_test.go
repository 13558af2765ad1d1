package engine

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/model"
)

// TestPrecisionGreedyMatchesEffectiveReference: an engine serving bf16 or int8 weights, under
// concurrency and through a weight update (converted at stage time), gives the greedy tokens
// of the float64 reference of the weights' effective values at that precision.
func TestPrecisionGreedyMatchesEffectiveReference(t *testing.T) {
	for _, prec := range []kernels.Precision{kernels.BF16, kernels.Int8} {
		t.Run(prec.String(), func(t *testing.T) {
			e, w := testEngine(t, func(c *Config) { c.Precision = prec; c.MaxBatchedTokens = 24; c.MaxNumSeqs = 4 })
			ctx := ctxT(t)
			require.Equal(t, prec, e.model.Precision, "set before Run; only the engine goroutine writes it")
			check := func(w *model.Weights, version int64) {
				t.Helper()
				eff, err := w.Effective(prec)
				require.NoError(t, err)
				var streams []*Stream
				var prompts [][]int
				for i := range 4 {
					p := prompt(5+i*9, i)
					s, err := e.Add(ctx, Request{ID: fmt.Sprintf("%d-%d", version, i), PromptTokenIDs: p, Sampling: greedy(10)})
					require.NoError(t, err)
					streams, prompts = append(streams, s), append(prompts, p)
				}
				for i, s := range streams {
					res, err := s.Collect(ctx)
					require.NoError(t, err)
					assert.Equal(t, referenceGreedy(t, eff, prompts[i], 10), res.TokenIDs(), "version %d request %d", version, i)
					for _, tok := range res.Tokens {
						assert.Equal(t, version, tok.WeightVersion)
					}
				}
			}
			check(w, 1)
			w2, err := model.Preset("tiny", 2)
			require.NoError(t, err)
			require.NoError(t, e.StageWeights(ctx, w2, 2))
			_, err = e.CommitWeights(ctx, 2)
			require.NoError(t, err)
			check(w2, 2)
		})
	}
}

func TestConfigRefusesAnUnknownPrecision(t *testing.T) {
	w, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	_, err = New(Config{Weights: w, Precision: kernels.Precision(9)})
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "Precision")
}

// TestMemoryBudgetGivesFreedMemoryToKV: under one MemoryBytes budget a bf16 engine holds the
// f32 model's freed half in KV blocks, and an int8 one more still.
func TestMemoryBudgetGivesFreedMemoryToKV(t *testing.T) {
	w, err := model.Preset("stories15m", 1)
	require.NoError(t, err)
	const budget = 160 << 20
	blocks := map[kernels.Precision]int{}
	for _, prec := range []kernels.Precision{kernels.F32, kernels.BF16, kernels.Int8} {
		cfg := Config{Weights: w, MemoryBytes: budget, Precision: prec, Workers: 1}
		require.NoError(t, cfg.defaults())
		blocks[prec] = cfg.NumBlocks
		kv := int64(cfg.NumBlocks) * w.Config.KVBlockBytes(cfg.BlockSize)
		used := kv + w.Config.ModelBytes(prec)
		require.LessOrEqual(t, used, int64(budget), prec)
		require.Greater(t, used, int64(budget)-w.Config.KVBlockBytes(cfg.BlockSize), "%s: the pool takes what the model leaves", prec)
	}
	t.Logf("KV blocks in %d MiB: %v", budget>>20, blocks)
	require.Greater(t, blocks[kernels.BF16], blocks[kernels.F32])
	require.Greater(t, blocks[kernels.Int8], blocks[kernels.BF16])

	for _, cfg := range []Config{
		{Weights: w, MemoryBytes: -1},
		{Weights: w, MemoryBytes: budget, KVBytes: 1 << 20},
		{Weights: w, MemoryBytes: budget, NumBlocks: 64},
		{Weights: w, MemoryBytes: 1 << 20}, // less than the model
	} {
		require.ErrorIs(t, cfg.defaults(), ErrInvalidArgument)
		_, err := New(cfg)
		require.ErrorContains(t, err, "MemoryBytes")
	}
}
