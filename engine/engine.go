package engine

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

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/kvcache"
	"github.com/rolloutkit/rollout/engine/kvconnector"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/sample"
	"github.com/rolloutkit/rollout/engine/sched"
)

// Errors callers branch on.
var (
	ErrClosed          = errors.New("engine: closed")
	ErrQueueFull       = errors.New("engine: queue full")
	ErrInvalidRequest  = errors.New("engine: invalid request")
	ErrDuplicateID     = errors.New("engine: duplicate request id")
	ErrNoWeights       = errors.New("engine: no weights loaded")
	ErrNothingStaged   = errors.New("engine: no staged weights")
	ErrNotStaged       = errors.New("engine: the staged weights are another version")
	ErrStaleVersion    = errors.New("engine: weight version not newer than the serving and staged ones")
	ErrInvalidArgument = errors.New("engine: invalid argument")
	ErrAsleep          = errors.New("engine: asleep")
)

// Defaults of the Config fields a zero value stands for.
const (
	// DefaultBlockSize is the KV block size in tokens.
	DefaultBlockSize = 16
	// DefaultMaxNumSeqs bounds the running batch.
	DefaultMaxNumSeqs = 64
	// DefaultMaxBatchedTokens bounds the tokens of one step.
	DefaultMaxBatchedTokens = 2048
	// DefaultMaxQueued bounds the requests waiting to be scheduled.
	DefaultMaxQueued = 4096
)

// Config configures an Engine. Zero values take the documented defaults.
type Config struct {
	// Weights is the initial weight set (this or Builder is required) and WeightVersion its
	// version. The engine serves it until a swap, and a level-2 sleep releases it (New does
	// not keep Config.Weights).
	Weights       *model.Weights
	WeightVersion int64
	// Builder, instead of Weights, is a complete model.Builder at Precision holding the
	// initial weights (a checkpoint loaded tensor by tensor, weights.LoadHFInto), so that no
	// float32 set of them need exist; New takes its model.
	Builder *model.Builder
	// BlockSize is the KV block size in tokens (default DefaultBlockSize).
	BlockSize int
	// NumBlocks is the size of the KV pool including the null block; 0 derives it from
	// KVBytes, or, with both 0, sizes the pool for MaxNumSeqs full contexts (capped at 1 GiB).
	// A pool of more than 2^31-1 blocks, or larger than the machine's memory, is refused.
	NumBlocks int
	KVBytes   int64
	// MemoryBytes, with NumBlocks and KVBytes 0, budgets the packed model and the KV pool
	// together: the pool gets what the model at Precision leaves (model.Config.ModelBytes), so
	// memory a lower precision frees becomes KV blocks.
	MemoryBytes int64
	// MaxNumSeqs bounds the running batch (default DefaultMaxNumSeqs, at most 2^20);
	// MaxBatchedTokens the tokens per step (default DefaultMaxBatchedTokens).
	MaxNumSeqs       int
	MaxBatchedTokens int
	// MaxQueued bounds the requests waiting to be scheduled, in every state (default
	// DefaultMaxQueued):
	// a running engine that is behind must refuse work too, or one burst of requests grows
	// the queue without bound.
	MaxQueued int
	// Workers is the number of kernel workers (default GOMAXPROCS).
	Workers int
	// Precision is how the packed matrices store the weights (default kernels.F32): every
	// weight set, the initial one and each update, is rounded or quantized to it when packed.
	Precision kernels.Precision
	// PrefaultKV writes every page of the KV pool when it is allocated (New, and WakeUp after
	// a sleep that released it), so that no decode step pays the first-touch page fault of a
	// block and the pool's memory is committed up front, as a GPU engine's is. It costs time
	// at allocation in proportion to the pool (about 1.8 s per GiB on a 2-core KVM guest, far
	// less on bare metal); off, the pool commits page by page as requests reach it.
	PrefaultKV bool
	// Connector and ConnectorWorker are the two sides of the KV connector (default: none).
	// A worker that copies KV bytes also implements kvconnector.StorageBinder.
	Connector       kvconnector.Scheduler
	ConnectorWorker kvconnector.Worker
	// Seed seeds requests that carry no seed of their own.
	Seed uint64
	// Logger defaults to slog.Default(); Tracer to a no-op tracer.
	Logger *slog.Logger
	Tracer trace.Tracer
	// Hooks observe the engine (metrics); any may be nil.
	Hooks Hooks
}

// Hooks are called from the engine goroutine; they must be cheap and must not call back into
// the engine.
type Hooks struct {
	// OnFinish is called once per finished request.
	OnFinish func(id string, reason FinishReason, promptTokens, genTokens int, t Timings)
	// OnStep is called after every step with the number of tokens it computed.
	OnStep func(tokens int)
	// BeforeForward is called before each forward pass; a non-nil error fails the step as a
	// model error would (for fault-injection tests; nil in production).
	BeforeForward func(step uint64) error
}

// Bounds of the Config fields that size memory.
const (
	// maxBlockSize bounds Config.BlockSize.
	maxBlockSize = 1024
	// maxNumSeqs bounds Config.MaxNumSeqs: far above any real batch, and low enough that the
	// derived pool size (MaxNumSeqs full contexts) cannot overflow.
	maxNumSeqs = 1 << 20
	// maxNumBlocks bounds the KV pool in blocks: block ids reach the model as int32.
	maxNumBlocks = math.MaxInt32
	// maxKVBytes bounds the KV pool in bytes where the machine's memory is unknown: the
	// user address space of x86-64 and arm64.
	maxKVBytes = 1 << 47
)

// invalidField is a Config error in the style every config of the module uses: the sentinel,
// the field, why.
func invalidField(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalidArgument, field, fmt.Sprintf(format, args...))
}

// modelConfig is the initial weights' model configuration.
func (c Config) modelConfig() model.Config {
	if c.Builder != nil {
		return c.Builder.Config()
	}
	return c.Weights.Config
}

// Validate reports the first field New would refuse, as "engine: invalid argument: Field:
// reason" (errors.Is ErrInvalidArgument). Zero values stand for their defaults and are valid;
// a KV pool derived from KVBytes too small to hold a block, and one larger than the machine's
// memory, are found by New only.
func (c Config) Validate() error {
	switch {
	case c.Weights == nil && c.Builder == nil:
		return invalidField("Weights", "required (or Builder)")
	case c.Weights != nil && c.Builder != nil:
		return invalidField("Builder", "set with Weights: give one")
	case c.Builder != nil && c.Builder.Precision() != c.Precision:
		return invalidField("Builder", "packs at %s, Precision is %s", c.Builder.Precision(), c.Precision)
	}
	if c.BlockSize < 0 || c.BlockSize > maxBlockSize {
		return invalidField("BlockSize", "%d tokens is outside 1..%d", c.BlockSize, maxBlockSize)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"MaxNumSeqs", c.MaxNumSeqs}, {"MaxBatchedTokens", c.MaxBatchedTokens}, {"MaxQueued", c.MaxQueued}, {"Workers", c.Workers}} {
		if f.v < 0 {
			return invalidField(f.name, "%d is negative", f.v)
		}
	}
	if c.MaxNumSeqs > maxNumSeqs {
		return invalidField("MaxNumSeqs", "%d is more than %d", c.MaxNumSeqs, maxNumSeqs)
	}
	if c.NumBlocks < 0 || c.NumBlocks == 1 {
		return invalidField("NumBlocks", "%d blocks (the null block included) hold nothing", c.NumBlocks)
	}
	if c.NumBlocks > maxNumBlocks {
		return invalidField("NumBlocks", "%d blocks is more than %d (block ids are 32-bit)", c.NumBlocks, maxNumBlocks)
	}
	if c.KVBytes < 0 {
		return invalidField("KVBytes", "%d is negative", c.KVBytes)
	}
	if c.MemoryBytes < 0 {
		return invalidField("MemoryBytes", "%d is negative", c.MemoryBytes)
	}
	if c.MemoryBytes > 0 && (c.NumBlocks > 0 || c.KVBytes > 0) {
		return invalidField("MemoryBytes", "sizes the KV pool, as NumBlocks and KVBytes do: give one of them")
	}
	if c.Precision > kernels.W8A8 {
		return invalidField("Precision", "unknown precision %d", c.Precision)
	}
	return nil
}

func (c *Config) defaults() error {
	if err := c.Validate(); err != nil {
		return err
	}
	if c.BlockSize == 0 {
		c.BlockSize = DefaultBlockSize
	}
	if c.MaxNumSeqs == 0 {
		c.MaxNumSeqs = DefaultMaxNumSeqs
	}
	if c.MaxBatchedTokens == 0 {
		c.MaxBatchedTokens = DefaultMaxBatchedTokens
	}
	if c.MaxQueued == 0 {
		c.MaxQueued = DefaultMaxQueued
	}
	if c.Workers == 0 {
		c.Workers = runtime.GOMAXPROCS(0)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Tracer == nil {
		c.Tracer = noop.NewTracerProvider().Tracer("engine")
	}
	mc := c.modelConfig()
	blockBytes := mc.KVBlockBytes(c.BlockSize)
	field := "NumBlocks"
	if c.NumBlocks == 0 && c.MemoryBytes > 0 {
		model := mc.ModelBytes(c.Precision)
		if c.MemoryBytes-model < blockBytes {
			return invalidField("MemoryBytes", "%d bytes leave no KV block beside the %s model's %d bytes", c.MemoryBytes, c.Precision, model)
		}
		c.KVBytes = c.MemoryBytes - model
	}
	if c.NumBlocks == 0 {
		if c.KVBytes > 0 {
			field = "KVBytes"
			n := c.KVBytes / blockBytes
			if n > maxNumBlocks {
				return invalidField("KVBytes", "%d bytes make a KV pool of %d blocks (%d bytes each), more than %d", c.KVBytes, n, blockBytes, maxNumBlocks)
			}
			c.NumBlocks = int(n)
		} else {
			// Validate bounds MaxNumSeqs, and MaxPositionEmbeddings is bounded by the model's
			// limits, so the product cannot overflow.
			field = "MaxNumSeqs"
			perSeq := (mc.MaxPositionEmbeddings + c.BlockSize - 1) / c.BlockSize
			c.NumBlocks = min(c.MaxNumSeqs*perSeq, int((1<<30)/blockBytes)) + 1
		}
	}
	minBlocks := (mc.MaxPositionEmbeddings+c.BlockSize-1)/c.BlockSize + 1
	if c.NumBlocks < 2 {
		return invalidField("KVBytes", "%d bytes make a KV pool of %d blocks (%d bytes each), which holds nothing", c.KVBytes, c.NumBlocks, blockBytes)
	}
	// The pool is one allocation: one larger than the machine's memory would end the process
	// (the runtime's out-of-memory error is fatal, and one beyond the address space panics).
	limit, where := physicalMemory(), "this machine's memory"
	if limit <= 0 {
		limit, where = maxKVBytes, "the address space"
	}
	if int64(c.NumBlocks) > limit/blockBytes {
		return invalidField(field, "a KV pool of %d blocks of %d bytes is larger than %s (%d bytes)", c.NumBlocks, blockBytes, where, limit)
	}
	if c.NumBlocks < minBlocks {
		c.Logger.Warn("KV pool smaller than one full context: long requests will be cut at the pool size",
			"blocks", c.NumBlocks, "full_context_blocks", minBlocks)
	}
	return nil
}

// Request is one generation request.
type Request struct {
	ID             string
	PromptTokenIDs []int
	Sampling       sample.Params
	// CacheSalt isolates prefix-cache reuse: requests only share KV with the same salt.
	CacheSalt string
}

// reqState is the engine's bookkeeping for one live request.
type reqState struct {
	stream  *Stream
	sampler *sample.Sampler
	params  sample.Params
	prompt  int
	gen     int
	stops   []int
}

type message struct {
	add   *addMsg
	abort []string
	call  *callMsg
}

type addMsg struct {
	req    Request
	stream *Stream
	reply  chan error
}

type callMsg struct {
	ctx   context.Context //nolint:containedctx // carried across the queue to the loop, never stored beyond the call
	name  string
	fn    func(ctx context.Context, done func(any, error))
	reply chan result
	// control marks a control call (pause, resume, sleep, wake-up, weight stage, commit and
	// update, spare): the loop queues it in Engine.ctlq instead of running it at once.
	control bool
	// state is callQueued until the loop starts the call or its caller withdraws it: whichever
	// swaps it first decides whether the call takes effect.
	state atomic.Int32
}

// States of a callMsg.
const (
	callQueued    int32 = iota // accepted, not started: its caller may still withdraw it
	callStarted                // started by the loop: it completes, caller or not
	callWithdrawn              // its caller gave up first: the loop drops it unrun
)

// idleTask completes a deferred utility call once the engine has no work. run reports whether
// it finished (it may instead create work, e.g. a flush to deliver, and run again later);
// fail answers its caller when the engine stops first.
type idleTask struct {
	run  func() bool
	fail func(error)
	// abandon, if set, answers the call at once when its caller gave up, for a call whose
	// effect is complete and whose wait serves only the caller (a Pause(wait) without
	// clear_cache): the control calls behind it need not wait for the drain then.
	abandon func()
}

// Engine is EngineCore. Create it with New, run it with Run, release it with Close (also one
// that never ran); every other method is safe for concurrent use.
type Engine struct {
	cfg Config
	// shape is the model configuration every weight set must have (the initial one's).
	shape model.Config
	log   *slog.Logger
	in    chan message
	done  chan struct{} // closed when the engine starts shutting down
	ran   atomic.Bool
	// stop is closed by Close; exited once shutdown has released everything New started.
	stop     chan struct{}
	stopOnce sync.Once
	exited   chan struct{}

	metrics Metrics

	// Owned by the Run goroutine.
	kpool  *kernels.Pool
	sched  *sched.Scheduler
	blocks *kvcache.Manager
	kv     *kvcache.Storage
	conn   kvconnector.Scheduler
	worker kvconnector.Worker
	model  *model.Model
	// weights is the float32 set the serving model was packed from, kept at F32 only (see
	// keep): at a lower precision Weights rebuilds it from the model instead.
	weights *model.Weights
	version int64
	staged  *staged
	// spare is a packed model no step runs any more (retired by a commit or replaced while
	// staged), whose memory the next StageWeights packs into instead of allocating a new
	// weight-sized set: an RL run updates weights every step. Sleep drops it.
	spare atomic.Pointer[model.Model]
	reqs  map[string]*reqState
	// idle holds the deferred completion of the control call in progress (a pause or sleep
	// waiting for the engine to drain); only that call can be in progress, so at most one.
	idle []idleTask
	// ctlq is the FIFO of accepted control calls not yet started, and ctlBusy says one is in
	// progress (started, its caller not yet answered). The next starts only once it is
	// answered, so control calls take effect one at a time in the order the loop received
	// them (docs/architecture.md, "Control calls").
	ctlq    []*callMsg
	ctlBusy bool
	ctlHead *callMsg // the control call in progress, while ctlBusy
	// copies are the copies by Weights in progress (VersionsInUse reports their versions);
	// beforeCopy, set by tests only, runs before each copy.
	copies     copyCount
	beforeCopy func()
	// kvReleased is the KV pool a sleep released (its memory given back to the OS), which the
	// wake-up reuses when the model's KV layout is unchanged; nil otherwise.
	kvReleased *kvcache.Storage
	// ctl is the pause and sleep state; only setCtl changes it (control.go's table decides).
	ctl controlState
	// ctlRunning mirrors ctl.Phase == ctlRunning and ctlPending counts the control calls
	// accepted and not yet answered or withdrawn, both readable off the engine goroutine: with
	// no control call pending on a running engine, a Resume changes nothing and answers at
	// once (see Resume).
	ctlRunning  atomic.Bool
	ctlPending  atomic.Int64
	logits      []float32
	seedCounter uint64
	closeOnce   sync.Once
}

type staged struct {
	model   *model.Model
	weights *model.Weights
	version int64
}

// New validates cfg, packs the initial weights and allocates the KV pool.
func New(cfg Config) (*Engine, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg, log: cfg.Logger, in: make(chan message, 256), done: make(chan struct{}),
		stop: make(chan struct{}), exited: make(chan struct{}),
		reqs: map[string]*reqState{}, version: cfg.WeightVersion, shape: cfg.modelConfig()}
	e.ctlRunning.Store(true) // a new engine runs
	e.kpool = kernels.NewPool(cfg.Workers)
	var m *model.Model
	var err error
	if cfg.Builder != nil {
		m, err = cfg.Builder.Model(e.kpool)
		if err != nil {
			err = invalidField("Builder", "%v", err)
		}
	} else {
		e.weights = e.keep(cfg.Weights)
		m, err = model.NewAs(cfg.Weights, e.kpool, nil, cfg.Precision)
	}
	if err != nil {
		e.kpool.Close()
		return nil, err
	}
	e.model = m
	e.conn, e.worker = cfg.Connector, cfg.ConnectorWorker
	if e.conn == nil {
		e.conn = kvconnector.Noop{}
	}
	if e.worker == nil {
		e.worker = kvconnector.Noop{}
	}
	fail := func(err error) (*Engine, error) {
		e.kpool.Close()
		return nil, err
	}
	// From here on Close (or Run's end) releases what New started.
	if e.blocks, err = kvcache.New(kvcache.Config{NumBlocks: cfg.NumBlocks, BlockSize: cfg.BlockSize, PrefixCaching: true}); err != nil {
		return fail(err)
	}
	// A request may use the whole context unless the pool is smaller.
	maxLen := min(e.shape.MaxPositionEmbeddings, (cfg.NumBlocks-1)*cfg.BlockSize)
	e.sched, err = sched.New(sched.Config{
		MaxNumSeqs: cfg.MaxNumSeqs, MaxNumBatchedTokens: cfg.MaxBatchedTokens,
		MaxModelLen: maxLen, EOSTokenIDs: []int{e.shape.EOSTokenID},
	}, e.blocks, e.conn)
	if err != nil {
		return fail(err)
	}
	if err := e.allocKV(); err != nil {
		return fail(err)
	}
	e.sched.SetWeightVersion(e.version)
	e.metrics.weightVersion.Store(e.version)
	// The engine owns the weights through e.weights and e.model only, so a level-2 sleep or a
	// swap can release them; the config must not keep the initial set alive.
	e.cfg.Weights, e.cfg.Builder = nil, nil
	return e, nil
}

// Run steps the engine until ctx is cancelled or Close is called, then aborts whatever is
// left, releases the engine's goroutines and returns nil. It may be called once, and not
// after Close (ErrClosed).
func (e *Engine) Run(ctx context.Context) error {
	if !e.ran.CompareAndSwap(false, true) {
		select {
		case <-e.stop:
			return ErrClosed
		default:
		}
		return fmt.Errorf("%w: Run called twice", ErrInvalidArgument)
	}
	defer e.shutdown()
	e.metrics.alive.Store(true)
	for {
		for !e.hasWork() {
			if e.runIdle() {
				continue
			}
			select {
			case m := <-e.in:
				e.handle(m)
			case <-ctx.Done():
				return nil
			case <-e.stop:
				return nil
			}
		}
	drain:
		for {
			select {
			case m := <-e.in:
				e.handle(m)
			default:
				break drain
			}
		}
		if ctx.Err() != nil || e.stopping() {
			return nil
		}
		e.dropAbandoned()
		if e.hasWork() {
			e.step()
		}
	}
}

func (e *Engine) stopping() bool {
	select {
	case <-e.stop:
		return true
	default:
		return false
	}
}

// Close stops the engine and waits until every goroutine it started (the kernel workers, the
// loop if Run is running, the connector's transfers) is gone: a running Run returns after
// aborting what is left; an engine never run is released without running. Close is
// idempotent and safe for concurrent use, but must not be called from the engine goroutine
// (a hook).
func (e *Engine) Close() error {
	e.stopOnce.Do(func() { close(e.stop) })
	if e.ran.CompareAndSwap(false, true) {
		e.shutdown() // never run: nothing else will
	}
	<-e.exited
	return nil
}

// hasWork is the busy-loop predicate. An undelivered flush set counts through the connector.
func (e *Engine) hasWork() bool {
	return e.sched.HasRequests()
}

// runIdle runs the idle tasks (pause and sleep completions) in order; a task that is not done
// stays queued. It reports whether any task ran to completion, so the caller re-checks for work.
func (e *Engine) runIdle() bool {
	if len(e.idle) == 0 {
		return false
	}
	progressed := false
	for len(e.idle) > 0 && !e.hasWork() {
		if !e.idle[0].run() {
			if !e.hasWork() {
				// A task that is not done must have created work; anything else is a bug that
				// would hang its caller, so fail loudly in logs and drop it.
				e.log.Error("engine: idle task made no progress; dropping it")
				e.idle[0].fail(fmt.Errorf("engine: internal error: deferred call made no progress"))
				e.idle = e.idle[1:]
				e.runControl()
			}
			return true
		}
		e.idle = e.idle[1:]
		progressed = true
		// The task answered the control call in progress: start the ones queued behind it.
		e.runControl()
	}
	return progressed
}

// dropAbandoned answers the control call in progress at once if its caller gave up and its
// wait is only for the caller (idleTask.abandon), and starts the calls behind it. So a client
// that timed out on /pause?mode=wait does not hold a later /pause?mode=abort back until the
// requests it left running finish.
func (e *Engine) dropAbandoned() {
	if len(e.idle) == 0 || e.idle[0].abandon == nil || e.ctlHead == nil || e.ctlHead.ctx.Err() == nil {
		return
	}
	t := e.idle[0]
	e.idle = e.idle[1:]
	t.abandon()
	e.runControl()
}

// runControl starts queued control calls, in order, while none is in progress. A call that
// completes at once is followed by the next in the same turn; one that waits for the engine to
// drain (a pause with wait, a sleep) holds the rest back until runIdle completes it. A call its
// caller withdrew before it started is dropped here without running.
func (e *Engine) runControl() {
	for !e.ctlBusy && len(e.ctlq) > 0 {
		cm := e.ctlq[0]
		e.ctlq[0] = nil
		e.ctlq = e.ctlq[1:]
		if !cm.state.CompareAndSwap(callQueued, callStarted) {
			continue
		}
		e.ctlBusy, e.ctlHead = true, cm
		e.run(cm, func() { e.ctlBusy, e.ctlHead = false, nil })
	}
}

func (e *Engine) handle(m message) {
	switch {
	case m.add != nil:
		m.add.reply <- e.admit(m.add)
	case m.abort != nil:
		e.abort(m.abort)
	case m.call != nil:
		e.dispatch(m.call)
	}
}

func (e *Engine) shutdown() {
	e.closeOnce.Do(func() {
		e.metrics.alive.Store(false)
		close(e.done)
		ids := make([]string, 0, len(e.reqs))
		for id := range e.reqs {
			ids = append(ids, id)
		}
		e.abort(ids)
		for _, t := range e.idle {
			t.fail(ErrClosed)
		}
		e.idle = nil
		for _, cm := range e.ctlq {
			cm.reply <- result{nil, ErrClosed}
		}
		e.ctlq = nil
		// Answer whatever is still queued.
		for {
			select {
			case m := <-e.in:
				switch {
				case m.add != nil:
					m.add.reply <- ErrClosed
				case m.call != nil:
					m.call.reply <- result{nil, ErrClosed}
				}
			default:
				if err := e.worker.WaitIdle(context.Background()); err != nil {
					e.log.Error("engine: connector did not go idle at shutdown", "err", err)
				}
				e.kpool.Close()
				close(e.exited)
				return
			}
		}
	})
}

// send queues a message for the loop, or fails once the engine stopped.
func (e *Engine) send(ctx context.Context, m message) error {
	select {
	case <-e.done:
		return ErrClosed
	default:
	}
	select {
	case e.in <- m:
		return nil
	case <-e.done:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Add validates and queues a request and returns its stream.
func (e *Engine) Add(ctx context.Context, req Request) (*Stream, error) {
	if err := e.validate(&req); err != nil {
		return nil, err
	}
	s := newStream(e, req.ID, time.Now())
	m := &addMsg{req: req, stream: s, reply: make(chan error, 1)}
	if err := e.send(ctx, message{add: m}); err != nil {
		return nil, err
	}
	select {
	case err := <-m.reply:
		if err != nil {
			return nil, err
		}
		return s, nil
	case <-e.done:
		// The loop may have admitted it just before stopping; its stream then ends aborted.
		select {
		case err := <-m.reply:
			if err != nil {
				return nil, err
			}
			return s, nil
		default:
			return nil, ErrClosed
		}
	}
}

func (e *Engine) validate(req *Request) error {
	c := e.shape
	if req.ID == "" {
		return fmt.Errorf("%w: empty request id", ErrInvalidRequest)
	}
	if len(req.PromptTokenIDs) == 0 {
		return fmt.Errorf("%w: empty prompt", ErrInvalidRequest)
	}
	if len(req.PromptTokenIDs) >= c.MaxPositionEmbeddings {
		return fmt.Errorf("%w: prompt of %d tokens leaves no room in the context of %d", ErrInvalidRequest, len(req.PromptTokenIDs), c.MaxPositionEmbeddings)
	}
	for i, id := range req.PromptTokenIDs {
		if id < 0 || id >= c.VocabSize {
			return fmt.Errorf("%w: prompt token %d: id %d outside vocab %d", ErrInvalidRequest, i, id, c.VocabSize)
		}
	}
	req.Sampling = req.Sampling.WithDefaults()
	if err := req.Sampling.Validate(c.VocabSize); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	return nil
}

func (e *Engine) admit(m *addMsg) error {
	if _, dup := e.reqs[m.req.ID]; dup {
		return fmt.Errorf("%w: %q", ErrDuplicateID, m.req.ID)
	}
	if e.sched.NumWaiting() >= e.cfg.MaxQueued {
		return fmt.Errorf("%w: %d requests already wait to be scheduled", ErrQueueFull, e.cfg.MaxQueued)
	}
	p := m.req.Sampling
	e.seedCounter++
	seed := p.SeedOr(e.cfg.Seed ^ (e.seedCounter * 0x9e3779b97f4a7c15))
	sr := &sched.Request{
		ID: m.req.ID, PromptTokenIDs: m.req.PromptTokenIDs, CacheSalt: m.req.CacheSalt,
		Params: sched.Params{MaxTokens: p.MaxTokens, StopTokenIDs: p.StopTokenIDs, IgnoreEOS: p.IgnoreEOS, MinTokens: p.MinTokens},
	}
	if err := e.sched.Add(sr); err != nil {
		// An id whose finish the scheduler has not yet delivered is still taken.
		if errors.Is(err, sched.ErrDuplicateID) {
			return fmt.Errorf("%w: %q (its previous request is still finishing)", ErrDuplicateID, m.req.ID)
		}
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	e.reqs[m.req.ID] = &reqState{stream: m.stream, sampler: sample.New(p, seed), params: p,
		prompt: len(m.req.PromptTokenIDs), stops: p.StopTokens([]int{e.shape.EOSTokenID})}
	e.metrics.promptTokens.Add(int64(len(m.req.PromptTokenIDs)))
	return nil
}

// Abort finishes the named requests with FinishAbort. Unknown ids are ignored.
func (e *Engine) Abort(ids ...string) {
	if len(ids) == 0 {
		return
	}
	_ = e.send(context.Background(), message{abort: ids})
}

func (e *Engine) abort(ids []string) {
	e.deliver(e.sched.Abort(ids...))
}

// deliver hands scheduler outputs to their streams.
func (e *Engine) deliver(outs []sched.RequestOutput) {
	now := time.Now()
	for _, o := range outs {
		st, ok := e.reqs[o.ReqID]
		if !ok {
			continue
		}
		toks := make([]Token, len(o.NewTokenIDs))
		for i, id := range o.NewTokenIDs {
			if i < len(o.Payloads) {
				if t, ok := o.Payloads[i].(Token); ok {
					toks[i] = t
					continue
				}
			}
			toks[i] = Token{ID: id, WeightVersion: o.WeightVersion}
		}
		st.gen += len(toks)
		e.metrics.genTokens.Add(int64(len(toks)))
		reason := FinishReason("")
		if o.Finished {
			reason = FinishReason(o.FinishReason)
		}
		st.stream.push(toks, o.NumCachedTokens, reason, now)
		if o.Finished {
			delete(e.reqs, o.ReqID)
			e.metrics.finished(reason)
			if h := e.cfg.Hooks.OnFinish; h != nil {
				st.stream.mu.Lock()
				t := st.stream.timings
				st.stream.mu.Unlock()
				h(o.ReqID, reason, st.prompt, st.gen, t)
			}
		}
	}
}

// step runs one engine step: schedule, execute (a forward pass, or a connector-only step
// with no tokens), update.
func (e *Engine) step() {
	so, err := e.sched.Schedule()
	if err != nil {
		// Schedule and UpdateFromOutput strictly alternate in this loop, so this is a bug.
		e.log.Error("engine: schedule failed", "err", err)
		return
	}
	mo := &sched.ModelOutput{Step: so.Step, Sampled: map[string]sched.Sample{}}
	var forward func(context.Context) error
	if so.NumScheduledTokens > 0 {
		forward = func(context.Context) error {
			if h := e.cfg.Hooks.BeforeForward; h != nil {
				if err := h(so.Step); err != nil {
					return err
				}
			}
			return e.execute(so, mo)
		}
	}
	ctx := context.Background()
	kvOut, err := kvconnector.RunStep(ctx, e.worker, so.ConnectorMeta, so.FinishedReqIDs, forward)
	if err != nil {
		// A failed step fails the requests it scheduled (their streams end with FinishAbort):
		// the scheduler rolls them back to the step's start, so nothing the step was to compute
		// is cached or stored, and the connector was told to fail the step's transfers. The
		// connector output is still applied, so no transfer completion is lost.
		e.metrics.stepErrors.Add(1)
		mo.Sampled = nil
		failed := e.sched.FailStep(so, sched.FinishAbort)
		e.log.Error("engine: step failed; its requests are aborted", "step", so.Step, "requests", len(failed), "err", err)
		e.deliver(failed)
	}
	mo.KVConnector = kvOut
	outs, err := e.sched.UpdateFromOutput(so, mo)
	if err != nil {
		e.log.Error("engine: update from output", "step", so.Step, "err", err)
	}
	e.deliver(outs)
	e.metrics.steps.Add(1)
	if len(e.idle) > 0 {
		e.metrics.drainSteps.Add(1)
	}
	e.metrics.snapshot(e)
	if h := e.cfg.Hooks.OnStep; h != nil {
		h(so.NumScheduledTokens)
	}
}

// execute runs the model over the scheduled tokens and samples the requests that reached the
// end of their known tokens.
func (e *Engine) execute(so *sched.SchedulerOutput, mo *sched.ModelOutput) error {
	var b model.Batch
	var sampleIDs []string
	for i, sr := range so.Scheduled {
		table := make([]int32, len(sr.BlockIDs))
		for j, blk := range sr.BlockIDs {
			table[j] = int32(blk)
		}
		b.BlockTables = append(b.BlockTables, table)
		for k, id := range sr.TokenIDs {
			b.Tokens = append(b.Tokens, int32(id))
			b.Positions = append(b.Positions, int32(sr.StartPos+k))
			b.Seq = append(b.Seq, int32(i))
		}
		if sr.Sample {
			b.Logits = append(b.Logits, int32(len(b.Tokens)-1))
			sampleIDs = append(sampleIDs, sr.ReqID)
		}
	}
	v := e.model.Config.VocabSize
	if need := len(b.Logits) * v; cap(e.logits) < need {
		e.logits = make([]float32, need)
	}
	logits := e.logits[:len(b.Logits)*v]
	if err := e.model.Forward(&b, e.kv, logits); err != nil {
		return err
	}
	// Sampling a 32k vocabulary with raw logprobs costs ~0.3 ms a request: split it across the
	// kernel workers. Each request has its own sampler, so the split changes no result.
	results := make([]sample.Result, len(sampleIDs))
	states := make([]*reqState, len(sampleIDs))
	for i, id := range sampleIDs {
		states[i] = e.reqs[id]
	}
	e.kpool.Parallel(len(sampleIDs), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			st := states[i]
			if st == nil {
				continue
			}
			row := logits[i*v : (i+1)*v]
			if st.params.SuppressStops(st.gen) {
				results[i] = st.sampler.SampleExcept(row, st.stops)
			} else {
				results[i] = st.sampler.Sample(row)
			}
		}
	})
	for i, id := range sampleIDs {
		if states[i] == nil {
			continue
		}
		r := results[i]
		tok := Token{ID: r.Token, Logprob: r.Logprob, Top: r.Top, WeightVersion: so.WeightVersion}
		mo.Sampled[id] = sched.Sample{TokenID: r.Token, Payload: tok}
	}
	return nil
}

type result struct {
	v   any
	err error
}

// ErrStillRunning is returned, wrapped with the context's error, by a call whose caller gave
// up after the engine had started it: the call completes anyway and takes effect (a control
// call at its one linearization point, never in part). A call whose caller gave up before it
// started returns the context's error alone and has no effect.
var ErrStillRunning = errors.New("engine: the call had started and completes without its caller")

// call runs fn on the engine goroutine and waits for it to call done (at once, or later from
// an idle task). A cancelled ctx withdraws the call if the loop has not started it yet (it then
// never runs: ctx.Err()); once started, the call runs to completion and the caller gets its
// result if it is already there, else ErrStillRunning wrapped with ctx.Err().
func call[T any](ctx context.Context, e *Engine, name string, fn func(ctx context.Context, done func(T, error))) (T, error) {
	return callAs(ctx, e, name, false, fn)
}

// controlCall is call for a control call: the loop queues it behind the control calls it
// received before and starts it once they all completed (runControl).
func controlCall[T any](ctx context.Context, e *Engine, name string, fn func(ctx context.Context, done func(T, error))) (T, error) {
	return callAs(ctx, e, name, true, fn)
}

func callAs[T any](ctx context.Context, e *Engine, name string, control bool, fn func(ctx context.Context, done func(T, error))) (T, error) {
	var zero T
	cm := &callMsg{ctx: ctx, name: name, reply: make(chan result, 1), control: control}
	cm.fn = func(ctx context.Context, done func(any, error)) {
		fn(ctx, func(v T, err error) { done(v, err) })
	}
	if control {
		e.ctlPending.Add(1)
	}
	if err := e.send(ctx, message{call: cm}); err != nil {
		if control {
			e.ctlPending.Add(-1)
		}
		return zero, err
	}
	var r result
	select {
	case r = <-cm.reply:
	case <-ctx.Done():
		if cm.state.CompareAndSwap(callQueued, callWithdrawn) {
			if control {
				e.ctlPending.Add(-1) // the loop drops it unrun
			}
			return zero, ctx.Err()
		}
		select {
		case r = <-cm.reply:
		default:
			return zero, fmt.Errorf("%w: %w", ErrStillRunning, ctx.Err())
		}
	case <-e.done:
		select {
		case r = <-cm.reply:
		default:
			return zero, ErrClosed
		}
	}
	if r.err != nil {
		return zero, r.err
	}
	v, _ := r.v.(T)
	return v, nil
}

// dispatch starts a call the loop received: a control call joins the FIFO of control calls,
// any other runs now unless its caller withdrew it.
func (e *Engine) dispatch(cm *callMsg) {
	if cm.control {
		e.ctlq = append(e.ctlq, cm)
		e.runControl()
		return
	}
	if cm.state.CompareAndSwap(callQueued, callStarted) {
		e.run(cm, nil)
	}
}

// run runs a started call; after, if set, runs when the call is answered, before its caller
// hears back.
func (e *Engine) run(cm *callMsg, after func()) {
	ctx, span := e.cfg.Tracer.Start(cm.ctx, "engine."+cm.name)
	var once sync.Once
	cm.fn(ctx, func(v any, err error) {
		once.Do(func() {
			if after != nil {
				after()
			}
			if err != nil {
				span.RecordError(err)
			}
			span.SetAttributes(attribute.Int64("weight_version", e.version))
			span.End()
			// Utility calls change the state without a step (pause, sleep, a swap while idle):
			// refresh the lock-free snapshot (/ready, /metrics) before the caller hears back.
			e.metrics.snapshot(e)
			if cm.control {
				e.ctlPending.Add(-1) // after its effect, before its caller hears back
			}
			cm.reply <- result{v, err}
		})
	})
}

func kvcacheStorage(m *model.Model, blocks, blockSize int) (*kvcache.Storage, error) {
	return kvcache.NewStorage(m.KVLayout(blocks, blockSize))
}
