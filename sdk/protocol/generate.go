package protocol

import (
	"fmt"
	"math"
	"strconv"
)

// The native POST /generate route of a rollout server: the one definition of its request
// and response that the server (server/api) and the SDK (sdk.Client.Generate) both use.

// FinishReason says why a sample ended.
type FinishReason string

// Finish reasons of a /generate output.
const (
	// FinishStop: the model produced EOS or a stop token.
	FinishStop FinishReason = "stop"
	// FinishLength: the sample reached max_tokens (or the context).
	FinishLength FinishReason = "length"
	// FinishAbort: the server aborted it (a pause with mode abort, an abort request); the
	// SDK continues such a sample on a server back in rotation.
	FinishAbort FinishReason = "abort"
)

// GenerateRequest is the body of POST /generate. S is the sampling parameters' type: the
// SDK's sdk.SamplingParams on the client, the engine's sample.Params on the server (which
// decodes onto its defaults); both carry the same JSON fields (docs/http-api.md).
type GenerateRequest[S any] struct {
	PromptTokenIDs []int  `json:"prompt_token_ids"`
	N              int    `json:"n"`
	Sampling       S      `json:"sampling"`
	RequestID      string `json:"request_id,omitempty"`
	CacheSalt      string `json:"cache_salt,omitempty"`
	// MinVersion makes the server wait until it serves at least this weight version (409
	// stale_version when it does not in time).
	MinVersion int64 `json:"min_version,omitempty"`
}

// GenerateResponse is the answer of POST /generate: one output per sample.
type GenerateResponse struct {
	RequestID string `json:"request_id"`
	// WeightVersion is the newest version any token was generated with (the serving one
	// when there are no tokens).
	WeightVersion int64            `json:"weight_version"`
	Outputs       []GenerateOutput `json:"outputs"`
}

// GenerateOutput is one sample: its tokens with, per token, the logprob, the weight version
// that produced it and, when asked for, the top candidates.
type GenerateOutput struct {
	TokenIDs        []int          `json:"token_ids"`
	Logprobs        Logprobs       `json:"logprobs"`
	TopLogprobs     [][]TopLogprob `json:"top_logprobs,omitempty"`
	WeightVersions  []int64        `json:"weight_versions"`
	FinishReason    FinishReason   `json:"finish_reason"`
	NumCachedTokens int            `json:"num_cached_tokens"`
}

// TopLogprob is one candidate token at a position and its log-probability.
type TopLogprob struct {
	Token   int     `json:"token"`
	Logprob Logprob `json:"logprob"`
}

// Logprob is a log-probability as the engine computes it (float32). JSON has no number for
// -Inf (a token outside the processed distribution) or NaN, so they travel as null, which
// decodes back to -Inf. A finite value is written in its shortest float32 form and decodes
// to exactly the engine's value.
type Logprob float32

// MarshalJSON implements json.Marshaler.
func (l Logprob) MarshalJSON() ([]byte, error) { return appendLogprob(nil, l), nil }

// UnmarshalJSON implements json.Unmarshaler: null is -Inf.
func (l *Logprob) UnmarshalJSON(b []byte) error {
	f, err := ParseLogprob(b, 32)
	if err != nil {
		return err
	}
	*l = Logprob(f)
	return nil
}

// ParseLogprob reads a logprob's JSON at bitSize (32 or 64): a number, or null for -Inf
// (JSON has no -Inf). The SDK's float64 logprobs read through it too.
func ParseLogprob(b []byte, bitSize int) (float64, error) {
	if string(b) == "null" {
		return math.Inf(-1), nil
	}
	f, err := strconv.ParseFloat(string(b), bitSize)
	if err != nil {
		return 0, fmt.Errorf("%w: logprob %q: %w", ErrInvalid, b, err)
	}
	return f, nil
}

func appendLogprob(b []byte, l Logprob) []byte {
	if f := float64(l); math.IsInf(f, 0) || math.IsNaN(f) {
		return append(b, "null"...)
	}
	return strconv.AppendFloat(b, float64(l), 'g', -1, 32)
}

// Logprobs is a list of Logprob encoded in one call: encoding/json calls a per-element
// MarshalJSON once per token and re-validates each result, which dominated the cost of long
// responses.
type Logprobs []Logprob

// MarshalJSON implements json.Marshaler.
func (l Logprobs) MarshalJSON() ([]byte, error) {
	if l == nil {
		return []byte("null"), nil
	}
	b := make([]byte, 0, 2+12*len(l))
	b = append(b, '[')
	for i, v := range l {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendLogprob(b, v)
	}
	return append(b, ']'), nil
}
