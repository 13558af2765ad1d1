package bench

import (
	"context"
	"fmt"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/sample"
)

// runEngine starts an engine on w and returns it with its stop function.
// The KV pool is prefaulted, as `rollout serve` does by default: a benchmark measures a serving
// engine, not the first touch of its memory.
func runEngine(ctx context.Context, cfg engine.Config) (*engine.Engine, func(), error) {
	cfg.PrefaultKV = true
	e, err := engine.New(cfg)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = e.Run(ctx); close(done) }()
	return e, func() { cancel(); <-done }, nil
}

func greedyParams(n int) sample.Params {
	p := sample.Defaults()
	p.Temperature = 0
	p.MaxTokens = n
	p.IgnoreEOS = true
	return p
}

func benchPrompt(n, salt, vocab int) []int {
	ids := make([]int, n)
	for i := range ids {
		ids[i] = (i*7919 + salt*104729 + 3) % vocab
	}
	return ids
}

// ConcurrentResult is aggregate greedy decode throughput at one concurrency.
type ConcurrentResult struct {
	Preset       string  `json:"preset"`
	Precision    string  `json:"precision"`
	Concurrency  int     `json:"concurrency"`
	Tokens       int     `json:"tokens_per_request"`
	TokensPerSec float64 `json:"tokens_per_s"`
	// SpeedupVsBatch1 is TokensPerSec over the concurrency-1 figure of the same round (the
	// median of the rounds' ratios when there are several).
	SpeedupVsBatch1 float64 `json:"speedup_vs_batch1"`
	// MatMulGFLOPs is the requests' MatMul flops (MatMulFlopsPerRequest: their prompts'
	// too) over the time they took, and OfPeak the median over the rounds of each round's
	// figure over the FMA peak probed at the round's start (PeakRuns): how close the aggregate
	// decode's matrix work is to the compute limit, each side measured on the same machine.
	MatMulGFLOPs float64 `json:"matmul_gflop_per_s"`
	OfPeak       float64 `json:"of_peak,omitempty"`
	// Runs holds each round's tokens/s when the figure is a median of several rounds.
	Runs     []float64 `json:"runs,omitempty"`
	PeakRuns []float64 `json:"peak_runs_gflop_per_s,omitempty"`
}

// Concurrent measures aggregate decode tokens/s with c concurrent greedy requests of tokens
// tokens each (8-token prompts), through the real engine serving w at precision prec.
func Concurrent(ctx context.Context, w *model.Weights, preset string, prec kernels.Precision, c, tokens, workers int) (ConcurrentResult, error) {
	freshHeap()
	e, stop, err := runEngine(ctx, engine.Config{Weights: w, MaxNumSeqs: c, MaxBatchedTokens: 2048, Workers: workers, Precision: prec})
	if err != nil {
		return ConcurrentResult{}, err
	}
	defer stop()
	// Warm up: one short request.
	if _, err := generate(ctx, e, "warm", benchPrompt(8, 999, w.Config.VocabSize), 2); err != nil {
		return ConcurrentResult{}, err
	}
	start := time.Now()
	errs := make(chan error, c)
	for i := range c {
		go func() {
			_, err := generate(ctx, e, fmt.Sprintf("r%d", i), benchPrompt(concurrentPrompt, i, w.Config.VocabSize), tokens)
			errs <- err
		}()
	}
	for range c {
		if err := <-errs; err != nil {
			return ConcurrentResult{}, err
		}
	}
	el := time.Since(start).Seconds()
	tps := float64(c*tokens) / el
	return ConcurrentResult{Preset: preset, Precision: prec.String(), Concurrency: c, Tokens: tokens, TokensPerSec: tps, MatMulGFLOPs: matmulGFLOPs(w.Config, tps, tokens)}, nil
}

// concurrentPrompt is the prompt length of Concurrent's requests.
const concurrentPrompt = 8

// matmulGFLOPs is the MatMul GFLOP/s of requests of tokens decoding at tps tokens/s in all.
func matmulGFLOPs(c model.Config, tps float64, tokens int) float64 {
	return tps * MatMulFlopsPerRequest(c, concurrentPrompt, tokens) / float64(tokens) / 1e9
}

// ConcurrentRounds runs Concurrent for each concurrency in conc, in order, rounds times over,
// and returns one result per concurrency: tokens/s is the median of its rounds (each in Runs),
// and SpeedupVsBatch1, when conc holds 1 before it, the median of each round's own ratio to
// that round's concurrency-1 figure, so that both sides of a ratio saw the same machine (on a
// shared VM the batch-1 figure alone moves 10-20% from one run to the next). OfPeak is set
// when peak, which probes the FMA peak in GFLOP/s (kernels.PeakFMA) at each round's start, is.
func ConcurrentRounds(ctx context.Context, w *model.Weights, preset string, prec kernels.Precision, conc []int, tokens, workers, rounds int, peak func() float64) ([]ConcurrentResult, error) {
	out := make([]ConcurrentResult, len(conc))
	speedups := make([][]float64, len(conc))
	shares := make([][]float64, len(conc))
	var peaks []float64
	for range max(rounds, 1) {
		p := 0.0
		if peak != nil {
			p = peak()
			peaks = append(peaks, p)
		}
		base := 0.0
		for i, c := range conc {
			r, err := Concurrent(ctx, w, preset, prec, c, tokens, workers)
			if err != nil {
				return nil, err
			}
			if c == 1 {
				base = r.TokensPerSec
			}
			if base > 0 {
				speedups[i] = append(speedups[i], r.TokensPerSec/base)
			}
			if p > 0 {
				shares[i] = append(shares[i], matmulGFLOPs(w.Config, r.TokensPerSec, tokens)/p)
			}
			runs := append(out[i].Runs, r.TokensPerSec)
			out[i], out[i].Runs = r, runs
		}
	}
	for i := range out {
		r := &out[i]
		r.TokensPerSec = Median(r.Runs)
		r.MatMulGFLOPs = matmulGFLOPs(w.Config, r.TokensPerSec, tokens)
		r.SpeedupVsBatch1 = Median(speedups[i])
		r.OfPeak, r.PeakRuns = Median(shares[i]), peaks
	}
	return out, nil
}

func generate(ctx context.Context, e *engine.Engine, id string, p []int, n int) (engine.Result, error) {
	s, err := e.Add(ctx, engine.Request{ID: id, PromptTokenIDs: p, Sampling: greedyParams(n)})
	if err != nil {
		return engine.Result{}, err
	}
	return s.Collect(ctx)
}

// PrefixResult compares time to first token with and without a prefix-cache hit.
type PrefixResult struct {
	Preset       string  `json:"preset"`
	PrefixTokens int     `json:"prefix_tokens"`
	MissTTFTms   float64 `json:"miss_ttft_ms"`
	HitTTFTms    float64 `json:"hit_ttft_ms"`
	Ratio        float64 `json:"hit_over_miss"`
	CachedTokens int     `json:"cached_tokens"`
}

// PrefixTTFT measures TTFT of a prompt sharing a prefix of prefix tokens with a previous
// request (hit) against the first such prompt (miss). The model needs a context > prefix+8.
func PrefixTTFT(ctx context.Context, w *model.Weights, preset string, prefix, workers int) (PrefixResult, error) {
	e, stop, err := runEngine(ctx, engine.Config{Weights: w, MaxNumSeqs: 4, MaxBatchedTokens: 2048, Workers: workers})
	if err != nil {
		return PrefixResult{}, err
	}
	defer stop()
	v := w.Config.VocabSize
	shared := benchPrompt(prefix, 1, v)
	ttft := func(id string, suffixSalt int) (float64, int, error) {
		p := append(append([]int(nil), shared...), benchPrompt(8, suffixSalt, v)...)
		s, err := e.Add(ctx, engine.Request{ID: id, PromptTokenIDs: p, Sampling: greedyParams(1)})
		if err != nil {
			return 0, 0, err
		}
		r, err := s.Collect(ctx)
		if err != nil {
			return 0, 0, err
		}
		return r.Timings.FirstToken.Sub(r.Timings.Arrival).Seconds() * 1e3, r.NumCachedTokens, nil
	}
	if _, _, err := ttft("warm", 50); err != nil { // warm the kernels on another prefix
		return PrefixResult{}, err
	}
	if _, err := e.ResetPrefixCache(ctx, false, false); err != nil {
		return PrefixResult{}, err
	}
	miss, _, err := ttft("miss", 2)
	if err != nil {
		return PrefixResult{}, err
	}
	hit, cached, err := ttft("hit", 3)
	if err != nil {
		return PrefixResult{}, err
	}
	return PrefixResult{Preset: preset, PrefixTokens: prefix, MissTTFTms: miss, HitTTFTms: hit, Ratio: hit / miss, CachedTokens: cached}, nil
}

// PauseResult is the latency of Pause(keep, clear_cache) with requests running.
type PauseResult struct {
	Running int `json:"running"`
	// Steps is the engine steps the pause waited for (engine DrainSteps).
	Steps          int64   `json:"engine_steps"`
	Milliseconds   float64 `json:"ms"`
	StepMillis     float64 `json:"mean_step_ms"`
	ResumeVerified bool    `json:"resumed_all"`
}

// PauseLatency starts running requests, calls Pause(keep, clearCache) and counts the engine
// steps and time until it returns.
func PauseLatency(ctx context.Context, w *model.Weights, running, workers int) (PauseResult, error) {
	e, stop, err := runEngine(ctx, engine.Config{Weights: w, MaxNumSeqs: running, MaxBatchedTokens: 2048, Workers: workers})
	if err != nil {
		return PauseResult{}, err
	}
	defer stop()
	streams, err := startDecoding(ctx, e, "p", running, w.Config.VocabSize, 100000)
	if err != nil {
		return PauseResult{}, err
	}
	stepMs := meanStepMillis(e)
	before := e.Metrics().DrainSteps
	start := time.Now()
	if _, err := e.Pause(ctx, engine.PauseKeep, true); err != nil {
		return PauseResult{}, err
	}
	r := PauseResult{Running: running, Steps: e.Metrics().DrainSteps - before, Milliseconds: time.Since(start).Seconds() * 1e3, StepMillis: stepMs}
	if err := e.Resume(ctx); err != nil {
		return r, err
	}
	e.Abort(streamIDs(streams)...)
	r.ResumeVerified = true
	for _, s := range streams {
		if _, err := s.Collect(ctx); err != nil {
			r.ResumeVerified = false
		}
	}
	return r, nil
}

// startDecoding adds n greedy requests of maxTokens tokens (8-token prompts, ids prefix0, …)
// and returns once each has produced a token, so that all of them are decoding.
func startDecoding(ctx context.Context, e *engine.Engine, prefix string, n, vocab, maxTokens int) ([]*engine.Stream, error) {
	streams := make([]*engine.Stream, 0, n)
	for i := range n {
		s, err := e.Add(ctx, engine.Request{ID: fmt.Sprintf("%s%d", prefix, i), PromptTokenIDs: benchPrompt(8, i, vocab), Sampling: greedyParams(maxTokens)})
		if err != nil {
			return nil, err
		}
		streams = append(streams, s)
	}
	for _, s := range streams {
		if _, err := s.Recv(ctx); err != nil {
			return nil, err
		}
	}
	return streams, nil
}

// streamIDs lists the streams' request ids.
func streamIDs(streams []*engine.Stream) []string {
	ids := make([]string, len(streams))
	for i, s := range streams {
		ids[i] = s.ID()
	}
	return ids
}

// meanStepMillis is the engine's mean step time over the five steps after the next one, or
// over the steps it ran before it had nothing left to run (0 when it ran none): the requests
// that keep it stepping may finish first, on a slow or loaded machine, and it must not wait
// for steps that will never come. The load may not have reached the engine yet (its
// generators just started, and the snapshot's request counts are refreshed by steps), so it
// first waits for a step; every wait is bounded.
func meanStepMillis(e *engine.Engine) float64 {
	const want, limit = 5, 10 * time.Second
	m0 := e.Metrics().Steps
	start := time.Now()
	for e.Metrics().Steps < m0+1 && time.Since(start) < limit {
		time.Sleep(100 * time.Microsecond)
	}
	m1, t1 := e.Metrics().Steps, time.Now()
	for time.Since(start) < limit {
		m := e.Metrics()
		if m.Steps >= m1+want || m.Running == 0 && m.Waiting == 0 {
			break
		}
		time.Sleep(100 * time.Microsecond)
	}
	n := e.Metrics().Steps - m1
	if n == 0 {
		return 0
	}
	return time.Since(t1).Seconds() * 1e3 / float64(n)
}

// IdleResult is the engine's CPU use while idle.
type IdleResult struct {
	Seconds        float64 `json:"seconds"`
	CPUCorePercent float64 `json:"cpu_percent_of_one_core"`
}

// IdleCPU runs a request, lets the engine go idle and measures the process's CPU time over d.
func IdleCPU(ctx context.Context, w *model.Weights, d time.Duration, workers int) (IdleResult, error) {
	e, stop, err := runEngine(ctx, engine.Config{Weights: w, Workers: workers})
	if err != nil {
		return IdleResult{}, err
	}
	defer stop()
	if _, err := generate(ctx, e, "a", benchPrompt(8, 1, w.Config.VocabSize), 16); err != nil {
		return IdleResult{}, err
	}
	// The figure is the idle engine's, not the collection of earlier benchmarks' garbage (the
	// 110m runs leave hundreds of MB) that the runtime would otherwise do in this window.
	debug.FreeOSMemory()
	time.Sleep(50 * time.Millisecond) // let spinning workers park
	c0 := cpuTime()
	t0 := time.Now()
	select {
	case <-time.After(d):
	case <-ctx.Done():
		return IdleResult{}, ctx.Err()
	}
	wall := time.Since(t0).Seconds()
	return IdleResult{Seconds: wall, CPUCorePercent: 100 * (cpuTime() - c0) / wall}, nil
}

func cpuTime() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}
