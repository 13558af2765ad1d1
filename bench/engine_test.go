package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/weights"
)

func tinyWeights(t testing.TB) *model.Weights {
	w, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	return w
}

// The figures are checked for shape, not speed: tests assert behaviour, benchmarks measure.
func TestEngineFigures(t *testing.T) {
	ctx := context.Background()
	w := tinyWeights(t)
	c, err := Concurrent(ctx, w, "tiny", kernels.F32, 4, 8, 2)
	require.NoError(t, err)
	assert.Positive(t, c.TokensPerSec)
	p, err := PrefixTTFT(ctx, w, "tiny", 64, 2)
	require.NoError(t, err)
	assert.Equal(t, 64, p.CachedTokens, "the whole shared prefix is a hit")
	pl, err := PauseLatency(ctx, w, 8, 2)
	require.NoError(t, err)
	assert.True(t, pl.ResumeVerified)
	assert.LessOrEqual(t, pl.Steps, int64(2), "Pause(keep) completes at the next step boundary")
	i, err := IdleCPU(ctx, w, 10*time.Millisecond, 2)
	require.NoError(t, err)
	assert.Positive(t, i.Seconds)
}

// TestConcurrentRounds checks the bookkeeping of the rounds: a median of each concurrency's own
// runs, and a speedup that is the median of the per-round ratios, not a ratio of medians.
func TestConcurrentRounds(t *testing.T) {
	w := tinyWeights(t)
	// The peak is probed once per round; each round's share is over its own probe.
	peaks := []float64{1000, 10, 100}
	probes := 0
	rs, err := ConcurrentRounds(context.Background(), w, "tiny", kernels.F32, []int{1, 4}, 8, 2, 3, func() float64 { probes++; return peaks[probes-1] })
	require.NoError(t, err)
	require.Equal(t, 3, probes)
	require.Len(t, rs, 2)
	for i, c := range []int{1, 4} {
		r := rs[i]
		assert.Equal(t, c, r.Concurrency)
		require.Len(t, r.Runs, 3, "one run per round")
		assert.Equal(t, peaks, r.PeakRuns)
		assert.Equal(t, Median(r.Runs), r.TokensPerSec)
		var shares []float64
		for k, p := range peaks {
			shares = append(shares, r.Runs[k]*MatMulFlopsPerRequest(w.Config, 8, 8)/8/1e9/p)
		}
		assert.InDelta(t, Median(shares), r.OfPeak, 1e-12*Median(shares))
	}
	assert.Equal(t, 1.0, rs[0].SpeedupVsBatch1)
	var ratios []float64
	for k := range 3 {
		ratios = append(ratios, rs[1].Runs[k]/rs[0].Runs[k])
	}
	assert.Equal(t, Median(ratios), rs[1].SpeedupVsBatch1)

	// Without concurrency 1 there is no baseline: no speedup.
	rs, err = ConcurrentRounds(context.Background(), w, "tiny", kernels.BF16, []int{2}, 4, 2, 1, nil)
	require.NoError(t, err)
	assert.Zero(t, rs[0].SpeedupVsBatch1)
	assert.Zero(t, rs[0].OfPeak)
}

func TestWeightUpdateFigures(t *testing.T) {
	for _, d := range []weights.DType{weights.F32, weights.BF16} {
		r, err := WeightUpdate(context.Background(), "tiny", 4, 2, 2, d, t.TempDir())
		require.NoError(t, err, d)
		assert.Equal(t, int64(3), r.Version, "two updates")
		assert.True(t, r.NewVersionTokens, "every running request continues on the new version")
		assert.Positive(t, r.Bytes)
		assert.Positive(t, r.LoadGBs)
		assert.Positive(t, r.ReadGBs)
		assert.Positive(t, r.SHA256GBs)
		require.Len(t, r.Rounds, 2)
		assert.Equal(t, r.Rounds[0].StageMs, r.FirstStageMs)
		assert.LessOrEqual(t, r.CutSteps, int64(2), "the cut (pause keep, commit, resume) waits for one step boundary")
	}
}

func BenchmarkConcurrentDecode(b *testing.B) {
	for _, preset := range []string{"stories15m", "stories110m"} {
		w, err := model.Preset(preset, 1)
		require.NoError(b, err)
		for _, c := range []int{1, 8, 32, 64} {
			b.Run(fmt.Sprintf("%s/c=%d", preset, c), func(b *testing.B) {
				for range b.N {
					r, err := Concurrent(context.Background(), w, preset, kernels.F32, c, 32, 2)
					require.NoError(b, err)
					b.ReportMetric(r.TokensPerSec, "tok/s")
				}
			})
		}
	}
}
