package protocol

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLogprobJSON(t *testing.T) {
	b, err := json.Marshal([]Logprob{-0.5, Logprob(math.Inf(-1)), Logprob(float32(math.NaN()))})
	require.NoError(t, err)
	assert.Equal(t, "[-0.5,null,null]", string(b))

	// Decoding gives back exactly the engine's float32, and null as -Inf.
	var got []Logprob
	require.NoError(t, json.Unmarshal([]byte("[-0.12345679,null,0]"), &got))
	assert.Equal(t, []Logprob{-0.12345679, Logprob(math.Inf(-1)), 0}, got)
	var bad Logprob
	require.ErrorIs(t, json.Unmarshal([]byte(`"x"`), &bad), ErrInvalid)
}

// The list encoder must produce exactly what per-element encoding produces, and decode back.
func TestLogprobsMatchElementEncoding(t *testing.T) {
	vals := []Logprob{0, -0.5, -1e-7, -3.4028235e38, Logprob(math.Inf(-1)), Logprob(math.NaN()), -12.345678, 1.5e-45}
	for _, in := range [][]Logprob{nil, {}, vals[:1], vals} {
		got, err := json.Marshal(struct {
			L Logprobs `json:"l"`
		}{Logprobs(in)})
		require.NoError(t, err)
		want, err := json.Marshal(struct {
			L []Logprob `json:"l"`
		}{in})
		require.NoError(t, err)
		assert.Equal(t, string(want), string(got))
		var back struct {
			L Logprobs `json:"l"`
		}
		require.NoError(t, json.Unmarshal(got, &back))
		require.Len(t, back.L, len(in))
		for i, v := range in {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				assert.True(t, math.IsInf(float64(back.L[i]), -1), "%v travels as null, back as -Inf", v)
				continue
			}
			assert.Equal(t, v, back.L[i])
		}
	}
}

// A response the server writes is what the SDK reads, field for field.
func TestGenerateWireRoundTrip(t *testing.T) {
	seed := int64(3)
	req := GenerateRequest[map[string]any]{PromptTokenIDs: []int{1, 2}, N: 2, Sampling: map[string]any{"max_tokens": 4, "seed": seed}, MinVersion: 3}
	b, err := json.Marshal(req)
	require.NoError(t, err)
	assert.JSONEq(t, `{"prompt_token_ids":[1,2],"n":2,"sampling":{"max_tokens":4,"seed":3},"min_version":3}`, string(b))

	resp := GenerateResponse{RequestID: "r", WeightVersion: 3, Outputs: []GenerateOutput{{TokenIDs: []int{5}, Logprobs: Logprobs{-0.25},
		TopLogprobs: [][]TopLogprob{{{Token: 5, Logprob: -0.25}}}, WeightVersions: []int64{3}, FinishReason: FinishLength, NumCachedTokens: 1}}}
	b, err = json.Marshal(resp)
	require.NoError(t, err)
	var back GenerateResponse
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, resp, back)
}

func BenchmarkLogprobEncoding(b *testing.B) {
	l := make([]Logprob, 256)
	for i := range l {
		l[i] = Logprob(-float32(i) / 7)
	}
	b.Run("list", func(b *testing.B) {
		for b.Loop() {
			_, _ = json.Marshal(Logprobs(l))
		}
	})
	b.Run("per-element", func(b *testing.B) {
		for b.Loop() {
			_, _ = json.Marshal(l)
		}
	})
}
