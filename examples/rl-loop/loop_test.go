package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/load"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/sample"
	"github.com/rolloutkit/rollout/internal/fleettest"
	"github.com/rolloutkit/rollout/trainer"
)

// TestMain checks for leaked goroutines after the tests, and removes the rollout binary the
// multi-process test builds.
func TestMain(m *testing.M) {
	os.Exit(fleettest.Main(m))
}

func testConfig(t *testing.T) config {
	cfg, err := parseFlags([]string{"--steps", "3", "--prompts", "2", "--group", "4", "--max-tokens", "6",
		"--warmup-steps", "0", "--pass-k", "2", "--out", t.TempDir(), "--log-level", "error"})
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
	for _, p := range []string{sum.PlotPath, sum.LogPath, sum.EvalPath, filepath.Join(cfg.Out, "checkpoint")} {
		_, err := os.Stat(p)
		require.NoError(t, err, p)
	}
	checkEvalReproduces(t, sum)
	checkLogFields(t, sum.LogPath)

	cfg.Resume, cfg.Steps = true, 1
	sum, err = run(t.Context(), cfg, devNull(t))
	require.NoError(t, err)
	require.Len(t, sum.Records, 1)
	require.Equal(t, 4, sum.Records[0].Step, "resumed after the third step")
	require.Equal(t, int64(4), sum.Records[0].Version)
}

// TestLoopLowPrecision runs the loop with int8 servers publishing bfloat16 checkpoints: every
// update lands, and the logprob mismatch and its KL (over on-policy tokens, hence --sync) are
// those of a rollout policy that differs from the trainer's float32 one, small but not zero.
func TestLoopLowPrecision(t *testing.T) {
	cfg, err := parseFlags([]string{"--steps", "2", "--prompts", "2", "--group", "4", "--max-tokens", "6",
		"--warmup-steps", "0", "--pass-k", "0", "--out", t.TempDir(), "--log-level", "error",
		"--precision", "int8", "--publish-dtype", "BF16", "--sync"})
	require.NoError(t, err)
	sum, err := run(t.Context(), cfg, devNull(t))
	require.NoError(t, err)
	require.Len(t, sum.Records, 2)
	require.Equal(t, 2, sum.Updates)
	require.Zero(t, sum.Violations)
	for _, r := range sum.Records {
		require.Greater(t, r.Mismatch, 1e-4, "step %d: int8 rollouts are another policy", r.Step)
		require.Positive(t, r.MismatchKL, "step %d", r.Step)
		require.Less(t, r.MismatchKL, 0.05, "step %d: a small gap", r.Step)
	}
	_, err = parseFlags([]string{"--precision", "fp4"})
	require.ErrorContains(t, err, "--precision")
	_, err = parseFlags([]string{"--publish-dtype", "int8"})
	require.ErrorContains(t, err, "--publish-dtype")
}

// TestBadConfig: what the loop cannot use is refused before anything starts.
func TestBadConfig(t *testing.T) {
	for name, mut := range map[string]func(*config){
		"group of one":     func(c *config) { c.Group = 1 },
		"no prompts":       func(c *config) { c.Prompts = 0 },
		"negative tokens":  func(c *config) { c.MaxTokens = -1 },
		"greedy rollouts":  func(c *config) { c.Temperature = 0 },
		"unknown task":     func(c *config) { c.Task = "poetry" },
		"no steps":         func(c *config) { c.Steps = 0 },
		"unknown policy":   func(c *config) { c.Policy = "most" },
		"redis, no fleet":  func(c *config) { c.Redis.URL = "redis://127.0.0.1:1" },
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

// checkEvalReproduces: eval.jsonl holds one object per held-out prompt with the fields the
// claim rests on, and greedy generation on the final checkpoint, as `rollout generate --model`
// runs it (load.Open, the engine, temperature 0), reproduces every completion.
func checkEvalReproduces(t *testing.T, sum *summary) {
	t.Helper()
	b, err := os.ReadFile(sum.EvalPath)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	require.Len(t, lines, len(sum.After.Items))
	m, err := load.Open(sum.Checkpoint, "")
	require.NoError(t, err)
	e, err := engine.New(engine.Config{Weights: m.Weights, MaxNumSeqs: 1})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() { cancel(); <-done }()
	correct := 0
	for i, line := range lines {
		var it map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &it))
		for _, k := range []string{"prompt", "prompt_token_ids", "expected", "completion_token_ids", "correct", "greedy", "max_tokens"} {
			require.Contains(t, it, k, "line %d", i+1)
		}
		var item evalItem
		require.NoError(t, json.Unmarshal([]byte(line), &item))
		if item.Correct {
			correct++
		}
		p := sample.Defaults()
		p.Temperature, p.MaxTokens = 0, item.MaxTokens
		s, err := e.Add(ctx, engine.Request{ID: fmt.Sprint("eval-", i), PromptTokenIDs: item.PromptTokenIDs, Sampling: p})
		require.NoError(t, err)
		var ids []int
		for {
			o, err := s.Recv(ctx)
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err)
			for _, tok := range o.Tokens {
				ids = append(ids, tok.ID)
			}
		}
		require.Equal(t, item.CompletionTokenIDs, ids, "held-out prompt %q: the checkpoint's greedy completion", item.Prompt)
	}
	require.InDelta(t, sum.After.Greedy, float64(correct)/float64(len(lines)), 1e-9)
}

// checkLogFields: every step's log line carries the RL metrics.
func checkLogFields(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var first map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &first))
	require.Equal(t, "initial", first["phase"])
	require.Contains(t, first, "eval_greedy_acc")
	for _, line := range lines[1:] {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec))
		for _, k := range []string{"entropy", "zero_adv_frac", "kl", "clip_frac", "tis_frac", "grad_norm", "response_len",
			"finish_reasons", "stale_share", "bubble_ms", "mismatch_kl"} {
			require.Contains(t, rec, k)
		}
		require.Positive(t, rec["entropy"], "a sampling policy has entropy")
	}
}

// TestSyncIsBitwiseDeterministic: with --sync (every batch generated by the latest weights,
// no update in flight while generating) two runs of the same seed end with the same bytes: the
// checkpoint, the held-out completions and every logged reward and loss. Without --sync the
// versions that generate each token depend on timing, so runs differ.
func TestSyncIsBitwiseDeterministic(t *testing.T) {
	var ckpts, evals, logs [2][]byte
	for i := range 2 {
		cfg := testConfig(t)
		cfg.Sync, cfg.Steps, cfg.WarmupSteps = true, 4, 2
		sum, err := run(t.Context(), cfg, devNull(t))
		require.NoError(t, err)
		ckpts[i], err = os.ReadFile(filepath.Join(sum.Checkpoint, "model.safetensors"))
		require.NoError(t, err)
		evals[i], err = os.ReadFile(sum.EvalPath)
		require.NoError(t, err)
		for _, r := range sum.Records {
			logs[i] = fmt.Appendf(logs[i], "%d %v %v %v %v\n", r.Step, r.Reward, r.Loss, r.Entropy, r.GradNorm)
		}
	}
	require.Equal(t, ckpts[0], ckpts[1], "the same checkpoint bytes")
	require.Equal(t, string(evals[0]), string(evals[1]))
	require.Equal(t, string(logs[0]), string(logs[1]))
}
