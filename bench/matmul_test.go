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
	// Each pass is held against the peak probed just before it, and the share is the median
	// of the passes' shares.
	peaks := []float64{1000, 10, 100}
	probes := 0
	r, err := MatMul(pool, 64, 48, 5, time.Millisecond, func() float64 { probes++; return peaks[probes-1] })
	require.NoError(t, err)
	require.Equal(t, 3, probes)
	require.Len(t, r.Runs, 3)
	assert.Equal(t, peaks, r.PeakRuns)
	shares := []float64{r.Runs[0] / 1000, r.Runs[1] / 10, r.Runs[2] / 100}
	assert.Equal(t, Median(shares), r.OfPeak)
	assert.Equal(t, max(r.Runs[0], r.Runs[1], r.Runs[2]), r.GFLOPs)
	assert.Equal(t, MatMulResult{Rows: 64, Cols: 48, N: 5, GFLOPs: r.GFLOPs, OfPeak: r.OfPeak, Runs: r.Runs, PeakRuns: peaks}, r)
	assert.Greater(t, r.GFLOPs, 0.0)
	_, err = MatMul(pool, 0, 48, 5, time.Millisecond, func() float64 { return 1 })
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
