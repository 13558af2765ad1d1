package main

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/load"
	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/server/embedded"
	"github.com/rolloutkit/rollout/trainer"
)

// TestTrainerLogprobsMatchSampling (issue 27, item 3): rollouts sampled through the SDK at
// temperature 0.7 and top_p 0.9 come back with processed logprobs (the default), a trainer
// told the same sampling recomputes them to 1e-6, and every on-policy importance ratio is 1
// (nothing clipped). Raw logprobs, the old only choice, are off by far more.
func TestTrainerLogprobsMatchSampling(t *testing.T) {
	ctx := t.Context()
	f, err := embedded.Start(ctx, embedded.Options{Servers: 1, Model: "builtin:tiny"})
	require.NoError(t, err)
	defer func() { require.NoError(t, f.Close()) }()
	c, err := sdk.Dial(ctx, f.DialOptions())
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()
	m, err := load.Open("builtin:tiny", "")
	require.NoError(t, err)
	samp := trainer.Sampling{Temperature: 0.7, TopP: 0.9}
	tr, err := trainer.New(m.Weights, trainer.Config{Sampling: samp, Workers: 1})
	require.NoError(t, err)
	defer tr.Close()
	rawTr, err := trainer.New(m.Weights, trainer.Config{Workers: 1})
	require.NoError(t, err)
	defer rawTr.Close()

	prompt := []int{m.Weights.Config.BOSTokenID, 'a', '=', '1'}
	seed := int64(5)
	p := sdk.SamplingParams{MaxTokens: 12, Temperature: samp.Temperature, TopP: samp.TopP, Seed: &seed, IgnoreEOS: true}
	res, err := c.Generate(ctx, sdk.GenerateRequest{PromptTokenIDs: prompt, N: 8, Sampling: p})
	require.NoError(t, err)
	p.LogprobMode = sdk.LogprobRaw
	rawRes, err := c.Generate(ctx, sdk.GenerateRequest{PromptTokenIDs: prompt, N: 8, Sampling: p})
	require.NoError(t, err)

	var samples []trainer.Sample
	rawGap := 0.0
	for i, s := range res.Samples {
		ids := s.TokenIDs()
		require.Equal(t, ids, rawRes.Samples[i].TokenIDs(), "same seed, same tokens")
		got, err := tr.Logprobs(ctx, prompt, ids)
		require.NoError(t, err)
		lps := make([]float32, len(ids))
		for j, lp := range s.Logprobs() {
			require.InDelta(t, lp, got[j], 1e-6, "sample %d token %d: trainer vs server processed logprob", i, j)
			lps[j] = float32(lp)
			rawGap = max(rawGap, math.Abs(rawRes.Samples[i].Logprobs()[j]-got[j]))
		}
		rawGot, err := rawTr.Logprobs(ctx, prompt, ids)
		require.NoError(t, err)
		for j, lp := range rawRes.Samples[i].Logprobs() {
			require.InDelta(t, lp, rawGot[j], 1e-6, "raw mode matches a trainer at temperature 1")
		}
		samples = append(samples, trainer.Sample{Prompt: prompt, Completion: ids, Logprobs: lps,
			Versions: s.WeightVersions(), Reward: float64(i % 2), Group: 0})
	}
	require.Greater(t, rawGap, 0.05, "raw logprobs are not the sampling distribution at T=0.7, top_p=0.9")
	st, err := tr.Step(ctx, samples)
	require.NoError(t, err)
	require.LessOrEqual(t, st.MismatchMax, 1e-6, "on-policy ratio exp(trainer - rollout) is 1")
	require.Zero(t, st.ClipFraction)
	require.Zero(t, st.OutsideKeptTokens)
	require.Equal(t, st.Tokens, st.OnPolicyTokens)
}
