package server_test

import (
	"encoding/json"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/server"
)

// gate holds the engine loop inside a forward pass, so that a test can queue an admin call
// while a request is known to be mid-generation: nothing steps, so nothing finishes, until the
// call waits in the engine's input and the gate lets the loop go on. The loop takes queued
// calls at the step boundary right after, so "the request was running when the call landed"
// holds however the OS schedules the test, with any model speed or race-detector slowdown.
type gate struct {
	eng atomic.Pointer[engine.Engine]

	mu      sync.Mutex
	cond    func(engine.MetricsSnapshot) bool // nil: disarmed
	held    chan struct{}
	release chan struct{}
	once    *sync.Once
}

// longTokens is the length of requests a test catches in flight with a gate: long enough to
// span a weight swap, short enough for a pause(wait) to wait out under the race detector.
const longTokens = 64

// startGated starts a test server whose engine runs every forward through a gate.
func startGated(t *testing.T, mut func(*server.Config)) (*testServer, *gate) {
	t.Helper()
	g := &gate{}
	ts := start(t, func(c *server.Config) {
		c.BeforeForward = g.hook
		if mut != nil {
			mut(c)
		}
	})
	g.eng.Store(ts.Engine())
	<-ts.API().SpareReady() // its engine call would count as a queued call
	// Registered after start's cleanup, so it runs first: a failed test never leaves the loop
	// held while the server shuts down.
	t.Cleanup(g.open)
	return ts, g
}

func (g *gate) hook(uint64) error {
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

// holdWhen arms the gate: the first forward pass that starts while cond holds (of the metrics
// the step before left) blocks until the test lets it go.
func (g *gate) holdWhen(cond func(engine.MetricsSnapshot) bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.openLocked()
	g.cond, g.held, g.release, g.once = cond, make(chan struct{}), make(chan struct{}), &sync.Once{}
}

// holdAfterTokens arms the gate to hold once the engine made more than n tokens in all.
func (g *gate) holdAfterTokens(n int64) {
	g.holdWhen(func(m engine.MetricsSnapshot) bool { return m.GenerationTokens > n })
}

// tokens is the engine's generation token count so far.
func (g *gate) tokens() int64 { return g.eng.Load().Metrics().GenerationTokens }

// waitHeld blocks until the loop is held.
func (g *gate) waitHeld(t *testing.T) {
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

// waitUntil blocks, with the loop held, until cond holds of the engine's live metrics (a
// request's Add queued or taken, say).
func (g *gate) waitUntil(t *testing.T, what string, cond func(engine.MetricsSnapshot) bool) {
	t.Helper()
	g.waitHeld(t)
	deadline := time.Now().Add(30 * time.Second)
	for !cond(g.eng.Load().Metrics()) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; engine %+v", what, g.eng.Load().Metrics())
		}
		runtime.Gosched()
	}
}

// open lets a held loop go on (idempotent; a no-op when nothing is armed).
func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.openLocked()
}

func (g *gate) openLocked() {
	if g.once != nil {
		g.once.Do(func() { close(g.release) })
	}
}

// callHeld sends an admin call while the loop is held, lets the loop go on once the call
// waits in the engine's input, and checks the answer's status; v (if not nil) receives the
// JSON body.
func (ts *testServer) callHeld(t *testing.T, g *gate, method, path string, body any, want int, v any) {
	t.Helper()
	g.waitHeld(t)
	type reply struct {
		code int
		out  []byte
		err  error
	}
	done := make(chan reply, 1)
	go func() {
		code, out, err := ts.tryDo(method, path, body)
		done <- reply{code, out, err}
	}()
	var r reply
	answered := false
	for !answered && g.eng.Load().Metrics().InputQueued == 0 { // no deadline: the client's timeout is one
		select {
		case r = <-done: // answered without waiting for the loop (an abort, an error)
			answered = true
		default:
			runtime.Gosched()
		}
	}
	g.open()
	if !answered {
		r = <-done
	}
	require.NoError(t, r.err)
	require.Equal(t, want, r.code, "%s %s: %s", method, path, r.out)
	if v != nil {
		require.NoError(t, json.Unmarshal(r.out, v), "%s", r.out)
	}
}
