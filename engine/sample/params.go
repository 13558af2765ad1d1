package sample

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// Limits and defaults of the sampling parameters.
const (
	// DefaultMaxTokens is the OpenAI / vLLM default of max_tokens for completions.
	DefaultMaxTokens = 16
	// MaxTemperature bounds temperature; beyond it every distribution is numerically uniform.
	MaxTemperature = 100.0
	// GreedyEpsilon: temperatures below it decode greedily, as vLLM does (_SAMPLING_EPS).
	GreedyEpsilon = 1e-5
	// MaxLogprobs caps the number of top logprobs per token (the OpenAI limit).
	MaxLogprobs = 20
)

// ErrInvalidParams is wrapped by every error [Params.Validate] returns.
var ErrInvalidParams = errors.New("invalid sampling parameters")

// FieldError reports one invalid field by its JSON name; it wraps [ErrInvalidParams].
type FieldError struct {
	// Field is the JSON name of the offending parameter, e.g. "top_p".
	Field string
	// Reason says what is wrong, including the value received.
	Reason string
}

// Error implements error.
func (e *FieldError) Error() string {
	return fmt.Sprintf("%s: %s: %s", ErrInvalidParams, e.Field, e.Reason)
}

// Unwrap lets errors.Is(err, ErrInvalidParams) hold.
func (e *FieldError) Unwrap() error { return ErrInvalidParams }

// LogprobMode selects which distribution reported logprobs refer to.
type LogprobMode string

const (
	// LogprobRaw is log_softmax of the raw logits at temperature 1, before filters: the
	// model's own distribution (the engine's default; the empty string means LogprobRaw). It is
	// the sampling distribution only at temperature 1 without filters, so RL importance ratios
	// need it only there; with any other sampling they need LogprobProcessed.
	LogprobRaw LogprobMode = "raw"
	// LogprobProcessed is the log-probability under the distribution actually sampled from: after
	// temperature and the min-p/top-k/top-p filters, renormalised over the kept tokens. It is the
	// behaviour policy of an RL rollout, what importance ratios divide by; a trainer recomputes
	// it with the same settings ([Sampler.Processed]).
	LogprobProcessed LogprobMode = "processed"
)

// Params are the per-request sampling parameters. The zero value of each field is documented;
// decode JSON into [Defaults] so that omitted fields get OpenAI's defaults rather than zero.
type Params struct {
	// Temperature scales logits; 0 (or anything below GreedyEpsilon) means greedy decoding.
	Temperature float64 `json:"temperature"`
	// TopP keeps the smallest set of most likely tokens whose mass reaches TopP; 1 is off.
	// 0 means "omitted" and WithDefaults turns it into 1.
	TopP float64 `json:"top_p"`
	// TopK keeps the K most likely tokens; 0 or -1 is off.
	TopK int `json:"top_k"`
	// MinP keeps tokens whose probability is at least MinP times the largest; 0 is off.
	MinP float64 `json:"min_p"`
	// Seed fixes the request's random stream; nil lets the engine choose one.
	Seed *int64 `json:"seed,omitempty"`
	// MaxTokens is the maximum number of generated tokens; 0 means DefaultMaxTokens after
	// WithDefaults.
	MaxTokens int `json:"max_tokens"`
	// MinTokens suppresses EOS and StopTokenIDs until this many tokens have been generated.
	MinTokens int `json:"min_tokens,omitempty"`
	// StopTokenIDs end generation when sampled (in addition to EOS unless IgnoreEOS).
	StopTokenIDs []int `json:"stop_token_ids,omitempty"`
	// IgnoreEOS keeps generating past the model's EOS token(s).
	IgnoreEOS bool `json:"ignore_eos,omitempty"`
	// Logprobs is how many top logprobs to return per token (0..MaxLogprobs); the sampled
	// token's own logprob is always returned.
	Logprobs int `json:"logprobs"`
	// LogprobMode selects raw (default) or processed logprobs.
	LogprobMode LogprobMode `json:"logprob_mode,omitempty"`
}

// Defaults returns the parameters an omitted JSON field should fall back to: temperature 1,
// top_p 1, top_k and min_p off, max_tokens DefaultMaxTokens, raw logprobs.
func Defaults() Params {
	return Params{
		Temperature: 1,
		TopP:        1,
		MaxTokens:   DefaultMaxTokens,
		LogprobMode: LogprobRaw,
	}
}

// WithDefaults returns a copy with unset zero values filled: TopP 0 becomes 1 (a JSON request that
// omitted top_p decodes to 0, and top_p 0 is meaningless), MaxTokens 0 becomes DefaultMaxTokens,
// TopK -1 becomes 0 and an empty LogprobMode becomes LogprobRaw. Temperature 0 stays 0 (greedy):
// it cannot be told apart from an omitted field, which is why callers decode into Defaults().
// StopTokenIDs is copied so the result never aliases the caller's slice.
func (p Params) WithDefaults() Params {
	if p.TopP == 0 {
		p.TopP = 1
	}
	if p.MaxTokens == 0 {
		p.MaxTokens = DefaultMaxTokens
	}
	if p.TopK == -1 {
		p.TopK = 0
	}
	if p.LogprobMode == "" {
		p.LogprobMode = LogprobRaw
	}
	if p.Seed != nil {
		s := *p.Seed
		p.Seed = &s
	}
	p.StopTokenIDs = slices.Clone(p.StopTokenIDs)
	return p
}

// Validate checks p for a model with vocabSize tokens and returns a *FieldError naming the first
// bad field (wrapping ErrInvalidParams). Call it after WithDefaults: a TopP or MaxTokens of 0 is
// rejected here.
func (p Params) Validate(vocabSize int) error {
	bad := func(field, format string, args ...any) error {
		return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	if vocabSize <= 0 {
		return bad("vocab_size", "must be > 0 (got %d)", vocabSize)
	}
	switch t := p.Temperature; {
	case math.IsNaN(t) || math.IsInf(t, 0):
		return bad("temperature", "must be finite (got %v)", t)
	case t < 0:
		return bad("temperature", "must be >= 0 (got %v)", t)
	case t > MaxTemperature:
		return bad("temperature", "must be <= %v (got %v)", MaxTemperature, t)
	}
	// NaN fails both comparisons, so test the accepted range positively.
	if !(p.TopP > 0 && p.TopP <= 1) {
		return bad("top_p", "must be in (0, 1] (got %v)", p.TopP)
	}
	if p.TopK < -1 {
		return bad("top_k", "must be -1, 0 (off) or positive (got %d)", p.TopK)
	}
	if !(p.MinP >= 0 && p.MinP <= 1) {
		return bad("min_p", "must be in [0, 1] (got %v)", p.MinP)
	}
	if p.MaxTokens <= 0 {
		return bad("max_tokens", "must be > 0 (got %d)", p.MaxTokens)
	}
	if p.MinTokens < 0 {
		return bad("min_tokens", "must be >= 0 (got %d)", p.MinTokens)
	}
	if p.MinTokens > p.MaxTokens {
		return bad("min_tokens", "must be <= max_tokens %d (got %d)", p.MaxTokens, p.MinTokens)
	}
	for i, id := range p.StopTokenIDs {
		if id < 0 || id >= vocabSize {
			return bad("stop_token_ids", "[%d] = %d is outside the vocabulary [0, %d)", i, id, vocabSize)
		}
	}
	if p.Logprobs < 0 || p.Logprobs > MaxLogprobs {
		return bad("logprobs", "must be in [0, %d] (got %d)", MaxLogprobs, p.Logprobs)
	}
	if p.Logprobs > vocabSize {
		return bad("logprobs", "must be <= vocabulary size %d (got %d)", vocabSize, p.Logprobs)
	}
	switch p.LogprobMode {
	case "", LogprobRaw, LogprobProcessed:
	default:
		return bad("logprob_mode", "must be %q or %q (got %q)", LogprobRaw, LogprobProcessed, p.LogprobMode)
	}
	return nil
}

// Greedy reports whether p decodes greedily (temperature below GreedyEpsilon).
func (p Params) Greedy() bool { return p.Temperature < GreedyEpsilon }

// SeedOr returns the request's seed as the Sampler seed, or engineSeed when none was given.
func (p Params) SeedOr(engineSeed uint64) uint64 {
	if p.Seed != nil {
		return uint64(*p.Seed)
	}
	return engineSeed
}

// StopTokens returns the ids that end generation: StopTokenIDs plus eos unless IgnoreEOS, without
// duplicates, sorted. The engine computes it once per request; while SuppressStops holds it is the
// exclusion list for [Sampler.SampleExcept].
func (p Params) StopTokens(eos []int) []int {
	out := slices.Clone(p.StopTokenIDs)
	if !p.IgnoreEOS {
		out = append(out, eos...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// SuppressStops reports whether stop tokens must not be sampled yet, because fewer than
// MinTokens tokens have been generated.
func (p Params) SuppressStops(numGenerated int) bool { return numGenerated < p.MinTokens }
