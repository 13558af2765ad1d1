package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/weights"
	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/server"
	"github.com/rolloutkit/rollout/server/embedded"
)

// fleetSecret signs the benchmark fleets' messages, so signing is part of every figure.
var fleetSecret = []byte("rollout-bench-fleet-secret-0123456789abcdef")

var quiet = slog.New(slog.DiscardHandler)

// ControlResult is one control round trip figure: an SDK call (publish a signed command,
// every server verifies and runs it, pushes its ack, the SDK reads every ack) beside the
// floor on the same bus in the same run: a bare publish answered by n subscribers with a push
// each. Over Redis RawFloor is the same floor with go-redis directly (no bus layer).
type ControlResult struct {
	Transport string   `json:"transport"`
	Servers   int      `json:"servers"`
	SDK       Latency  `json:"sdk"`
	Floor     Latency  `json:"bus_floor"`
	RawFloor  *Latency `json:"raw_redis_floor,omitempty"`
	// Ratio is SDK p50 over the floor's p50 (goal <= 2).
	Ratio float64 `json:"ratio_p50"`
}

// startFleet runs n servers of modelSpec on b (nil: an in-process bus) and dials it.
func startFleet(ctx context.Context, n int, modelSpec string, b bus.Bus, tweak func(int, *server.Config)) (*embedded.Fleet, *sdk.Client, error) {
	f, err := embedded.Start(ctx, embedded.Options{Servers: n, Model: modelSpec, Secret: fleetSecret, Bus: b, Logger: quiet, Server: tweak})
	if err != nil {
		return nil, nil, err
	}
	o := f.DialOptions()
	o.Logger = quiet
	c, err := sdk.Dial(ctx, o)
	if err != nil {
		_ = f.Close()
		return nil, nil, err
	}
	return f, c, nil
}

// ControlRoundTrip measures rounds SDK round trips on n tiny servers, each a Resume of running
// servers (a no-op on the engine) with explicit targets, so only the command and its acks
// travel, beside the floor on the same bus. The SDK's rounds and the floor's alternate, one
// each in turn, so that both see the same machine: measured one after the other, a shared
// host's noise moved the ratio by a third from run to run.
func ControlRoundTrip(ctx context.Context, transport string, b bus.Bus, n, rounds int) (ControlResult, error) {
	r := ControlResult{Transport: transport, Servers: n}
	f, c, err := startFleet(ctx, n, "builtin:tiny", b, func(_ int, c *server.Config) { c.KVBlocks = 128; c.Workers = 1 })
	if err != nil {
		return r, err
	}
	defer f.Close()
	defer c.Close()
	floor, err := newBusFloor(ctx, f.Bus(), n)
	if err != nil {
		return r, err
	}
	defer floor.close()
	all := sdk.ResumeOptions{Call: sdk.Call{Targets: f.IDs()}}
	for i := range 5 { // warm the connections
		if _, err := c.Resume(ctx, all); err != nil {
			return r, err
		}
		if _, err := floor.round(ctx, -1-i); err != nil {
			return r, err
		}
	}
	lat := make([]time.Duration, 0, rounds)
	floorLat := make([]time.Duration, 0, rounds)
	for i := range rounds {
		t0 := time.Now()
		if _, err := c.Resume(ctx, all); err != nil {
			return r, err
		}
		lat = append(lat, time.Since(t0))
		d, err := floor.round(ctx, i)
		if err != nil {
			return r, err
		}
		floorLat = append(floorLat, d)
	}
	r.SDK, r.Floor = Summarize(lat), Summarize(floorLat)
	if r.Floor.P50Ms > 0 {
		r.Ratio = r.SDK.P50Ms / r.Floor.P50Ms
	}
	return r, nil
}

// busFloor is RedisFloor through the Bus interface: n subscribers on one channel, each
// pushing the ack a message names; a round publishes and pops all n acks.
type busFloor struct {
	b    bus.Bus
	n    int
	ch   string
	subs []bus.Subscription
	wg   sync.WaitGroup
}

func newBusFloor(ctx context.Context, b bus.Bus, n int) (*busFloor, error) {
	f := &busFloor{b: b, n: n, ch: "rollout-bench:{floor}:" + strconv.FormatInt(time.Now().UnixNano(), 36)}
	for i := range n {
		sub, err := b.Subscribe(ctx, f.ch)
		if err != nil {
			f.close()
			return nil, err
		}
		f.subs = append(f.subs, sub)
		f.wg.Go(func() {
			for ev := range sub.Events() {
				if ev.Kind == bus.EventMessage {
					_ = b.Push(context.Background(), string(ev.Payload), []byte(strconv.Itoa(i)), time.Minute)
				}
			}
		})
	}
	return f, nil
}

// round publishes round r's message and pops its n acks.
func (f *busFloor) round(ctx context.Context, r int) (time.Duration, error) {
	list := f.ch + ":ack:" + strconv.Itoa(r)
	t0 := time.Now()
	if _, err := f.b.Publish(ctx, f.ch, []byte(list)); err != nil {
		return 0, err
	}
	for got := 0; got < f.n; {
		vals, err := f.b.Pop(ctx, list, f.n-got, 10*time.Second)
		if err != nil {
			return 0, err
		}
		if len(vals) == 0 {
			return 0, fmt.Errorf("bench: floor: %d of %d acks after 10s", got, f.n)
		}
		got += len(vals)
	}
	return time.Since(t0), nil
}

func (f *busFloor) close() {
	for _, s := range f.subs {
		_ = s.Close()
	}
	f.wg.Wait()
}

// BubbleResult is UpdateWeights on a fleet under generation load: each server's generation
// bubble (last token before its pause to first token after its resume, as it measured it),
// the stage time apart (fetch, verify and stage while serving), the commit time, and the
// engine's mean step under that load for scale (goal: bubble <= 50 ms + one step).
type BubbleResult struct {
	Preset          string    `json:"preset"`
	Servers         int       `json:"servers"`
	Updates         int       `json:"updates"`
	CheckpointBytes int64     `json:"checkpoint_bytes"`
	BubblesMs       []float64 `json:"bubbles_ms"`
	BubbleP50Ms     float64   `json:"bubble_p50_ms"`
	BubbleMaxMs     float64   `json:"bubble_max_ms"`
	MeasuredFrac    float64   `json:"bubble_measured_fraction"`
	StageP50Ms      float64   `json:"stage_p50_ms"`
	CommitP50Ms     float64   `json:"commit_p50_ms"`
	StepMs          float64   `json:"mean_step_ms"`
}

// UpdateBubble runs updates UpdateWeights (all-or-nothing, pause abort with clear_cache,
// sleep level 1: the default plan) on servers servers of preset while 8 workers generate.
func UpdateBubble(ctx context.Context, preset string, servers, updates int, dir string) (BubbleResult, error) {
	r := BubbleResult{Preset: preset, Servers: servers, Updates: updates}
	f, c, err := startFleet(ctx, servers, "builtin:"+preset, nil, nil)
	if err != nil {
		return r, err
	}
	defer f.Close()
	defer c.Close()
	refs := make([]sdk.WeightsRef, updates)
	for i := range refs {
		p := filepath.Join(dir, fmt.Sprintf("%s-v%d", preset, i+1))
		if err := writeCheckpoint(p, preset, uint64(100+i), weights.F32); err != nil {
			return r, err
		}
		d, err := weights.Digest(ctx, p)
		if err != nil {
			return r, err
		}
		refs[i] = sdk.WeightsRef{Version: int64(i + 1), URI: "file://" + p, SHA256: d}
		if i == 0 {
			if r.CheckpointBytes, err = dirBytes(p); err != nil {
				return r, err
			}
		}
	}
	cfg, err := model.PresetConfig(preset)
	if err != nil {
		return r, err
	}
	stop := startGenerating(c, 8, cfg.VocabSize)
	defer stop()
	r.StepMs = meanStepMillis(f.Servers()[0].Engine())
	var bubbles, stages, commits []time.Duration
	measured := 0
	for _, ref := range refs {
		res, err := c.UpdateWeights(ctx, ref, sdk.Plan{})
		if err != nil {
			return r, err
		}
		for _, s := range res.Servers {
			bubbles = append(bubbles, s.Bubble)
			r.BubblesMs = append(r.BubblesMs, float64(s.Bubble)/1e6)
			if s.BubbleMeasured {
				measured++
			}
		}
		stages = append(stages, res.StageTime)
		commits = append(commits, res.CommitTime)
	}
	b := Summarize(bubbles)
	r.BubbleP50Ms = b.P50Ms
	r.BubbleMaxMs = float64(maxDuration(bubbles)) / 1e6
	r.MeasuredFrac = float64(measured) / float64(len(bubbles))
	r.StageP50Ms, r.CommitP50Ms = Summarize(stages).P50Ms, Summarize(commits).P50Ms
	return r, nil
}

// startGenerating keeps workers generating through c until the returned stop is called.
func startGenerating(c *sdk.Client, workers, vocab int) func() {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				_, _ = c.Generate(context.Background(), sdk.GenerateRequest{PromptTokenIDs: benchPrompt(8, w*1000+i, vocab), N: 2,
					Sampling: sdk.SamplingParams{MaxTokens: 64, Temperature: 1, IgnoreEOS: true}})
			}
		}()
	}
	return func() {
		close(done)
		wg.Wait()
	}
}

// GenerateResult compares aggregate generated tokens per second at the same concurrency
// through the SDK (routing, heartbeat view, continuation bookkeeping) and straight to the
// server's /generate, alternating the two so both see the same machine.
type GenerateResult struct {
	Preset       string    `json:"preset"`
	Concurrency  int       `json:"concurrency"`
	Requests     int       `json:"requests_per_run"`
	MaxTokens    int       `json:"max_tokens"`
	SDKRuns      []float64 `json:"sdk_tokens_per_s_runs"`
	DirectRuns   []float64 `json:"direct_tokens_per_s_runs"`
	SDKTokS      float64   `json:"sdk_tokens_per_s"`
	DirectTokS   float64   `json:"direct_tokens_per_s"`
	Ratio        float64   `json:"ratio"`
	SDKErrors    int64     `json:"sdk_errors"`
	DirectErrors int64     `json:"direct_errors"`
}

// GenerateVsDirect runs requests greedy-free requests of maxTokens at concurrency, repeats
// times each way, on one server of preset.
func GenerateVsDirect(ctx context.Context, preset string, concurrency, requests, maxTokens, repeats int) (GenerateResult, error) {
	r := GenerateResult{Preset: preset, Concurrency: concurrency, Requests: requests, MaxTokens: maxTokens}
	f, c, err := startFleet(ctx, 1, "builtin:"+preset, nil, nil)
	if err != nil {
		return r, err
	}
	defer f.Close()
	defer c.Close()
	cfg, err := model.PresetConfig(preset)
	if err != nil {
		return r, err
	}
	url := f.Servers()[0].URL() + "/generate"
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * concurrency}}
	defer hc.CloseIdleConnections()
	viaSDK := func(i int) (int, error) {
		res, err := c.Generate(ctx, sdk.GenerateRequest{PromptTokenIDs: benchPrompt(16, i, cfg.VocabSize),
			Sampling: sdk.SamplingParams{MaxTokens: maxTokens, Temperature: 1, IgnoreEOS: true}})
		if err != nil {
			return 0, err
		}
		return len(res.Samples[0].Tokens), nil
	}
	direct := func(i int) (int, error) {
		return postGenerate(ctx, hc, url, benchPrompt(16, i, cfg.VocabSize), maxTokens)
	}
	for k := range repeats {
		v, e := concurrentRun(concurrency, requests, k*requests, direct)
		r.DirectRuns, r.DirectErrors = append(r.DirectRuns, v), r.DirectErrors+e
		v, e = concurrentRun(concurrency, requests, k*requests, viaSDK)
		r.SDKRuns, r.SDKErrors = append(r.SDKRuns, v), r.SDKErrors+e
	}
	r.SDKTokS, r.DirectTokS = Median(r.SDKRuns), Median(r.DirectRuns)
	if r.DirectTokS > 0 {
		r.Ratio = r.SDKTokS / r.DirectTokS
	}
	return r, nil
}

// concurrentRun runs n calls of one at the given concurrency and returns tokens per second
// and the number of failed calls.
func concurrentRun(concurrency, n, offset int, one func(i int) (int, error)) (float64, int64) {
	var next, tokens, errs atomic.Int64
	var wg sync.WaitGroup
	t0 := time.Now()
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				k, err := one(offset + int(i))
				if err != nil {
					errs.Add(1)
					continue
				}
				tokens.Add(int64(k))
			}
		}()
	}
	wg.Wait()
	return float64(tokens.Load()) / time.Since(t0).Seconds(), errs.Load()
}

func postGenerate(ctx context.Context, hc *http.Client, url string, prompt []int, maxTokens int) (int, error) {
	body, err := json.Marshal(map[string]any{"prompt_token_ids": prompt, "n": 1,
		"sampling": map[string]any{"max_tokens": maxTokens, "temperature": 1, "ignore_eos": true}})
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		return 0, fmt.Errorf("bench: /generate answered %d: %s", resp.StatusCode, b)
	}
	var out struct {
		Outputs []struct {
			TokenIDs []int `json:"token_ids"`
		} `json:"outputs"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return 0, err
	}
	if len(out.Outputs) != 1 {
		return 0, fmt.Errorf("bench: /generate returned %d outputs", len(out.Outputs))
	}
	return len(out.Outputs[0].TokenIDs), nil
}

func dirBytes(dir string) (int64, error) {
	var n int64
	des, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	for _, de := range des {
		info, err := de.Info()
		if err != nil {
			return 0, err
		}
		n += info.Size()
	}
	return n, nil
}

func maxDuration(d []time.Duration) time.Duration {
	var m time.Duration
	for _, v := range d {
		m = max(m, v)
	}
	return m
}

// FleetReport is what `rollout bench fleet` measures.
type FleetReport struct {
	GOMAXPROCS int             `json:"gomaxprocs"`
	RedisURL   string          `json:"redis,omitempty"`
	RedisNote  string          `json:"redis_note,omitempty"`
	Control    []ControlResult `json:"control"`
	Bubbles    []BubbleResult  `json:"update_bubbles"`
	Generate   *GenerateResult `json:"generate,omitempty"`
}
