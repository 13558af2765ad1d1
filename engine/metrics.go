package engine

import (
	"context"
	"fmt"
	"sync/atomic"
)

// Metrics are the engine's counters and gauges, readable at any time without waiting for the
// engine goroutine (a scrape never queues behind a long step).
type Metrics struct {
	alive         atomic.Bool
	kvReleased    atomic.Bool
	weightVersion atomic.Int64
	stagedVersion atomic.Int64
	steps         atomic.Int64
	drainSteps    atomic.Int64
	promptTokens  atomic.Int64
	genTokens     atomic.Int64
	finishedStop  atomic.Int64
	finishedLen   atomic.Int64
	finishedAbort atomic.Int64
	running       atomic.Int64
	waiting       atomic.Int64
	kvUsedBlocks  atomic.Int64
	kvTotalBlocks atomic.Int64
	prefixQueries atomic.Int64
	prefixHits    atomic.Int64
	violations    atomic.Int64
	stepErrors    atomic.Int64
	state         atomic.Value // State
}

func (m *Metrics) finished(r FinishReason) {
	switch r {
	case FinishStop:
		m.finishedStop.Add(1)
	case FinishLength:
		m.finishedLen.Add(1)
	default:
		m.finishedAbort.Add(1)
	}
}

// snapshot refreshes the gauges from the loop's state; called by the engine goroutine.
func (m *Metrics) snapshot(e *Engine) {
	m.running.Store(int64(e.sched.NumRunning()))
	m.waiting.Store(int64(e.sched.NumWaiting()))
	m.kvUsedBlocks.Store(int64(e.usedBlocks()))
	m.kvTotalBlocks.Store(int64(e.blocks.NumBlocks() - 1))
	ps := e.blocks.Stats()
	m.prefixQueries.Store(ps.PrefixQueries)
	m.prefixHits.Store(ps.PrefixHits)
	m.state.Store(e.ctl.Phase.State())
}

// MetricsSnapshot is a consistent-enough copy of the counters for exporters.
type MetricsSnapshot struct {
	Alive         bool
	State         State
	WeightVersion int64
	StagedVersion int64
	Steps         int64
	// DrainSteps counts the steps run while a pause or sleep waited for the engine to drain
	// (running requests to finish, transfers to land, a reset's flush to be delivered): the
	// steps a caller of Pause or Sleep actually waited for, however late it was scheduled.
	DrainSteps       int64
	PromptTokens     int64
	GenerationTokens int64
	FinishedStop     int64
	FinishedLength   int64
	FinishedAbort    int64
	Running, Waiting int64
	KVUsedBlocks     int64
	KVTotalBlocks    int64
	PrefixQueries    int64
	PrefixHits       int64
	KVReleased       bool
	// InvariantViolations counts broken engine invariants detected in production paths (a KV
	// pool released while a request owned blocks); it must stay 0.
	InvariantViolations int64
	// StepErrors counts steps whose execution failed (their requests were aborted).
	StepErrors int64
	// InputQueued is the number of messages (adds, aborts, utility calls) waiting for the
	// engine loop right now.
	InputQueued int
}

// Metrics returns the current counters without a round trip through the engine loop.
func (e *Engine) Metrics() MetricsSnapshot {
	m := &e.metrics
	st, _ := m.state.Load().(State)
	if st == "" {
		st = StateRunning // no step yet: a new engine runs
	}
	return MetricsSnapshot{
		Alive: m.alive.Load(), State: st, WeightVersion: m.weightVersion.Load(), StagedVersion: m.stagedVersion.Load(),
		Steps: m.steps.Load(), DrainSteps: m.drainSteps.Load(), PromptTokens: m.promptTokens.Load(), GenerationTokens: m.genTokens.Load(),
		FinishedStop: m.finishedStop.Load(), FinishedLength: m.finishedLen.Load(), FinishedAbort: m.finishedAbort.Load(),
		Running: m.running.Load(), Waiting: m.waiting.Load(), KVUsedBlocks: m.kvUsedBlocks.Load(),
		KVTotalBlocks: m.kvTotalBlocks.Load(), PrefixQueries: m.prefixQueries.Load(), PrefixHits: m.prefixHits.Load(),
		KVReleased: m.kvReleased.Load(), InvariantViolations: m.violations.Load(), StepErrors: m.stepErrors.Load(), InputQueued: len(e.in),
	}
}

// Stats is the engine state as the loop sees it, between steps.
type Stats struct {
	State         State  `json:"state"`
	WeightVersion int64  `json:"weight_version"`
	StagedVersion int64  `json:"staged_version,omitempty"`
	Paused        bool   `json:"paused"`
	PauseMode     string `json:"pause_mode,omitempty"`
	SleepLevel    int    `json:"sleep_level"`
	Running       int    `json:"requests_running"`
	Waiting       int    `json:"requests_waiting"`
	KVBlocksUsed  int    `json:"kv_blocks_used"`
	KVBlocksTotal int    `json:"kv_blocks_total"`
	KVReleased    bool   `json:"kv_released"`
	Steps         int64  `json:"steps"`
	// InvariantViolations is Metrics().InvariantViolations (0 unless something is broken).
	InvariantViolations int64 `json:"invariant_violations"`
	// Connector reports the connector's own state (offload jobs in flight, flush pending, …).
	Connector map[string]float64 `json:"connector,omitempty"`
}

// Stats returns the engine state as the loop sees it between steps. It is cheap (the /state
// route calls it); CheckInvariants also verifies the scheduler's and the pool's consistency.
func (e *Engine) Stats(ctx context.Context) (Stats, error) {
	return call(ctx, e, "stats", func(_ context.Context, done func(Stats, error)) { done(e.stats(), nil) })
}

// CheckInvariants returns Stats and walks the scheduler's queues and the whole block pool to
// verify their consistency, reporting a violation as an error. The walk is linear in the pool
// size and runs on the engine goroutine: for tests and debugging, not for routes.
func (e *Engine) CheckInvariants(ctx context.Context) (Stats, error) {
	return call(ctx, e, "check_invariants", func(_ context.Context, done func(Stats, error)) {
		s := e.stats()
		err := e.sched.CheckInvariants()
		if err == nil {
			err = e.blocks.CheckInvariants()
		}
		if err == nil && s.KVReleased && s.KVBlocksUsed > 0 {
			err = fmt.Errorf("engine: %d blocks owned with the KV pool released", s.KVBlocksUsed)
		}
		if n := e.metrics.violations.Load(); err == nil && n > 0 {
			err = fmt.Errorf("engine: %d invariant violations counted", n)
		}
		done(s, err)
	})
}

func (e *Engine) stats() Stats {
	s := Stats{State: e.ctl.Phase.State(), WeightVersion: e.version, Paused: e.ctl.Phase != ctlRunning, PauseMode: string(e.ctl.Mode),
		SleepLevel: e.ctl.Level, Running: e.sched.NumRunning(), Waiting: e.sched.NumWaiting(),
		KVBlocksUsed: e.usedBlocks(), KVBlocksTotal: e.blocks.NumBlocks() - 1, KVReleased: e.ctl.KVReleased,
		Steps: e.metrics.steps.Load(), InvariantViolations: e.metrics.violations.Load(), Connector: e.conn.Stats()}
	if e.staged != nil {
		s.StagedVersion = e.staged.version
	}
	return s
}

// Version returns the serving weight version.
func (e *Engine) Version() int64 { return e.metrics.weightVersion.Load() }

// StagedVersion returns the version of the staged weight set, 0 when none is staged.
func (e *Engine) StagedVersion() int64 { return e.metrics.stagedVersion.Load() }

// VersionsInUse returns the versions of the weight sets (the *model.Weights passed to
// StageWeights, UpdateWeights or Config.Weights) the engine may still read: the staged one
// and the serving one. A set staged with any other version is no longer read by the engine,
// and never will be again, since versions only grow: a caller that owns it may overwrite it
// (weights.Options.Reuse). The model packed from it may still be the engine's retired spare,
// which shares its embedding and norms but is never run (it is only packed into). The staged
// version is read first: a commit moves a version from staged to serving, so reading in
// this order cannot miss a set on its way between the two. The versions Weights is copying
// count too, read last: Weights registers its copy on the engine goroutine while the set still
// serves, so a commit that retires it comes after, and a reader that misses the registration
// read the serving version before that commit.
// At a precision below F32 the engine keeps no set once packed (Engine.Weights), so the
// versions it reports only matter to a caller that reuses its sets at F32.
func (e *Engine) VersionsInUse() []int64 {
	staged := e.StagedVersion()
	serving := e.Version()
	vs := []int64{staged, serving}
	if staged == 0 && serving >= 0 {
		// 0 means none: a staged version is newer than the serving one, so a real 0 was
		// staged below 0 and, if committed since, is the serving version now.
		vs = vs[1:]
	}
	return e.copies.versions(vs)
}

// usedBlocks counts blocks owned by requests (free blocks that only hold cached KV are free).
func (e *Engine) usedBlocks() int { return e.blocks.NumBlocks() - 1 - e.blocks.NumFreeBlocks() }
