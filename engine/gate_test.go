package engine

import (
	"runtime"
	"sync/atomic"
	"testing"
)

// forwardGate holds the engine loop inside one forward pass, so that a test can queue a call
// while its requests are mid-generation, however fast the machine steps: a request that only
// has "many" tokens left can otherwise finish before the test's next call reaches the loop (a
// loaded CI machine ran 1,000 tiny-model steps in that gap).
type forwardGate struct {
	at            int64 // the forward pass to hold, counting from 1
	forwards      atomic.Int64
	held, release chan struct{}
}

// newForwardGate holds the at-th forward pass; install it with testEngine(t, g.install). An Add
// waits for the loop, so every request the test adds before the hold must be added before that
// pass (or while the engine is paused).
func newForwardGate(at int) *forwardGate {
	return &forwardGate{at: int64(at), held: make(chan struct{}), release: make(chan struct{})}
}

func (g *forwardGate) install(c *Config) {
	c.Hooks.BeforeForward = func(uint64) error {
		if g.forwards.Add(1) == g.at {
			close(g.held)
			<-g.release
		}
		return nil
	}
}

// during waits until the loop is held, runs call on its own goroutine, lets the loop go once
// the engine has queued call's message (or call has returned without reaching the loop: an
// error), and returns what call returned. The held step completes before the engine takes the
// call; nothing later runs before it. (internal/enginetest.Gate is the same for the tests
// outside this package, which this one cannot import.)
func (g *forwardGate) during(t *testing.T, e *Engine, call func() error) error {
	t.Helper()
	<-g.held
	queued := e.Metrics().InputQueued
	done := make(chan error, 1)
	go func() { done <- call() }()
	for e.Metrics().InputQueued == queued {
		select {
		case err := <-done:
			close(g.release)
			return err
		default:
			runtime.Gosched()
		}
	}
	close(g.release)
	return <-done
}
