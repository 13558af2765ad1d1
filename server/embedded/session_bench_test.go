package embedded_test

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/server"
)

// BenchmarkSessionTurnTTFT measures the time to first token of a session's turn k+1 (a
// 1-token turn after environment tokens) with session affinity, where the server holds the
// transcript's KV from turn k, beside its baseline in the same run: the same transcript sent
// as a fresh request that must prefill all of it (a cache salt of its own, so no server has
// any of it cached). Each iteration is a new episode: a unique 1024-token prompt, a
// 256-token turn k (untimed), 16 environment tokens, then both timed requests. It reports the
// medians and their ratio (goal: <= 0.1).
func BenchmarkSessionTurnTTFT(b *testing.B) {
	const promptLen, turnK, envLen = 1024, 256, 16
	_, c := benchFleet(b, 2, nil, func(_ int, cfg *server.Config) { cfg.KVBlocks = 1024 })
	var warm, cold []time.Duration
	one := sdk.SamplingParams{MaxTokens: 1, IgnoreEOS: true}
	b.ResetTimer()
	for i := range b.N {
		prompt := make([]int, promptLen)
		for j := range prompt {
			prompt[j] = (i*7919 + j*31) % 256
		}
		s, err := c.NewSession(prompt, sdk.SessionOptions{ID: "bench-" + strconv.Itoa(i), Sampling: sdk.SamplingParams{MaxTokens: turnK, IgnoreEOS: true}})
		require.NoError(b, err)
		_, err = s.Generate(b.Context(), sdk.TurnOptions{})
		require.NoError(b, err)
		env := make([]int, envLen)
		for j := range env {
			env[j] = (i + j) % 256
		}
		require.NoError(b, s.Append(env...))
		transcript := s.Transcript()

		t0 := time.Now()
		tr, err := s.Generate(b.Context(), sdk.TurnOptions{Sampling: &one})
		require.NoError(b, err)
		warm = append(warm, time.Since(t0))
		require.Greater(b, tr.Sample.NumCachedTokens, promptLen, "turn k+1 found turn k's KV")

		t0 = time.Now()
		res, err := c.Generate(b.Context(), sdk.GenerateRequest{PromptTokenIDs: transcript, Sampling: one, CacheSalt: "cold-" + strconv.Itoa(i)})
		require.NoError(b, err)
		cold = append(cold, time.Since(t0))
		require.Zero(b, res.Samples[0].NumCachedTokens, "the baseline prefills the whole transcript")
	}
	b.StopTimer()
	slices.Sort(warm)
	slices.Sort(cold)
	w, k := warm[len(warm)/2], cold[len(cold)/2]
	b.ReportMetric(float64(w)/1e6, "session-ttft-ms")
	b.ReportMetric(float64(k)/1e6, "recompute-ttft-ms")
	b.ReportMetric(float64(w)/float64(k), "ratio")
}
