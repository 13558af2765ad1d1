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

	"github.com/rolloutkit/rollout/engine/load"
	"github.com/rolloutkit/rollout/engine/weights"
	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/sdk/bus/redisconf"
	"github.com/rolloutkit/rollout/sdk/protocol"
	"github.com/rolloutkit/rollout/server"
	"github.com/rolloutkit/rollout/server/embedded"
	"github.com/rolloutkit/rollout/trainer"
	"github.com/rolloutkit/rollout/trainer/weightstore"
)

// config is the loop's configuration (flags in main.go).
type config struct {
	Steps     int     // training steps
	Prompts   int     // groups (prompts) per step
	Group     int     // samples per prompt (G)
	MaxTokens int     // completion budget
	LR        float64 // peak learning rate
	KL        float64 // weight of the KL penalty to the initial policy
	Seed      uint64
	Out       string // directory for the checkpoint, weight store, log and plot
	Resume    bool   // continue from Out's checkpoint
	// FleetStart says what to do when the fleet already serves a version above this run's
	// (another run's weights): FleetStartFail, FleetStartReset or FleetStartAdopt.
	FleetStart string
	Sync       bool   // wait for each update before generating the next batch
	Policy     string // update policy: all, quorum:K, rolling:K
	Mode       string // pause mode of the cut: abort, wait, keep

	// Embedded fleet (default) or an external one over Redis.
	Servers      int
	Model        string
	OffloadBytes int64
	Redis, Fleet string
	RedisConfig  redisconf.Config // how to reach Redis beyond its URL (TLS, password file, Sentinel)
	Secret       []byte
	APIKey       string // bearer token of the servers' generation routes (external fleet only)
	StoreAddr    string // where the weight store listens
	StoreURL     string // the store's URL as the servers reach it (default: its listen URL)
	Logger       *slog.Logger
}

func (c *config) validate() error {
	switch {
	case c.Steps < 1:
		return fmt.Errorf("--steps must be >= 1 (got %d)", c.Steps)
	case c.Prompts < 1:
		return fmt.Errorf("--prompts must be >= 1 (got %d)", c.Prompts)
	case c.Group < 2:
		return fmt.Errorf("--group must be >= 2: GRPO compares the rewards within a group (got %d)", c.Group)
	case c.MaxTokens < 1:
		return fmt.Errorf("--max-tokens must be >= 1 (got %d)", c.MaxTokens)
	case c.LR <= 0:
		return fmt.Errorf("--lr must be > 0 (got %g)", c.LR)
	case c.Out == "":
		return errors.New("--out must name a directory")
	case c.Redis == "" && c.Servers < 1:
		return fmt.Errorf("--servers must be >= 1 (got %d)", c.Servers)
	case c.Redis != "" && c.Fleet == "":
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
	PlotPath   string
	LogPath    string
}

// fleet is what the loop drives: the SDK client and, when embedded, the servers.
type fleet struct {
	client *sdk.Client
	close  func() error
}

func openFleet(ctx context.Context, cfg config) (*fleet, error) {
	if cfg.Redis != "" {
		c, err := sdk.Dial(ctx, sdk.Options{RedisURL: cfg.Redis, RedisConfig: cfg.RedisConfig, Fleet: cfg.Fleet, Secret: cfg.Secret,
			APIKey: cfg.APIKey, Logger: cfg.Logger})
		if err != nil {
			return nil, err
		}
		return &fleet{client: c, close: c.Close}, nil
	}
	f, err := embedded.Start(ctx, embedded.Options{Servers: cfg.Servers, Model: cfg.Model, Secret: cfg.Secret, Logger: cfg.Logger,
		Server: func(_ int, sc *server.Config) { sc.OffloadCPUBytes = cfg.OffloadBytes }})
	if err != nil {
		return nil, err
	}
	c, err := sdk.Dial(ctx, f.DialOptions())
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
	if u.res.Outcome != sdk.OutcomeCommitted {
		return u.res, fmt.Errorf("update to version %d: %s (%s)", u.res.Version, u.res.Outcome, u.res.Reason)
	}
	return u.res, nil
}

func run(ctx context.Context, cfg config, stdout *os.File) (*summary, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if !cfg.Resume {
		// A fresh run must not serve a previous run's weights under the same version numbers.
		for _, name := range []string{"checkpoint", "weights", "log.jsonl", "reward.png"} {
			if err := os.RemoveAll(filepath.Join(cfg.Out, name)); err != nil {
				return nil, err
			}
		}
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return nil, err
	}
	m, err := load.Open(cfg.Model, "")
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", cfg.Model, err)
	}
	tcfg := trainer.Config{LR: cfg.LR, MaxGradNorm: 1, DrGRPO: true, KLCoef: cfg.KL}
	ckpt := filepath.Join(cfg.Out, "checkpoint")
	var tr *trainer.Trainer
	if cfg.Resume && trainer.HasCheckpoint(ckpt) {
		tr, err = trainer.Resume(ckpt, tcfg)
		if err == nil {
			if err = trainer.CheckShape(m.Weights.Config, tr.ModelConfig()); err != nil {
				tr.Close()
			}
		}
	} else {
		tr, err = trainer.New(m.Weights, tcfg)
	}
	if err != nil {
		return nil, fmt.Errorf("trainer: %w", err)
	}
	defer tr.Close()

	store, err := weightstore.Open(ctx, filepath.Join(cfg.Out, "weights"))
	if err != nil {
		return nil, err
	}
	ws, err := weightstore.Serve(cfg.StoreAddr, store)
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
	publish := func(v int64) (sdk.WeightsRef, error) {
		if _, err := store.Get(v); errors.Is(err, weightstore.ErrNotFound) {
			if _, err := store.Publish(ctx, v, tr.Weights()); err != nil {
				return sdk.WeightsRef{}, err
			}
		}
		base := cfg.StoreURL
		if base == "" {
			base = ws.URL()
		}
		ref, err := store.Ref(base, v)
		return sdk.WeightsRef{Version: ref.Version, URI: ref.URI, SHA256: ref.SHA256}, err
	}

	// A fleet another run left at a later version: reset it to this run's weights, adopt
	// its checkpoint, or stop, as --fleet-start says.
	if d, err := c.DesiredState(ctx); err != nil {
		return nil, err
	} else if d != nil && d.Weights != nil && d.Weights.Version > tr.Version() {
		if tr, err = fleetStart(ctx, cfg, tr, tcfg, d); err != nil {
			return nil, err
		}
		defer tr.Close()
	}

	// A resumed trainer is ahead of a fresh fleet: bring the fleet to its version first.
	if v := tr.Version(); v > 0 {
		if serving, err := minServing(ctx, c); err != nil {
			return nil, err
		} else if serving < v {
			ref, err := publish(v)
			if err != nil {
				return nil, err
			}
			if _, err := startUpdate(ctx, c, ref, plan).wait(); err != nil {
				return nil, err
			}
		}
	}

	logPath := filepath.Join(cfg.Out, "log.jsonl")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	rep := newReporter(stdout, logf, cfg.Steps)
	defer rep.finish()

	tk := task{bos: m.Weights.Config.BOSTokenID, maxTokens: cfg.MaxTokens}
	rng := rand.New(rand.NewPCG(cfg.Seed, uint64(tr.Steps())))
	sum := &summary{LogPath: logPath, PlotPath: filepath.Join(cfg.Out, "reward.png")}
	var pending *update
	for i := 0; i < cfg.Steps; i++ {
		stepStart := time.Now()
		rec := record{Step: tr.Steps() + 1}

		// Generate: one group per prompt, each a single request the SDK routes to one server.
		// A pending update stages and commits meanwhile; tokens carry the version that made them.
		ds := digits(rng, cfg.Prompts)
		t := time.Now()
		groups, err := generate(ctx, c, tk, ds, cfg.Group, cfg.MaxTokens, uint64(rec.Step))
		if err != nil {
			return sum, err
		}
		rec.GenerateSec = time.Since(t).Seconds()
		if pending != nil { // the previous step's update; this step starts the next one below
			if err := land(pending, &rec, sum); err != nil {
				return sum, err
			}
		}

		// Score.
		t = time.Now()
		var samples []trainer.Sample
		rec.MinVersion, rec.MaxVersion = -1, -1
		genTokens := 0
		for g, res := range groups {
			for _, s := range res.Samples {
				ids := s.TokenIDs()
				if len(ids) == 0 {
					continue
				}
				vs := s.WeightVersions()
				if err := checkVersions(vs, tr.Version()); err != nil {
					return sum, err
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
				samples = append(samples, trainer.Sample{Prompt: tk.prompt(ds[g]), Completion: ids, Logprobs: lps,
					Versions: vs, Reward: tk.reward(ds[g], ids), Group: g})
			}
			if g == 0 && len(res.Samples) > 0 {
				rec.Example = fmt.Sprintf("n=%d -> %s", ds[g], render(res.Samples[0].TokenIDs()))
			}
		}
		samples = dropSmallGroups(samples)
		rec.ScoreSec = time.Since(t).Seconds()
		rec.GenTokensPerSec = float64(genTokens) / rec.GenerateSec

		// Train.
		t = time.Now()
		st, err := tr.Step(ctx, samples)
		if err != nil {
			return sum, fmt.Errorf("step %d: %w", rec.Step, err)
		}
		rec.TrainSec = time.Since(t).Seconds()
		rec.Version, rec.Reward, rec.Max, rec.Loss = st.Version, st.RewardMean, st.RewardMax, st.Loss
		rec.Mismatch, rec.MismatchMax, rec.StaleTokens, rec.Tokens = st.MismatchMeanAbs, st.MismatchMax, st.StaleTokens, st.Tokens

		// Publish the new version and start updating the fleet: it stages while the next
		// batch generates, then commits.
		t = time.Now()
		ref, err := publish(st.Version)
		if err != nil {
			return sum, err
		}
		if err := tr.Save(ckpt); err != nil {
			return sum, err
		}
		_ = store.Prune(3)
		rec.PublishSec = time.Since(t).Seconds()
		pending = startUpdate(ctx, c, ref, plan)
		if cfg.Sync || i == cfg.Steps-1 {
			if err := land(pending, &rec, sum); err != nil {
				return sum, err
			}
			pending = nil
		}
		if rec.Violations, err = violations(ctx, c); err != nil {
			return sum, err
		}
		rec.StepSec = time.Since(stepStart).Seconds()
		sum.Records = append(sum.Records, rec)
		if err := rep.step(rec); err != nil {
			return sum, err
		}
	}
	rep.finish()
	sum.Violations = sum.Records[len(sum.Records)-1].Violations
	sum.FirstMean, sum.LastMean = meanReward(sum.Records[:min(5, len(sum.Records))]), meanReward(sum.Records[max(0, len(sum.Records)-5):])
	if err := plotRewards(sum.PlotPath, sum.Records); err != nil {
		return sum, fmt.Errorf("plot: %w", err)
	}
	return sum, nil
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

// generate runs one Generate per prompt digit, concurrently.
func generate(ctx context.Context, c *sdk.Client, tk task, ds []int, group, maxTokens int, step uint64) ([]*sdk.GenerateResult, error) {
	out := make([]*sdk.GenerateResult, len(ds))
	errs := make([]error, len(ds))
	var wg sync.WaitGroup
	for g, d := range ds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			seed := int64(step*1000 + uint64(g))
			out[g], errs[g] = c.Generate(ctx, sdk.GenerateRequest{PromptTokenIDs: tk.prompt(d), N: group,
				Sampling: sdk.SamplingParams{MaxTokens: maxTokens, Temperature: 1, TopP: 1, Seed: &seed}})
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

// violations sums rollout_safety_violations_total over the fleet's /metrics.
func violations(ctx context.Context, c *sdk.Client) (int64, error) {
	st, err := c.Status(ctx)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, s := range st {
		n, err := scrapeCounter(ctx, strings.TrimSuffix(s.AdvertiseURL, "/")+"/metrics", "rollout_safety_violations_total")
		if err != nil {
			return 0, fmt.Errorf("server %s: %w", s.ID, err)
		}
		total += n
	}
	return total, nil
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
