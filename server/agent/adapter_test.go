package agent_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/internal/enginetest"
	"github.com/rolloutkit/rollout/sdk/protocol"
	"github.com/rolloutkit/rollout/server/agent"
)

// TestEngineAdapterSlept: Slept runs after a successful Sleep with its level (the server gives
// back its kept weight sets there), and not after a failed one.
func TestEngineAdapterSlept(t *testing.T) {
	e, _ := enginetest.Run(t, engine.Config{})
	var levels []int
	a := &agent.EngineAdapter{Engine: e, Slept: func(level int) { levels = append(levels, level) }}
	require.Error(t, a.Sleep(t.Context(), 3, ""))
	require.Error(t, a.Sleep(t.Context(), 1, "sideways"))
	require.NoError(t, a.Sleep(t.Context(), 1, ""))
	assert.Equal(t, []int{1}, levels)
}

// TestEngineAdapterState: the adapter reports the engine's own state through WireState as the
// protocol's constant, so that a heartbeat says "paused" exactly when the engine is paused.
func TestEngineAdapterState(t *testing.T) {
	e, _ := enginetest.Run(t, engine.Config{})
	a := &agent.EngineAdapter{Engine: e}
	assert.Equal(t, protocol.StateRunning, a.State().State)
	_, err := a.Pause(t.Context(), "keep", false)
	require.NoError(t, err)
	assert.Equal(t, protocol.StatePaused, a.State().State)
	require.NoError(t, a.Sleep(t.Context(), 1, ""))
	assert.Equal(t, protocol.StateSleeping, a.State().State)
	require.NoError(t, a.WakeUp(t.Context(), nil))
	assert.Equal(t, protocol.StatePaused, a.State().State, "the pause from before the sleep stands")
}

// TestWireState: every state the engine reports has the protocol constant of the same name,
// and a name the protocol does not know passes through rather than reading as running.
func TestWireState(t *testing.T) {
	for _, s := range []engine.State{engine.StateRunning, engine.StatePaused, engine.StateSleeping} {
		w := agent.WireState(s)
		assert.Equal(t, string(s), string(w))
		assert.Contains(t, []protocol.EngineState{protocol.StateRunning, protocol.StatePaused, protocol.StateSleeping}, w)
	}
	assert.Equal(t, protocol.EngineState("phase(9)"), agent.WireState("phase(9)"))
}
