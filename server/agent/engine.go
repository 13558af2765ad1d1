package agent

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/sdk/protocol"
)

// Engine is what the agent needs of a server's engine: its utility calls, a lock-free
// snapshot, and when it last produced tokens. Every call the agent makes on the engine goes
// through it; EngineAdapter is the one implementation over *engine.Engine, so a change of the
// engine's API is a change in this file only.
type Engine interface {
	Pause(ctx context.Context, mode string, clearCache bool) (ResetResult, error)
	Resume(ctx context.Context) error
	Sleep(ctx context.Context, level int, mode string) error
	WakeUp(ctx context.Context, tags []string) error
	Reset(ctx context.Context, resetRunning, resetExternal bool) (ResetResult, error)
	// Commit swaps in the staged weights, which must be version, and returns the serving
	// version.
	Commit(ctx context.Context, version int64) (int64, error)
	// DropStaged discards the staged set when it is version (reporting whether it did).
	DropStaged(ctx context.Context, version int64) (bool, error)
	// Abort aborts the named requests (empty: all) and returns how many it aborted.
	Abort(ids []string) int
	// State is a snapshot that does not wait for the engine loop (its request counts may lag
	// while the engine is paused); Requests asks the loop.
	State() EngineState
	Requests(ctx context.Context) (running, waiting int, err error)
	// Steps is the clock of the engine's token steps (fed by its OnStep hook).
	Steps() *StepClock
}

// ResetResult is what a cache reset did (engine.ResetResult's facts).
type ResetResult struct {
	Success       bool
	BlocksCleared int
	JobsFlushed   int
	Preempted     int
	Reason        string
}

// EngineState is the engine as the agent's core sees it.
type EngineState struct {
	// State is StateRunning, StatePaused or StateSleeping ("" reads as running).
	State                        protocol.EngineState
	WeightVersion, StagedVersion int64
	// WeightSHA256 and StagedSHA256 are the digests of the checkpoints serving and staged
	// ("" when unknown: what the server loaded at start), filled by the agent, which
	// staged them, not by the engine.
	WeightSHA256, StagedSHA256 string
	Running, Waiting           int
	KVUsage                    float64
	// Holds are the versions the server's peer route serves (filled by the agent, not the
	// engine).
	Holds []int64
}

// EngineAdapter implements Engine over the server's *engine.Engine.
type EngineAdapter struct {
	Engine *engine.Engine
	// AbortRequests maps client-visible request ids to the engine's and aborts them (empty:
	// every request); the server passes its API's Abort. Nil aborts engine ids directly.
	AbortRequests func(ids []string) int
	// Clock is the clock the engine's OnStep hook feeds (StepClock.Hook).
	Clock *StepClock
	// Slept, when set, runs after every successful Sleep with its level; the server passes
	// its API's ReleaseWeightSets, so that a sleep the fleet asks for gives back the weight
	// sets kept for reuse as one through the admin route does.
	Slept func(level int)
}

var _ Engine = (*EngineAdapter)(nil)

// Pause implements Engine.
func (a *EngineAdapter) Pause(ctx context.Context, mode string, clearCache bool) (ResetResult, error) {
	m, err := engine.ParsePauseMode(mode)
	if err != nil {
		return ResetResult{}, err
	}
	r, err := a.Engine.Pause(ctx, m, clearCache)
	return resetResult(r), err
}

// Resume implements Engine.
func (a *EngineAdapter) Resume(ctx context.Context) error { return a.Engine.Resume(ctx) }

// ResumeIfRunning is the engine's Resume answered without its loop, when it can be (see
// engine.Engine.ResumeIfRunning); the agent runs such a resume in its own loop.
func (a *EngineAdapter) ResumeIfRunning() bool { return a.Engine.ResumeIfRunning() }

// Sleep implements Engine; an empty mode is abort.
func (a *EngineAdapter) Sleep(ctx context.Context, level int, mode string) error {
	if mode == "" {
		mode = string(engine.PauseAbort)
	}
	m, err := engine.ParsePauseMode(mode)
	if err != nil {
		return err
	}
	if err := a.Engine.Sleep(ctx, level, m); err != nil {
		return err
	}
	if a.Slept != nil {
		a.Slept(level)
	}
	return nil
}

// WakeUp implements Engine.
func (a *EngineAdapter) WakeUp(ctx context.Context, tags []string) error {
	return a.Engine.WakeUp(ctx, tags)
}

// Reset implements Engine.
func (a *EngineAdapter) Reset(ctx context.Context, resetRunning, resetExternal bool) (ResetResult, error) {
	r, err := a.Engine.ResetPrefixCache(ctx, resetRunning, resetExternal)
	return resetResult(r), err
}

// Commit implements Engine. The engine checks, on its own goroutine, that version is the
// one staged, so a stage that raced in between is never swapped in unasked.
func (a *EngineAdapter) Commit(ctx context.Context, version int64) (int64, error) {
	return a.Engine.CommitWeights(ctx, version)
}

// DropStaged implements Engine.
func (a *EngineAdapter) DropStaged(ctx context.Context, version int64) (bool, error) {
	return a.Engine.DropStaged(ctx, version)
}

// Abort implements Engine.
func (a *EngineAdapter) Abort(ids []string) int {
	if a.AbortRequests != nil {
		return a.AbortRequests(ids)
	}
	a.Engine.Abort(ids...)
	return len(ids)
}

// State implements Engine.
func (a *EngineAdapter) State() EngineState {
	m := a.Engine.Metrics()
	s := EngineState{State: WireState(m.State), WeightVersion: m.WeightVersion, StagedVersion: m.StagedVersion,
		Running: int(m.Running), Waiting: int(m.Waiting)}
	if m.KVTotalBlocks > 0 {
		s.KVUsage = float64(m.KVUsedBlocks) / float64(m.KVTotalBlocks)
	}
	return s
}

// WireState is the engine's state as the fleet protocol names it. It is the one place the
// server converts the engine's own State (the engine imports nothing of the protocol) into a
// protocol.EngineState: the agent's heartbeats and the HTTP API's /state and metrics all go
// through it. A state the protocol does not know passes through as its name.
func WireState(s engine.State) protocol.EngineState {
	switch s {
	case engine.StateRunning:
		return protocol.StateRunning
	case engine.StatePaused:
		return protocol.StatePaused
	case engine.StateSleeping:
		return protocol.StateSleeping
	}
	return protocol.EngineState(s)
}

// Requests implements Engine.
func (a *EngineAdapter) Requests(ctx context.Context) (running, waiting int, err error) {
	st, err := a.Engine.Stats(ctx)
	return st.Running, st.Waiting, err
}

// Steps implements Engine.
func (a *EngineAdapter) Steps() *StepClock { return a.Clock }

func resetResult(r engine.ResetResult) ResetResult {
	return ResetResult{Success: r.Success, BlocksCleared: r.BlocksCleared, JobsFlushed: r.JobsFlushed, Preempted: r.Preempted, Reason: r.Reason}
}

// StepClock records when the engine finishes steps that computed tokens, from the engine's
// OnStep hook, so a commit's ack can bound the generation bubble: the last token step before
// the pause (Last) and the first one after the resume (Arm, then First).
type StepClock struct {
	now   func() time.Time
	last  atomic.Int64 // Unix ns of the last token step
	first atomic.Int64 // Unix ns of the first token step after Arm (0: none yet)
	armed atomic.Bool

	nwait   atomic.Int32
	mu      sync.Mutex
	waiters []chan struct{}
}

// NewStepClock returns a clock reading now (nil: time.Now).
func NewStepClock(now func() time.Time) *StepClock {
	if now == nil {
		now = time.Now
	}
	return &StepClock{now: now}
}

// Hook returns an OnStep hook that records token steps and then calls next (may be nil).
// It runs on the engine goroutine and costs an atomic store per step unless someone waits.
func (c *StepClock) Hook(next func(tokens int)) func(tokens int) {
	return func(tokens int) {
		if tokens > 0 {
			c.step()
		}
		if next != nil {
			next(tokens)
		}
	}
}

func (c *StepClock) step() {
	t := c.now().UnixNano()
	c.last.Store(t)
	if c.armed.Load() && c.first.CompareAndSwap(0, t) {
		c.armed.Store(false)
	}
	if c.nwait.Load() == 0 {
		return
	}
	c.mu.Lock()
	for _, w := range c.waiters {
		close(w)
	}
	c.waiters = nil
	c.nwait.Store(0)
	c.mu.Unlock()
}

// Last is the time of the last token step (zero: none yet).
func (c *StepClock) Last() time.Time { return unixNano(c.last.Load()) }

// Arm starts watching for the next token step; First reports it.
func (c *StepClock) Arm() {
	c.first.Store(0)
	c.armed.Store(true)
}

// First returns the time of the first token step since Arm, waiting for it until ctx ends.
func (c *StepClock) First(ctx context.Context) (time.Time, error) {
	for {
		if ns := c.first.Load(); ns != 0 {
			return unixNano(ns), nil
		}
		c.mu.Lock()
		w := make(chan struct{})
		c.waiters = append(c.waiters, w)
		c.nwait.Add(1)
		// Re-read after registering: a step that stored before nwait was raised did not
		// wake us, but what it stored is visible now.
		if ns := c.first.Load(); ns != 0 {
			c.mu.Unlock()
			return unixNano(ns), nil
		}
		c.mu.Unlock()
		select {
		case <-w:
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
	}
}

func unixNano(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}
