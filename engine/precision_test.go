package engine

import (
	"context"
	"fmt"
	"math"
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
				streams, prompts := addFourGreedy(ctx, t, e, version)
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

// TestW8A8ServesBatchInvariantGreedy: w8a8 has no float32 reference (its MatMuls round their
// inputs too), but it is batch invariant: an engine serving w8a8 weights, four requests at a
// time in chunked prefills and through a weight update, gives each request the greedy
// tokens and the logprobs, bit for bit, that an engine running it alone (whole prompt in one
// step, one worker) gives; and those tokens mostly agree with the float64 reference of the
// int8 weights it stores.
func TestW8A8ServesBatchInvariantGreedy(t *testing.T) {
	prec := kernels.W8A8
	e, w := testEngine(t, func(c *Config) { c.Precision = prec; c.MaxBatchedTokens = 24; c.MaxNumSeqs = 4 })
	alone, _ := testEngine(t, func(c *Config) { c.Precision = prec; c.MaxNumSeqs = 1; c.Workers = 1 })
	ctx := ctxT(t)
	require.Equal(t, prec, e.Precision())
	check := func(w *model.Weights, version int64) {
		t.Helper()
		eff, err := w.Effective(prec)
		require.NoError(t, err)
		streams, prompts := addFourGreedy(ctx, t, e, version)
		agree, total := 0, 0
		for i, s := range streams {
			res, err := s.Collect(ctx)
			require.NoError(t, err)
			one, err := alone.Add(ctx, Request{ID: fmt.Sprintf("alone-%d-%d", version, i), PromptTokenIDs: prompts[i], Sampling: greedy(10)})
			require.NoError(t, err)
			want, err := one.Collect(ctx)
			require.NoError(t, err)
			require.Equal(t, want.TokenIDs(), res.TokenIDs(), "version %d request %d", version, i)
			for j, tok := range res.Tokens {
				assert.Equal(t, version, tok.WeightVersion)
				assert.Equal(t, math.Float32bits(want.Tokens[j].Logprob), math.Float32bits(tok.Logprob), "version %d request %d token %d logprob", version, i, j)
			}
			ref := referenceGreedy(t, eff, prompts[i], 10)
			for j, id := range res.TokenIDs() {
				if id != ref[j] {
					break // the rest follows a different prefix
				}
				agree++
			}
			total += len(ref)
		}
		t.Logf("version %d: %d of %d greedy tokens before the first divergence from the float64 reference of the int8 weights", version, agree, total)
		assert.Greater(t, agree, total/2, "version %d: w8a8 follows its weights", version)
	}
	check(w, 1)
	w2, err := model.Preset("tiny", 2)
	require.NoError(t, err)
	for _, x := range []*Engine{e, alone} {
		require.NoError(t, x.StageWeights(ctx, w2, 2))
		_, err = x.CommitWeights(ctx, 2)
		require.NoError(t, err)
	}
	check(w2, 2)
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
	for _, prec := range []kernels.Precision{kernels.F32, kernels.BF16, kernels.Int8, kernels.W8A8} {
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
	require.Greater(t, blocks[kernels.W8A8], blocks[kernels.Int8], "w8a8 stores float16 scales where int8 keeps float32 ones")

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

// TestLowPrecisionKeepsNoFloat32Set: at bf16 and int8 the engine holds its packed models
// only (the initial set and every update), Weights rebuilds the effective weights from the
// serving model bit for bit, and a commit during that copy does not hand the model being
// copied to the next stage as its spare (a torn copy).
func TestLowPrecisionKeepsNoFloat32Set(t *testing.T) {
	for _, prec := range []kernels.Precision{kernels.BF16, kernels.Int8, kernels.W8A8} {
		t.Run(prec.String(), func(t *testing.T) {
			e, w1 := testEngine(t, func(c *Config) { c.Precision = prec })
			ctx := ctxT(t)
			require.Equal(t, prec, e.Precision())
			one := w1.Config.ModelBytes(prec)
			held := func() int64 {
				t.Helper()
				n, err := e.ResidentWeightBytes(ctx)
				require.NoError(t, err)
				return n
			}
			require.Equal(t, one, held(), "the packed model alone")
			eff1, err := w1.Effective(prec)
			require.NoError(t, err)
			got, err := e.Weights(ctx)
			require.NoError(t, err)
			require.Equal(t, eff1, got, "the effective weights served")

			w2, err := model.Preset("tiny", 2)
			require.NoError(t, err)
			require.NoError(t, e.StageWeights(ctx, w2, 2))
			require.Equal(t, 2*one, held(), "serving and staged models, no float32 set")
			_, err = e.CommitWeights(ctx, 2)
			require.NoError(t, err)
			require.Equal(t, 2*one, held(), "serving model and the retired one as spare")

			// Retire version 2 while Weights copies it, then stage version 4 (which would
			// pack into the spare): the copy is still version 2's effective weights.
			w3, err := model.Preset("tiny", 3)
			require.NoError(t, err)
			w4, err := model.Preset("tiny", 4)
			require.NoError(t, err)
			e.beforeCopy = func() {
				_, err := e.UpdateWeights(ctx, w3, 3, false)
				require.NoError(t, err)
				_, err = e.UpdateWeights(ctx, w4, 4, false)
				require.NoError(t, err)
			}
			got, err = e.Weights(ctx)
			require.NoError(t, err)
			eff2, err := w2.Effective(prec)
			require.NoError(t, err)
			require.Equal(t, eff2, got, "the copy of version 2 is whole")
			e.beforeCopy = nil
			eff4, err := w4.Effective(prec)
			require.NoError(t, err)
			got, err = e.Weights(ctx)
			require.NoError(t, err)
			require.Equal(t, eff4, got)
			if prec != kernels.W8A8 { // w8a8 has no float32 reference: see TestW8A8ServesBatchInvariantGreedy
				assertServesGreedy(ctx, t, e, eff4, prompt(9, 1), 6, "version 4 serves")
			}
		})
	}
}

// TestResidentWeightBytesPerPrecision: the weight memory an engine holds (its serving packed
// model and, at f32 only, the float32 set beside it) on the stories15m shape, per precision,
// and what a MemoryBytes budget then gives the KV pool. The figures are in
// docs/precision.md ("Memory").
func TestResidentWeightBytesPerPrecision(t *testing.T) {
	w, err := model.Preset("stories15m", 1)
	require.NoError(t, err)
	const budget = 160 << 20
	held := map[kernels.Precision]int64{}
	for _, prec := range []kernels.Precision{kernels.F32, kernels.BF16, kernels.Int8, kernels.W8A8} {
		e, err := New(Config{Weights: w, MemoryBytes: budget, Precision: prec, Workers: 1})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(ctxT(t))
		done := make(chan error, 1)
		go func() { done <- e.Run(ctx) }()
		held[prec], err = e.ResidentWeightBytes(ctx)
		require.NoError(t, err)
		blocks := e.blocks.NumBlocks()
		cancel()
		require.NoError(t, <-done)
		model := w.Config.ModelBytes(prec)
		if prec == kernels.F32 {
			require.Greater(t, held[prec], model, "f32 keeps the set's matrices beside the packed ones")
		} else {
			require.Equal(t, model, held[prec], "%s: the packed model alone", prec)
		}
		t.Logf("%s: engine weight memory %.1f MiB (packed model %.1f MiB), %d KV blocks of 16 tokens in %d MiB",
			prec, float64(held[prec])/(1<<20), float64(model)/(1<<20), blocks, budget>>20)
	}
	bf, i8 := float64(held[kernels.BF16])/float64(held[kernels.F32]), float64(held[kernels.Int8])/float64(held[kernels.F32])
	t.Logf("over f32's: bf16 %.3f, int8 %.3f", bf, i8)
	require.LessOrEqual(t, bf, 0.5, "bf16 holds at most half of f32's weight memory")
	require.LessOrEqual(t, i8, 1.125/4+0.01, "int8 at most about 1.125/4 of it")
	w8 := float64(held[kernels.W8A8]) / float64(held[kernels.F32])
	t.Logf("w8a8 %.3f", w8)
	require.Less(t, w8, i8, "w8a8's matrices hold float16 scales, int8's float32 ones")
	require.LessOrEqual(t, w8, 1.0625/4+0.01, "w8a8 at most about 1.0625/4 of it")
}

// TestStageBuilt: a model built tensor by tensor (Builder) stages and serves as the set it
// was built from would, Weights gives its effective weights, and an incomplete builder is
// refused without touching what serves.
func TestStageBuilt(t *testing.T) {
	for _, prec := range []kernels.Precision{kernels.F32, kernels.BF16} {
		t.Run(prec.String(), func(t *testing.T) {
			e, _ := testEngine(t, func(c *Config) { c.Precision = prec })
			ctx := ctxT(t)
			b, err := e.Builder()
			require.NoError(t, err)
			require.ErrorIs(t, e.StageBuilt(ctx, b, 2), ErrInvalidArgument, "no tensor put")
			require.ErrorIs(t, e.StageBuilt(ctx, nil, 2), ErrInvalidArgument)

			w2, err := model.Preset("tiny", 2)
			require.NoError(t, err)
			b, err = e.Builder()
			require.NoError(t, err)
			require.NoError(t, b.SetConfig(w2.Config))
			for _, ts := range w2.Tensors() {
				buf := b.Buffer(ts.Len())
				copy(buf, *ts.Data)
				require.NoError(t, b.Put(ts.Name, buf))
			}
			require.NoError(t, e.StageBuilt(ctx, b, 2))
			_, err = e.CommitWeights(ctx, 2)
			require.NoError(t, err)
			eff, err := w2.Effective(prec)
			require.NoError(t, err)
			got, err := e.Weights(ctx)
			require.NoError(t, err)
			require.Equal(t, eff, got)
			assertServesGreedy(ctx, t, e, eff, prompt(7, 2), 5)
		})
	}
}

// TestConfigBuilder: an engine starts from a complete Builder instead of a weight set (the
// initial load of a bf16 server) and serves its model; a Builder beside Weights, at another
// precision, or incomplete is refused.
func TestConfigBuilder(t *testing.T) {
	w, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	build := func(prec kernels.Precision, complete bool) *model.Builder {
		b, err := model.NewBuilder(w.Config, prec, nil)
		require.NoError(t, err)
		for _, ts := range w.Tensors() {
			if !complete && ts.Name == "model.norm.weight" {
				continue
			}
			buf := b.Buffer(ts.Len())
			copy(buf, *ts.Data)
			require.NoError(t, b.Put(ts.Name, buf))
		}
		return b
	}
	for _, cfg := range []Config{
		{},
		{Weights: w, Builder: build(kernels.BF16, true), Precision: kernels.BF16},
		{Builder: build(kernels.BF16, true), Precision: kernels.Int8},
		{Builder: build(kernels.BF16, false), Precision: kernels.BF16, NumBlocks: 16},
	} {
		_, err := New(cfg)
		require.ErrorIs(t, err, ErrInvalidArgument)
	}
	e, _ := testEngine(t, func(c *Config) { c.Weights, c.Builder, c.Precision = nil, build(kernels.BF16, true), kernels.BF16 })
	ctx := ctxT(t)
	n, err := e.ResidentWeightBytes(ctx)
	require.NoError(t, err)
	require.Equal(t, w.Config.ModelBytes(kernels.BF16), n)
	eff, err := w.Effective(kernels.BF16)
	require.NoError(t, err)
	assertServesGreedy(ctx, t, e, eff, prompt(6, 3), 5)
}

// assertServesGreedy checks that e decodes p greedily for n tokens as the reference forward
// of eff (the effective weights of the precision e serves) does.
func assertServesGreedy(ctx context.Context, t *testing.T, e *Engine, eff *model.Weights, p []int, n int, msgAndArgs ...any) {
	t.Helper()
	s, err := e.Add(ctx, Request{ID: "a", PromptTokenIDs: p, Sampling: greedy(n)})
	require.NoError(t, err)
	res, err := s.Collect(ctx)
	require.NoError(t, err)
	assert.Equal(t, referenceGreedy(t, eff, p, n), res.TokenIDs(), msgAndArgs...)
}

// addFourGreedy adds four greedy requests of 10 tokens for version, with prompts of 5 to 32
// tokens (chunked prefills beside decodes at a 24-token step budget), and returns their
// streams and prompts.
func addFourGreedy(ctx context.Context, t *testing.T, e *Engine, version int64) ([]*Stream, [][]int) {
	t.Helper()
	var streams []*Stream
	var prompts [][]int
	for i := range 4 {
		p := prompt(5+i*9, i)
		s, err := e.Add(ctx, Request{ID: fmt.Sprintf("%d-%d", version, i), PromptTokenIDs: p, Sampling: greedy(10)})
		require.NoError(t, err)
		streams, prompts = append(streams, s), append(prompts, p)
	}
	return streams, prompts
}
