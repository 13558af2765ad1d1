package embedded_test

import (
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/server"
)

// BenchmarkSessionTurnTTFT measures the time to first token of a session's turn k+1 (a
// 1-token turn after environment tokens), where the session's server holds the transcript's
// KV from turn k, beside its baseline in the same run: the same transcript sent as a fresh
// request that must prefill all of it (a cache salt of its own, so no server has any of it
// cached). Each iteration is a new episode: a unique 1024-token prompt, a 256-token turn k
// (untimed), 16 environment tokens, then both timed requests. It reports the medians and
// their ratio (goal: <= 0.1).
//
//   - prefix-cache: turn k's KV is still in the server's GPU-side prefix cache.
//   - cpu-tier: the server's KV pool is small and other requests (untimed) evict turn k's
//     blocks before turn k+1, which loads them back from the CPU offload tier.
func BenchmarkSessionTurnTTFT(b *testing.B) {
	b.Run("prefix-cache", func(b *testing.B) {
		_, c := benchFleet(b, 2, nil, func(_ int, cfg *server.Config) { cfg.KVBlocks = 1024 })
		benchTurnTTFT(b, c, nil)
	})
	b.Run("cpu-tier", func(b *testing.B) {
		f, c := benchFleet(b, 1, nil, func(_ int, cfg *server.Config) {
			cfg.KVBlocks = 160 // 2560 tokens: one episode and a little more
			cfg.OffloadCPUBytes = 512 << 20
		})
		evict := func(i int) {
			// Two other long prompts take the pool: turn k's blocks are evicted from it.
			for k := range 2 {
				p := make([]int, 1900)
				for j := range p {
					p[j] = (i*104729 + k*7 + j*13) % 256
				}
				_, err := c.Generate(b.Context(), sdk.GenerateRequest{PromptTokenIDs: p, Sampling: sdk.SamplingParams{MaxTokens: 1}})
				require.NoError(b, err)
			}
		}
		benchTurnTTFT(b, c, evict)
		hits := offloadHitTokens(b, f.Servers()[0].URL())
		require.Positive(b, hits, "turn k+1 loaded KV from the CPU tier")
		b.ReportMetric(hits/float64(b.N), "cpu-hit-tokens/op")
	})
}

// offloadHitTokens reads rollout_offload_hit_tokens_total from a server's /metrics.
func offloadHitTokens(b *testing.B, url string) float64 {
	b.Helper()
	resp, err := http.Get(url + "/metrics")
	require.NoError(b, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(b, err)
	for _, line := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(line, "rollout_offload_hit_tokens_total "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			require.NoError(b, err)
			return v
		}
	}
	b.Fatal("rollout_offload_hit_tokens_total not exported")
	return 0
}

func benchTurnTTFT(b *testing.B, c *sdk.Client, between func(i int)) {
	const promptLen, turnK, envLen = 1024, 256, 16
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
		if between != nil {
			between(i)
		}
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
