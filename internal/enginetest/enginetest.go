package enginetest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/model"
)

// Run starts an engine with cfg and runs its loop until the test ends. With cfg.Weights nil it
// serves the tiny preset's seed-1 weights, and with cfg.NumBlocks zero a 64-block pool. It
// returns the engine and the weights it started with.
func Run(t testing.TB, cfg engine.Config) (*engine.Engine, *model.Weights) {
	t.Helper()
	if cfg.Weights == nil {
		w, err := model.Preset("tiny", 1)
		require.NoError(t, err)
		cfg.Weights = w
	}
	if cfg.NumBlocks == 0 && cfg.KVBytes == 0 {
		cfg.NumBlocks = 64
	}
	e, err := engine.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return e, cfg.Weights
}
