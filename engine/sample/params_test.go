package sample

import (
	"encoding/json"
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestValidate(t *testing.T) {
	const vocab = 100
	ok := Defaults()
	with := func(f func(p *Params)) Params {
		p := ok
		f(&p)
		return p
	}
	bad := []struct {
		name  string
		p     Params
		vocab int
		field string
	}{
		{"negative temperature", with(func(p *Params) { p.Temperature = -0.1 }), vocab, "temperature"},
		{"NaN temperature", with(func(p *Params) { p.Temperature = math.NaN() }), vocab, "temperature"},
		{"+Inf temperature", with(func(p *Params) { p.Temperature = math.Inf(1) }), vocab, "temperature"},
		{"huge temperature", with(func(p *Params) { p.Temperature = MaxTemperature + 1 }), vocab, "temperature"},
		{"top_p zero", with(func(p *Params) { p.TopP = 0 }), vocab, "top_p"},
		{"top_p negative", with(func(p *Params) { p.TopP = -0.5 }), vocab, "top_p"},
		{"top_p above one", with(func(p *Params) { p.TopP = 1.01 }), vocab, "top_p"},
		{"top_p NaN", with(func(p *Params) { p.TopP = math.NaN() }), vocab, "top_p"},
		{"top_k below -1", with(func(p *Params) { p.TopK = -2 }), vocab, "top_k"},
		{"min_p negative", with(func(p *Params) { p.MinP = -0.01 }), vocab, "min_p"},
		{"min_p above one", with(func(p *Params) { p.MinP = 1.5 }), vocab, "min_p"},
		{"min_p NaN", with(func(p *Params) { p.MinP = math.NaN() }), vocab, "min_p"},
		{"max_tokens zero", with(func(p *Params) { p.MaxTokens = 0 }), vocab, "max_tokens"},
		{"max_tokens negative", with(func(p *Params) { p.MaxTokens = -3 }), vocab, "max_tokens"},
		{"min_tokens negative", with(func(p *Params) { p.MinTokens = -1 }), vocab, "min_tokens"},
		{"min_tokens above max", with(func(p *Params) { p.MinTokens = 17 }), vocab, "min_tokens"},
		{"stop id negative", with(func(p *Params) { p.StopTokenIDs = []int{3, -1} }), vocab, "stop_token_ids"},
		{"stop id = vocab", with(func(p *Params) { p.StopTokenIDs = []int{vocab} }), vocab, "stop_token_ids"},
		{"logprobs negative", with(func(p *Params) { p.Logprobs = -1 }), vocab, "logprobs"},
		{"logprobs above cap", with(func(p *Params) { p.Logprobs = MaxLogprobs + 1 }), vocab, "logprobs"},
		{"logprobs above vocab", with(func(p *Params) { p.Logprobs = 5 }), 4, "logprobs"},
		{"unknown logprob mode", with(func(p *Params) { p.LogprobMode = "logits" }), vocab, "logprob_mode"},
		{"zero vocab", ok, 0, "vocab_size"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.p.Validate(tc.vocab)
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrInvalidParams)
			var fe *FieldError
			require.ErrorAs(t, err, &fe)
			assert.Equal(t, tc.field, fe.Field)
			assert.Contains(t, err.Error(), tc.field)
		})
	}

	seed := int64(-5)
	good := []Params{
		ok,
		with(func(p *Params) { p.Temperature = 0 }),
		with(func(p *Params) { p.Temperature = MaxTemperature }),
		with(func(p *Params) { p.TopP = 1e-9; p.TopK = -1; p.MinP = 1 }),
		with(func(p *Params) { p.TopK = 1_000_000 }), // larger than the vocabulary: off
		with(func(p *Params) {
			p.Seed = &seed
			p.StopTokenIDs = []int{0, vocab - 1}
			p.Logprobs = MaxLogprobs
			p.MinTokens = 16
			p.LogprobMode = LogprobProcessed
		}),
		(Params{}).WithDefaults(),
	}
	for i, p := range good {
		assert.NoError(t, p.Validate(vocab), "good case %d", i)
	}
}

func TestDefaultsAndJSON(t *testing.T) {
	d := Defaults()
	assert.Equal(t, 1.0, d.Temperature)
	assert.Equal(t, 1.0, d.TopP)
	assert.Equal(t, DefaultMaxTokens, d.MaxTokens)
	assert.Equal(t, LogprobRaw, d.LogprobMode)

	// Decoding into Defaults keeps OpenAI defaults for omitted fields and honours explicit zeros.
	p := Defaults()
	require.NoError(t, json.Unmarshal([]byte(`{"max_tokens":5,"top_k":40}`), &p))
	assert.Equal(t, 1.0, p.Temperature)
	assert.Equal(t, 1.0, p.TopP)
	assert.Equal(t, 40, p.TopK)
	assert.Equal(t, 5, p.MaxTokens)

	p = Defaults()
	body := `{"temperature":0,"top_p":0.9,"min_p":0.05,"seed":42,"stop_token_ids":[2,7],
		"logprobs":3,"max_tokens":8,"min_tokens":2,"ignore_eos":true,"logprob_mode":"processed"}`
	require.NoError(t, json.Unmarshal([]byte(body), &p))
	assert.True(t, p.Greedy())
	assert.Equal(t, 0.9, p.TopP)
	assert.Equal(t, 0.05, p.MinP)
	require.NotNil(t, p.Seed)
	assert.Equal(t, int64(42), *p.Seed)
	assert.Equal(t, []int{2, 7}, p.StopTokenIDs)
	assert.Equal(t, 3, p.Logprobs)
	assert.Equal(t, 2, p.MinTokens)
	assert.True(t, p.IgnoreEOS)
	assert.Equal(t, LogprobProcessed, p.LogprobMode)
	require.NoError(t, p.WithDefaults().Validate(10))

	// Decoding into a zero Params: WithDefaults repairs top_p and max_tokens; temperature stays 0.
	var z Params
	require.NoError(t, json.Unmarshal([]byte(`{}`), &z))
	w := z.WithDefaults()
	assert.Equal(t, 1.0, w.TopP)
	assert.Equal(t, DefaultMaxTokens, w.MaxTokens)
	assert.Equal(t, 0.0, w.Temperature)
	assert.Equal(t, LogprobRaw, w.LogprobMode)
	assert.Equal(t, 0, Params{TopK: -1}.WithDefaults().TopK)

	// WithDefaults does not alias the caller's slices.
	orig := Params{StopTokenIDs: []int{1}}
	cp := orig.WithDefaults()
	cp.StopTokenIDs[0] = 9
	assert.Equal(t, 1, orig.StopTokenIDs[0])
}

func TestParamHelpers(t *testing.T) {
	s := int64(-1)
	assert.Equal(t, uint64(7), Params{}.SeedOr(7))
	assert.Equal(t, uint64(math.MaxUint64), Params{Seed: &s}.SeedOr(7))

	p := Params{StopTokenIDs: []int{9, 3, 9}}
	assert.Equal(t, []int{2, 3, 9}, p.StopTokens([]int{2, 3}))
	p.IgnoreEOS = true
	assert.Equal(t, []int{3, 9}, p.StopTokens([]int{2}))

	p.MinTokens = 2
	assert.True(t, p.SuppressStops(0))
	assert.True(t, p.SuppressStops(1))
	assert.False(t, p.SuppressStops(2))

	err := Params{MaxTokens: 1, TopP: 2}.Validate(5)
	assert.True(t, errors.Is(err, ErrInvalidParams))
	assert.Contains(t, err.Error(), "top_p")
}
