package offload

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/rolloutkit/rollout/engine/kvconnector"
	"github.com/rolloutkit/rollout/offload/cpu"
)

// ErrInvalidConfig is returned for a configuration that cannot work.
var ErrInvalidConfig = errors.New("offload: invalid config")

// maxBlocksPerChunk bounds Config.BlocksPerChunk: an engine's KV pool has at most 2^31-1
// blocks (block ids are 32-bit), so a larger chunk could never be filled.
const maxBlocksPerChunk = math.MaxInt32

// Config configures a Connector.
type Config struct {
	// CPUBytes sizes the CPU tier; it must hold at least one chunk.
	CPUBytes int64
	// BlockSize is the pool's block size in tokens; the bound pool must match it.
	BlockSize int
	// BlocksPerChunk is the number of pool blocks per offloaded chunk (default 1, at most
	// 2^31-1; a chunk's size in tokens and in bytes must not overflow).
	BlocksPerChunk int
	// Policy is the CPU eviction policy, "lru" (default) or "arc".
	Policy string
	// CopyThreads is how many goroutines share the copy of one transfer of at least
	// SplitBytes (0: runtime.GOMAXPROCS(0); 1: each transfer copies on its own goroutine). The
	// split is by block, so a transfer of one block never splits. Transfers stay FIFO per
	// direction and complete as a whole either way.
	CopyThreads int
	// SplitBytes is the smallest transfer that is split (0: DefaultSplitBytes).
	SplitBytes int64
	// Test holds the knobs that keep copies in flight, for tests and benchmarks only; nil (the
	// production setting) turns them all off.
	Test *TestHooks
	// BlockBytes is the size of one pool block in bytes (all layers, K and V). Optional: when
	// set, New checks CPUBytes against it; otherwise the check happens at BindKVStorage.
	BlockBytes int64
	// RecordEvents keeps the CPU tier's cache events (keys stored, removed) for
	// Scheduler().TakeEvents, e.g. for a KV-aware router that drains them every step. Off by
	// default: nothing in the engine drains them, and undrained they would grow forever.
	RecordEvents bool
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// TracerProvider makes the connector's spans (nil: none): offload.reset_cache, a child of
	// the context ResetCache is given; offload.flush.delivered on the step that carries the
	// resets' flush set to the workers, a child of the first reset it covers and linked to the
	// others; offload.flush.wait, its child, while the workers wait on the flushed jobs.
	TracerProvider trace.TracerProvider
	// OnFlushDelivered, if set, is called by the worker side once a reset's flush set reached
	// it and it waited on every job in it, with the time since the first reset it covers (the
	// server's rollout_reset_to_flush_seconds) and a context holding the flush.delivered span
	// (for exemplars). Now is the clock it measures with (time.Now).
	OnFlushDelivered func(ctx context.Context, jobIDs []int64, sinceReset time.Duration)
	Now              func() time.Time
}

// TestHooks slow or hold the connector's transfers so that copies stay in flight: black-box
// reset tests (`rollout serve --offload-delay`), the offload benchmark's bandwidth cap and the
// tests that catch a reset with jobs in flight. Nothing in production sets them. A TestHooks
// belongs to one connector.
type TestHooks struct {
	// Delay is added to every transfer; BandwidthBytesPerSec (0: none) caps each transfer's
	// rate.
	Delay                time.Duration
	BandwidthBytesPerSec float64
	// TransferGate, if set, is called on a transfer's goroutine before it copies anything and
	// may block: tests hold transfers in flight with it deterministically, where a Delay only
	// makes that likely.
	TransferGate func(t *Transfer)

	delay atomic.Int64 // the current Delay: New sets it, SetDelay changes it
}

// SetDelay changes the per-transfer delay for transfers that start from now on.
func (h *TestHooks) SetDelay(d time.Duration) { h.delay.Store(int64(d)) }

// testDelay is the current per-transfer delay (0 without hooks).
func (c *Connector) testDelay() time.Duration {
	if c.cfg.Test == nil {
		return 0
	}
	return time.Duration(c.cfg.Test.delay.Load())
}

// testBandwidth is the transfer rate cap in bytes per second (0: none).
func (c *Connector) testBandwidth() float64 {
	if c.cfg.Test == nil {
		return 0
	}
	return c.cfg.Test.BandwidthBytesPerSec
}

// transferGate is the hook called before a transfer copies (nil: none).
func (c *Connector) transferGate() func(*Transfer) {
	if c.cfg.Test == nil {
		return nil
	}
	return c.cfg.Test.TransferGate
}

// tracerName is the instrumentation scope of the connector's spans.
const tracerName = "github.com/rolloutkit/rollout/offload"

// Span names and attribute keys of the connector's spans.
const (
	SpanResetCache     = "offload.reset_cache"
	SpanFlushDelivered = "offload.flush.delivered"
	SpanFlushWait      = "offload.flush.wait"

	// AttrJobsFlushed is the number of in-flight jobs a reset moved into the flush set.
	AttrJobsFlushed = "offload.jobs_flushed"
	// AttrFlushPending is the size of the pending flush set after a reset.
	AttrFlushPending = "offload.flush_pending"
	// AttrResetsMerged is, on a reset, how many earlier undelivered resets it joined (0 for
	// the first); on a delivery, how many resets its flush set covers.
	AttrResetsMerged = "offload.resets_merged"
	// AttrJobIDs and AttrJobs are the flushed job ids a step delivers and their number.
	AttrJobIDs = "offload.job_ids"
	AttrJobs   = "offload.jobs"
	// AttrStep is the engine step that carries the flush.
	AttrStep = "offload.step"
	// AttrResetToDelivery is the time from the first reset to the step that delivers its
	// flush; AttrResetToFlush adds the workers' wait (rollout_reset_to_flush_seconds).
	AttrResetToDelivery = "offload.reset_to_delivery_seconds"
	AttrResetToFlush    = "offload.reset_to_flush_seconds"
	// AttrJobsInFlight is how many flushed jobs were still copying when the wait began.
	AttrJobsInFlight = "offload.jobs_in_flight"
)

// Connector is the offloading connector; its two sides are Scheduler and Worker.
type Connector struct {
	cfg    Config
	log    *slog.Logger
	tracer trace.Tracer
	stats  counters

	mu      sync.Mutex // guards pool, mgr and bindErr across the sides
	pool    kvconnector.BlockPool
	mgr     *cpu.Manager
	bindErr error

	sched  *schedSide
	worker *workerSide
	// boundSched and boundWorker are the two sides bound together (kvconnector.Bind), as the
	// engine drives them.
	boundSched  kvconnector.Scheduler
	boundWorker kvconnector.Worker
}

// counters are readable from any goroutine.
type counters struct {
	jobsInflight      atomic.Int64
	xfersInflight     atomic.Int64
	flushPending      atomic.Int64
	flushDelivered    atomic.Int64
	resets            atomic.Int64
	resetsMerged      atomic.Int64
	storedBytes       atomic.Int64
	loadedBytes       atomic.Int64
	hitTokens         atomic.Int64
	storesDiscarded   atomic.Int64
	allocFailures     atomic.Int64
	lookupMisses      atomic.Int64
	staleCompletions  atomic.Int64
	unknownCompletes  atomic.Int64
	duplicateComplete atomic.Int64
	cpuSlots          atomic.Int64
	cpuSlotsUsed      atomic.Int64
	violations        atomic.Int64
	loadFailures      atomic.Int64
	checksumFailures  atomic.Int64
}

// Validate reports the first field New would refuse, as "offload: invalid config: Field:
// reason" (errors.Is ErrInvalidConfig). Zero BlocksPerChunk and Policy stand for their
// defaults and are valid.
func (cfg Config) Validate() error {
	bpc := cfg.BlocksPerChunk
	if bpc == 0 {
		bpc = 1
	}
	switch {
	case cfg.BlockSize <= 0:
		return fmt.Errorf("%w: BlockSize: %d tokens, need > 0", ErrInvalidConfig, cfg.BlockSize)
	case bpc < 0:
		return fmt.Errorf("%w: BlocksPerChunk: %d, need > 0", ErrInvalidConfig, cfg.BlocksPerChunk)
	case bpc > maxBlocksPerChunk:
		return fmt.Errorf("%w: BlocksPerChunk: %d is more blocks than a KV pool holds (at most %d)", ErrInvalidConfig, cfg.BlocksPerChunk, maxBlocksPerChunk)
	case bpc > math.MaxInt/cfg.BlockSize:
		// Tokens per chunk must be an int: wrapped around to 0, it divided by zero.
		return fmt.Errorf("%w: BlocksPerChunk: %d blocks of %d tokens overflow", ErrInvalidConfig, cfg.BlocksPerChunk, cfg.BlockSize)
	case cfg.CPUBytes <= 0:
		return fmt.Errorf("%w: CPUBytes: %d, the CPU tier needs room for at least one chunk", ErrInvalidConfig, cfg.CPUBytes)
	case cfg.Policy != "" && cfg.Policy != cpu.PolicyLRU && cfg.Policy != cpu.PolicyARC:
		return fmt.Errorf("%w: Policy: %q, want lru or arc", ErrInvalidConfig, cfg.Policy)
	case cfg.Test != nil && cfg.Test.Delay < 0:
		return fmt.Errorf("%w: Test.Delay: %v is negative", ErrInvalidConfig, cfg.Test.Delay)
	case cfg.Test != nil && cfg.Test.BandwidthBytesPerSec < 0:
		return fmt.Errorf("%w: Test.BandwidthBytesPerSec: %v is negative", ErrInvalidConfig, cfg.Test.BandwidthBytesPerSec)
	case cfg.BlockBytes < 0:
		return fmt.Errorf("%w: BlockBytes: %d is negative", ErrInvalidConfig, cfg.BlockBytes)
	case cfg.CopyThreads < 0:
		return fmt.Errorf("%w: CopyThreads: %d is negative", ErrInvalidConfig, cfg.CopyThreads)
	case cfg.SplitBytes < 0:
		return fmt.Errorf("%w: SplitBytes: %d is negative", ErrInvalidConfig, cfg.SplitBytes)
	}
	if cfg.BlockBytes > 0 && int64(bpc) > math.MaxInt64/cfg.BlockBytes {
		return fmt.Errorf("%w: BlocksPerChunk: %d blocks of %d bytes overflow", ErrInvalidConfig, bpc, cfg.BlockBytes)
	}
	if chunk := cfg.BlockBytes * int64(bpc); cfg.BlockBytes > 0 && cfg.CPUBytes < chunk {
		return fmt.Errorf("%w: CPUBytes: %d is smaller than one chunk (%d bytes: %d blocks of %d)", ErrInvalidConfig, cfg.CPUBytes, chunk, bpc, cfg.BlockBytes)
	}
	return nil
}

// New validates cfg and builds a connector. The CPU tier is allocated when the worker side is
// bound to the KV storage (the chunk size in bytes comes from it).
func New(cfg Config) (*Connector, error) {
	if cfg.BlocksPerChunk == 0 {
		cfg.BlocksPerChunk = 1
	}
	if cfg.Policy == "" {
		cfg.Policy = cpu.PolicyLRU
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.CopyThreads == 0 {
		cfg.CopyThreads = runtime.GOMAXPROCS(0)
	}
	if cfg.SplitBytes == 0 {
		cfg.SplitBytes = DefaultSplitBytes
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = noop.NewTracerProvider()
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Connector{cfg: cfg, log: cfg.Logger, tracer: cfg.TracerProvider.Tracer(tracerName)}
	if cfg.Test != nil {
		cfg.Test.SetDelay(cfg.Test.Delay)
	}
	c.sched = newSchedSide(c)
	c.worker = newWorkerSide(c)
	c.boundSched, c.boundWorker = kvconnector.Bind[*Payload, *WorkerMeta](c.sched, c.worker)
	return c, nil
}

// Scheduler returns the scheduler side (engine.Config.Connector).
func (c *Connector) Scheduler() kvconnector.Scheduler { return c.boundSched }

// Worker returns the worker side (engine.Config.ConnectorWorker).
func (c *Connector) Worker() kvconnector.Worker { return c.boundWorker }

// TypedSides returns the two sides unbound, with their payload types, for code that drives the
// connector step by step with payloads it builds itself (the offload benchmark, tests). What
// the engine takes is Scheduler and Worker.
func (c *Connector) TypedSides() (kvconnector.TypedScheduler[*Payload, *WorkerMeta], kvconnector.TypedWorker[*Payload, *WorkerMeta]) {
	return c.sched, c.worker
}

// Err returns the binding error, if the bound pool or storage does not fit the configuration.
func (c *Connector) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bindErr
}

// Violations is the number of safety violations detected so far.
func (c *Connector) Violations() int64 { return c.stats.violations.Load() }

// Stats returns the counters under their documented names.
func (c *Connector) Stats() kvconnector.Stats {
	s := &c.stats
	return kvconnector.Stats{
		"offload_jobs_inflight":             float64(s.jobsInflight.Load()),
		"offload_flush_pending":             float64(s.flushPending.Load()),
		"offload_transfers_inflight":        float64(s.xfersInflight.Load()),
		"offload_flush_delivered_total":     float64(s.flushDelivered.Load()),
		"offload_resets_total":              float64(s.resets.Load()),
		"offload_resets_merged_total":       float64(s.resetsMerged.Load()),
		"offload_stored_bytes_total":        float64(s.storedBytes.Load()),
		"offload_loaded_bytes_total":        float64(s.loadedBytes.Load()),
		"offload_hit_tokens_total":          float64(s.hitTokens.Load()),
		"offload_stores_discarded_total":    float64(s.storesDiscarded.Load()),
		"offload_alloc_failures_total":      float64(s.allocFailures.Load()),
		"offload_lookup_misses_total":       float64(s.lookupMisses.Load()),
		"offload_stale_completions_total":   float64(s.staleCompletions.Load()),
		"offload_unknown_completions_total": float64(s.unknownCompletes.Load()),
		"offload_duplicate_completes_total": float64(s.duplicateComplete.Load()),
		"offload_cpu_slots":                 float64(s.cpuSlots.Load()),
		"offload_cpu_slots_used":            float64(s.cpuSlotsUsed.Load()),
		"offload_load_failures_total":       float64(s.loadFailures.Load()),
		"offload_checksum_failures_total":   float64(s.checksumFailures.Load()),
		"safety_violations_total":           float64(s.violations.Load()),
	}
}

// violation counts and logs one safety violation.
func (c *Connector) violation(jobID int64, what string, args ...any) {
	c.stats.violations.Add(1)
	c.log.Error("offload: safety violation", append([]any{"job", jobID, "what", what}, args...)...)
}

// bindPool is the scheduler side's BindBlockPool.
func (c *Connector) bindPool(p kvconnector.BlockPool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p.BlockSize() != c.cfg.BlockSize {
		c.bindErr = fmt.Errorf("%w: the KV pool has %d-token blocks, the connector is configured for %d", ErrInvalidConfig, p.BlockSize(), c.cfg.BlockSize)
		c.log.Error("offload: connector disabled", "err", c.bindErr)
		return
	}
	c.pool = p
}

// bindStorage sizes (first time) or checks (on wake) the CPU tier for a storage.
func (c *Connector) bindStorage(blockFloats int) (slots int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bindErr != nil {
		return 0, c.bindErr
	}
	if c.pool == nil {
		return 0, fmt.Errorf("%w: storage bound before the block pool", ErrInvalidConfig)
	}
	if blockFloats <= 0 || int64(c.cfg.BlocksPerChunk) > math.MaxInt64/(int64(blockFloats)*4) {
		// A chunk size that wraps around could be 0 (a division by zero below) or negative.
		c.bindErr = fmt.Errorf("%w: BlocksPerChunk: %d blocks of %d bytes overflow", ErrInvalidConfig, c.cfg.BlocksPerChunk, int64(blockFloats)*4)
		return 0, c.bindErr
	}
	chunk := int64(blockFloats) * 4 * int64(c.cfg.BlocksPerChunk)
	if c.cfg.CPUBytes < chunk {
		c.bindErr = fmt.Errorf("%w: CPU bytes %d smaller than one chunk (%d bytes: %d blocks of %d)", ErrInvalidConfig, c.cfg.CPUBytes, chunk, c.cfg.BlocksPerChunk, blockFloats*4)
		return 0, c.bindErr
	}
	n := int(c.cfg.CPUBytes / chunk)
	if c.mgr == nil {
		m, err := cpu.New(n, c.cfg.Policy)
		if err != nil {
			return 0, fmt.Errorf("offload: %w", err)
		}
		c.mgr = m
		c.stats.cpuSlots.Store(int64(n))
	} else if c.mgr.NumSlots() != n {
		return 0, fmt.Errorf("%w: storage with %d-float blocks does not match the CPU tier of %d slots", ErrInvalidConfig, blockFloats, c.mgr.NumSlots())
	}
	return n, nil
}

// manager returns the CPU manager, nil while unbound or misconfigured.
func (c *Connector) manager() (*cpu.Manager, kvconnector.BlockPool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bindErr != nil {
		return nil, nil
	}
	return c.mgr, c.pool
}

// Transfer is one job as the worker side receives it. It is immutable once built.
type Transfer struct {
	ID     int64
	ReqID  string
	Store  bool
	Chunks []ChunkTransfer
}

// ChunkTransfer moves one chunk: pool blocks Blocks (with the generations they had when the job
// was created) to or from CPU slot Slot. Offset is the index within the chunk of Blocks[0]; a
// load of a chunk partly covered by the engine's own prefix hit skips the covered blocks.
type ChunkTransfer struct {
	Index  int // chunk index within the request
	Slot   cpu.Slot
	Offset int
	Blocks []int
	Gens   []uint64
}

// Payload is this connector's kvconnector.Metadata.Payload.
type Payload struct {
	Loads  []*Transfer // submit this step
	Stores []*Transfer // submit at the start of the next step (unless flushed now)
	// Release are finished requests whose delayed block free may happen now: the worker reports
	// them in FinishedSending.
	Release            []string
	NumScheduledTokens int
	// ResetAt is when the first reset whose flush this step delivers was called; zero when the
	// step delivers no reset.
	ResetAt time.Time
	// FlushSpan is the offload.flush.delivered span of a step that delivers resets (nil
	// otherwise); the worker side ends it once it waited on the flush set.
	FlushSpan trace.Span
}

// WorkerMeta is this connector's kvconnector.Output.WorkerMeta: completed job ids with success.
type WorkerMeta struct {
	Completed map[int64]bool
}
