package agent_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/internal/enginetest"
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
