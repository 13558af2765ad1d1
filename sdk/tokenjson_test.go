package sdk_test

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/sdk"
)

// TestGenerateResultJSON: a GenerateResult always has a JSON form (encoding/json refuses
// -Inf): a logprob outside the processed distribution is null, as on the generate wire, and
// reads back as -Inf; an engine's float32 logprob is written in its shortest form and reads
// back to the same float32.
func TestGenerateResultJSON(t *testing.T) {
	lp := float64(float32(-0.1))
	res := sdk.GenerateResult{RequestID: "r", Samples: []sdk.Sample{{
		Tokens: []sdk.Token{
			{ID: 5, Logprob: lp, WeightVersion: 2, Top: []sdk.TokenLogprob{{Token: 5, Logprob: lp}, {Token: 6, Logprob: math.Inf(-1)}}},
			{ID: 7, Logprob: math.Inf(-1), WeightVersion: 3},
		},
		FinishReason: sdk.FinishLength,
	}}}
	b, err := json.Marshal(res)
	require.NoError(t, err)
	assert.Contains(t, string(b), `{"id":5,"logprob":-0.1,"weight_version":2,"top":[{"token":5,"logprob":-0.1},{"token":6,"logprob":null}]}`)
	assert.Contains(t, string(b), `{"id":7,"logprob":null,"weight_version":3}`)

	var back sdk.GenerateResult
	require.NoError(t, json.Unmarshal(b, &back))
	toks := back.Samples[0].Tokens
	assert.Equal(t, float32(lp), float32(toks[0].Logprob))
	assert.True(t, math.IsInf(toks[1].Logprob, -1))
	assert.True(t, math.IsInf(toks[0].Top[1].Logprob, -1))
	assert.Equal(t, []int{5, 7}, back.Samples[0].TokenIDs())
	assert.Equal(t, []int64{2, 3}, back.Samples[0].WeightVersions())

	// A logprob that is no float32 (a trainer's own) keeps every digit.
	b, err = json.Marshal(sdk.Token{ID: 1, Logprob: 0.1})
	require.NoError(t, err)
	assert.JSONEq(t, `{"id":1,"logprob":0.1,"weight_version":0}`, string(b))
	require.Error(t, json.Unmarshal([]byte(`{"id":1,"logprob":"x"}`), new(sdk.Token)))
}
