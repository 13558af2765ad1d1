package bench

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/model"
)

func TestMatMulReportsShareOfPeak(t *testing.T) {
	pool := kernels.NewPool(2)
	defer pool.Close()
	r, err := MatMul(pool, 64, 48, 5, time.Millisecond, 1000)
	require.NoError(t, err)
	assert.Equal(t, MatMulResult{Rows: 64, Cols: 48, N: 5, GFLOPs: r.GFLOPs, OfPeak: r.GFLOPs / 1000}, r)
	assert.Greater(t, r.GFLOPs, 0.0)
	_, err = MatMul(pool, 0, 48, 5, time.Millisecond, 1)
	require.Error(t, err)
}

func TestMatMulFlopsPerTokenCountsEveryProjection(t *testing.T) {
	c, err := model.PresetConfig("stories15m")
	require.NoError(t, err)
	// Without attention heads of their own, the projections are the non-norm parameters that a
	// token multiplies: all of them except the embedding table (tied: it is the classifier).
	norms := int64(c.NumHiddenLayers*2*c.HiddenSize + c.HiddenSize)
	want := 2 * float64(c.NumParams()-norms)
	if !c.TieWordEmbeddings {
		want -= 2 * float64(c.VocabSize*c.HiddenSize)
	}
	assert.Equal(t, want, MatMulFlopsPerToken(c))
}

// A request's flops: every prompt position and every decoded token but the last through the
// layers, the classifier once per decoded token.
func TestMatMulFlopsPerRequestCountsThePrompt(t *testing.T) {
	c, err := model.PresetConfig("stories15m")
	require.NoError(t, err)
	tok := MatMulFlopsPerToken(c)
	cls := 2 * float64(c.VocabSize*c.HiddenSize)
	assert.Equal(t, tok, MatMulFlopsPerRequest(c, 1, 1), "a one-token prompt decoding one token is one forward")
	assert.Equal(t, 16*tok, MatMulFlopsPerRequest(c, 1, 16))
	assert.InDelta(t, 16*tok+7*(tok-cls), MatMulFlopsPerRequest(c, 8, 16), 1)
	assert.Zero(t, MatMulFlopsPerRequest(c, 8, 0))
}
