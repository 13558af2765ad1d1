package sdk

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSamplingDefaultsFitRL (issue 27): a zero SamplingParams samples at temperature 1 (as
// vLLM) with processed logprobs, greedy decoding is explicit, and a greedy group of identical
// samples is refused unless asked for.
func TestSamplingDefaultsFitRL(t *testing.T) {
	_, gens, c := genFleet(t, 1, 0)
	last := func() wireRequest {
		r := gens[0].got()
		require.NotEmpty(t, r)
		return r[len(r)-1]
	}

	_, err := c.Generate(t.Context(), GenerateRequest{PromptTokenIDs: []int{1}, N: 4, Sampling: SamplingParams{MaxTokens: 2}})
	require.NoError(t, err)
	assert.Equal(t, DefaultTemperature, last().Sampling.Temperature, "temperature 0 means the default, 1.0")
	assert.Equal(t, LogprobProcessed, last().Sampling.LogprobMode, "logprobs of the distribution sampled from")

	_, err = c.Generate(t.Context(), GenerateRequest{PromptTokenIDs: []int{1}, Sampling: SamplingParams{MaxTokens: 2, Greedy: true,
		LogprobMode: LogprobRaw}})
	require.NoError(t, err)
	assert.Zero(t, last().Sampling.Temperature, "greedy goes to the servers as temperature 0")
	assert.Equal(t, LogprobRaw, last().Sampling.LogprobMode)

	for name, p := range map[string]SamplingParams{
		"greedy group":         {Greedy: true},
		"tiny temperature":     {Temperature: 1e-6},
		"greedy and T":         {Greedy: true, Temperature: 0.5},
		"unknown logprob mode": {LogprobMode: "sampled"},
	} {
		n := len(gens[0].got())
		_, err := c.Generate(t.Context(), GenerateRequest{PromptTokenIDs: []int{1}, N: 3, Sampling: p})
		require.ErrorIs(t, err, ErrInvalid, name)
		require.Len(t, gens[0].got(), n, "%s: refused before any request", name)
	}
	_, err = c.Generate(t.Context(), GenerateRequest{PromptTokenIDs: []int{1}, N: 3, Sampling: SamplingParams{MaxTokens: 2, Greedy: true}})
	require.ErrorContains(t, err, "identical samples")

	_, err = c.Generate(t.Context(), GenerateRequest{PromptTokenIDs: []int{1}, N: 3, Sampling: SamplingParams{MaxTokens: 2, Greedy: true,
		AllowIdenticalSamples: true}})
	require.NoError(t, err, "asked for explicitly")
	assert.Zero(t, last().Sampling.Temperature)
}
