// Command rl-loop is a complete GRPO run on Rollout: a fleet of rollout servers (two
// in-process servers by default, or `rollout serve` processes over Redis) generates groups of
// completions through the SDK, a verifiable reward scores them, the reference trainer takes
// one step, publishes the new weights, and the fleet updates to them (staging while the next
// batch generates, then the cut: pause with cache clearing, sleep, swap, wake, resume).
//
// The task (see task.go): after the prompt "n=D:", write digits, ideally the digit D. A random
// builtin:tiny model scores about 0.02; the run shows the reward rising within a minute.
//
// Usage:
//
//	go run ./examples/rl-loop                       # embedded: 2 servers in this process
//	go run ./examples/rl-loop --redis redis://127.0.0.1:6379 --fleet demo --fleet-secret-file s.txt
//
// Against servers started with --api-key-file, pass the same file as --api-key-file (or the
// key as ROLLOUT_API_KEY): the loop's generation requests carry it as a bearer token.
//
// It writes DIR/log.jsonl (one JSON record per step), DIR/reward.png (the reward curve) and
// DIR/checkpoint (the trainer's state; --resume continues from it).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/gin-gonic/gin"
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
		fmt.Fprintln(os.Stderr, "rl-loop:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("rl-loop", flag.ContinueOnError)
	fs.IntVar(&cfg.Steps, "steps", 40, "training steps")
	fs.IntVar(&cfg.Prompts, "prompts", 4, "prompts (GRPO groups) per step")
	fs.IntVar(&cfg.Group, "group", 8, "completions per prompt (G, at least 2)")
	fs.IntVar(&cfg.MaxTokens, "max-tokens", 12, "completion budget in tokens")
	fs.Float64Var(&cfg.LR, "lr", 1e-3, "peak learning rate")
	fs.Float64Var(&cfg.KL, "kl", 0, "weight of the KL penalty to the initial policy; 0: none")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the prompts and sampling")
	fs.StringVar(&cfg.Out, "out", "rl-loop-out", "directory for the log, the plot, the weight store and the checkpoint")
	fs.BoolVar(&cfg.Resume, "resume", false, "continue from the checkpoint in --out")
	fs.StringVar(&cfg.FleetStart, "fleet-start", FleetStartFail, "when the fleet already serves a later version (another run's): fail, reset (publish this run's weights as the next version) or adopt (train on from the fleet's checkpoint)")
	fs.BoolVar(&cfg.Sync, "sync", false, "wait for each weight update before generating the next batch (fully on-policy)")
	fs.StringVar(&cfg.Policy, "policy", "all", "update policy: all, quorum:K or rolling:K")
	fs.StringVar(&cfg.Mode, "mode", "keep", "pause mode of the cut: abort, wait or keep")
	fs.IntVar(&cfg.Servers, "servers", 2, "embedded servers (ignored with --redis)")
	fs.StringVar(&cfg.Model, "model", "builtin:tiny", "model spec (the servers' initial weights must be the same)")
	fs.Int64Var(&cfg.OffloadBytes, "offload-cpu-bytes", 16<<20, "KV offload CPU memory per embedded server (0: no offloading)")
	cfg.RedisConfig.RegisterFlags(fs, "Redis of an external fleet (default: an embedded fleet)")
	fs.StringVar(&cfg.Fleet, "fleet", "", "fleet name (with --redis)")
	secretFile := fs.String("fleet-secret-file", "", "file holding the fleet secret (at least 32 bytes)")
	apiKeyFile := fs.String("api-key-file", "", "file holding the servers' API key (with --redis; or set ROLLOUT_API_KEY)")
	fs.StringVar(&cfg.StoreAddr, "store-addr", "127.0.0.1:0", "listen address of the weight store the servers fetch from")
	fs.StringVar(&cfg.StoreURL, "store-url", "", "base URL the servers fetch weights from (default: the store's listen URL)")
	logLevel := fs.String("log-level", "warn", "log level of the servers and the SDK: debug, info, warn, error")
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
	cfg.RedisConfig.LoadEnv(os.LookupEnv)
	cfg.Redis = cfg.RedisConfig.URL
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
	cfg.APIKey = os.Getenv("ROLLOUT_API_KEY")
	if *apiKeyFile != "" {
		b, err := os.ReadFile(*apiKeyFile)
		if err != nil {
			return cfg, err
		}
		// An empty key would silently send no Authorization header and fail every request
		// with 401: refuse it here, where the cause is clear.
		if cfg.APIKey = strings.TrimSpace(string(b)); cfg.APIKey == "" {
			return cfg, fmt.Errorf("--api-key-file %s is empty", *apiKeyFile)
		}
	}
	return cfg, nil
}

func runMain(cfg config) error {
	gin.SetMode(gin.ReleaseMode) // the servers' routers; gin's mode is a process global, set by mains
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	sum, err := run(ctx, cfg, os.Stdout)
	if err != nil {
		return err
	}
	fmt.Printf("\nreward: first 5 steps %.3f -> last 5 steps %.3f (%.1fx); %d weight updates; %d safety violations\n",
		sum.FirstMean, sum.LastMean, sum.LastMean/max(sum.FirstMean, 1e-9), sum.Updates, sum.Violations)
	last := sum.Records[len(sum.Records)-1]
	fmt.Printf("last sample: %q\n", last.Example)
	fmt.Printf("reward curve: %s\nlog: %s\n", sum.PlotPath, sum.LogPath)
	if sum.Violations > 0 {
		return fmt.Errorf("%d safety violations", sum.Violations)
	}
	return nil
}
