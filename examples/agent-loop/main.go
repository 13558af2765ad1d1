// Command agent-loop trains a policy to use a tool, with GRPO on multi-turn trajectories
// through the rollout pipeline (sdk/pipeline) on a Rollout fleet (two in-process servers by
// default, or `rollout serve` processes over Redis).
//
// The task (task.go): "47?" asks for the digit a lookup tool holds under key 47. The table is
// random, so on held-out keys (20 of the 100, never trained on) only the tool can answer. An
// episode is a sdk.Session: the model's first turn is a call ("@47" EOS), the environment
// appends the tool's result ("=3\n", as token ids, loss mask 0), and the model's second turn
// is the answer ("3" EOS); a first turn that is no call is the answer. The reward is 0.5 for
// the right answer plus 0.25 per key digit the call copied right.
//
// A warm start (--warmup-steps) teaches the format (calls of random keys whose answer repeats
// the tool's result, and as many episodes answering a random digit at once without the tool):
// the warm-started policy calls the tool about half the time, with a random key, and so
// answers at chance. GRPO has to teach it to call, and to call the question's key. GRPO then
// trains on the pipeline's batches with a staleness bound (--max-staleness, default 1: the
// next batch generates while the trainer trains and the fleet updates), DAPO dynamic
// sampling (--dynamic-sampling) and the trainer dropping tokens past the bound.
//
// The held-out evaluation (greedy episodes, before the first step, every --eval-every steps
// and after the last) reports the success rate, the tool-use rate and the share of calls of
// the right key, beside two reference lines: the initial policy and the best constant answer.
//
// Usage:
//
//	go run ./examples/agent-loop                 # embedded: 2 servers in this process
//	go run ./examples/agent-loop --seeds 3       # seeds 1..3 in DIR/seed-N, then mean ± std
//	go run ./examples/agent-loop --redis redis://127.0.0.1:6379 --fleet demo --fleet-secret-file s.txt
//
// Outputs in --out (default agent-loop-out): log.jsonl (one object per step; the first is the
// initial evaluation), eval.jsonl (one object per held-out episode of the final evaluation:
// the prompt, the transcript's token ids and loss mask, whether it called the tool with the
// right key and succeeded), success.png (training reward and tool use, held-out success and
// right-key calls, the two reference lines), checkpoint/ (the final weights, HF safetensors)
// and weights/ (the weight store the fleet fetched from).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/rolloutkit/rollout/sdk/telemetry"
)

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err == nil {
		err = runMain(cfg)
	}
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "agent-loop:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("agent-loop", flag.ContinueOnError)
	fs.IntVar(&cfg.Steps, "steps", 200, "GRPO steps")
	fs.IntVar(&cfg.Groups, "groups", 16, "questions (GRPO groups) per step")
	fs.IntVar(&cfg.Group, "group", 8, "episodes per question (G, at least 2)")
	fs.Float64Var(&cfg.LR, "lr", 1e-3, "learning rate of GRPO")
	fs.Float64Var(&cfg.KL, "kl", 0.05, "weight of the KL penalty to the warm-started policy; 0: none")
	fs.Int64Var(&cfg.Staleness, "max-staleness", 1, "K: train on tokens at most K versions old (0: synchronous)")
	fs.BoolVar(&cfg.Dynamic, "dynamic-sampling", true, "drop groups whose rewards are all equal and generate others (DAPO)")
	fs.IntVar(&cfg.OverSample, "over-sample", 4, "groups started beyond the staleness bound's batches, to hide refills")
	fs.Float64Var(&cfg.Temperature, "temperature", 1, "sampling temperature of the episodes (the trainer matches it)")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the questions, the warm start and the sampling")
	fs.IntVar(&cfg.Seeds, "seeds", 1, "runs, with seeds seed, seed+1, ...: each in DIR/seed-N, then mean ± std")
	fs.IntVar(&cfg.WarmupSteps, "warmup-steps", 30, "supervised warm-start steps on the episode format; 0: none")
	fs.Float64Var(&cfg.WarmupLR, "warmup-lr", 3e-3, "learning rate of the warm start")
	fs.IntVar(&cfg.EvalEvery, "eval-every", 25, "held-out evaluation every this many steps (0: only before and after)")
	fs.StringVar(&cfg.Out, "out", "agent-loop-out", "directory for the logs, the weight store and the checkpoint")
	fs.IntVar(&cfg.Servers, "servers", 2, "embedded servers (ignored with --redis)")
	fs.StringVar(&cfg.Model, "model", "builtin:tiny", "model spec (an external fleet must serve the same)")
	fs.StringVar(&cfg.Redis, "redis", "", "Redis URL of an external fleet (default: an embedded fleet)")
	fs.StringVar(&cfg.Fleet, "fleet", "", "fleet name (with --redis)")
	secretFile := fs.String("fleet-secret-file", "", "file holding the fleet secret (at least 32 bytes)")
	logLevel := fs.String("log-level", "warn", "log level: debug, info, warn, error")
	fs.StringVar(&cfg.Otel, "otel", "", "trace exporter: none, stdout (to stderr) or otlp (OTEL_EXPORTER_OTLP_*); default OTEL_TRACES_EXPORTER, else none. One trace per step (agent.step), its id in log.jsonl")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*logLevel)); err != nil {
		return cfg, fmt.Errorf("--log-level: %w", err)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	if s := os.Getenv("ROLLOUT_FLEET_SECRET"); s != "" {
		cfg.Secret = []byte(s)
	}
	if *secretFile != "" {
		b, err := os.ReadFile(*secretFile)
		if err != nil {
			return cfg, err
		}
		cfg.Secret = []byte(strings.TrimSpace(string(b)))
	}
	return cfg, nil
}

func runMain(cfg config) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	tp, shutdown, err := telemetry.Setup(ctx, telemetry.Options{Exporter: cfg.Otel, ServiceName: "agent-loop", Stdout: os.Stderr})
	if err != nil {
		return fmt.Errorf("--otel: %w", err)
	}
	defer func() { _ = shutdown(context.WithoutCancel(ctx)) }()
	cfg.TracerProvider = tp
	if cfg.Seeds < 1 {
		return fmt.Errorf("--seeds must be >= 1 (got %d)", cfg.Seeds)
	}
	var before, after, wall []float64
	for i := range cfg.Seeds {
		c := cfg
		if cfg.Seeds > 1 {
			c.Seed = cfg.Seed + uint64(i)
			c.Out = filepath.Join(cfg.Out, fmt.Sprintf("seed-%d", c.Seed))
			fmt.Printf("\n== seed %d (%d of %d) -> %s\n", c.Seed, i+1, cfg.Seeds, c.Out)
		}
		sum, err := run(ctx, c, os.Stdout)
		if err != nil {
			return err
		}
		fmt.Printf("held-out success: before %.3f -> after %.3f (tool use %.3f -> %.3f, right key %.3f -> %.3f); "+
			"reference lines: initial policy %.3f, best constant answer %.3f; wall time %.1f s\nplot: %s\nlog: %s\nheld-out episodes: %s\ncheckpoint: %s\n",
			sum.Before.Success, sum.After.Success, sum.Before.ToolUse, sum.After.ToolUse, sum.Before.KeyRight, sum.After.KeyRight,
			sum.Before.Success, sum.Constant, sum.WallSec, sum.PlotPath, sum.LogPath, sum.EvalPath, sum.Checkpoint)
		before, after, wall = append(before, sum.Before.Success), append(after, sum.After.Success), append(wall, sum.WallSec)
	}
	if cfg.Seeds > 1 {
		fmt.Printf("\n%d seeds (%d..%d): held-out success %s -> %s; wall time %s s per run\n", cfg.Seeds, cfg.Seed,
			cfg.Seed+uint64(cfg.Seeds-1), meanStd(before), meanStd(after), meanStd(wall))
	}
	return nil
}

// meanStd formats the mean ± the sample standard deviation.
func meanStd(x []float64) string {
	m := 0.0
	for _, v := range x {
		m += v
	}
	m /= float64(len(x))
	v := 0.0
	for _, e := range x {
		v += (e - m) * (e - m)
	}
	if len(x) > 1 {
		v /= float64(len(x) - 1)
	}
	return fmt.Sprintf("%.3f ± %.3f", m, math.Sqrt(v))
}
