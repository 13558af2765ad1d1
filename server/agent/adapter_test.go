package agent_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/server/agent"
)

// TestEngineAdapterSlept: Slept runs after a successful Sleep with its level (the server gives
// back its kept weight sets there), and not after a failed one.
func TestEngineAdapterSlept(t *testing.T) {
	w, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	e, err := engine.New(engine.Config{Weights: w, NumBlocks: 64})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() { cancel(); <-done }()
	var levels []int
	a := &agent.EngineAdapter{Engine: e, Slept: func(level int) { levels = append(levels, level) }}
	require.Error(t, a.Sleep(t.Context(), 3, ""))
	require.Error(t, a.Sleep(t.Context(), 1, "sideways"))
	require.NoError(t, a.Sleep(t.Context(), 1, ""))
	assert.Equal(t, []int{1}, levels)
}
