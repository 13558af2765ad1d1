// Package sample turns one row of logits into the next token of one request: temperature,
// min-p, top-k and top-p filtering, a per-request random stream, and the logprobs RL needs.
//
// # Parameters
//
// [Params] is the canonical per-request sampling configuration shared by the engine and the HTTP
// layer; its JSON names follow the public API (max_tokens, temperature, top_p, top_k, min_p, seed,
// stop_token_ids, logprobs, ...). Decode a request into [Defaults] so omitted fields keep the
// OpenAI defaults (temperature 1, top_p 1, max_tokens 16), then call [Params.WithDefaults] and
// [Params.Validate].
//
// # Filters
//
// The order is vLLM's: temperature, then min-p (keep tokens whose probability is at least
// min_p times the largest), then top-k, then top-p over what is left, renormalised. min-p and top-k
// commute; top-p is last. Every filter keeps a prefix of the tokens ordered by (logit desc, token id
// asc), so ties are always broken towards the lower id and results never depend on map or sort
// stability.
//
// # Determinism
//
// Each [Sampler] owns a PCG stream seeded from one uint64 and consumes exactly one uniform draw per
// Sample call, whatever the filters (greedy included). The same seed and the same sequence of logits
// therefore give the same tokens regardless of other requests, batch composition or which filters a
// request uses; [Sampler.Advance] re-aligns a stream when a request resumes after n tokens.
//
// # Logprobs
//
// [LogprobRaw] (the engine's default) reports log_softmax of the raw logits at temperature 1,
// before any filter or exclusion: the model's distribution, which is the distribution sampled
// from only at temperature 1 without filters. [LogprobProcessed] reports the log-probability
// under the distribution actually sampled from (after temperature, filters and
// renormalisation): the behaviour policy whose logprobs RL importance ratios divide by, at any
// sampling settings; [Sampler.Processed] recomputes it for a trainer, bit for bit. Tokens
// outside the kept set get -Inf, and greedy decoding puts all mass (logprob 0) on its token. Callers serialising to JSON must
// map -Inf themselves: encoding/json rejects it.
//
// Sums and logprobs are computed in float64 from float32 logits, with an inlined exponential
// accurate to 1e-8 relative (see expNeg), so reported float32 logprobs are accurate to about
// their last bit.
//
// # Cost
//
// Per call on a 32000-token row: one pass for the maximum, one exp pass for the raw normaliser
// (fused with the sampling weights at temperature 1), a size-k heap for top-k (no sort), and for
// top-p without top-k llama2.c's cutoff, keeping only tokens with probability >= (1-p)/(n-1),
// followed by a quickselect on cumulative mass instead of a sort, so even a flat distribution
// never costs a 32000-element sort. Scratch buffers live in the Sampler: no allocation per call
// unless Logprobs > 0 (the returned Top list).
//
// # Robustness
//
// NaN logits are treated as -Inf (never sampled) and +Inf as the largest float32. If no token has
// a finite logit (or every one is excluded), Sample does not panic: it returns token 0 with
// [Result.Degenerate] set, and the engine should finish the request with an error.
package sample
