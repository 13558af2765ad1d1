package sched

import (
	"errors"
	"fmt"

	"github.com/rolloutkit/rollout/engine/kvcache"
	"github.com/rolloutkit/rollout/engine/kvconnector"
)

// Sentinel errors callers branch on.
var (
	ErrInvalidConfig  = errors.New("sched: invalid config")
	ErrInvalidRequest = errors.New("sched: invalid request")
	ErrDuplicateID    = errors.New("sched: duplicate request id")
	ErrEmptyPrompt    = errors.New("sched: empty prompt")
	ErrPromptTooLong  = errors.New("sched: prompt longer than the context length")
	ErrStepPending    = errors.New("sched: previous step's output not applied yet")
	ErrOutputMismatch = errors.New("sched: model output does not match the pending step")
	ErrMissingSample  = errors.New("sched: model output lacks a sampled token")
)

// Config bounds the scheduler.
type Config struct {
	MaxNumBatchedTokens int // token budget per step
	MaxNumSeqs          int // running requests at most
	MaxModelLen         int // context length: prompt plus output tokens
	// EOSTokenIDs finish a request with FinishStop unless Params.IgnoreEOS (empty: none).
	EOSTokenIDs []int
	// DisableChunkedPrefill makes a waiting request whose prompt does not fit the remaining
	// budget wait (vLLM without chunked prefill); by default prompts are chunked.
	DisableChunkedPrefill bool
	// LongPrefillTokenThreshold caps the tokens one request computes per step (0: no cap).
	LongPrefillTokenThreshold int
}

// Validate reports the first field New would refuse, as "sched: invalid config: Field:
// reason" (errors.Is ErrInvalidConfig). That the pool holds one MaxModelLen request is
// checked by New, which has the pool.
func (cfg Config) Validate() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"MaxNumBatchedTokens", cfg.MaxNumBatchedTokens}, {"MaxNumSeqs", cfg.MaxNumSeqs}, {"MaxModelLen", cfg.MaxModelLen}} {
		if f.v <= 0 {
			return fmt.Errorf("%w: %s: %d, need > 0", ErrInvalidConfig, f.name, f.v)
		}
	}
	if cfg.LongPrefillTokenThreshold < 0 {
		return fmt.Errorf("%w: LongPrefillTokenThreshold: %d, need >= 0", ErrInvalidConfig, cfg.LongPrefillTokenThreshold)
	}
	if cfg.DisableChunkedPrefill && cfg.MaxNumBatchedTokens < cfg.MaxModelLen {
		return fmt.Errorf("%w: MaxNumBatchedTokens: %d is below MaxModelLen %d, which without chunked prefill it must hold",
			ErrInvalidConfig, cfg.MaxNumBatchedTokens, cfg.MaxModelLen)
	}
	return nil
}

// PauseState is the scheduler's pause state (vLLM PauseState).
type PauseState int

// Pause states.
const (
	Unpaused  PauseState = iota // everything is scheduled
	PausedNew                   // waiting requests are not scheduled; running ones are
	PausedAll                   // nothing is scheduled (token budget 0)
)

func (p PauseState) String() string {
	switch p {
	case Unpaused:
		return "unpaused"
	case PausedNew:
		return "paused_new"
	case PausedAll:
		return "paused_all"
	}
	return "unknown"
}

// ScheduledRequest is one request's share of a step.
type ScheduledRequest struct {
	ReqID string
	Req   *Request // read-only for the runner
	// TokenIDs are the tokens to compute this step, at positions StartPos, StartPos+1, ...
	TokenIDs []int
	StartPos int
	// BlockIDs is the request's whole block table; position p lives in block BlockIDs[p/BlockSize]
	// at slot p%BlockSize. Positions below StartPos are already in the cache.
	BlockIDs    []int
	NewBlockIDs []int // blocks added this step (prefix hits first)
	// Sample is true when this step computes the request's last known token, so the runner must
	// sample the next one; false for a partial prefill chunk.
	Sample bool
	// Fresh is true when the request enters the running batch this step with a new block table
	// (new, resumed after a preemption, or after a connector load); the runner should drop any
	// state it kept for the id.
	Fresh bool
}

// SchedulerOutput is one step: what to compute, plus what to forget. Runners process
// PreemptedReqIDs and FinishedReqIDs before Scheduled (an id may appear in both).
type SchedulerOutput struct {
	Step               uint64
	WeightVersion      int64 // the version this step runs under (stamped on every sampled token)
	Scheduled          []ScheduledRequest
	NumScheduledTokens int
	FinishedReqIDs     []string // finished since the previous step
	PreemptedReqIDs    []string // preempted since the previous step (KV freed; will recompute)
	// ConnectorMeta goes to the connector's worker side with this step, even with 0 tokens.
	ConnectorMeta kvconnector.Metadata
}

// Sample is the runner's result for one request that had Sample set.
type Sample struct {
	TokenID int
	Payload any // logprobs etc., opaque to the scheduler, handed back in RequestOutput
}

// ModelOutput is what executing a SchedulerOutput produced.
type ModelOutput struct {
	Step        uint64            // SchedulerOutput.Step it answers
	Sampled     map[string]Sample // by request id, for every scheduled request with Sample set
	KVConnector kvconnector.Output
}

// RequestOutput reports progress of one request: new tokens and/or its end.
type RequestOutput struct {
	ReqID           string
	NewTokenIDs     []int
	Payloads        []any // one per new token, from Sample.Payload
	WeightVersion   int64 // weight version that produced NewTokenIDs
	Finished        bool
	FinishReason    FinishReason
	NumCachedTokens int
}

// ResetDetail says what a ResetPrefixCache did.
type ResetDetail struct {
	RequestsPreempted    int    // running requests preempted first (resetRunning)
	BlocksCleared        int    // cached blocks dropped from the prefix cache
	BlocksInUse          int    // blocks still held after preemption (delayed frees, loads)
	PrefixCacheReset     bool   // the block pool's prefix cache was cleared
	ConnectorReset       bool   // the connector reset ran and succeeded
	ConnectorJobsFlushed int    // in-flight connector jobs queued for flushing by the reset
	Reason               string // why something was not reset, or what a forced reset left in use; empty on a clean success
}

// Stats is a snapshot of the scheduler's counters.
type Stats struct {
	Steps          uint64
	NumRunning     int
	NumWaiting     int
	NumPreemptions int64 // cumulative
	KVUsage        float64
	KV             kvcache.Stats
	PauseState     PauseState
	WeightVersion  int64
}
