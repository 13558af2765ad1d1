package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"runtime/debug"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Defaults of Config.
const (
	// DefaultVerifyTimeout bounds one verifier call.
	DefaultVerifyTimeout = 30 * time.Second
	// DefaultVerifyConcurrency bounds the verifier calls running at once.
	DefaultVerifyConcurrency = 16
)

const tracerName = "github.com/rolloutkit/rollout/sdk/pipeline"

// Config configures a Pipeline. Generator, Verifier and Source are required.
type Config struct {
	// GroupSize is the samples per prompt (GRPO's G, at least 2).
	GroupSize int
	// BatchGroups is the groups per batch (at least 1).
	BatchGroups int
	// MaxStaleness is K: a group whose oldest model token was generated at version v is
	// trained on only by a trainer at version <= v+K. 0 is synchronous on-policy training:
	// each batch is generated after the update before it. Admission starts a group only if
	// the batches before it leave it within the bound.
	MaxStaleness int64
	// OverSample admits this many groups beyond what the staleness bound's batches hold, so
	// that groups removed by FilterZeroVariance are replaced without waiting (DAPO's
	// over-sampling). Extra groups that no batch can take in time are dropped as stale.
	OverSample int
	// FilterZeroVariance drops groups whose rewards are all equal (no GRPO signal) and
	// generates others in their place (DAPO's dynamic sampling).
	FilterZeroVariance bool
	// MaxFiltered bounds the groups FilterZeroVariance may drop while one batch fills (0: no
	// bound); past it Next returns ErrNoSignal instead of waiting on, as DAPO's bound on
	// generation rounds does: a policy that has collapsed (or mastered the prompts) would
	// otherwise generate forever.
	MaxFiltered int
	// MaxInFlight bounds the groups generating at once (0: only the staleness bound).
	MaxInFlight int
	// Version is the weight version the fleet serves and the trainer holds at the start.
	Version int64

	Generator Generator
	Verifier  Verifier
	Source    Source
	// VerifyTimeout bounds each verifier call (default DefaultVerifyTimeout).
	VerifyTimeout time.Duration
	// VerifyConcurrency bounds the verifier calls at once (default DefaultVerifyConcurrency).
	VerifyConcurrency int

	// OnSample and OnGroup stream results as they finish: each sample once scored, each
	// group once all its samples are (with Filtered or Err set when it will not be trained
	// on). They are called from the pipeline's goroutines, concurrently, and must not block; a
	// panic in them is logged and recovered, and loses no sample or group.
	OnSample func(Sample)
	OnGroup  func(*Group)

	// Metrics records the pipeline's Prometheus metrics (nil: none).
	Metrics *Metrics
	// TracerProvider makes the pipeline's spans (default otel.GetTracerProvider()).
	TracerProvider trace.TracerProvider
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *Config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
	}
	switch {
	case c.GroupSize < 2:
		return bad("GroupSize must be >= 2: GRPO compares rewards within a group (got %d)", c.GroupSize)
	case c.BatchGroups < 1:
		return bad("BatchGroups must be >= 1 (got %d)", c.BatchGroups)
	case c.MaxStaleness < 0:
		return bad("MaxStaleness must be >= 0 (got %d)", c.MaxStaleness)
	case c.OverSample < 0:
		return bad("OverSample must be >= 0 (got %d)", c.OverSample)
	case c.MaxInFlight < 0 || c.MaxFiltered < 0:
		return bad("MaxInFlight and MaxFiltered must be >= 0 (got %d, %d)", c.MaxInFlight, c.MaxFiltered)
	case c.Version < 0:
		return bad("Version must be >= 0 (got %d)", c.Version)
	case c.Generator == nil || c.Verifier == nil || c.Source == nil:
		return bad("Generator, Verifier and Source are required")
	case c.VerifyTimeout < 0 || c.VerifyConcurrency < 0:
		return bad("VerifyTimeout and VerifyConcurrency must be >= 0")
	}
	if c.VerifyTimeout == 0 {
		c.VerifyTimeout = DefaultVerifyTimeout
	}
	if c.VerifyConcurrency == 0 {
		c.VerifyConcurrency = DefaultVerifyConcurrency
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Stats are the pipeline's counters since Start.
type Stats struct {
	Admitted, Consumed, Filtered, Stale, Failed int
	VerifyErrors, VerifyTimeouts                int
	Buffered, InFlight                          int
	// Version is the fleet version new groups are generated at; NextBatch the trainer version
	// the next batch is for.
	Version, NextBatch int64
}

// Pipeline generates groups continuously into a buffer and hands them out in batches. Its
// methods are safe for concurrent use.
type Pipeline struct {
	cfg    Config
	tracer trace.Tracer
	verify chan struct{}      // semaphore of verifier calls
	cancel context.CancelFunc // ends the context of every goroutine of the pipeline
	done   <-chan struct{}    // closed when that context ends (Close, or the caller's cancel)
	wg     sync.WaitGroup

	mu         sync.Mutex
	core       *core
	changed    chan struct{} // closed and replaced on every change of state
	closed     bool
	sourceDone bool
	fatal      error
	st         Stats
	pending    Batch // counts and errors since the last batch
}

// Start starts generating. ctx bounds the pipeline's life (as Close does); the pipeline's
// spans are children of its span.
func Start(ctx context.Context, cfg Config) (*Pipeline, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	p := &Pipeline{cfg: cfg, tracer: cfg.TracerProvider.Tracer(tracerName), verify: make(chan struct{}, cfg.VerifyConcurrency),
		cancel: cancel, done: ctx.Done(), changed: make(chan struct{}),
		core: newCore(cfg.BatchGroups, cfg.MaxStaleness, cfg.OverSample, cfg.MaxInFlight, cfg.Version)}
	p.wg.Add(1)
	go p.admitLoop(ctx)
	return p, nil
}

// notify wakes every waiter; p.mu is held.
func (p *Pipeline) notify() {
	close(p.changed)
	p.changed = make(chan struct{})
	p.cfg.Metrics.setDepth(len(p.core.buffer), len(p.core.inflight))
}

// SetVersion tells the pipeline that the fleet serves version v (call it once an update
// commits): groups admitted from now on are generated at v or above, and the staleness
// bound admits the groups the batches up to v+K will take.
func (p *Pipeline) SetVersion(v int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.core.setVersion(v)
	p.notify()
}

// Stats returns the counters.
func (p *Pipeline) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.st
	s.Buffered, s.InFlight = len(p.core.buffer), len(p.core.inflight)
	s.Version, s.NextBatch = p.core.version, p.core.next
	return s
}

// Close stops generating, cancels the groups in flight and waits for every goroutine of the
// pipeline to end. Next returns ErrClosed afterwards, as it does once the context given to
// Start ends (Close is still needed then, to wait for the goroutines).
func (p *Pipeline) Close() error {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		p.notify()
	}
	p.mu.Unlock()
	p.cancel()
	p.wg.Wait()
	return nil
}

// Next returns the batch for a trainer at weight version version (whose samples it may train
// on: every group's oldest model token is at least version-K). It blocks until B groups are
// ready, withholding the batch while a group in flight would otherwise miss its last batch.
// It returns a generation error that stopped the pipeline, ErrExhausted once the source
// ended and too few groups are left, ErrClosed after Close, or ctx's error.
func (p *Pipeline) Next(ctx context.Context, version int64) (b *Batch, err error) {
	ctx, span := p.tracer.Start(ctx, "pipeline.next", trace.WithAttributes(attribute.Int64("rollout.trainer_version", version)))
	defer func() {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}()
	if version < 0 {
		return nil, fmt.Errorf("%w: version must be >= 0 (got %d)", ErrInvalid, version)
	}
	start := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if p.closed || closed(p.done) {
			return nil, ErrClosed
		}
		groups, stale, ok := p.core.take(version)
		p.dropStale(stale)
		if ok {
			b := p.pending
			p.pending = Batch{}
			b.Version, b.Groups, b.Wait = version, groups, time.Since(start)
			p.st.Consumed += len(groups)
			for _, g := range groups {
				p.cfg.Metrics.consumed(version - g.MinVersion)
			}
			p.cfg.Metrics.batchWait(b.Wait)
			p.notify() // the next batch's version opens admission
			span.SetAttributes(attribute.Int("rollout.groups", len(groups)), attribute.Int("rollout.stale", b.Stale),
				attribute.Int("rollout.filtered", b.Filtered), attribute.Int("rollout.failed", b.Failed))
			return &b, nil
		}
		if len(stale) > 0 {
			p.notify() // room to admit replacements
		}
		switch {
		case p.fatal != nil:
			return nil, p.fatal
		case p.cfg.MaxFiltered > 0 && p.pending.Filtered > p.cfg.MaxFiltered:
			n := p.pending.Filtered
			p.pending.Filtered = 0
			return nil, fmt.Errorf("%w: %d groups had rewards all equal while batch %d filled (MaxFiltered %d)", ErrNoSignal, n, version, p.cfg.MaxFiltered)
		case p.sourceDone && len(p.core.inflight) == 0:
			return nil, fmt.Errorf("%w: %d groups left, a batch takes %d", ErrExhausted, len(p.core.buffer), p.cfg.BatchGroups)
		}
		ch := p.changed
		p.mu.Unlock()
		select {
		case <-ch:
		case <-p.done:
		case <-ctx.Done():
			p.mu.Lock()
			return nil, ctx.Err()
		}
		p.mu.Lock()
	}
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// dropStale accounts groups no batch can take any more; p.mu is held.
func (p *Pipeline) dropStale(stale []*Group) {
	if len(stale) == 0 {
		return
	}
	p.st.Stale += len(stale)
	p.pending.Stale += len(stale)
	p.cfg.Metrics.outcome(outcomeStale, len(stale))
	p.cfg.Logger.Debug("pipeline: dropped stale groups", "groups", len(stale), "next_batch", p.core.next)
}

// admitLoop starts groups while the staleness bound admits them, until the source ends, a
// generation fails or the pipeline closes.
func (p *Pipeline) admitLoop(ctx context.Context) {
	defer p.wg.Done()
	var held *Prompt // a prompt read while the bound closed (a trainer version jumped ahead)
	for {
		p.mu.Lock()
		for !p.closed && p.fatal == nil && !p.core.canAdmit() {
			ch := p.changed
			p.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return
			}
			p.mu.Lock()
		}
		if p.closed || p.fatal != nil {
			p.mu.Unlock()
			return
		}
		if held == nil {
			p.mu.Unlock()
			var prompt Prompt
			err := p.recovered("source", func() (err error) { prompt, err = p.cfg.Source(ctx); return err })
			p.mu.Lock()
			switch {
			case p.closed || ctx.Err() != nil:
				p.mu.Unlock()
				return
			case errors.Is(err, io.EOF):
				p.sourceDone = true
				p.notify()
				p.mu.Unlock()
				return
			case err != nil:
				p.fatal = fmt.Errorf("pipeline: prompt source: %w", err)
				p.notify()
				p.mu.Unlock()
				return
			}
			held = &prompt
			if !p.core.canAdmit() {
				p.mu.Unlock()
				continue
			}
		}
		id, minV := p.core.admit()
		p.st.Admitted++
		g := &Group{ID: id, Prompt: *held, RequestedVersion: minV}
		held = nil
		p.notify()
		p.mu.Unlock()
		p.cfg.Metrics.outcome(outcomeAdmitted, 1)
		p.wg.Add(1)
		go p.runGroup(ctx, g)
	}
}

// runGroup generates one group, scores each sample as it arrives and hands the group to the
// core.
func (p *Pipeline) runGroup(ctx context.Context, g *Group) {
	defer p.wg.Done()
	ctx, span := p.tracer.Start(ctx, "pipeline.group", trace.WithAttributes(attribute.Int64("rollout.group", int64(g.ID)),
		attribute.Int64("rollout.min_version", g.RequestedVersion)))
	defer span.End()
	n := p.cfg.GroupSize
	g.Samples = make([]Sample, n)
	var (
		mu      sync.Mutex
		seen    = make([]bool, n)
		done    bool // Generate returned: later emits are ignored
		scoring sync.WaitGroup
		bad     error // an emit out of range or repeated
	)
	emit := func(i int, t Trajectory) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case done:
			return
		case i < 0 || i >= n || seen[i]:
			if bad == nil {
				bad = fmt.Errorf("emitted sample %d twice or outside [0, %d)", i, n)
			}
			return
		case t.check() != nil:
			if bad == nil {
				bad = fmt.Errorf("sample %d: %w", i, t.check())
			}
			return
		}
		seen[i] = true
		scoring.Add(1)
		go func() {
			defer scoring.Done()
			g.Samples[i] = p.score(ctx, g, i, t)
		}()
	}
	err := p.recovered("generator", func() error {
		return p.cfg.Generator.Generate(ctx, Request{Group: g.ID, Prompt: g.Prompt, N: n, MinVersion: g.RequestedVersion}, emit)
	})
	mu.Lock()
	done = true
	missing := 0
	for _, s := range seen {
		if !s {
			missing++
		}
	}
	mu.Unlock()
	scoring.Wait()
	if err == nil && bad != nil {
		err = bad
	}
	if err == nil && missing > 0 {
		err = fmt.Errorf("generator returned with %d of %d samples not emitted", missing, n)
	}
	if err != nil {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.core.finish(g, false)
		if ctx.Err() == nil && p.fatal == nil {
			p.fatal = fmt.Errorf("%w: group %d: %w", ErrGenerate, g.ID, err)
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		p.notify()
		return
	}
	g.MinVersion, g.MaxVersion = math.MaxInt64, math.MinInt64
	for i := range g.Samples {
		s := &g.Samples[i]
		lo, hi, ok := s.VersionRange()
		if !ok {
			lo, hi = g.RequestedVersion, g.RequestedVersion
		}
		g.MinVersion, g.MaxVersion = min(g.MinVersion, lo), max(g.MaxVersion, hi)
		if s.Err != nil && g.Err == nil {
			g.Err = s.Err
		}
	}
	g.Filtered = g.Err == nil && p.cfg.FilterZeroVariance && g.zeroVariance()
	span.SetAttributes(attribute.Int64("rollout.token_min_version", g.MinVersion), attribute.Bool("rollout.filtered", g.Filtered))
	if g.Err != nil {
		span.RecordError(g.Err)
		span.SetStatus(codes.Error, g.Err.Error())
	}
	if p.cfg.OnGroup != nil {
		// A panicking callback is logged (recovered) and the group goes on to the buffer: it
		// is only an observer, and the trainer must not lose the group to it.
		_ = p.recovered("OnGroup", func() error { p.cfg.OnGroup(g); return nil })
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	keep := g.Err == nil && !g.Filtered
	p.core.finish(g, keep)
	switch {
	case g.Err != nil:
		p.st.Failed++
		p.pending.Failed++
		p.pending.Errors = append(p.pending.Errors, fmt.Errorf("group %d: %w", g.ID, g.Err))
		p.cfg.Metrics.outcome(outcomeFailed, 1)
	case g.Filtered:
		p.st.Filtered++
		p.pending.Filtered++
		p.cfg.Metrics.outcome(outcomeFiltered, 1)
	}
	p.notify()
}

// score runs the verifier on one sample under its timeout. A verifier that ignores its
// context still times out: the sample fails at the deadline and the call is left to end
// on its own (Close waits for it).
func (p *Pipeline) score(ctx context.Context, g *Group, i int, t Trajectory) Sample {
	s := Sample{Group: g.ID, Index: i, Trajectory: t}
	select {
	case p.verify <- struct{}{}:
	case <-ctx.Done():
		s.Err = fmt.Errorf("%w: %w", ErrVerifier, ctx.Err())
		return s
	}
	defer func() { <-p.verify }()
	vctx, cancel := context.WithTimeoutCause(ctx, p.cfg.VerifyTimeout, ErrVerifierTimeout)
	defer cancel()
	vctx, span := p.tracer.Start(vctx, "pipeline.verify", trace.WithAttributes(attribute.Int("rollout.sample", i)))
	defer span.End()
	type result struct {
		r   float64
		err error
	}
	res := make(chan result, 1)
	start := time.Now()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		var r float64
		err := p.recovered("verifier", func() (err error) { r, err = p.cfg.Verifier.Verify(vctx, g.Prompt, t); return err })
		res <- result{r, err}
	}()
	var r result
	select {
	case r = <-res:
	case <-vctx.Done():
		// A verifier that returned as the deadline passed keeps its answer.
		select {
		case r = <-res:
		default:
			r.err = vctx.Err()
		}
	}
	s.Reward, s.Err = r.r, r.err
	switch {
	case s.Err != nil && errors.Is(context.Cause(vctx), ErrVerifierTimeout):
		s.Err = fmt.Errorf("%w after %s: %w", ErrVerifierTimeout, p.cfg.VerifyTimeout, s.Err)
	case s.Err != nil:
		s.Err = fmt.Errorf("%w: %w", ErrVerifier, s.Err)
	case math.IsNaN(s.Reward) || math.IsInf(s.Reward, 0):
		s.Err = fmt.Errorf("%w: reward %v is not a finite number", ErrVerifier, s.Reward)
	}
	s.VerifyTime = time.Since(start)
	if s.Err != nil {
		s.Reward = 0
		span.RecordError(s.Err)
		span.SetStatus(codes.Error, s.Err.Error())
	}
	p.cfg.Metrics.verified(s.VerifyTime, s.Err)
	p.mu.Lock()
	switch {
	case errors.Is(s.Err, ErrVerifierTimeout):
		p.st.VerifyTimeouts++
	case s.Err != nil:
		p.st.VerifyErrors++
	}
	p.mu.Unlock()
	if p.cfg.OnSample != nil {
		_ = p.recovered("OnSample", func() error { p.cfg.OnSample(s); return nil })
	}
	return s
}

// recovered calls f, the caller's code (what names it), turning a panic into an error
// wrapping ErrPanic: it runs on the pipeline's goroutines, where a panic would end the whole
// process. The stack goes to the log, the error stays one line.
func (p *Pipeline) recovered(what string, f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s: %v", ErrPanic, what, r)
			p.cfg.Logger.Error("pipeline: recovered a panic", "in", what, "panic", r, "stack", string(debug.Stack()))
		}
	}()
	return f()
}
