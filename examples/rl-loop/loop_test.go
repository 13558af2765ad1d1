package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/internal/fleettest"
	"github.com/rolloutkit/rollout/trainer"
)

// TestMain checks for leaked goroutines after the tests, and removes the rollout binary the
// multi-process test builds.
func TestMain(m *testing.M) {
	code := fleettest.Main(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func testConfig(t *testing.T) config {
	cfg, err := parseFlags([]string{"--steps", "3", "--prompts", "2", "--group", "4", "--max-tokens", "6",
		"--out", t.TempDir(), "--log-level", "error"})
	require.NoError(t, err)
	return cfg
}

func devNull(t *testing.T) *os.File {
	f, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	return f
}

// TestLoopEmbedded runs the whole loop on an embedded two-server fleet: every step commits a
// weight update, every token carries a version the trainer accepts, no server reports a
// safety violation, and the outputs exist. A second run resumes from the checkpoint.
func TestLoopEmbedded(t *testing.T) {
	cfg := testConfig(t)
	sum, err := run(t.Context(), cfg, devNull(t))
	require.NoError(t, err)
	require.Len(t, sum.Records, 3)
	require.Equal(t, 3, sum.Updates)
	require.Zero(t, sum.Violations)
	for i, r := range sum.Records {
		require.Equal(t, i+1, r.Step)
		require.Equal(t, int64(i+1), r.Version)
		require.LessOrEqual(t, r.MaxVersion, int64(i), "tokens of step %d come from versions before its update", r.Step)
		require.Less(t, r.Mismatch, 1e-4, "trainer and servers share their arithmetic")
	}
	for _, p := range []string{sum.PlotPath, sum.LogPath, filepath.Join(cfg.Out, "checkpoint")} {
		_, err := os.Stat(p)
		require.NoError(t, err, p)
	}

	cfg.Resume, cfg.Steps = true, 1
	sum, err = run(t.Context(), cfg, devNull(t))
	require.NoError(t, err)
	require.Len(t, sum.Records, 1)
	require.Equal(t, 4, sum.Records[0].Step, "resumed after the third step")
	require.Equal(t, int64(4), sum.Records[0].Version)
}

// TestBadConfig: what the loop cannot use is refused before anything starts.
func TestBadConfig(t *testing.T) {
	for name, mut := range map[string]func(*config){
		"group of one":     func(c *config) { c.Group = 1 },
		"no prompts":       func(c *config) { c.Prompts = 0 },
		"no tokens":        func(c *config) { c.MaxTokens = 0 },
		"no steps":         func(c *config) { c.Steps = 0 },
		"unknown policy":   func(c *config) { c.Policy = "most" },
		"redis, no fleet":  func(c *config) { c.Redis = "redis://127.0.0.1:1" },
		"zero lr":          func(c *config) { c.LR = 0 },
		"unknown model":    func(c *config) { c.Model = "builtin:nope" },
		"no servers":       func(c *config) { c.Servers = 0 },
		"no out directory": func(c *config) { c.Out = "" },
	} {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig(t)
			mut(&cfg)
			_, err := run(t.Context(), cfg, devNull(t))
			require.Error(t, err)
		})
	}
	_, err := parseFlags([]string{"--steps", "x"})
	require.Error(t, err)
	_, err = parseFlags([]string{"extra"})
	require.Error(t, err)
}

// TestResumeOtherShape: a checkpoint of another model is a clear error at start.
func TestResumeOtherShape(t *testing.T) {
	cfg := testConfig(t)
	w, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	w.Config.NumHiddenLayers = 1
	w.Layers = w.Layers[:1]
	tr, err := trainer.New(w, trainer.Config{})
	require.NoError(t, err)
	require.NoError(t, tr.Save(filepath.Join(cfg.Out, "checkpoint")))
	tr.Close()
	cfg.Resume = true
	_, err = run(t.Context(), cfg, devNull(t))
	require.ErrorIs(t, err, trainer.ErrShapeMismatch)
}
