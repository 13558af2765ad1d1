package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/load"
	engmodel "github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/weights"
	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/sdk/bus/redisconf"
	"github.com/rolloutkit/rollout/sdk/protocol"
	"github.com/rolloutkit/rollout/server"
	"github.com/rolloutkit/rollout/server/embedded"
	"github.com/rolloutkit/rollout/trainer"
	"github.com/rolloutkit/rollout/weightstore"
)

// config is the loop's configuration (flags in main.go).
type config struct {
	Steps     int     // training steps
	Prompts   int     // groups (prompts) per step
	Group     int     // samples per prompt (G)
	MaxTokens int     // completion budget (0: the task's, the answer and EOS)
	LR        float64 // peak learning rate
	KL        float64 // weight of the KL penalty to the initial policy
	Seed      uint64
	Seeds     int    // runs with seeds Seed, Seed+1, ... (main.go; run does one)
	Task      string // lastdigit or succ (task.go)
	// Temperature and TopP are the rollouts' sampling; the trainer recomputes the logprobs of
	// the same (processed) distribution.
	Temperature float64
	TopP        float64
	WarmupSteps int     // supervised steps teaching the answer format before GRPO (0: none)
	WarmupLR    float64 // their learning rate
	EvalEvery   int     // held-out evaluation every this many steps (0: only before and after)
	PassK       int     // samples per held-out prompt for pass@k (0: greedy accuracy only)
	Out         string  // directory for the checkpoint, weight store, log and plot
	Resume      bool    // continue from Out's checkpoint
	// FleetStart says what to do when the fleet already serves a version above this run's
	// (another run's weights): FleetStartFail, FleetStartReset or FleetStartAdopt.
	FleetStart string
	Sync       bool   // wait for each update before generating the next batch
	Policy     string // update policy: all, quorum:K, rolling:K
	Mode       string // pause mode of the cut: abort, wait, keep

	// Precision is the embedded servers' weight precision (server.Config.Precision): below
	// the trainer's float32 the rollouts sample a slightly different policy, which the
	// mismatch columns measure and the objective's importance ratio corrects. PublishDType is
	// the dtype of the published checkpoints (weightstore.Store.SetDType).
	Precision    kernels.Precision
	PublishDType weights.DType

	// Embedded fleet (default) or an external one over Redis.
	Servers      int
	Model        string
	OffloadBytes int64
	Redis        redisconf.Config // an external fleet's Redis: its URL, TLS, password file, Sentinel
	Fleet        string
	Secret       []byte
	APIKey       string // bearer token of the servers' generation routes (external fleet only)
	StoreAddr    string // where the weight store listens
	StoreURL     string // the store's URL as the servers reach it (default: its listen URL)
	Logger       *slog.Logger
	Otel         string // trace exporter (main.go)
	// TracerProvider makes one trace per step (rl.step, with the SDK's and the embedded
	// servers' spans under it); nil: no tracing.
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
	case c.Steps < 1:
		return fmt.Errorf("--steps must be >= 1 (got %d)", c.Steps)
	case c.Prompts < 1:
		return fmt.Errorf("--prompts must be >= 1 (got %d)", c.Prompts)
	case c.Group < 2:
		return fmt.Errorf("--group must be >= 2: GRPO compares the rewards within a group (got %d)", c.Group)
	case c.MaxTokens < 0:
		return fmt.Errorf("--max-tokens must be >= 0 (got %d)", c.MaxTokens)
	case !(c.Temperature >= 1e-5 && c.Temperature <= 100):
		return fmt.Errorf("--temperature must be in [1e-5, 100]: GRPO needs a sampling distribution (got %g)", c.Temperature)
	case !(c.TopP > 0 && c.TopP <= 1):
		return fmt.Errorf("--top-p must be in (0, 1] (got %g)", c.TopP)
	case c.WarmupSteps < 0 || c.EvalEvery < 0 || c.PassK < 0:
		return errors.New("--warmup-steps, --eval-every and --pass-k must be >= 0")
	case c.WarmupSteps > 0 && c.WarmupLR <= 0:
		return fmt.Errorf("--warmup-lr must be > 0 (got %g)", c.WarmupLR)
	case c.LR <= 0:
		return fmt.Errorf("--lr must be > 0 (got %g)", c.LR)
	case c.Out == "":
		return errors.New("--out must name a directory")
	case c.Redis.URL == "" && c.Servers < 1:
		return fmt.Errorf("--servers must be >= 1 (got %d)", c.Servers)
	case c.Redis.URL != "" && c.Fleet == "":
		return errors.New("--redis needs --fleet")
	case c.FleetStart != "" && c.FleetStart != FleetStartFail && c.FleetStart != FleetStartReset && c.FleetStart != FleetStartAdopt:
		return fmt.Errorf("--fleet-start %q: want fail, reset or adopt", c.FleetStart)
	}
	if _, err := sdk.ParsePolicy(c.Policy); err != nil {
		return err
	}
	return nil
}

// summary is what a run ends with.
type summary struct {
	Records    []record
	FirstMean  float64 // mean reward of the first 5 steps
	LastMean   float64 // mean reward of the last 5 steps
	Updates    int     // weight updates committed
	Violations int64   // safety violations reported by the servers
	// Held-out greedy accuracy and pass@k before GRPO (the initial policy, after the warm
	// start) and after the last step, and the best constant policy's accuracy.
	Before, After *evalResult
	Constant      float64
	WarmupLoss    [2]float64 // cross-entropy of the first and last warm-start step
	WallSec       float64
	PlotPath      string
	LogPath       string
	EvalPath      string
	Checkpoint    string
}

// fleet is what the loop drives: the SDK client and, when embedded, the servers.
type fleet struct {
	client *sdk.Client
	close  func() error
}

func openFleet(ctx context.Context, cfg config) (*fleet, error) {
	if cfg.Redis.URL != "" {
		c, err := sdk.Dial(ctx, sdk.Options{Redis: cfg.Redis, Fleet: cfg.Fleet, Secret: cfg.Secret,
			APIKey: cfg.APIKey, Logger: cfg.Logger, TracerProvider: cfg.tracerProvider()})
		if err != nil {
			return nil, err
		}
		return &fleet{client: c, close: c.Close}, nil
	}
	f, err := embedded.Start(ctx, embedded.Options{Servers: cfg.Servers, Model: cfg.Model, Secret: cfg.Secret, Logger: cfg.Logger,
		Server: func(_ int, sc *server.Config) {
			sc.OffloadCPUBytes = cfg.OffloadBytes
			sc.Precision = cfg.Precision
			sc.TracerProvider = cfg.tracerProvider()
		}})
	if err != nil {
		return nil, err
	}
	o := f.DialOptions()
	o.TracerProvider = cfg.tracerProvider()
	c, err := sdk.Dial(ctx, o)
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return &fleet{client: c, close: func() error { return errors.Join(c.Close(), f.Close()) }}, nil
}

// What a run does on a fleet that serves a version above the run's own (--fleet-start).
const (
	// FleetStartFail refuses to start, saying what the fleet serves and the two choices.
	FleetStartFail = "fail"
	// FleetStartReset publishes this run's weights as the version after the fleet's and
	// brings the fleet to it before the first step: the run trains from its own weights.
	FleetStartReset = "reset"
	// FleetStartAdopt loads the checkpoint the fleet serves (its desired state's ref) and
	// trains from it at the fleet's version: the run continues the fleet's policy.
	FleetStartAdopt = "adopt"
)

// fleetStart reconciles the trainer with a fleet that already serves version fleetV (from
// another run) as cfg.FleetStart says, returning the trainer to use. Versions only go
// forward on a fleet: a run cannot serve its step-1 weights as version 1 where another
// run's version 10 is committed.
func fleetStart(ctx context.Context, cfg config, tr *trainer.Trainer, tcfg trainer.Config, d *protocol.DesiredState) (*trainer.Trainer, error) {
	fleetV := d.Weights.Version
	switch cfg.FleetStart {
	case FleetStartReset:
		tcfg.Version = fleetV + 1
		w := tr.Weights()
		if tcfg.KLCoef > 0 {
			tcfg.Reference = w
		}
		tr.Close()
		return trainer.New(w, tcfg)
	case FleetStartAdopt:
		w, err := weights.Load(ctx, weights.Ref{Version: fleetV, URI: d.Weights.URI, SHA256: d.Weights.SHA256},
			weights.Options{HTTPClient: weights.NewHTTPClient(weights.FetchPolicy{AllowLoopback: true, AllowPrivate: true})})
		if err != nil {
			return nil, fmt.Errorf("--fleet-start adopt: load the fleet's version %d from %s: %w", fleetV, weights.RedactURI(d.Weights.URI), err)
		}
		if err := trainer.CheckShape(w.Config, tr.ModelConfig()); err != nil {
			return nil, fmt.Errorf("--fleet-start adopt: %w", err)
		}
		tcfg.Version = fleetV
		if tcfg.KLCoef > 0 {
			tcfg.Reference = w
		}
		tr.Close()
		return trainer.New(w, tcfg)
	}
	return nil, fmt.Errorf("fleet %q serves weight version %d (%s) from another run and this run is at version %d: "+
		"pass --fleet-start reset to publish this run's weights as version %d and train from them, "+
		"or --fleet-start adopt to train on from the fleet's checkpoint", cfg.Fleet, fleetV, d.Weights.SHA256[:12], tr.Version(), fleetV+1)
}

// update is an UpdateWeights call in flight.
type update struct {
	done chan struct{}
	res  *sdk.UpdateResult
	err  error
}

func startUpdate(ctx context.Context, c *sdk.Client, ref sdk.WeightsRef, plan sdk.Plan) *update {
	u := &update{done: make(chan struct{})}
	go func() {
		defer close(u.done)
		u.res, u.err = c.UpdateWeights(ctx, ref, plan)
	}()
	return u
}

func (u *update) wait() (*sdk.UpdateResult, error) {
	<-u.done
	if u.err != nil {
		return u.res, u.err
	}
	// Degraded is --policy quorum:K met: the servers that missed the update are out of
	// rotation until they converge by themselves, and training goes on.
	if u.res.Outcome != sdk.OutcomeCommitted && u.res.Outcome != sdk.OutcomeDegraded {
		return u.res, fmt.Errorf("update to version %d: %s (%s)", u.res.Version, u.res.Outcome, u.res.Reason)
	}
	return u.res, nil
}

// run is the whole loop: set up the trainer, the weight store and the fleet (openTrainer,
// openStore, alignFleet), evaluate the starting policy, run cfg.Steps steps (loop.step),
// then write the evaluation and the plot.
func run(ctx context.Context, cfg config, stdout *os.File) (*summary, error) {
	wallStart := time.Now()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := prepareOut(cfg); err != nil {
		return nil, err
	}
	m, err := load.Open(cfg.Model, "")
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", cfg.Model, err)
	}
	tk, err := newTask(cfg.Task, m.Weights.Config.BOSTokenID, m.Weights.Config.EOSTokenID)
	if err != nil {
		return nil, err
	}
	maxTokens := cfg.MaxTokens
	if maxTokens == 0 {
		maxTokens = tk.maxTokens()
	}
	ckpt := filepath.Join(cfg.Out, "checkpoint")
	sum := &summary{PlotPath: filepath.Join(cfg.Out, "reward.png"), EvalPath: filepath.Join(cfg.Out, "eval.jsonl"),
		Checkpoint: ckpt, Constant: tk.constantAccuracy()}
	tr, tcfg, err := openTrainer(ctx, cfg, tk, m.Weights, sum)
	if err != nil {
		return nil, err
	}
	defer tr.Close()

	store, ws, err := openStore(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer func() { _ = ws.Close(context.WithoutCancel(ctx)) }()

	fl, err := openFleet(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	defer func() { _ = fl.close() }()
	c := fl.client

	plan := sdk.Plan{Policy: sdk.Policy(cfg.Policy), Mode: sdk.PauseMode(cfg.Mode)}
	l := &loop{cfg: cfg, tk: tk, c: c, store: store, ws: ws, plan: plan, ckpt: ckpt, sum: sum,
		samp: sdk.SamplingParams{MaxTokens: maxTokens, Temperature: cfg.Temperature, TopP: cfg.TopP}}
	atr, err := l.alignFleet(ctx, tr, tcfg)
	if atr != nil && atr != tr {
		defer atr.Close() // the trainer --fleet-start made
	}
	if err != nil {
		return nil, err
	}
	l.tr = atr

	logPath := filepath.Join(cfg.Out, "log.jsonl")
	sum.LogPath = logPath
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	l.rep = newReporter(stdout, logf, cfg.Steps)
	defer l.rep.finish()

	if err := l.evalBefore(ctx); err != nil {
		return sum, err
	}

	l.rng = rand.New(rand.NewPCG(cfg.Seed, uint64(l.tr.Steps())))
	l.tracer = cfg.tracerProvider().Tracer("rollout/examples/rl-loop")
	l.tally = newViolationTally(cfg.Logger)
	for i := 0; i < cfg.Steps; i++ {
		if err := l.step(ctx, i); err != nil {
			return sum, err
		}
	}
	l.rep.finish()
	if err := finishRun(tk, sum); err != nil {
		return sum, err
	}
	sum.WallSec = time.Since(wallStart).Seconds()
	return sum, nil
}

// finishRun sums the run up from its records and writes the final evaluation and the plot.
func finishRun(tk *task, sum *summary) error {
	sum.Violations = sum.Records[len(sum.Records)-1].Violations
	sum.FirstMean, sum.LastMean = meanReward(sum.Records[:min(5, len(sum.Records))]), meanReward(sum.Records[max(0, len(sum.Records)-5):])
	if err := writeEval(sum.EvalPath, sum.After); err != nil {
		return err
	}
	if err := plotRun(sum.PlotPath, tk, sum); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	return nil
}

// prepareOut creates the output directory. A fresh run (not --resume) first removes what a
// previous run left there: it must not serve that run's weights under the same version
// numbers.
func prepareOut(cfg config) error {
	if !cfg.Resume {
		for _, name := range []string{"checkpoint", "weights", "reference", "log.jsonl", "reward.png", "eval.jsonl"} {
			if err := os.RemoveAll(filepath.Join(cfg.Out, name)); err != nil {
				return err
			}
		}
	}
	return os.MkdirAll(cfg.Out, 0o755)
}

// openTrainer resumes the trainer from the checkpoint in cfg.Out (with --resume and one
// there) or starts one from w, warm-started first with --warmup-steps. It returns the
// trainer's configuration too, which --fleet-start needs to start it again.
func openTrainer(ctx context.Context, cfg config, tk *task, w *engmodel.Weights, sum *summary) (*trainer.Trainer, trainer.Config, error) {
	samp := trainer.Sampling{Temperature: cfg.Temperature, TopP: cfg.TopP}
	tcfg := trainer.Config{LR: cfg.LR, MaxGradNorm: 1, DrGRPO: true, KLCoef: cfg.KL, Sampling: samp}
	// The KL reference is the policy GRPO starts from (the warm-started one): saved beside the
	// checkpoint, since a checkpoint holds only the trained weights.
	refDir := filepath.Join(cfg.Out, "reference")
	var tr *trainer.Trainer
	var err error
	if cfg.Resume && trainer.HasCheckpoint(sum.Checkpoint) {
		if cfg.KL > 0 {
			tcfg.Reference = w // a checkpoint of a run that saved no reference
			if _, err := os.Stat(refDir); err == nil {
				if tcfg.Reference, err = weights.LoadHF(refDir); err != nil {
					return nil, tcfg, fmt.Errorf("KL reference: %w", err)
				}
			}
		}
		tr, err = trainer.Resume(sum.Checkpoint, tcfg)
		if err == nil {
			if err = trainer.CheckShape(w.Config, tr.ModelConfig()); err != nil {
				tr.Close()
			}
		}
	} else {
		if cfg.WarmupSteps > 0 {
			if w, err = warmStart(ctx, cfg, tk, w, sum); err != nil {
				return nil, tcfg, err
			}
			tcfg.Version = int64(cfg.WarmupSteps)
		}
		if cfg.KL > 0 {
			if err := weights.SaveHF(refDir, w, weights.F32); err != nil {
				return nil, tcfg, fmt.Errorf("KL reference: %w", err)
			}
		}
		tr, err = trainer.New(w, tcfg) // the reference of --kl is the warm-started policy
	}
	if err != nil {
		return nil, tcfg, fmt.Errorf("trainer: %w", err)
	}
	return tr, tcfg, nil
}

// openStore opens the run's weight store and serves it over HTTP for the fleet.
func openStore(ctx context.Context, cfg config) (*weightstore.Store, *weightstore.Server, error) {
	store, err := weightstore.Open(ctx, filepath.Join(cfg.Out, "weights"))
	if err == nil {
		err = store.SetDType(cfg.PublishDType)
	}
	if err != nil {
		return nil, nil, err
	}
	ws, err := weightstore.Serve(cfg.StoreAddr, store)
	if err != nil {
		return nil, nil, err
	}
	return store, ws, nil
}

// loop is a run's state once it is set up: what its steps share.
type loop struct {
	cfg   config
	tk    *task
	tr    *trainer.Trainer
	c     *sdk.Client
	store *weightstore.Store
	ws    *weightstore.Server
	plan  sdk.Plan
	samp  sdk.SamplingParams
	ckpt  string
	sum   *summary
	rep   *reporter

	rng    *rand.Rand
	tracer trace.Tracer
	tally  *violationTally
	// pending is the update the last step started and no step has waited for yet.
	pending *update
}

// publish publishes the trainer's weights as version v and returns their ref.
func (l *loop) publish(ctx context.Context, v int64) (sdk.WeightsRef, error) {
	base := l.cfg.StoreURL
	if base == "" {
		base = l.ws.URL()
	}
	return l.store.PublishRef(ctx, base, v, l.tr.Weights())
}

// evalAt evaluates the fleet's policy at version v on the held-out prompts.
func (l *loop) evalAt(ctx context.Context, v int64) (*evalResult, error) {
	return evaluate(ctx, l.c, l.tk, l.samp, l.cfg.PassK, v)
}

// evalBefore evaluates the policy the run starts from, reports it beside the task's
// reference accuracies and logs it.
func (l *loop) evalBefore(ctx context.Context) error {
	var err error
	if l.sum.Before, err = l.evalAt(ctx, l.tr.Version()); err != nil {
		return err
	}
	l.rep.reference(l.tk, l.sum.Before, l.sum.Constant)
	return l.rep.log.Encode(evalRecord(l.tr.Steps(), l.tr.Version(), l.sum.Before))
}

// alignFleet brings the fleet and trainer tr to one version before the first step and
// returns the trainer to go on with. A fleet another run left at a later version is reset to
// this run's weights, adopted, or refused, as --fleet-start says (then the trainer is a new
// one); a resumed or warm-started trainer ahead of a fresh fleet updates the fleet to its
// version.
func (l *loop) alignFleet(ctx context.Context, tr *trainer.Trainer, tcfg trainer.Config) (*trainer.Trainer, error) {
	if d, err := l.c.DesiredState(ctx); err != nil {
		return nil, err
	} else if d != nil && d.Weights != nil && d.Weights.Version > tr.Version() {
		if tr, err = fleetStart(ctx, l.cfg, tr, tcfg, d); err != nil {
			return nil, err
		}
	}
	l.tr = tr
	if v := tr.Version(); v > 0 {
		serving, err := minServing(ctx, l.c)
		if err != nil {
			return tr, err
		}
		if serving < v {
			ref, err := l.publish(ctx, v)
			if err != nil {
				return tr, err
			}
			if _, err := startUpdate(ctx, l.c, ref, l.plan).wait(); err != nil {
				return tr, err
			}
		}
	}
	return tr, nil
}

// step is one GRPO step, i of cfg.Steps: generate a group per prompt (while the previous
// step's update lands), score, train, publish and start the fleet's update, evaluate when
// due, and record it all. Each phase is a child span of the step's trace.
func (l *loop) step(ctx context.Context, i int) error {
	stepStart := time.Now()
	rec := record{Step: l.tr.Steps() + 1}
	// One trace per step: its phases are child spans, and the SDK's generate and update
	// spans (and the embedded servers' spans) nest under them.
	sctx, stepSpan := l.tracer.Start(ctx, "rl.step", trace.WithAttributes(attribute.Int("rl.step", rec.Step)))
	if sc := stepSpan.SpanContext(); sc.IsSampled() {
		rec.TraceID = sc.TraceID().String()
	}
	phase := func(name string) (context.Context, func()) {
		pctx, sp := l.tracer.Start(sctx, name)
		return pctx, func() { sp.End() }
	}

	// Generate: one group per prompt, each a single request the SDK routes to one server.
	// A pending update stages and commits meanwhile; tokens carry the version that made them.
	ps := make([]problem, l.cfg.Prompts)
	for g := range ps {
		ps[g] = l.tk.Train[l.rng.IntN(len(l.tk.Train))]
	}
	t := time.Now()
	gctx, end := phase("rl.generate")
	groups, err := generate(gctx, l.c, ps, l.cfg.Group, l.samp, l.cfg.Seed<<32|uint64(rec.Step))
	end()
	if err != nil {
		return err
	}
	rec.GenerateSec = time.Since(t).Seconds()
	if l.pending != nil { // the previous step's update; this step starts the next one below
		_, end := phase("rl.update_wait")
		err := land(l.pending, &rec, l.sum)
		end()
		if err != nil {
			return err
		}
	}

	t = time.Now()
	_, end = phase("rl.score")
	samples, err := l.score(ps, groups, &rec)
	end()
	if err != nil {
		return err
	}
	rec.ScoreSec = time.Since(t).Seconds()

	t = time.Now()
	_, end = phase("rl.train")
	st, err := l.tr.Step(sctx, samples)
	end()
	if err != nil {
		return fmt.Errorf("step %d: %w", rec.Step, err)
	}
	rec.TrainSec = time.Since(t).Seconds()
	rec.fromStats(st)

	if err := l.publishAndEval(ctx, sctx, phase, i, st.Version, &rec); err != nil {
		return err
	}
	if rec.Violations, err = l.tally.observe(sctx, l.c); err != nil {
		return err
	}
	rec.StepSec = time.Since(stepStart).Seconds()
	stepSpan.End()
	l.sum.Records = append(l.sum.Records, rec)
	return l.rep.step(rec)
}

// phaseFunc starts a phase's span under the step's and returns its context and its end.
type phaseFunc func(name string) (context.Context, func())

// publishAndEval publishes the trained version v and starts updating the fleet to it: the
// fleet stages while the next batch generates, then commits. With --sync, or when step i
// evaluates, it waits for the update to land and then evaluates v. Publishing runs under the
// run's ctx; the update, under the step's sctx.
func (l *loop) publishAndEval(ctx, sctx context.Context, phase phaseFunc, i int, v int64, rec *record) error {
	t := time.Now()
	_, end := phase("rl.publish")
	ref, err := l.publish(ctx, v)
	end()
	if err != nil {
		return err
	}
	if err := l.tr.Save(l.ckpt); err != nil {
		return err
	}
	_ = l.store.Prune(3)
	rec.PublishSec = time.Since(t).Seconds()
	l.pending = startUpdate(sctx, l.c, ref, l.plan)
	last := i == l.cfg.Steps-1
	evalNow := last || (l.cfg.EvalEvery > 0 && (i+1)%l.cfg.EvalEvery == 0)
	if l.cfg.Sync || evalNow {
		_, end := phase("rl.update_wait")
		err := land(l.pending, rec, l.sum)
		end()
		if err != nil {
			return err
		}
		l.pending = nil
	}
	if !evalNow {
		return nil
	}
	ectx, end := phase("rl.eval")
	ev, err := l.evalAt(ectx, v)
	end()
	if err != nil {
		return err
	}
	rec.setEval(ev)
	if last {
		l.sum.After = ev
	}
	return nil
}

// score turns a step's groups into trainer samples (reward, logprobs, versions; groups too
// small to have a signal dropped) and records the batch's statistics in rec. Every token's
// version must be one the trainer has made (checkVersions).
func (l *loop) score(ps []problem, groups []*sdk.GenerateResult, rec *record) ([]trainer.Sample, error) {
	var samples []trainer.Sample
	rec.MinVersion, rec.MaxVersion = -1, -1
	genTokens, nSamples, correct := 0, 0, 0
	rec.Finish = map[string]int{}
	for g, res := range groups {
		distinct := map[string]bool{}
		for _, s := range res.Samples {
			ids := s.TokenIDs()
			rec.Finish[string(s.FinishReason)]++
			nSamples++
			distinct[fmt.Sprint(ids)] = true
			if len(ids) == 0 {
				continue
			}
			vs := s.WeightVersions()
			if err := checkVersions(vs, l.tr.Version()); err != nil {
				return nil, err
			}
			if rec.MinVersion < 0 || vs[0] < rec.MinVersion {
				rec.MinVersion = vs[0]
			}
			rec.MaxVersion = max(rec.MaxVersion, vs[len(vs)-1])
			lps := make([]float32, len(ids))
			for j, lp := range s.Logprobs() {
				lps[j] = float32(lp)
			}
			genTokens += len(ids)
			if l.tk.correct(ps[g], ids) {
				correct++
			}
			samples = append(samples, trainer.Sample{Prompt: ps[g].Prompt, Completion: ids, Logprobs: lps,
				Versions: vs, Reward: l.tk.reward(ps[g], ids), Group: g})
		}
		rec.DistinctPerGroup += float64(len(distinct)) / float64(len(groups))
		if g == 0 && len(res.Samples) > 0 {
			rec.Example = fmt.Sprintf("%s -> %s", ps[g].Text, l.tk.render(res.Samples[0].TokenIDs()))
		}
	}
	rec.GenTokensPerSec = float64(genTokens) / rec.GenerateSec
	rec.ResponseLen = float64(genTokens) / float64(max(nSamples, 1))
	rec.TrainCorrect = float64(correct) / float64(max(nSamples, 1))
	return dropSmallGroups(samples), nil
}

// warmStart is the supervised phase before GRPO: cfg.WarmupSteps cross-entropy steps of the
// trainer on the answer format (task.warmExample: right shape, random digits), as a pretrained
// model knows the format of an answer before RL teaches it which answer is right. It returns
// the weights GRPO starts from.
func warmStart(ctx context.Context, cfg config, tk *task, w *engmodel.Weights, sum *summary) (*engmodel.Weights, error) {
	tr, err := trainer.New(w, trainer.Config{LR: cfg.WarmupLR, MaxGradNorm: 1})
	if err != nil {
		return nil, fmt.Errorf("warm start: %w", err)
	}
	defer tr.Close()
	r := rand.New(rand.NewPCG(cfg.Seed, 0x5f7))
	for i := range cfg.WarmupSteps {
		ex := make([]trainer.Example, 64)
		for j := range ex {
			ex[j].Prompt, ex[j].Completion = tk.warmExample(r)
		}
		st, err := tr.SupervisedStep(ctx, ex)
		if err != nil {
			return nil, fmt.Errorf("warm start step %d: %w", i+1, err)
		}
		if i == 0 {
			sum.WarmupLoss[0] = st.Loss
		}
		sum.WarmupLoss[1] = st.Loss
	}
	return tr.Weights(), nil
}

// land waits for an update and records it in the step that saw it land.
func land(u *update, rec *record, sum *summary) error {
	res, err := u.wait()
	if err != nil {
		return err
	}
	sum.Updates++
	rec.StageSec, rec.CommitSec = res.StageTime.Seconds(), res.CommitTime.Seconds()
	rec.BubbleMs = float64(res.MaxBubble) / float64(time.Millisecond)
	return nil
}

// generate runs one Generate per prompt, concurrently: a group of n samples each.
func generate(ctx context.Context, c *sdk.Client, ps []problem, n int, samp sdk.SamplingParams, seedBase uint64) ([]*sdk.GenerateResult, error) {
	out := make([]*sdk.GenerateResult, len(ps))
	errs := make([]error, len(ps))
	var wg sync.WaitGroup
	for g, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sp := samp
			seed := int64(seedBase*1000 + uint64(g))
			sp.Seed = &seed
			out[g], errs[g] = c.Generate(ctx, sdk.GenerateRequest{PromptTokenIDs: p.Prompt, N: n, Sampling: sp})
		}()
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// checkVersions enforces what the trainer relies on: every token carries the version that
// generated it, versions never go down within a sample, and none is newer than the trainer.
func checkVersions(vs []int64, trainerVersion int64) error {
	for j, v := range vs {
		if v < 0 || v > trainerVersion || (j > 0 && v < vs[j-1]) {
			return fmt.Errorf("token %d carries weight version %d (sample versions %v, trainer at %d)", j, v, vs, trainerVersion)
		}
	}
	return nil
}

// dropSmallGroups removes groups left with fewer than two samples.
func dropSmallGroups(s []trainer.Sample) []trainer.Sample {
	n := map[int]int{}
	for _, x := range s {
		n[x.Group]++
	}
	out := s[:0]
	for _, x := range s {
		if n[x.Group] >= 2 {
			out = append(out, x)
		}
	}
	return out
}

func meanReward(rs []record) float64 {
	if len(rs) == 0 {
		return 0
	}
	s := 0.0
	for _, r := range rs {
		s += r.Reward
	}
	return s / float64(len(rs))
}

// minServing is the lowest weight version the fleet serves.
func minServing(ctx context.Context, c *sdk.Client) (int64, error) {
	st, err := c.Status(ctx)
	if err != nil {
		return 0, err
	}
	if len(st) == 0 {
		return 0, sdk.ErrNoServers
	}
	v := st[0].WeightVersion
	for _, s := range st {
		v = min(v, s.WeightVersion)
	}
	return v, nil
}

// violationTally sums rollout_safety_violations_total over the fleet's /metrics
// across the whole run. A server that is down between its crash and the
// expiry of its heartbeat cannot be scraped; the run must outlive it (a soak
// restarts servers on purpose), so the tally keeps each server's last figure
// instead of failing the step. A restarted server's counter starts again at
// zero, so a drop is read as a restart and what it had counted is kept.
type violationTally struct {
	last map[string]int64 // server id -> the counter's value at its last scrape
	base map[string]int64 // server id -> what earlier processes of that id counted
	log  *slog.Logger
}

func newViolationTally(log *slog.Logger) *violationTally {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &violationTally{last: map[string]int64{}, base: map[string]int64{}, log: log}
}

// observe scrapes every server the fleet lists and returns the run's total.
func (v *violationTally) observe(ctx context.Context, c *sdk.Client) (int64, error) {
	st, err := c.Status(ctx)
	if err != nil {
		return 0, err
	}
	for _, s := range st {
		n, err := scrapeCounter(ctx, strings.TrimSuffix(s.AdvertiseURL, "/")+"/metrics", "rollout_safety_violations_total")
		if err != nil {
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			v.log.Warn("rl-loop: safety counter not scraped; keeping its last figure", "server_id", s.ID, "err", err)
			continue
		}
		v.record(s.ID, n)
	}
	return v.total(), nil
}

// record takes one scraped value; a value below the last one is a restart.
func (v *violationTally) record(id string, n int64) {
	if n < v.last[id] {
		v.base[id] += v.last[id]
	}
	v.last[id] = n
}

func (v *violationTally) total() int64 {
	var t int64
	for id, n := range v.last {
		t += n + v.base[id]
	}
	return t
}

func scrapeCounter(ctx context.Context, url, name string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return 0, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, err
	}
	var total float64
	if f, ok := fams[name]; ok {
		for _, m := range f.GetMetric() {
			if m.GetCounter() != nil {
				total += m.GetCounter().GetValue()
			} else if m.GetGauge() != nil {
				total += m.GetGauge().GetValue()
			}
		}
	}
	return int64(total), nil
}
