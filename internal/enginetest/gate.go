package enginetest

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rolloutkit/rollout/engine"
)

// Gate holds an engine's loop inside a forward pass, so that a test can queue a call while a
// request is known to be mid-generation: nothing steps, so nothing finishes, until the call
// waits in the engine's input and the gate lets the loop go on. The loop takes queued calls at
// the step boundary right after, so "the request was running when the call landed" holds
// however the OS schedules the test, with any model speed or race-detector slowdown.
//
// Install Hook as the engine's BeforeForward (engine.Hooks or server.Config), Bind the engine,
// then arm the gate with HoldWhen for each hold.
type Gate struct {
	eng atomic.Pointer[engine.Engine]

	mu      sync.Mutex
	cond    func(engine.MetricsSnapshot) bool // nil: disarmed
	held    chan struct{}
	release chan struct{}
	once    *sync.Once
}

// Bind names the engine whose metrics the gate's conditions read.
func (g *Gate) Bind(e *engine.Engine) { g.eng.Store(e) }

// Engine is the bound engine.
func (g *Gate) Engine() *engine.Engine { return g.eng.Load() }

// Hook is the BeforeForward hook: it blocks the first forward pass that starts while the armed
// condition holds (of the metrics the step before left) until the test lets it go.
func (g *Gate) Hook(uint64) error {
	g.mu.Lock()
	cond, held, release := g.cond, g.held, g.release
	e := g.eng.Load()
	if cond == nil || e == nil || !cond(e.Metrics()) {
		g.mu.Unlock()
		return nil
	}
	g.cond = nil
	g.mu.Unlock()
	close(held)
	<-release
	return nil
}

// HoldWhen arms the gate (letting go of any earlier hold): the first forward pass that starts
// while cond holds blocks until Open.
func (g *Gate) HoldWhen(cond func(engine.MetricsSnapshot) bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.openLocked()
	g.cond, g.held, g.release, g.once = cond, make(chan struct{}), make(chan struct{}), &sync.Once{}
}

// HoldAfterTokens arms the gate to hold once the engine made more than n tokens in all.
func (g *Gate) HoldAfterTokens(n int64) {
	g.HoldWhen(func(m engine.MetricsSnapshot) bool { return m.GenerationTokens > n })
}

// Tokens is the engine's generation token count so far.
func (g *Gate) Tokens() int64 { return g.eng.Load().Metrics().GenerationTokens }

// WaitHeld blocks until the loop is held.
func (g *Gate) WaitHeld(t testing.TB) {
	t.Helper()
	g.mu.Lock()
	held := g.held
	g.mu.Unlock()
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatalf("the engine never reached the gate; engine %+v", g.eng.Load().Metrics())
	}
}

// WaitUntil blocks, with the loop held, until cond holds of the engine's live metrics (a
// request's Add queued or taken, say).
func (g *Gate) WaitUntil(t testing.TB, what string, cond func(engine.MetricsSnapshot) bool) {
	t.Helper()
	g.WaitHeld(t)
	deadline := time.Now().Add(30 * time.Second)
	for !cond(g.eng.Load().Metrics()) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; engine %+v", what, g.eng.Load().Metrics())
		}
		runtime.Gosched()
	}
}

// CallHeld runs call on its own goroutine while the loop is held, lets the loop go on once
// call's message waits in the engine's input (or call has returned without reaching the loop:
// an error), and returns call's error. There is no deadline: call's own timeout is one.
func (g *Gate) CallHeld(t testing.TB, call func() error) error {
	t.Helper()
	g.WaitHeld(t)
	done := make(chan error, 1)
	go func() { done <- call() }()
	for g.eng.Load().Metrics().InputQueued == 0 {
		select {
		case err := <-done:
			g.Open()
			return err
		default:
			runtime.Gosched()
		}
	}
	g.Open()
	return <-done
}

// Open lets a held loop go on (idempotent; a no-op when nothing is armed).
func (g *Gate) Open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.openLocked()
}

func (g *Gate) openLocked() {
	if g.once != nil {
		g.once.Do(func() { close(g.release) })
	}
}
