package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/kvcache"
	"github.com/rolloutkit/rollout/engine/kvconnector"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/sched"
)

// PauseMode says what a pause does with requests in flight.
type PauseMode string

// Pause modes, as vLLM's.
const (
	PauseAbort PauseMode = "abort" // finish running and waiting requests with FinishAbort
	PauseWait  PauseMode = "wait"  // let running requests finish; queue new ones
	PauseKeep  PauseMode = "keep"  // freeze running requests; Resume continues them
)

// ParsePauseMode parses "abort", "wait" or "keep".
func ParsePauseMode(s string) (PauseMode, error) {
	switch m := PauseMode(s); m {
	case PauseAbort, PauseWait, PauseKeep:
		return m, nil
	}
	return "", fmt.Errorf("%w: pause mode %q: want abort, wait or keep", ErrInvalidArgument, s)
}

// Wake-up tags.
const (
	TagWeights = "weights"
	TagKVCache = "kv_cache"
)

// ResetResult reports what a prefix-cache reset did. Success is never true when something
// was not cleared.
type ResetResult struct {
	Success       bool   `json:"success"`
	BlocksCleared int    `json:"gpu_blocks_cleared"`
	JobsFlushed   int    `json:"offload_jobs_flushed"`
	Preempted     int    `json:"preempted_requests"`
	Reason        string `json:"reason,omitempty"`
}

func fromDetail(ok bool, d sched.ResetDetail) ResetResult {
	return ResetResult{Success: ok, BlocksCleared: d.BlocksCleared, JobsFlushed: d.ConnectorJobsFlushed, Preempted: d.RequestsPreempted, Reason: d.Reason}
}

// Pause stops scheduling as mode says. With clearCache it then resets the prefix cache and
// the connector, preempting running requests (also those frozen by keep) and turning waiting
// requests whose connector load landed back into recomputing ones, so that no KV computed
// before the pause is reused; they recompute on Resume. The reset runs once the engine is idle,
// so normally nothing is left in use and it reports success; otherwise Success is false and
// Reason says what is still held. It returns once the pause is complete: at once for keep and
// abort, after the running requests finished for wait.
//
// Pause takes effect when it starts (it is a control call: see Resume): from then on the engine
// reports paused, while a wait pause drains; the control calls received after it start only
// once it returned. If the caller of a wait pause without clearCache gives up while it drains,
// the calls behind it start at once (the pause has taken effect; the drain goes on, but no
// longer holds anything back).
func (e *Engine) Pause(ctx context.Context, mode PauseMode, clearCache bool) (ResetResult, error) {
	if _, err := ParsePauseMode(string(mode)); err != nil {
		return ResetResult{}, err
	}
	return controlCall(ctx, e, "pause", func(ctx context.Context, done func(ResetResult, error)) {
		e.pause(mode)
		if err := e.transition(ctlEvent{kind: evPause, mode: mode}); err != nil {
			done(ResetResult{}, err)
			return
		}
		span := trace.SpanFromContext(ctx)
		span.SetAttributes(attribute.String("engine.pause_mode", string(mode)), attribute.Bool("engine.clear_cache", clearCache))
		if e.hasWork() {
			// The pause completes once running requests and in-flight KV transfers are done:
			// the event marks where that wait starts, so a slow pause shows what it waited on.
			span.AddEvent("engine.drain", trace.WithAttributes(attribute.Int("engine.running", e.sched.NumUnfinishedRequests()),
				attribute.Bool("engine.connector_pending", e.conn.HasPendingPushWork())))
		}
		complete := func() bool {
			var r ResetResult
			if clearCache {
				r = e.resetCaches(ctx)
				span.SetAttributes(attribute.Int("engine.blocks_cleared", r.BlocksCleared), attribute.Int("engine.jobs_flushed", r.JobsFlushed),
					attribute.Int("engine.preempted", r.Preempted), attribute.Bool("engine.reset_success", r.Success))
			}
			done(r, nil)
			return true
		}
		var abandon func()
		if !clearCache {
			// The pause took effect when it started; its drain only delays the answer.
			// Its caller may still read the answer (it gave up as the answer came): the error
			// must say the call took effect, as ErrStillRunning does, not only ctx.Err().
			abandon = func() { done(ResetResult{}, fmt.Errorf("%w: %w", ErrStillRunning, ctx.Err())) }
		}
		e.whenIdle(complete, func(err error) { done(ResetResult{}, err) }, abandon)
	})
}

// pause applies a pause's effects on requests and the scheduler; the caller records it in the
// control state.
func (e *Engine) pause(mode PauseMode) {
	if mode == PauseAbort {
		e.deliver(e.sched.FinishAll(sched.FinishAbort))
	}
	if mode == PauseKeep {
		e.sched.SetPauseState(sched.PausedAll)
	} else {
		e.sched.SetPauseState(sched.PausedNew)
	}
}

// whenIdle runs task now when the engine has no work, otherwise once it drains; abandon (may
// be nil) is idleTask.abandon.
func (e *Engine) whenIdle(task func() bool, fail func(error), abandon func()) {
	if !e.hasWork() && len(e.idle) == 0 && task() {
		return
	}
	e.idle = append(e.idle, idleTask{run: task, fail: fail, abandon: abandon})
}

// resetCaches is vLLM's _reset_caches: preempt running requests, reset the prefix cache and
// the connector. ctx is the utility call's (its span is the connector reset's parent).
func (e *Engine) resetCaches(ctx context.Context) ResetResult {
	ok, d := e.sched.ResetPrefixCache(ctx, true, true)
	return fromDetail(ok, d)
}

// Resume lets scheduling continue. It fails with ErrAsleep while any part is asleep.
//
// Resume, like Pause, Sleep, WakeUp, StageWeights, CommitWeights, UpdateWeights and
// PrepareSpare, is a control call: the engine loop queues control calls in the order it
// receives them and starts each only once the one before it returned, so each takes effect at
// one point on the engine goroutine and any set of concurrent control calls leaves the state
// some sequential order of them would, each returning what it would in that order. A Resume
// that arrives while a Pause(wait) or a Sleep is still draining therefore does not cut the drain
// short: it starts once that call returned, and only then do queued requests start. A control
// call whose caller gives up (ctx) before it started never takes effect and returns ctx.Err();
// once started it completes whole (ErrStillRunning tells its caller so).
//
// A Resume of a running engine with no control call pending (accepted and not yet answered or
// withdrawn) answers at once, without the loop: it would change nothing, and answering it there
// is the order in which it came first among the calls concurrent with it. Every fleet call
// that finds a server serving (a resume after an update, a retried resume) costs that server no
// wake of its engine goroutine (ResumeIfRunning).
func (e *Engine) Resume(ctx context.Context) error {
	if e.ResumeIfRunning() {
		return nil
	}
	_, err := controlCall(ctx, e, "resume", func(_ context.Context, done func(struct{}, error)) {
		if err := e.transition(ctlEvent{kind: evResume}); err != nil {
			done(struct{}{}, err)
			return
		}
		e.sched.SetPauseState(sched.Unpaused)
		done(struct{}{}, nil)
	})
	return err
}

// ResumeIfRunning is Resume's answer when it needs no engine loop: it reports whether the
// engine is open, running, and has no control call pending, in which case a Resume now would
// change nothing and has taken effect. A false answer changes nothing either: call Resume.
func (e *Engine) ResumeIfRunning() bool {
	select {
	case <-e.done:
		return false
	default:
	}
	// Pending first: a control call counts as pending until after its state change is
	// visible, so a call that completed before this read shows in ctlRunning.
	return e.ctlPending.Load() == 0 && e.ctlRunning.Load()
}

// transition moves the control state by evs in one change (control.go's table), or not at
// all: an event the table refuses leaves the state as it is and returns the refusal; an
// illegal one is also counted as an invariant violation, since the engine must never produce
// it.
func (e *Engine) transition(evs ...ctlEvent) error {
	next := e.ctl
	for _, ev := range evs {
		var err error
		next, err = next.next(ev)
		if errors.Is(err, errIllegalTransition) {
			e.metrics.violations.Add(1)
			e.log.Error("engine: invariant violation", "err", err)
		}
		if err != nil {
			return err
		}
	}
	e.setCtl(next)
	return nil
}

// IsPaused reports whether scheduling is paused (by Pause or by Sleep).
func (e *Engine) IsPaused(ctx context.Context) (bool, error) {
	return call(ctx, e, "is_paused", func(_ context.Context, done func(bool, error)) { done(e.ctl.Phase != ctlRunning, nil) })
}

// IsSleeping reports whether the engine sleeps at any level. Unlike vLLM, a plain Pause does
// not count as sleeping.
func (e *Engine) IsSleeping(ctx context.Context) (bool, error) {
	return call(ctx, e, "is_sleeping", func(_ context.Context, done func(bool, error)) { done(e.asleep(), nil) })
}

func (e *Engine) asleep() bool { return e.ctl.Phase == ctlAsleep }

// Sleep pauses the engine (with mode, unless it is paused already, in which case the existing
// pause stands) and then, for level ≥ 1, resets every cache, keeps stepping until every flush
// the reset produced has been delivered to the connector's workers, waits for every transfer
// touching the KV pool, turns every request still holding blocks (a connector load that landed
// meanwhile) into one that recomputes after the wake-up, and only then releases the pool.
// Level 2 also releases every weight set the engine serves or retired (a staged one stays): a
// wake-up then needs new weights (CommitWeights while asleep). Level 0 only pauses.
//
// Sleep is a control call (see Resume) that takes effect when it completes: while it drains,
// the engine schedules nothing new but IsPaused, IsSleeping and Stats still report the state
// before it, and the pause and the sleep then take effect together, as one change, in the same
// turn as the release. Should waiting for the KV transfers fail, it takes effect as the pause
// alone and returns the error.
func (e *Engine) Sleep(ctx context.Context, level int, mode PauseMode) error {
	if level < 0 || level > 2 {
		return fmt.Errorf("%w: sleep level %d: want 0, 1 or 2", ErrInvalidArgument, level)
	}
	if mode == "" {
		mode = PauseAbort
	}
	if _, err := ParsePauseMode(string(mode)); err != nil {
		return err
	}
	_, err := controlCall(ctx, e, "sleep", func(ctx context.Context, done func(struct{}, error)) {
		// The scheduler pauses now, so that the engine drains; the control state changes once,
		// at the end. No other control call runs in between, so the phase is the same then.
		if e.ctl.Phase == ctlRunning {
			e.pause(mode)
		}
		pauseEv := ctlEvent{kind: evSleepPause, mode: mode}
		trace.SpanFromContext(ctx).SetAttributes(attribute.Int("engine.sleep_level", level))
		if level == 0 {
			done(struct{}{}, e.transition(pauseEv, ctlEvent{kind: evSleep, level: 0}))
			return
		}
		phase := 0
		task := func() bool {
			if phase == 0 {
				phase = 1
				if r := e.resetCaches(ctx); !r.Success {
					e.log.Warn("engine: sleep: cache reset incomplete", "reason", r.Reason)
				}
				if e.hasWork() {
					return false // deliver the flush first
				}
			}
			// Every flush is delivered; wait for every transfer that touches the pool.
			if err := e.worker.WaitIdle(context.Background()); err != nil {
				if terr := e.transition(pauseEv); terr != nil {
					err = errors.Join(err, terr)
				}
				done(struct{}{}, fmt.Errorf("engine: sleep: waiting for KV transfers: %w", err))
				return true
			}
			// No request may keep blocks whose memory is about to go: whatever still holds
			// some (a connector load that landed while paused) recomputes after the wake-up.
			if n := e.sched.DropAllKV(); n > 0 {
				e.log.Info("engine: sleep: requests holding KV will recompute", "requests", n)
			}
			e.releaseKV()
			if level == 2 {
				// Every weight set the engine serves or retired goes. A staged set stays: it
				// is what the caller asked to serve next. Level 1 keeps the weights, the
				// retired spare included, so the update that follows packs into touched
				// memory (the RL cycle sleeps before every update).
				e.model, e.weights = nil, nil
				e.spare.Store(nil)
			}
			done(struct{}{}, e.transition(pauseEv, ctlEvent{kind: evSleep, level: level}))
			return true
		}
		// No abandon: the sleep takes effect at its end, and its pause already acted.
		e.whenIdle(task, func(err error) { done(struct{}{}, err) }, nil)
	})
	return err
}

// releaseKV drops the KV pool's memory. Every request must have given its blocks up first
// (Scheduler.DropAllKV); a block still owned here would resume on the zeroed pool a wake-up
// allocates, so it is counted as an invariant violation, and the prefix cache is cleared so no
// lookup can reach the old content either. The caller records the release in the control
// state.
func (e *Engine) releaseKV() {
	if e.ctl.KVReleased {
		return
	}
	if used := e.usedBlocks(); used > 0 {
		e.metrics.violations.Add(1)
		e.log.Error("engine: invariant violation: KV pool released while requests own blocks", "blocks", used)
	}
	e.blocks.Reset(true)
	if b, ok := e.worker.(kvconnector.StorageBinder); ok {
		b.ReleaseKVStorage()
	}
	// The memory goes back to the OS now; the allocation is kept for the wake-up, which then
	// faults the same range back in rather than a new one. A new allocation waited on the
	// garbage collector for the old pool's memory: when it had not run, the wake-up faulted in
	// fresh 4 KB pages (about 1.8 s a GiB on a KVM guest), and that was most of the weight
	// update's bubble one update in three or four.
	if e.kv != nil && e.kv.Release() {
		e.kvReleased = e.kv
	}
	e.kv = nil
	e.metrics.kvReleased.Store(true)
}

// WakeUp restores the tags asked for (nil: all). Waking the weights after a level-2 sleep needs
// weights committed while asleep, else ErrNoWeights. Once nothing sleeps, the engine resumes if
// the sleep paused it; a pause that was there before the sleep stays until Resume.
func (e *Engine) WakeUp(ctx context.Context, tags []string) error {
	for _, t := range tags {
		if t != TagWeights && t != TagKVCache {
			return fmt.Errorf("%w: wake-up tag %q: want %s or %s", ErrInvalidArgument, t, TagWeights, TagKVCache)
		}
	}
	if len(tags) == 0 {
		tags = []string{TagWeights, TagKVCache}
	}
	_, err := controlCall(ctx, e, "wake_up", func(_ context.Context, done func(struct{}, error)) {
		e.wakeUp(tags, done)
	})
	return err
}

// wakeUp is WakeUp's effect, on the engine goroutine.
func (e *Engine) wakeUp(tags []string, done func(struct{}, error)) {
	next, err := e.ctl.next(ctlEvent{kind: evWake, wakeWeights: slices.Contains(tags, TagWeights),
		wakeKV: slices.Contains(tags, TagKVCache), haveWeights: e.model != nil})
	if err != nil {
		done(struct{}{}, err)
		return
	}
	if e.ctl.KVReleased && !next.KVReleased {
		if err := e.allocKV(); err != nil {
			done(struct{}{}, err)
			return
		}
	}
	if e.ctl.Phase != ctlRunning && next.Phase == ctlRunning {
		e.sched.SetPauseState(sched.Unpaused)
	}
	e.setCtl(next)
	done(struct{}{}, nil)
}

// setCtl is the one place the control state changes, on the engine goroutine; it keeps
// ctlRunning in step before any caller hears of the change.
func (e *Engine) setCtl(next controlState) {
	e.ctl = next
	e.ctlRunning.Store(next.Phase == ctlRunning)
}

func (e *Engine) allocKV() error {
	m := e.model
	if m == nil {
		return fmt.Errorf("%w: the KV pool's shape comes from the weights; commit weights first", ErrNoWeights)
	}
	var kv *kvcache.Storage
	if r := e.kvReleased; r != nil && r.Layout == m.KVLayout(e.cfg.NumBlocks, e.cfg.BlockSize) {
		kv = r // released: its memory reads as zeros, as a new pool's does
	} else {
		var err error
		if kv, err = kvcacheStorage(m, e.cfg.NumBlocks, e.cfg.BlockSize); err != nil {
			return err
		}
	}
	e.kvReleased = nil
	if e.cfg.PrefaultKV {
		kv.Prefault(e.kpool.Workers())
	}
	if b, ok := e.worker.(kvconnector.StorageBinder); ok {
		if err := b.BindKVStorage(kv); err != nil {
			return fmt.Errorf("engine: connector: %w", err)
		}
	}
	e.kv = kv
	e.metrics.kvReleased.Store(false)
	return nil
}

// ResetPrefixCache resets the engine's prefix cache and, with resetConnector, the connector's
// (the offloaded KV). Without resetRunning it refuses while requests hold blocks, and says so.
func (e *Engine) ResetPrefixCache(ctx context.Context, resetRunning, resetConnector bool) (ResetResult, error) {
	return call(ctx, e, "reset_prefix_cache", func(ctx context.Context, done func(ResetResult, error)) {
		ok, d := e.sched.ResetPrefixCache(ctx, resetRunning, resetConnector)
		done(fromDetail(ok, d), nil)
	})
}

// StageWeights packs w (on the caller's goroutine, while the old weights keep serving) and
// stages it as version. It must have the serving model's shape and a version newer than the
// serving one and not older than a staged one (else ErrStaleVersion); it replaces a staged
// set of an older or the same version (the same version from another checkpoint: the fleet
// names a checkpoint by version and digest, and the caller decides which one it wants).
func (e *Engine) StageWeights(ctx context.Context, w *model.Weights, version int64) error {
	m, err := e.pack(w)
	if err != nil {
		return err
	}
	_, err = controlCall(ctx, e, "update_weights.stage", func(_ context.Context, done func(struct{}, error)) {
		done(struct{}{}, e.stage(m, e.keep(w), version))
	})
	return err
}

// keep returns the float32 set w to keep beside its packed model: w itself at F32, where the
// model shares its embedding and norms and keeping it costs the matrices once more, and nil
// at a lower precision, where the packed model is all the engine holds (docs/precision.md,
// "Memory"): keeping w would cost twice the model's own bytes at bf16.
func (e *Engine) keep(w *model.Weights) *model.Weights {
	if e.cfg.Precision != kernels.F32 {
		return nil
	}
	return w
}

// Precision returns the precision the engine packs every weight set at (Config.Precision).
func (e *Engine) Precision() kernels.Precision { return e.cfg.Precision }

// Builder starts a model of the serving shape at the engine's precision, for a loader to
// fill one tensor at a time (weights.Options.Sink) and StageBuilt to stage: no float32 set of
// the update exists at any point. It packs into the retired spare when there is one (which
// is then the builder's: a failed load drops it, as a failed pack does).
func (e *Engine) Builder() (*model.Builder, error) {
	b, err := model.NewBuilder(e.shape, e.cfg.Precision, e.spare.Swap(nil))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	return b, nil
}

// StageBuilt is StageWeights for a model built by b (Builder) once every tensor is in (else
// ErrInvalidArgument): the engine keeps no float32 set of it, so Weights rebuilds one from
// the model while it serves.
func (e *Engine) StageBuilt(ctx context.Context, b *model.Builder, version int64) error {
	if b == nil {
		return fmt.Errorf("%w: nil builder", ErrInvalidArgument)
	}
	m, err := b.Model(e.kpool)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	if !m.Config.SameShape(e.shape) {
		return fmt.Errorf("%w: built weights have shape %+v, the engine serves %+v", ErrInvalidArgument, m.Config, e.shape)
	}
	_, err = controlCall(ctx, e, "update_weights.stage", func(_ context.Context, done func(struct{}, error)) {
		done(struct{}{}, e.stage(m, nil, version))
	})
	return err
}

// DropStaged discards the staged set when it is version (it becomes the spare the next
// stage packs into) and reports whether it did. A fleet whose desired version is below a
// staged one (staged by an update that then aborted) drops it before staging what it wants:
// StageWeights refuses to go below a staged version.
func (e *Engine) DropStaged(ctx context.Context, version int64) (bool, error) {
	return controlCall(ctx, e, "update_weights.drop", func(_ context.Context, done func(bool, error)) {
		s := e.staged
		if s == nil || s.version != version {
			done(false, nil)
			return
		}
		e.staged = nil
		e.spare.Store(s.model)
		e.metrics.stagedVersion.Store(0)
		done(true, nil)
	})
}

// pack validates w and packs it for the kernels, into the retired set when there is one.
func (e *Engine) pack(w *model.Weights) (*model.Model, error) {
	if w == nil {
		return nil, fmt.Errorf("%w: nil weights", ErrInvalidArgument)
	}
	if !w.Config.SameShape(e.shape) {
		return nil, fmt.Errorf("%w: staged weights have shape %+v, the engine serves %+v", ErrInvalidArgument, w.Config, e.shape)
	}
	// A failed pack leaves the spare half-written: it is dropped, not put back.
	return model.NewAs(w, e.kpool, e.spare.Swap(nil), e.cfg.Precision)
}

// PrepareSpare packs w, a set of the serving shape whose values do not matter (e.g. zeros),
// into a new model and keeps it as the retired spare the next StageWeights packs into, when
// the engine has none and is not asleep; otherwise it is dropped. Packing runs on the
// caller's goroutine alone, not on the kernel pool, so serving keeps its cores. Without it
// the first stage packs into new memory and pays the first-touch page fault of every page
// (on a virtual machine about as long as the load), while every later stage reuses the set
// the commit before retired. It costs one packed model's memory, which the engine holds
// anyway from its first commit on; a level-2 sleep gives it back. The spare shares w's embedding and
// norms but is never run (a pack only takes its matrices), so w is free again once
// PrepareSpare returns.
func (e *Engine) PrepareSpare(ctx context.Context, w *model.Weights) error {
	if w == nil || !w.Config.SameShape(e.shape) {
		return fmt.Errorf("%w: a spare needs weights of the serving shape", ErrInvalidArgument)
	}
	m, err := model.NewAs(w, nil, nil, e.cfg.Precision)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	_, err = controlCall(ctx, e, "prepare_spare", func(_ context.Context, done func(struct{}, error)) {
		if !e.asleep() {
			e.spare.CompareAndSwap(nil, m)
		}
		done(struct{}{}, nil)
	})
	return err
}

// stage makes the packed m the staged set, on the engine goroutine. A refused m becomes the
// spare again.
func (e *Engine) stage(m *model.Model, w *model.Weights, version int64) error {
	switch {
	case version <= e.version:
		e.spare.Store(m)
		return fmt.Errorf("%w: %d <= serving %d", ErrStaleVersion, version, e.version)
	case e.staged != nil && version < e.staged.version:
		e.spare.Store(m)
		return fmt.Errorf("%w: %d < staged %d", ErrStaleVersion, version, e.staged.version)
	}
	if e.staged != nil {
		e.spare.Store(e.staged.model)
	}
	e.staged = &staged{model: m, weights: w, version: version}
	e.metrics.stagedVersion.Store(version)
	return nil
}

// CommitWeights swaps in the staged weights of the given version at a step boundary and
// returns it. It fails with ErrNothingStaged when nothing is staged and with ErrNotStaged when
// the staged set is another version (a newer stage replaced it), so a caller never commits a
// version it did not mean. Requests keep running (use Pause first for a clean cut); their
// later tokens carry the new version, and the new version enters the prefix hashes, so no new
// request reuses old KV.
func (e *Engine) CommitWeights(ctx context.Context, version int64) (int64, error) {
	return controlCall(ctx, e, "update_weights.commit", func(_ context.Context, done func(int64, error)) {
		done(e.commit(version))
	})
}

// commit is CommitWeights' effect, on the engine goroutine.
func (e *Engine) commit(version int64) (int64, error) {
	s := e.staged
	switch {
	case s == nil:
		return 0, fmt.Errorf("%w: cannot commit version %d", ErrNothingStaged, version)
	case s.version != version:
		return 0, fmt.Errorf("%w: version %d requested, %d is staged", ErrNotStaged, version, s.version)
	}
	e.staged = nil
	// At a step boundary no forward uses the retired model any more; but a copy by Weights
	// may be reading it (without a float32 set it copies from the model), and then it must
	// not be packed into: it is dropped instead.
	if e.model != nil && (e.weights != nil || !e.copies.has(e.version)) {
		e.spare.Store(e.model)
	}
	e.model, e.weights, e.version = s.model, s.weights, s.version
	e.sched.SetWeightVersion(s.version)
	e.metrics.weightVersion.Store(s.version)
	e.metrics.stagedVersion.Store(0)
	return s.version, nil
}

// UpdateWeights stages w as version and, unless stageOnly, commits it, in one task of the
// engine loop: concurrent callers never interleave between the stage and the commit. It
// returns the serving version afterwards (version itself unless stageOnly).
func (e *Engine) UpdateWeights(ctx context.Context, w *model.Weights, version int64, stageOnly bool) (int64, error) {
	m, err := e.pack(w)
	if err != nil {
		return 0, err
	}
	return controlCall(ctx, e, "update_weights", func(_ context.Context, done func(int64, error)) {
		if err := e.stage(m, e.keep(w), version); err != nil {
			done(0, err)
			return
		}
		if stageOnly {
			done(e.version, nil)
			return
		}
		done(e.commit(version))
	})
}

// Weights returns a copy of the serving weight set (nil after a level-2 sleep), e.g. for a
// trainer that starts from the served policy. At F32 it is a copy of the set the engine was
// given (rebuilt from the model, exactly, for a set staged by StageBuilt), because the serving model shares memory with it: writes to it would change what is
// served without a version bump and race the forward pass. At a lower precision the engine
// keeps no float32 set, and the copy is rebuilt from the packed model: the effective weights
// (model.Weights.Effective of the set it was given, bit for bit), which are what the engine
// serves, rather than the values before rounding. While the copy runs, VersionsInUse
// reports the set's version, so that a caller recycling retired sets (weights.Recycler) does
// not load into it mid-copy even if a commit retires it meanwhile, and a commit does not
// make the model being copied the spare the next stage packs into. Its context bounds the
// copy's start only: once the engine handed the set over, the copy completes.
func (e *Engine) Weights(ctx context.Context) (*model.Weights, error) {
	type got struct {
		w       *model.Weights
		m       *model.Model
		version int64
	}
	// Not withdrawable once sent: the loop registers the copy before it answers, and a caller
	// that stopped waiting could not unregister it.
	g, err := call(context.WithoutCancel(ctx), e, "weights", func(_ context.Context, done func(got, error)) {
		if e.model != nil {
			e.copies.start(e.version)
		}
		done(got{e.weights, e.model, e.version}, nil)
	})
	if err != nil || g.m == nil {
		return nil, err
	}
	defer e.copies.end(g.version)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if e.beforeCopy != nil {
		e.beforeCopy()
	}
	// The set and the model are immutable once staged (only the caller that passed the set
	// in could write to it), so they are copied on the caller's goroutine, not the engine's.
	if g.w == nil {
		return g.m.Weights(), nil
	}
	return g.w.Clone(), nil
}

// ResidentWeightBytes is the memory the engine's weights hold: the serving, staged and spare
// packed models (model.Model.ResidentBytes) and, at F32, the float32 sets kept beside the
// serving and staged ones, less what those share with their models (the embedding and the
// norms). At bf16 or int8 it is the packed models alone: about half and 1.125/4 of the packed
// f32 model, a quarter and 1.125/8 of what an f32 engine holds for its matrices.
func (e *Engine) ResidentWeightBytes(ctx context.Context) (int64, error) {
	return call(ctx, e, "resident_weight_bytes", func(_ context.Context, done func(int64, error)) {
		n := residentBytes(e.model, e.weights)
		if s := e.staged; s != nil {
			n += residentBytes(s.model, s.weights)
		}
		done(n+residentBytes(e.spare.Load(), nil), nil)
	})
}

// residentBytes is m's resident bytes plus those of w, the set it was packed from when kept,
// that m does not share.
func residentBytes(m *model.Model, w *model.Weights) int64 {
	var n int64
	if m != nil {
		n = m.ResidentBytes()
	}
	if w == nil {
		return n
	}
	for _, t := range w.Tensors() {
		if t.Name != "model.embed_tokens.weight" && !strings.HasSuffix(t.Name, "norm.weight") {
			n += int64(len(*t.Data)) * 4 // the model shares the embedding and the norms
		}
	}
	return n
}

// copyCount counts the copies by Weights in progress, by version.
type copyCount struct {
	mu sync.Mutex
	n  map[int64]int
}

func (c *copyCount) start(v int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[int64]int{}
	}
	c.n[v]++
}

// has reports whether a copy of version v is in progress.
func (c *copyCount) has(v int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[v] > 0
}

func (c *copyCount) end(v int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[v]--; c.n[v] <= 0 {
		delete(c.n, v)
	}
}

// versions appends the versions being copied to vs.
func (c *copyCount) versions(vs []int64) []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	for v := range c.n {
		if !slices.Contains(vs, v) {
			vs = append(vs, v)
		}
	}
	return vs
}
