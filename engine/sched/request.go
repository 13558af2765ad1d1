package sched

import (
	"github.com/rolloutkit/rollout/engine/kvcache"
	"github.com/rolloutkit/rollout/engine/kvconnector"
)

// Params are the sampling parameters the scheduler needs (when to stop): the same-named fields of
// sample.Params. The sampler's own parameters (temperature, top-p, seeds, ...) travel in
// Request.Data, opaque to the scheduler, which keeps sched independent of the sampler.
type Params struct {
	MaxTokens    int   // output tokens at most; must be > 0
	MinTokens    int   // EOS and stop tokens are ignored before this many output tokens
	StopTokenIDs []int // sampling one of these finishes the request with FinishStop (kept in the output)
	IgnoreEOS    bool  // do not stop on Config.EOSTokenIDs
}

// Status is a request's lifecycle state.
type Status int

// Request states.
const (
	StatusWaiting             Status = iota // queued, never scheduled
	StatusRunning                           // in the running batch
	StatusPreempted                         // back in the waiting queue, KV freed, recomputes
	StatusWaitingForRemoteKVs               // blocks allocated, a connector load is in flight
	StatusFinished                          // done; see FinishReason
)

var statusNames = [...]string{"waiting", "running", "preempted", "waiting_for_remote_kvs", "finished"}

func (s Status) String() string {
	if s < 0 || int(s) >= len(statusNames) {
		return "unknown"
	}
	return statusNames[s]
}

// FinishReason says why a request finished.
type FinishReason string

// Finish reasons, as reported to clients.
const (
	FinishNone   FinishReason = ""       // not finished
	FinishStop   FinishReason = "stop"   // EOS or a stop token
	FinishLength FinishReason = "length" // max tokens or the context length
	FinishAbort  FinishReason = "abort"  // aborted (client abort, pause(abort), shutdown)
)

// Request is one generation request. The caller fills the exported fields and hands the request to
// Scheduler.Add; from then on the scheduler owns it and the caller only reads it through the
// accessor methods, from the scheduler's goroutine.
type Request struct {
	ID              string
	PromptTokenIDs  []int
	Params          Params
	CacheSalt       string // separates prefix-cache namespaces (part of the first block hash)
	SkipPrefixCache bool   // never read cached KV for this request (e.g. prompt logprobs)
	Data            any    // opaque to the scheduler (sampler state, stream handle, ...)

	tokens         []int // prompt then output
	numComputed    int
	numCached      int // -1 until first scheduled
	numPreemptions int
	weightVersion  int64
	hashes         []kvcache.BlockHash
	status         Status
	finishReason   FinishReason
}

var _ kvconnector.Request = (*Request)(nil)

// RequestID implements kvconnector.Request.
func (r *Request) RequestID() string { return r.ID }

// NumPromptTokens implements kvconnector.Request.
func (r *Request) NumPromptTokens() int { return len(r.PromptTokenIDs) }

// NumTokens implements kvconnector.Request: prompt plus output tokens.
func (r *Request) NumTokens() int { return len(r.tokens) }

// NumComputedTokens implements kvconnector.Request.
func (r *Request) NumComputedTokens() int { return r.numComputed }

// BlockHashes implements kvconnector.Request. The slice is read-only.
func (r *Request) BlockHashes() []kvcache.BlockHash { return r.hashes }

// Aborted implements kvconnector.Request.
func (r *Request) Aborted() bool { return r.status == StatusFinished && r.finishReason == FinishAbort }

// TokenIDs returns prompt and output tokens (read-only).
func (r *Request) TokenIDs() []int { return r.tokens }

// OutputTokenIDs returns the tokens generated so far (read-only).
func (r *Request) OutputTokenIDs() []int { return r.tokens[len(r.PromptTokenIDs):] }

// Status returns the lifecycle state.
func (r *Request) Status() Status { return r.status }

// FinishReason returns why the request finished (FinishNone while it has not).
func (r *Request) FinishReason() FinishReason { return r.finishReason }

// NumCachedTokens is the number of prompt tokens served from a cache (GPU prefix cache plus
// connector) when the request was first scheduled; 0 before that.
func (r *Request) NumCachedTokens() int { return max(r.numCached, 0) }

// NumPreemptions counts how often the request was preempted.
func (r *Request) NumPreemptions() int { return r.numPreemptions }

// WeightVersion is the weight version the request's block hashes (and so its cached KV) belong to:
// the version current when it last started computing from scratch.
func (r *Request) WeightVersion() int64 { return r.weightVersion }

func (r *Request) rehash(blockSize int) {
	r.hashes = kvcache.ExtendHashes(nil, r.tokens, blockSize, r.weightVersion, r.CacheSalt)
}
