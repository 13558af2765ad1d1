package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/rolloutkit/rollout/engine/load"
	engmodel "github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/sdk/bus/redisconf"
	"github.com/rolloutkit/rollout/sdk/pipeline"
	"github.com/rolloutkit/rollout/server"
	"github.com/rolloutkit/rollout/server/embedded"
	"github.com/rolloutkit/rollout/trainer"
	"github.com/rolloutkit/rollout/weightstore"
)

// config is the loop's configuration (flags in main.go).
type config struct {
	Steps       int     // GRPO steps
	Groups      int     // groups (questions) per step
	Group       int     // episodes per question (G)
	LR          float64 // learning rate
	KL          float64 // weight of the KL penalty to the warm-started policy
	Staleness   int64   // the pipeline's and the trainer's staleness bound K
	Dynamic     bool    // DAPO dynamic sampling: drop zero-variance groups and refill
	OverSample  int     // groups started beyond the bound's batches
	Temperature float64
	Seed        uint64
	Seeds       int
	WarmupSteps int
	WarmupLR    float64
	EvalEvery   int
	Out         string
	Servers     int
	Model       string
	Redis       string // an external fleet's Redis (default: an embedded fleet)
	Fleet       string
	Secret      []byte
	Logger      *slog.Logger
	Otel        string // trace exporter (main.go)
	// TracerProvider makes one trace per step (agent.step) and the pipeline's, the SDK's and
	// the embedded servers' spans; nil: no tracing.
	TracerProvider trace.TracerProvider
}

func (c *config) tracerProvider() trace.TracerProvider {
	if c.TracerProvider == nil {
		return noop.NewTracerProvider()
	}
	return c.TracerProvider
}

func (c *config) validate() error {
	switch {
	case c.Steps < 1 || c.Groups < 1:
		return fmt.Errorf("--steps and --groups must be >= 1 (got %d, %d)", c.Steps, c.Groups)
	case c.Group < 2:
		return fmt.Errorf("--group must be >= 2: GRPO compares the rewards within a group (got %d)", c.Group)
	case c.Staleness < 0 || c.OverSample < 0 || c.WarmupSteps < 0 || c.EvalEvery < 0:
		return errors.New("--max-staleness, --over-sample, --warmup-steps and --eval-every must be >= 0")
	case !(c.LR > 0) || c.KL < 0 || (c.WarmupSteps > 0 && !(c.WarmupLR > 0)):
		return errors.New("--lr (and --warmup-lr with a warm start) must be > 0, --kl >= 0")
	case !(c.Temperature >= 1e-5 && c.Temperature <= 100):
		return fmt.Errorf("--temperature must be in [1e-5, 100] (got %g)", c.Temperature)
	case c.Out == "":
		return errors.New("--out must name a directory")
	case c.Redis == "" && c.Servers < 1:
		return fmt.Errorf("--servers must be >= 1 (got %d)", c.Servers)
	case c.Redis != "" && c.Fleet == "":
		return errors.New("--redis needs --fleet")
	}
	return nil
}

// record is one line of log.jsonl.
type record struct {
	Step    int     `json:"step"`
	Version int64   `json:"version"`
	Phase   string  `json:"phase,omitempty"` // "initial" for the evaluation before GRPO
	Reward  float64 `json:"reward"`
	// TrainSuccess, ToolUse and KeyRight are shares of the batch's episodes: right answer,
	// a well-formed call, a call of the question's key.
	TrainSuccess float64 `json:"train_success"`
	ToolUse      float64 `json:"tool_use"`
	KeyRight     float64 `json:"key_right"`
	// MaxStaleness is the largest trainer version minus a group's oldest token version in the
	// batch; Filtered, Stale and Failed the pipeline's counts since the previous batch;
	// DroppedStaleTokens the tokens the trainer left out as too old.
	MaxStaleness       int64    `json:"max_staleness"`
	Filtered           int      `json:"filtered_groups"`
	Stale              int      `json:"stale_groups"`
	Failed             int      `json:"failed_groups"`
	DroppedStaleTokens int      `json:"dropped_stale_tokens"`
	ModelTokens        int      `json:"model_tokens"`
	EnvTokens          int      `json:"env_tokens"`
	Entropy            float64  `json:"entropy"`
	KL                 float64  `json:"kl"`
	WaitSec            float64  `json:"batch_wait_sec"`
	TrainSec           float64  `json:"train_sec"`
	StepSec            float64  `json:"step_sec"`
	BubbleMs           float64  `json:"bubble_ms"`
	EvalSuccess        *float64 `json:"eval_success,omitempty"`
	EvalToolUse        *float64 `json:"eval_tool_use,omitempty"`
	EvalKeyRight       *float64 `json:"eval_key_right,omitempty"`
	Example            string   `json:"example,omitempty"`
	TraceID            string   `json:"trace_id,omitempty"` // the step's trace (with --otel)
}

func (r *record) setEval(e *evalResult) {
	r.EvalSuccess, r.EvalToolUse, r.EvalKeyRight = &e.Success, &e.ToolUse, &e.KeyRight
}

// summary is what a run ends with.
type summary struct {
	Before, After *evalResult
	Constant      float64 // the best constant answer's held-out success
	Records       []record
	WallSec       float64
	LogPath       string
	EvalPath      string
	PlotPath      string
	Checkpoint    string
}

// run trains cfg.Steps GRPO steps on the lookup task through the rollout pipeline.
func run(ctx context.Context, cfg config, stdout io.Writer) (*summary, error) {
	start := time.Now()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	for _, name := range []string{"weights", "checkpoint", "log.jsonl", "eval.jsonl", "success.png"} {
		if err := os.RemoveAll(filepath.Join(cfg.Out, name)); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return nil, err
	}
	m, err := load.Open(cfg.Model, "")
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", cfg.Model, err)
	}
	tk := newTask(m.Weights.Config.BOSTokenID, m.Weights.Config.EOSTokenID)
	sum := &summary{Constant: tk.constantSuccess(), LogPath: filepath.Join(cfg.Out, "log.jsonl"),
		EvalPath: filepath.Join(cfg.Out, "eval.jsonl"), PlotPath: filepath.Join(cfg.Out, "success.png"), Checkpoint: filepath.Join(cfg.Out, "checkpoint")}

	w, err := warmStart(ctx, cfg, tk, m.Weights)
	if err != nil {
		return nil, err
	}
	samp := trainer.Sampling{Temperature: cfg.Temperature}
	tr, err := trainer.New(w, trainer.Config{LR: cfg.LR, KLCoef: cfg.KL, DrGRPO: true, Sampling: samp,
		Version: int64(cfg.WarmupSteps), DropStale: true, MaxStaleness: cfg.Staleness})
	if err != nil {
		return nil, fmt.Errorf("trainer: %w", err)
	}
	defer tr.Close()

	store, err := weightstore.Open(ctx, filepath.Join(cfg.Out, "weights"))
	if err != nil {
		return nil, err
	}
	ws, err := weightstore.Serve("127.0.0.1:0", store)
	if err != nil {
		return nil, err
	}
	defer func() { _ = ws.Close(context.WithoutCancel(ctx)) }()
	c, closeFleet, err := openFleet(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	defer func() { _ = closeFleet() }()
	update := func(ctx context.Context, v int64) (*sdk.UpdateResult, error) {
		if _, err := store.Publish(ctx, v, tr.Weights()); err != nil {
			return nil, err
		}
		_ = store.Prune(3)
		ref, err := ws.Ref(v)
		if err != nil {
			return nil, err
		}
		res, err := c.UpdateWeights(ctx, ref, sdk.Plan{Policy: sdk.AllOrNothing})
		if err == nil && res.Outcome != sdk.OutcomeCommitted {
			err = fmt.Errorf("update to version %d: %s (%s)", v, res.Outcome, res.Reason)
		}
		return res, err
	}
	// The warm-started policy is ahead of a fresh fleet: serve it before the first episode.
	if _, err := update(ctx, tr.Version()); err != nil {
		return nil, err
	}

	logf, err := os.Create(sum.LogPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	enc := json.NewEncoder(logf)
	ep := episodes{c: c, tk: tk, samp: sdk.SamplingParams{Temperature: cfg.Temperature}, seed: cfg.Seed}
	if sum.Before, err = evaluate(ctx, ep, tr.Version()); err != nil {
		return nil, err
	}
	initial := record{Version: tr.Version(), Phase: "initial"}
	initial.setEval(sum.Before)
	if err := enc.Encode(initial); err != nil {
		return nil, err
	}
	fmt.Fprintf(stdout, "held-out success before GRPO %.3f (tool use %.3f, right key %.3f); best constant answer %.3f\n",
		sum.Before.Success, sum.Before.ToolUse, sum.Before.KeyRight, sum.Constant)
	fmt.Fprintf(stdout, "%5s %7s %7s %7s %7s %6s %5s %6s %7s  %s\n", "step", "reward", "success", "tool", "key", "stale", "filt", "wait", "eval", "example")

	reg := prometheus.NewRegistry()
	metrics, err := pipeline.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x9e3))
	p, err := pipeline.Start(ctx, pipeline.Config{GroupSize: cfg.Group, BatchGroups: cfg.Groups, MaxStaleness: cfg.Staleness,
		FilterZeroVariance: cfg.Dynamic, OverSample: cfg.OverSample, Version: tr.Version(), Generator: ep, Verifier: verifier(tk),
		Source: func(context.Context) (pipeline.Prompt, error) {
			pr := tk.Train[rng.IntN(len(tk.Train))]
			return pipeline.Prompt{TokenIDs: pr.Prompt, Task: pr}, nil
		},
		Metrics: metrics, Logger: cfg.Logger, TracerProvider: cfg.tracerProvider()})
	if err != nil {
		return nil, err
	}
	defer func() { _ = p.Close() }()

	type pendingUpdate struct {
		done chan struct{}
		res  *sdk.UpdateResult
		err  error
	}
	var pending *pendingUpdate
	land := func(rec *record) error {
		if pending == nil {
			return nil
		}
		<-pending.done
		if pending.err != nil {
			return pending.err
		}
		rec.BubbleMs = float64(pending.res.MaxBubble) / float64(time.Millisecond)
		pending = nil
		return nil
	}
	tracer := cfg.tracerProvider().Tracer("rollout/examples/agent-loop")
	// step runs one GRPO step into rec: the batch, the trainer's step, the update (and an
	// evaluation on its steps), under the step's span.
	step := func(ctx context.Context, i int, rec *record) error {
		b, err := p.Next(ctx, tr.Version())
		if err != nil {
			return err
		}
		rec.WaitSec, rec.Filtered, rec.Stale, rec.Failed = b.Wait.Seconds(), b.Filtered, b.Stale, b.Failed
		if len(b.Errors) > 0 {
			return fmt.Errorf("step %d: %w", rec.Step, errors.Join(b.Errors...))
		}
		for _, s := range b.Staleness() {
			rec.MaxStaleness = max(rec.MaxStaleness, s)
		}
		samples, n := []trainer.Sample{}, 0
		for gi, g := range b.Groups {
			for _, s := range g.Samples {
				lps := make([]float32, len(s.Logprobs))
				for j, lp := range s.Logprobs {
					lps[j] = float32(lp)
				}
				samples = append(samples, trainer.Sample{Prompt: g.Prompt.TokenIDs, Completion: s.Completion, Logprobs: lps,
					Versions: s.Versions, LossMask: s.LossMask, Reward: s.Reward, Group: gi})
				turns := modelTurns(s.Trajectory)
				var second []int
				if len(turns) == 2 {
					second = turns[1]
				}
				o := tk.score(g.Prompt.Task.(problem), turns[0], second)
				rec.Reward += s.Reward
				rec.TrainSuccess += b2f(o.Success)
				rec.ToolUse += b2f(o.Called)
				rec.KeyRight += b2f(o.KeyDigits == 2)
				rec.ModelTokens += s.ModelTokens()
				rec.EnvTokens += len(s.Completion) - s.ModelTokens()
				if n == 0 {
					rec.Example = g.Prompt.Task.(problem).Text + " " + tk.render(s.Completion)
				}
				n++
			}
		}
		rec.Reward /= float64(n)
		rec.TrainSuccess /= float64(n)
		rec.ToolUse /= float64(n)
		rec.KeyRight /= float64(n)
		t0 := time.Now()
		st, err := tr.Step(ctx, samples)
		if err != nil {
			return fmt.Errorf("step %d: %w", rec.Step, err)
		}
		rec.TrainSec = time.Since(t0).Seconds()
		rec.Version, rec.Entropy, rec.KL, rec.DroppedStaleTokens = st.Version, st.Entropy, st.KL, st.DroppedStaleTokens
		// One update at a time: the previous one lands before this one starts. The update
		// stages and commits while the pipeline keeps generating; it learns of the new
		// version when the update commits.
		if err := land(rec); err != nil {
			return err
		}
		pu := &pendingUpdate{done: make(chan struct{})}
		pending = pu
		go func(v int64) {
			defer close(pu.done)
			pu.res, pu.err = update(ctx, v)
			if pu.err == nil {
				p.SetVersion(v)
			}
		}(st.Version)
		last := i == cfg.Steps-1
		if last || (cfg.EvalEvery > 0 && (i+1)%cfg.EvalEvery == 0) {
			if err := land(rec); err != nil {
				return err
			}
			ev, err := evaluate(ctx, ep, st.Version)
			if err != nil {
				return err
			}
			rec.setEval(ev)
			if last {
				sum.After = ev
			}
		}
		return nil
	}
	for i := range cfg.Steps {
		stepStart := time.Now()
		rec := record{Step: i + 1}
		sctx, span := tracer.Start(ctx, "agent.step", trace.WithAttributes(attribute.Int("rl.step", rec.Step)))
		if sc := span.SpanContext(); sc.IsSampled() {
			rec.TraceID = sc.TraceID().String()
		}
		err := step(sctx, i, &rec)
		span.End()
		if err != nil {
			return sum, err
		}
		rec.StepSec = time.Since(stepStart).Seconds()
		if err := enc.Encode(rec); err != nil {
			return sum, err
		}
		sum.Records = append(sum.Records, rec)
		evalCol := ""
		if rec.EvalSuccess != nil {
			evalCol = fmt.Sprintf("%.3f", *rec.EvalSuccess)
		}
		if rec.EvalSuccess != nil || i%10 == 0 {
			fmt.Fprintf(stdout, "%5d %7.3f %7.3f %7.3f %7.3f %6d %5d %6.2f %7s  %s\n", rec.Step, rec.Reward, rec.TrainSuccess, rec.ToolUse,
				rec.KeyRight, rec.MaxStaleness, rec.Filtered, rec.WaitSec, evalCol, rec.Example)
		}
	}
	if err := land(&record{}); err != nil {
		return sum, err
	}
	if err := writeEval(sum.EvalPath, sum.After); err != nil {
		return sum, err
	}
	if err := tr.Save(sum.Checkpoint); err != nil {
		return sum, err
	}
	if err := plotRun(sum.PlotPath, cfg.Model, sum); err != nil {
		return sum, fmt.Errorf("plot: %w", err)
	}
	sum.WallSec = time.Since(start).Seconds()
	return sum, nil
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// warmStart teaches the episode format (task.warmExamples) with supervised steps and
// returns the weights GRPO starts from.
func warmStart(ctx context.Context, cfg config, tk *task, w *engmodel.Weights) (*engmodel.Weights, error) {
	if cfg.WarmupSteps == 0 {
		return w, nil
	}
	tr, err := trainer.New(w, trainer.Config{LR: cfg.WarmupLR})
	if err != nil {
		return nil, fmt.Errorf("warm start: %w", err)
	}
	defer tr.Close()
	r := rand.New(rand.NewPCG(cfg.Seed, 0x5f7))
	for i := range cfg.WarmupSteps {
		ps, cs := tk.warmExamples(r, 48)
		ex := make([]trainer.Example, len(ps))
		for j := range ps {
			ex[j] = trainer.Example{Prompt: ps[j], Completion: cs[j]}
		}
		if _, err := tr.SupervisedStep(ctx, ex); err != nil {
			return nil, fmt.Errorf("warm start step %d: %w", i+1, err)
		}
	}
	return tr.Weights(), nil
}

// openFleet starts an embedded fleet (default) or dials an external one over Redis.
func openFleet(ctx context.Context, cfg config) (*sdk.Client, func() error, error) {
	if cfg.Redis != "" {
		c, err := sdk.Dial(ctx, sdk.Options{Redis: redisconf.Config{URL: cfg.Redis}, Fleet: cfg.Fleet, Secret: cfg.Secret, Logger: cfg.Logger,
			TracerProvider: cfg.tracerProvider()})
		if err != nil {
			return nil, nil, err
		}
		return c, c.Close, nil
	}
	f, err := embedded.Start(ctx, embedded.Options{Servers: cfg.Servers, Model: cfg.Model, Secret: cfg.Secret, Logger: cfg.Logger,
		Server: func(_ int, sc *server.Config) { sc.TracerProvider = cfg.tracerProvider() }})
	if err != nil {
		return nil, nil, err
	}
	o := f.DialOptions()
	o.Logger, o.TracerProvider = cfg.Logger, cfg.tracerProvider()
	c, err := sdk.Dial(ctx, o)
	if err != nil {
		_ = f.Close()
		return nil, nil, err
	}
	return c, func() error { return errors.Join(c.Close(), f.Close()) }, nil
}
