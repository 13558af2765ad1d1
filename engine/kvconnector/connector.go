package kvconnector

import (
	"context"
	"fmt"

	"github.com/rolloutkit/rollout/engine/kvcache"
)

// BlockHash is the chained hash of one full block (see kvcache.HashBlock). Aliased here so a
// connector can name it without importing kvcache.
type BlockHash = kvcache.BlockHash

// Defer is the token count GetNumNewMatchedTokens returns to ask the scheduler to try the request
// again on a later step (vLLM's None).
const Defer = -1

// Request is the connector's read-only view of a scheduler request. The value stays valid (and
// live: counts change as the request advances) until the request is finished and freed.
type Request interface {
	RequestID() string
	// NumPromptTokens is the prompt length.
	NumPromptTokens() int
	// NumTokens is prompt plus output tokens so far.
	NumTokens() int
	// NumComputedTokens is the number of tokens whose KV is (or, for the current step, will be)
	// in the request's blocks.
	NumComputedTokens() int
	// BlockHashes are the hashes of the request's full blocks, in order; it grows during decode.
	BlockHashes() []BlockHash
	// Aborted is true once the request has been finished by an abort.
	Aborted() bool
}

// ScheduledRequest is one request of a step as the connector sees it.
type ScheduledRequest struct {
	Req                Request
	NumScheduledTokens int   // tokens computed this step
	NewBlockIDs        []int // blocks added to the request's table this step
	BlockIDs           []int // the request's whole block table after this step's allocation
	// Resumed is true when the request (re)starts from a fresh block table this step after a
	// preemption: any block ids the connector remembered for it are stale.
	Resumed bool
}

// StepInfo is the connector's view of one SchedulerOutput.
type StepInfo struct {
	Step               uint64
	Scheduled          []ScheduledRequest
	NumScheduledTokens int
	FinishedReqIDs     []string // finished since the previous step
	PreemptedReqIDs    []string // preempted since the previous step (their blocks are free again)
}

// Metadata is the per-step message from a connector's scheduler side to its worker side, as the
// scheduler and the engine carry it. It travels only inside a step (SchedulerOutput), and every
// step carries one, even a step with 0 tokens: that is how a flush set produced by a reset
// reaches the workers when no request is left.
type Metadata struct {
	Step uint64
	// FlushJobIDs are transfer jobs the worker must have submitted and waited on before this step
	// proceeds (before any load is submitted and before the forward pass). Kept outside Payload so
	// the engine can log and trace flush delivery without knowing the connector.
	FlushJobIDs []int64
	// Payload is the connector's own data (loads, stores, ...), sealed: only the worker side
	// bound (Bind) with the scheduler side that built it opens it, with its static type. Zero
	// for the Noop connector.
	Payload Sealed
}

// Output is the worker side's per-step report back to the scheduler side.
type Output struct {
	FinishedSending []string // requests whose delayed-free blocks may now be freed
	FinishedRecving []string // requests whose asynchronous KV load completed
	// FailedRecving are requests whose load completed without valid KV (a checksum or
	// generation check failed, or the step that was to submit it failed): the scheduler frees
	// their blocks and recomputes them (vLLM's load-error path). An id here needs not be
	// repeated in FinishedRecving.
	FailedRecving []string
	// WorkerMeta is the connector's own report (e.g. completed job ids), sealed like
	// Metadata.Payload.
	WorkerMeta Sealed
}

// Sealed is a connector's payload on its way between the connector's two sides through code
// that must not read it (the scheduler, the engine). Only Bind's adapters make and open one, so
// the payload a worker side receives has the type its scheduler side built, checked by the
// compiler at Bind; the zero Sealed carries nothing.
type Sealed struct {
	v    any
	from *binding
}

// binding identifies one Bind call: a Sealed opens only on the side bound with its maker. It
// is not zero-sized, so that every Bind's pointer is distinct.
type binding struct{ _ byte }

// Event is a cache event for consumers such as a KV-aware router.
type Event struct {
	Removed     bool        // false: stored
	Medium      string      // e.g. "cpu"
	BlockHashes []BlockHash // the blocks concerned
}

// Stats are named counters and gauges a connector exports (names are connector-specific).
type Stats map[string]float64

// BlockPool is the read-only view of the KV block pool a connector may bind to (kvcache.Manager
// implements it). Generation may be called from any goroutine.
type BlockPool interface {
	BlockSize() int
	NumBlocks() int
	Generation(block int) uint64
}

// Scheduler is the scheduler side of a connector (vLLM KVConnectorBase_V1, SCHEDULER role) as
// the scheduler sees it. The scheduler calls it from its single goroutine; implementations need
// no locking against it. A connector with a payload implements TypedScheduler and TypedWorker
// and binds them with Bind; Noop implements Scheduler and Worker directly.
type Scheduler interface {
	SchedulerBase
	// BuildConnectorMeta is called exactly once per schedule, 0-token steps included, and resets
	// the connector's per-step state. It must not mutate step (its slices are shared).
	BuildConnectorMeta(step StepInfo) Metadata
	// UpdateConnectorOutput consumes the worker side's output of a step.
	UpdateConnectorOutput(out Output)
}

// TypedMetadata is Metadata as a connector's own two sides see it: the payload with its type.
type TypedMetadata[P any] struct {
	Step        uint64
	FlushJobIDs []int64
	Payload     P
}

// TypedOutput is Output as a connector's scheduler side sees it: the worker report with its
// type.
type TypedOutput[W any] struct {
	FinishedSending, FinishedRecving, FailedRecving []string
	WorkerMeta                                      W
}

// TypedScheduler is the scheduler side of a connector whose metadata payload is P and whose
// worker report is W; Bind adapts it to Scheduler.
type TypedScheduler[P, W any] interface {
	SchedulerBase
	// BuildConnectorMeta is Scheduler.BuildConnectorMeta with the payload typed.
	BuildConnectorMeta(step StepInfo) TypedMetadata[P]
	// UpdateConnectorOutput is Scheduler.UpdateConnectorOutput with the report typed.
	UpdateConnectorOutput(out TypedOutput[W])
}

// SchedulerBase is the part of a connector's scheduler side that carries no payload.
type SchedulerBase interface {
	// OnNewRequest is called once when a request is added.
	OnNewRequest(req Request)
	// GetNumNewMatchedTokens returns how many tokens beyond numComputedTokens (the local prefix
	// hit, block aligned) the connector can load, and whether the load is asynchronous (then the
	// request waits until its id appears in Output.FinishedRecving). async must be false when n is
	// 0. Return n == Defer to be asked again on a later step. Called only for requests with no
	// computed tokens.
	GetNumNewMatchedTokens(req Request, numComputedTokens int) (n int, async bool)
	// UpdateStateAfterAlloc is called after a successful allocation for a request taken from the
	// waiting queue, with its whole block table and the external token count it was granted.
	UpdateStateAfterAlloc(req Request, blockIDs []int, numExternalTokens int)
	// RequestFinished is called exactly once per request, before its blocks return to the pool,
	// with the blocks holding its computed tokens. Returning true keeps the blocks allocated until
	// the request id appears in Output.FinishedSending.
	RequestFinished(req Request, blockIDs []int) (delayFree bool)
	// HasPendingPushWork reports work that needs more engine steps even with no request left
	// (in-flight transfers, an undelivered flush set).
	HasPendingPushWork() bool
	// ResetCache drops the connector's cached KV. In-flight jobs are not cancelled but queued for
	// flushing by the next step's metadata; jobsFlushed is how many this call queued. It must be
	// re-entrant: two resets with no step between them are routine. ctx carries the caller's
	// trace context, for parentage only: a reset never blocks and ignores cancellation.
	ResetCache(ctx context.Context) (jobsFlushed int, ok bool)
	// TakeEvents returns the events since the previous call.
	TakeEvents() []Event
	// Stats returns the connector's current counters.
	Stats() Stats
}

// PoolBinder is implemented by scheduler-side connectors that want the block pool (vLLM's
// bind_gpu_block_pool); the scheduler binds it once, at construction.
type PoolBinder interface {
	BindBlockPool(pool BlockPool)
}

// Worker is the worker side of a connector (vLLM KVConnectorBase_V1, WORKER role), driven by the
// model runner once per step in the order RunStep encodes.
type Worker interface {
	WorkerBase
	// BindMetadata hands over this step's metadata; it is the first call of every step.
	BindMetadata(meta Metadata)
	// BuildWorkerMeta returns the worker-to-scheduler payload of this step (Output.WorkerMeta).
	BuildWorkerMeta() Sealed
}

// TypedWorker is the worker side of a connector whose metadata payload is P and whose report
// is W; Bind adapts it to Worker.
type TypedWorker[P, W any] interface {
	WorkerBase
	// BindMetadata is Worker.BindMetadata with the payload typed.
	BindMetadata(meta TypedMetadata[P])
	// BuildWorkerMeta is Worker.BuildWorkerMeta with the report typed.
	BuildWorkerMeta() W
}

// WorkerBase is the part of a connector's worker side that carries no payload.
type WorkerBase interface {
	// HandlePreemptions runs before anything can overwrite KV blocks this step: it submits
	// deferred stores and waits on the step's FlushJobIDs.
	HandlePreemptions(ctx context.Context) error
	// StartLoadKV submits this step's loads.
	StartLoadKV(ctx context.Context) error
	// WaitForSave runs after the forward pass (also on steps without one).
	WaitForSave(ctx context.Context) error
	// GetFinished reports requests whose transfers completed; finishedReqIDs are the step's
	// finished requests.
	GetFinished(finishedReqIDs []string) (finishedSending, finishedRecving []string)
	// ClearMetadata ends the step.
	ClearMetadata()
	// WaitIdle blocks until no transfer submitted by this worker is still touching the KV pool or
	// its own buffers, e.g. before the pool is released for sleep.
	WaitIdle(ctx context.Context) error
}

// StepFailer is implemented by worker sides that must hear that a step failed (its forward
// pass, or a phase before it): the KV the step was to compute is not there, so the transfers
// built for it (stores of the chunks it completes, loads it did not submit) must not run; the
// worker reports them as failed in the step's output instead.
type StepFailer interface {
	FailStep()
}

// LoadErrorReporter is implemented by worker sides that detect failed loads; RunStep puts what
// it returns into Output.FailedRecving.
type LoadErrorReporter interface {
	// TakeFailedRecving returns the requests whose load failed among those GetFinished
	// reported since the previous call (RunStep calls it right after GetFinished). A load
	// that completes between the two belongs to the next step: reported failed now, its
	// completion would reach the scheduler a step later, as a finished load.
	TakeFailedRecving() []string
}

// RunStep drives a worker through one step in the canonical order: bind the metadata, handle
// preemptions (flush), start loads, run forward (nil or skipped for a 0-token step), wait for saves,
// collect finished transfers and the worker metadata, clear the metadata. When a phase fails the
// rest of it is skipped and the worker is told (StepFailer), but finished transfers and the worker
// metadata are still collected and returned with the error: a transfer's completion is reported
// exactly once, and a scheduler side that never hears of one would wait for it forever. The
// metadata is cleared even on error.
func RunStep(ctx context.Context, w Worker, meta Metadata, finishedReqIDs []string, forward func(context.Context) error) (Output, error) {
	w.BindMetadata(meta)
	defer w.ClearMetadata()
	var err error
	if e := w.HandlePreemptions(ctx); e != nil {
		err = fmt.Errorf("kvconnector: handle preemptions: %w", e)
	} else if e := w.StartLoadKV(ctx); e != nil {
		err = fmt.Errorf("kvconnector: start load: %w", e)
	} else if forward != nil {
		if e := forward(ctx); e != nil {
			err = fmt.Errorf("kvconnector: forward: %w", e)
		}
	}
	if err == nil {
		if e := w.WaitForSave(ctx); e != nil {
			err = fmt.Errorf("kvconnector: wait for save: %w", e)
		}
	}
	if f, ok := w.(StepFailer); ok && err != nil {
		f.FailStep()
	}
	sending, recving := w.GetFinished(finishedReqIDs)
	out := Output{FinishedSending: sending, FinishedRecving: recving}
	if r, ok := w.(LoadErrorReporter); ok {
		out.FailedRecving = r.TakeFailedRecving()
	}
	out.WorkerMeta = w.BuildWorkerMeta()
	return out, err
}

// KVStorage is the worker side's view of the KV pool's memory (kvcache.Storage implements it):
// block i is one contiguous region holding every layer's K and V for that block.
type KVStorage interface {
	// Block returns block i's region; it aliases the pool memory.
	Block(i int) []float32
	// BlockFloats is the length of every block's region.
	BlockFloats() int
}

// StorageBinder is implemented by worker sides that copy KV bytes: the engine binds the KV
// storage when it allocates it (at start and on waking from sleep) and releases it before it
// drops the storage (sleep), after WaitIdle. No copy may touch a storage after its release.
type StorageBinder interface {
	BindKVStorage(s KVStorage) error
	ReleaseKVStorage()
}
