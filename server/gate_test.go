package server_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/internal/enginetest"
	"github.com/rolloutkit/rollout/server"
)

// gate is enginetest.Gate: it holds the engine loop inside a forward pass while a test queues
// an admin call.
type gate = enginetest.Gate

// longTokens is the length of requests a test catches in flight with a gate: long enough to
// span a weight swap, short enough for a pause(wait) to wait out under the race detector.
const longTokens = 64

// startGated starts a test server whose engine runs every forward through a gate.
func startGated(t *testing.T, mut func(*server.Config)) (*testServer, *gate) {
	t.Helper()
	g := &gate{}
	ts := start(t, func(c *server.Config) {
		c.BeforeForward = g.Hook
		if mut != nil {
			mut(c)
		}
	})
	g.Bind(ts.Engine())
	<-ts.API().SpareReady() // its engine call would count as a queued call
	// Registered after start's cleanup, so it runs first: a failed test never leaves the loop
	// held while the server shuts down.
	t.Cleanup(g.Open)
	return ts, g
}

// callHeld sends an admin call while the loop is held, lets the loop go on once the call
// waits in the engine's input, and checks the answer's status; v (if not nil) receives the
// JSON body.
func (ts *testServer) callHeld(t *testing.T, g *gate, method, path string, body any, want int, v any) {
	t.Helper()
	var (
		code int
		out  []byte
	)
	require.NoError(t, g.CallHeld(t, func() (err error) {
		code, out, err = ts.tryDo(method, path, body)
		return err
	}))
	require.Equal(t, want, code, "%s %s: %s", method, path, out)
	if v != nil {
		require.NoError(t, json.Unmarshal(out, v), "%s", out)
	}
}
