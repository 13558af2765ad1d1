package enginetest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/weights"
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

// Checkpoint writes the tiny preset's weights of seed as an F32 Hugging Face directory and
// returns its file:// URI, its digest and the weights.
func Checkpoint(t testing.TB, seed uint64) (uri, digest string, w *model.Weights) {
	t.Helper()
	w, err := model.Preset("tiny", seed)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, weights.SaveHF(dir, w, weights.F32))
	digest, err = weights.Digest(context.Background(), dir)
	require.NoError(t, err)
	return "file://" + dir, digest, w
}
