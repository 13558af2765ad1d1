package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"text/tabwriter"

	"github.com/gin-gonic/gin"
	"github.com/spf13/cobra"

	"github.com/rolloutkit/rollout/bench"
	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/bus/redisconf"
)

// benchFleet is `rollout bench fleet`: its flags, and one method per group of figures.
type benchFleet struct {
	asJSON      bool
	redis       redisFlags
	servers     []int
	rounds      int
	quick       bool
	updates     int
	concurrency int
	requests    int
	maxTokens   int
	figures     []string
	sim         simFlags
}

func newBenchFleetCmd() *cobra.Command {
	var b benchFleet
	cmd := &cobra.Command{
		Use:   "fleet",
		Short: "Fleet control plane: control round trip vs the bare publish/ack floor, UpdateWeights bubble, Generate via SDK vs direct",
		Long: "Control round trip (an SDK call to every ack) at each --servers count, on an in-process bus\n" +
			"and over a real redis-server (--redis, or one started here when redis-server is on PATH),\n" +
			"each beside the floor measured on the same bus in the same run: a bare publish that n\n" +
			"subscribers answer with a push. Then the UpdateWeights bubble per server on stories15m\n" +
			"(and stories110m unless --quick) under generation load, stage time apart, and Generate\n" +
			"through the SDK against the same requests sent straight to the server's /generate.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return b.run(cmd) },
	}
	f := cmd.Flags()
	f.BoolVar(&b.asJSON, "json", false, "print JSON")
	b.redis.register(f, "Redis to measure over (default: start a redis-server on a free port when one is on PATH)")
	f.IntSliceVar(&b.servers, "servers", []int{1, 8, 32}, "fleet sizes of the control round trip")
	f.IntVar(&b.rounds, "rounds", 200, "control round trips per figure")
	f.BoolVar(&b.quick, "quick", false, "stories15m only, fewer rounds, updates and requests")
	f.IntVar(&b.updates, "updates", 3, "weight updates per bubble figure")
	f.IntVar(&b.concurrency, "concurrency", 64, "concurrent requests of the Generate figure")
	f.IntVar(&b.requests, "requests", 256, "requests per Generate run")
	f.IntVar(&b.maxTokens, "max-tokens", 32, "tokens per request of the Generate figure")
	b.sim.register(cmd)
	f.StringSliceVar(&b.figures, "figures", []string{"control", "bubble", "generate"}, "which figures to measure: control, bubble, generate")
	return cmd
}

// run measures the figures --figures names and prints the report.
func (b *benchFleet) run(cmd *cobra.Command) error {
	ctx := cmd.Context()
	log := loggerFrom(cmd)
	if len(b.sim.sizes) > 0 {
		return runSimulate(ctx, cmd.OutOrStdout(), log, &b.sim, b.redis.config(cmd).URL, b.asJSON)
	}
	if os.Getenv(gin.EnvGinMode) == "" {
		gin.SetMode(gin.ReleaseMode) // as serve does: the fleets' servers log through slog
	}
	conf := b.redis.config(cmd)
	rep := bench.FleetReport{GOMAXPROCS: runtime.GOMAXPROCS(0), RedisURL: redisconf.Redact(conf.URL)}
	if conf.URL == "" {
		rs, err := bench.StartRedis(ctx)
		switch {
		case errors.Is(err, bench.ErrNoRedisServer):
			rep.RedisNote = "redis-server is not on PATH and --redis was not given: no Redis figures"
		case err != nil:
			return err
		default:
			defer rs.Stop()
			conf.URL = rs.URL
			rep.RedisURL, rep.RedisNote = rs.URL, "redis-server started by the benchmark"
		}
	}
	want := map[string]bool{}
	for _, f := range b.figures {
		if f != "control" && f != "bubble" && f != "generate" {
			return fmt.Errorf("--figures %q: want control, bubble and/or generate", f)
		}
		want[f] = true
	}
	if b.quick {
		b.rounds = min(b.rounds, 50)
		b.updates = min(b.updates, 2)
		b.requests = min(b.requests, 128)
	}
	if want["control"] {
		if err := b.control(ctx, log, conf, &rep); err != nil {
			return err
		}
	}
	if want["bubble"] {
		if err := b.bubbles(ctx, log, &rep); err != nil {
			return err
		}
	}
	if want["generate"] {
		if err := b.generate(ctx, log, &rep); err != nil {
			return err
		}
	}
	out := cmd.OutOrStdout()
	if b.asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return printFleetBench(out, &rep)
}

// control measures the control round trip at each fleet size, on the in-process bus and, when
// the report has a Redis, over it beside the raw Redis floor.
func (b *benchFleet) control(ctx context.Context, log *slog.Logger, conf redisconf.Config, rep *bench.FleetReport) error {
	for _, n := range b.servers {
		log.Info("bench fleet: control round trip", "transport", "mem", "servers", n)
		r, err := bench.ControlRoundTrip(ctx, "mem", nil, n, b.rounds)
		if err != nil {
			return fmt.Errorf("control round trip (mem, %d servers): %w", n, err)
		}
		rep.Control = append(rep.Control, r)
		if rep.RedisURL == "" {
			continue
		}
		log.Info("bench fleet: control round trip", "transport", "redis", "servers", n)
		rb, err := bus.DialRedisConfig(ctx, conf, bus.RedisOptions{Logger: log})
		if err != nil {
			return err
		}
		r, err = bench.ControlRoundTrip(ctx, "redis", rb, n, b.rounds)
		_ = rb.Close()
		if err != nil {
			return fmt.Errorf("control round trip (redis, %d servers): %w", n, err)
		}
		raw, err := bench.RedisFloorConfig(ctx, conf, n, b.rounds)
		if err != nil {
			return err
		}
		r.RawFloor = &raw
		rep.Control = append(rep.Control, r)
	}
	return nil
}

// bubbles measures the UpdateWeights bubble on stories15m, and stories110m unless quick.
func (b *benchFleet) bubbles(ctx context.Context, log *slog.Logger, rep *bench.FleetReport) error {
	presets := []string{"stories15m"}
	if !b.quick {
		presets = append(presets, "stories110m")
	}
	dir, err := os.MkdirTemp("", "rollout-bench-fleet-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for _, p := range presets {
		log.Info("bench fleet: update bubble", "preset", p)
		bb, err := bench.UpdateBubble(ctx, p, 2, b.updates, dir)
		if err != nil {
			return fmt.Errorf("update bubble (%s): %w", p, err)
		}
		rep.Bubbles = append(rep.Bubbles, bb)
	}
	return nil
}

// generate measures Generate through the SDK against the same requests sent to /generate.
func (b *benchFleet) generate(ctx context.Context, log *slog.Logger, rep *bench.FleetReport) error {
	log.Info("bench fleet: generate via SDK vs direct", "concurrency", b.concurrency)
	repeats := 2
	if b.quick {
		repeats = 1
	}
	g, err := bench.GenerateVsDirect(ctx, "stories15m", b.concurrency, b.requests, b.maxTokens, repeats)
	if err != nil {
		return fmt.Errorf("generate: %w", err)
	}
	rep.Generate = &g
	return nil
}

func printFleetBench(out io.Writer, rep *bench.FleetReport) error {
	fmt.Fprintf(out, "GOMAXPROCS %d; %s\n\ncontrol round trip (Resume to every server and back, signed), ms\n", rep.GOMAXPROCS, rep.RedisNote)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "transport\tservers\tsdk p50\tsdk p99\tfloor p50\tfloor p99\traw redis floor p50\tsdk/floor p50 (goal <= 2)")
	for _, r := range rep.Control {
		raw := "-"
		if r.RawFloor != nil {
			raw = fmt.Sprintf("%.3f", r.RawFloor.P50Ms)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.3f\t%.3f\t%.3f\t%.3f\t%s\t%.2fx\n", r.Transport, r.Servers, r.SDK.P50Ms, r.SDK.P99Ms,
			r.Floor.P50Ms, r.Floor.P99Ms, raw, r.Ratio)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out, "\nUpdateWeights under generation load (8 workers, n=2, 64 tokens), default plan: pause(abort, clear_cache) -> sleep 1 -> swap -> wake -> resume")
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "preset\tcheckpoint\tservers x updates\tbubble p50 ms\tbubble max ms\tmeasured\tstage p50 ms\tcommit p50 ms\tengine step ms")
	for _, b := range rep.Bubbles {
		fmt.Fprintf(tw, "%s\t%.0f MB\t%d x %d\t%.1f\t%.1f\t%.0f%%\t%.1f\t%.1f\t%.1f\n", b.Preset, float64(b.CheckpointBytes)/1e6, b.Servers, b.Updates,
			b.BubbleP50Ms, b.BubbleMaxMs, 100*b.MeasuredFrac, b.StageP50Ms, b.CommitP50Ms, b.StepMs)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if g := rep.Generate; g != nil {
		fmt.Fprintf(out, "\nGenerate on one %s server, %d concurrent, %d requests x %d tokens: SDK %.1f tok/s, direct /generate %.1f tok/s = %.3fx (goal >= 0.95; errors %d/%d)\n",
			g.Preset, g.Concurrency, g.Requests, g.MaxTokens, g.SDKTokS, g.DirectTokS, g.Ratio, g.SDKErrors, g.DirectErrors)
	}
	return nil
}
