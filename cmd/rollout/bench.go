package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/rolloutkit/rollout/bench"
	"github.com/rolloutkit/rollout/engine/gguf"
	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/load"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/weights"
)

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "bench", Short: "Run benchmarks, each figure beside its baseline measured in the same run"}
	cmd.AddCommand(newBenchEngineCmd(), newBenchOffloadCmd(), newBenchUpdateCmd(), newBenchFleetCmd())
	return cmd
}

func newBenchEngineCmd() *cobra.Command {
	var (
		asJSON   bool
		presets  []string
		tokens   int
		prefill  int
		bwBytes  int
		workers  int
		conc     []int
		matmulN  int
		concToks int
		idleFor  time.Duration
		quick    bool
		repeats  int

		llama2cBin string
		precisions []string
		peer       peerFlags
	)
	cmd := &cobra.Command{
		Use:   "engine",
		Short: "Model and engine throughput: batch-1 and concurrent decode, prefill, bandwidth, prefix cache, pause, idle CPU",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			precs, err := parsePrecisions(precisions)
			if err != nil {
				return err
			}
			// The peer is checked first: a missing install must not cost the whole benchmark.
			var lc *bench.LlamaCpp
			var peerTypes []gguf.Type
			if peer.name != "" {
				if lc, peerTypes, err = peer.resolve(); err != nil {
					return err
				}
			}
			pool := kernels.NewPool(workers)
			defer pool.Close()
			steps := engineSteps(len(presets), len(precs), repeats, quick, idleFor > 0)
			sbs := bench.SideBySideConfig{Precs: precs, Types: peerTypes, Tokens: peer.tokens, Seqs: peer.seqs,
				Threads: cmp.Or(peer.threads, workers), Workers: workers, Rounds: repeats}
			if lc != nil {
				steps += len(presets) * sbs.Runs()
			}
			pr := newProgress(cmd.ErrOrStderr(), "bench engine", steps)
			sbs.Step = pr.step
			defer pr.done()
			rep := bench.EngineReport{CPU: bench.DescribeCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), Kernel: kernels.KernelName(), KernelBuild: kernels.KernelBuild(), W8A8Kernel: kernels.W8A8KernelName()}
			pr.step("streaming read bandwidth (%d MiB)", bwBytes>>20)
			rep.ReadBandwidthGBs = kernels.StreamReadBandwidth(pool, bwBytes)
			pr.step("peak FMA rate")
			rep.PeakGFLOPs = kernels.PeakFMA(pool, peakPass)
			for _, p := range presets {
				pr.step("batched matmul, %s FFN shape, %d tokens", p, matmulN)
				mm, err := batchedMatMul(pool, p, matmulN)
				if err != nil {
					return err
				}
				rep.MatMul = append(rep.MatMul, mm)
			}
			for _, p := range presets {
				// One weight set for every precision and repeat: generating the 1B shape takes
				// longer than decoding it.
				w, err := model.Preset(p, 1)
				if err != nil {
					return err
				}
				rs, err := decodeFigures(cmd.Context(), pr, pool, p, w, precs, tokens, prefill, bwBytes, repeats, llama2cBin, workers)
				if err != nil {
					return err
				}
				rep.Decode = append(rep.Decode, rs...)
			}
			if !quick {
				if err := engineFigures(cmd.Context(), pr, pool, &rep, presets, precs, conc, concToks, workers, repeats, idleFor); err != nil {
					return err
				}
			}
			if lc != nil {
				if err := peerFigures(cmd.Context(), pool, &rep, presets, lc, sbs); err != nil {
					return err
				}
			}
			pr.done()
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			fmt.Fprintf(out, "cpu: %s\n", rep.CPU)
			fmt.Fprintf(out, "kernels: %s (%s), w8a8 %s, %d workers, streaming read bandwidth %.1f GB/s, peak FMA %.1f GFLOP/s\n", rep.Kernel, rep.KernelBuild, rep.W8A8Kernel, workers, rep.ReadBandwidthGBs, rep.PeakGFLOPs)
			for _, mm := range rep.MatMul {
				fmt.Fprintf(out, "batched matmul %dx%d, n=%d: %.1f GFLOP/s, %.2f of peak (median of %d passes, each over the peak probed before it)\n", mm.Rows, mm.Cols, mm.N, mm.GFLOPs, mm.OfPeak, len(mm.Runs))
			}
			fmt.Fprintln(out)
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "preset\tprecision\tdecode tok/s\tvs f32\tllama2.c tok/s\tratio\tweights GB/s\tof bandwidth\tprefill tok/s")
			for _, r := range rep.Decode {
				// A preset llama2.c has no figure for (the 0.5B-1B shapes) shows none.
				base, ratio := "-", "-"
				switch {
				case r.Llama2CMeasured > 0:
					base = fmt.Sprintf("%.1f (this run)", r.Llama2CMeasured)
				case r.Llama2CTokensPerSec[1] > 0:
					base = fmt.Sprintf("%.0f-%.0f (published, other CPU)", r.Llama2CTokensPerSec[0], r.Llama2CTokensPerSec[1])
				}
				if base != "-" {
					ratio = fmt.Sprintf("%.2fx", r.Ratio())
				}
				vs := "-"
				if r.VsF32 > 0 {
					vs = fmt.Sprintf("%.2fx", r.VsF32)
				}
				fmt.Fprintf(tw, "%s\t%s\t%.1f\t%s\t%s\t%s\t%.1f\t%.2f\t%.0f\n", r.Preset, r.Precision, r.DecodeTokensPerSec, vs,
					base, ratio, r.WeightGBPerSec, r.BandwidthRatio, r.PrefillTokensPerSec)
			}
			if repeats > 1 {
				fmt.Fprintf(tw, "(medians of %d rounds, each running every precision once; vs f32: the median of each round's ratio)\n", repeats)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			printEngineFigures(out, &rep)
			printPeerFigures(out, &rep, peer, precs[0], repeats)
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, "print JSON")
	f.StringSliceVar(&presets, "presets", []string{"stories15m", "stories110m"}, "model presets to measure")
	f.IntVar(&tokens, "tokens", 256, "decode tokens per preset")
	f.IntVar(&prefill, "prefill", 256, "prefill chunk in tokens")
	f.IntVar(&bwBytes, "bandwidth-bytes", 1<<30, "bytes streamed by the bandwidth probe")
	f.IntVar(&workers, "workers", runtime.GOMAXPROCS(0), "kernel workers")
	f.IntSliceVar(&conc, "concurrency", []int{1, 8, 32, 64}, "concurrent greedy requests for the aggregate decode figures")
	f.IntVar(&matmulN, "matmul-batch", 64, "tokens of the batched matmul figure (each preset's FFN up-projection shape)")
	f.IntVar(&concToks, "concurrent-tokens", 64, "tokens per request in the aggregate decode figures")
	f.DurationVar(&idleFor, "idle", 5*time.Second, "how long to measure idle CPU")
	f.BoolVar(&quick, "quick", false, "only batch-1 decode, prefill and bandwidth")
	f.IntVar(&repeats, "repeats", 3, "batch-1 decode runs per preset (alternating with llama2.c's) and rounds of the concurrency list; medians are reported")
	f.StringSliceVar(&precisions, "precision", []string{"f32"}, "weight precisions to measure, each beside the others in the same run: f32, bf16, int8, w8a8")
	f.StringVar(&llama2cBin, "llama2c", "", "a llama2.c run binary (gcc -Ofast -march=native -fopenmp run.c -lm) to measure the baseline in the same run")
	f.StringVar(&peer.name, "peer", "", "measure a peer engine on the same weights, beside rollout: llamacpp (node-llama-cpp; make peer-install)")
	f.StringVar(&peer.module, "peer-module", "", "node-llama-cpp package directory (default $"+bench.LlamaCppModuleEnv+", else bench/peer/node_modules/node-llama-cpp)")
	f.StringSliceVar(&peer.types, "peer-types", gguf.Types(), "GGUF precisions the peer runs")
	f.IntVar(&peer.tokens, "peer-tokens", 64, "greedy tokens per sequence in the side-by-side figures")
	f.IntVar(&peer.seqs, "peer-sequences", 16, "concurrent sequences of the side-by-side aggregate figure (0: batch 1 only)")
	f.IntVar(&peer.threads, "peer-threads", 0, "the peer's threads (default --workers; llama.cpp's threads spin at barriers, so more threads than free cores collapse its speed)")
	return cmd
}

// engineSteps is the number of progress steps of bench engine: bandwidth, FMA, and per preset
// a matmul and each decode run of each precision; unless quick, per preset the concurrency
// rounds of each precision and the weight update, then prefix TTFT, pause and idle CPU. It
// must match the step calls below.
func engineSteps(presets, precs, repeats int, quick, idle bool) int {
	n := 2 + presets*(1+precs*max(repeats, 1))
	if !quick {
		n += presets*(precs+1) + 2
		if idle {
			n++
		}
	}
	return n
}

// peerFlags are the side-by-side benchmark's settings.
type peerFlags struct {
	name, module string
	types        []string
	tokens, seqs int
	threads      int
}

// resolve checks the flags and finds the peer.
func (peer peerFlags) resolve() (*bench.LlamaCpp, []gguf.Type, error) {
	if peer.name != "llamacpp" {
		return nil, nil, fmt.Errorf("--peer %q: want llamacpp", peer.name)
	}
	if peer.tokens <= 0 || peer.seqs < 0 || peer.threads < 0 {
		return nil, nil, fmt.Errorf("--peer-tokens %d, --peer-sequences %d, --peer-threads %d: want > 0, >= 0, >= 0", peer.tokens, peer.seqs, peer.threads)
	}
	var types []gguf.Type
	for _, s := range peer.types {
		t, err := gguf.ParseType(s)
		if err != nil {
			return nil, nil, err
		}
		types = append(types, t)
	}
	lc, err := bench.FindLlamaCpp(peer.module)
	if err != nil {
		return nil, nil, err
	}
	return lc, types, nil
}

// peerFigures measures, per preset, rollout and the peer side by side on the same weights
// (bench.SideBySide with cfg, its Preset set to each preset in turn).
func peerFigures(ctx context.Context, pool *kernels.Pool, rep *bench.EngineReport, presets []string, lc *bench.LlamaCpp, cfg bench.SideBySideConfig) error {
	for _, p := range presets {
		w, err := model.Preset(p, 1)
		if err != nil {
			return err
		}
		tok, err := load.BuiltinTokenizer(w.Config)
		if err != nil {
			return err
		}
		cfg.Preset = p
		rs, err := bench.SideBySide(ctx, pool, lc, w, tok, cfg)
		if err != nil {
			return err
		}
		rep.Peers = append(rep.Peers, rs...)
	}
	return nil
}

func printPeerFigures(out io.Writer, rep *bench.EngineReport, peer peerFlags, ref kernels.Precision, repeats int) {
	if len(rep.Peers) == 0 {
		return
	}
	many := ""
	if peer.seqs > 0 {
		many = fmt.Sprintf(", %d sequences after 8-token prompts", peer.seqs)
	}
	fmt.Fprintf(out, "\nside by side on the same weights (llama.cpp through node-llama-cpp; batch 1 from BOS%s; %d tokens each; medians of %d rounds, each running every row once)\n",
		many, peer.tokens, max(repeats, 1))
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	head := "preset\tengine\tprecision\tbatch-1 tok/s\tvs llama.cpp"
	if peer.seqs > 0 {
		head += fmt.Sprintf("\t%d seqs tok/s\tvs llama.cpp", peer.seqs)
	}
	fmt.Fprintf(tw, "%s\tgreedy = rollout %s\n", head, ref)
	vs := func(x float64, typ string) string {
		if x == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2fx %s", x, typ)
	}
	for _, r := range rep.Peers {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.1f\t%s", r.Preset, r.Engine, r.Precision, r.Batch1TokensPerSec, vs(r.VsPeer, r.VsPeerType))
		if peer.seqs > 0 {
			fmt.Fprintf(tw, "\t%.1f\t%s", r.AggregateTokensPerSec, vs(r.VsPeerAggregate, r.VsPeerType))
		}
		fmt.Fprintf(tw, "\t%d/%d\n", r.GreedyMatch, r.GreedyTokens)
	}
	if len(rep.Peers) > 0 {
		fmt.Fprintln(tw, "(vs llama.cpp: the median of each round's ratio to llama.cpp at about the same bytes a weight: f32, bf16, q8_0 for int8 and w8a8)")
	}
	_ = tw.Flush()
}

// decodeFigures measures batch-1 decode at each of precs in repeats rounds, each of which runs
// every precision once (and llama2.c's run after the f32 one when a binary is given), each run
// after a read-bandwidth probe of bwBytes, its ratio's baseline: a shared host's drift then moves
// all of a round's figures alike. It reports medians, and each precision's VsF32 as the median
// of each round's ratio to its f32 run.
func decodeFigures(ctx context.Context, pr *progress, pool *kernels.Pool, preset string, w *model.Weights, precs []kernels.Precision, tokens, prefill, bwBytes, repeats int, llama2cBin string, threads int) ([]bench.DecodeResult, error) {
	var l2c *bench.Llama2C
	if llama2cBin != "" && slices.Contains(precs, kernels.F32) { // llama2.c reads float32 weights only
		var err error
		if l2c, err = bench.NewLlama2C(llama2cBin, preset); err != nil {
			return nil, err
		}
		defer l2c.Close()
	}
	type runs struct{ decode, prefill, bw, ratio []float64 }
	rs, out := make([]runs, len(precs)), make([]bench.DecodeResult, len(precs))
	var base []float64
	rounds := max(repeats, 1)
	for i := range rounds {
		for pi, prec := range precs {
			with := ""
			if l2c != nil && prec == kernels.F32 {
				with = ", then llama2.c's"
			}
			pr.step("batch-1 decode, %s at %s, %d tokens, round %d of %d%s", preset, prec, tokens, i+1, rounds, with)
			// Each run beside a probe of its own: on a shared host the bandwidth moves by a
			// quarter to a half between probes a minute apart, and the ratio is the gate's figure.
			bw := kernels.StreamReadBandwidth(pool, bwBytes)
			d, err := bench.DecodeWeights(ctx, pool, w, preset, prec, tokens, prefill, bw)
			if err != nil {
				return nil, err
			}
			r := &rs[pi]
			r.decode, r.prefill = append(r.decode, d.DecodeTokensPerSec), append(r.prefill, d.PrefillTokensPerSec)
			r.bw, r.ratio = append(r.bw, bw), append(r.ratio, d.BandwidthRatio)
			if i == 0 {
				out[pi] = d
			}
			if with != "" {
				v, err := l2c.Run(ctx, tokens, threads)
				if err != nil {
					return nil, err
				}
				base = append(base, v)
			}
		}
	}
	f32 := slices.Index(precs, kernels.F32)
	for pi, prec := range precs {
		d, r := &out[pi], rs[pi]
		d.Runs, d.BandwidthRuns = r.decode, r.bw
		d.DecodeTokensPerSec, d.PrefillTokensPerSec = bench.Median(r.decode), bench.Median(r.prefill)
		d.WeightGBPerSec = d.DecodeTokensPerSec * float64(d.WeightBytes) / 1e9
		d.BandwidthRatio = bench.Median(r.ratio)
		if prec == kernels.F32 {
			d.Llama2CRuns, d.Llama2CMeasured = base, bench.Median(base)
		}
		if f32 >= 0 {
			d.VsF32 = bench.MedianRatio(r.decode, rs[f32].decode)
		}
	}
	return out, nil
}

// peakPass is the length of one pass of the FMA probe and of the batched matmul figure.
const peakPass = 200 * time.Millisecond

// batchedMatMul measures the batched MatMul at preset's FFN up-projection shape
// (intermediate × hidden) on n tokens, each pass beside a probe of the FMA peak.
func batchedMatMul(pool *kernels.Pool, preset string, n int) (bench.MatMulResult, error) {
	c, err := model.PresetConfig(preset)
	if err != nil {
		return bench.MatMulResult{}, err
	}
	return bench.MatMul(pool, c.IntermediateSize, c.HiddenSize, n, peakPass, func() float64 { return kernels.PeakFMA(pool, peakPass) })
}

// engineFigures adds the engine-level figures: aggregate decode at each concurrency, prefix
// cache TTFT, pause latency and idle CPU; the concurrency list runs repeats rounds
// (bench.ConcurrentRounds), each after a probe of the FMA peak on pool.
func engineFigures(ctx context.Context, pr *progress, pool *kernels.Pool, rep *bench.EngineReport, presets []string, precs []kernels.Precision, conc []int, tokens, workers, repeats int, idle time.Duration) error {
	for _, p := range presets {
		w, err := model.Preset(p, 1)
		if err != nil {
			return err
		}
		for _, prec := range precs {
			pr.step("concurrent decode, %s at %s, %v requests, %d rounds", p, prec, conc, max(repeats, 1))
			rs, err := bench.ConcurrentRounds(ctx, w, p, prec, conc, tokens, workers, repeats, func() float64 { return kernels.PeakFMA(pool, peakPass) })
			if err != nil {
				return err
			}
			rep.Concurrent = append(rep.Concurrent, rs...)
		}
		pr.step("weight update, %s, 32 requests decoding", p)
		u, err := weightUpdate(ctx, p, workers)
		if errors.Is(err, bench.ErrNotEnoughMemory) {
			// The other figures stand without it; being killed by the kernel would lose them.
			rep.UpdatesSkipped = append(rep.UpdatesSkipped, err.Error())
			continue
		}
		if err != nil {
			return err
		}
		rep.Updates = append(rep.Updates, u)
	}
	// A 1,024-token shared prefix needs a longer context than the stories presets have: the
	// stories15m shape with a 2,048-token context.
	cfg, err := model.PresetConfig("stories15m")
	if err != nil {
		return err
	}
	cfg.MaxPositionEmbeddings = 2048
	w, err := model.Random(cfg, 1)
	if err != nil {
		return err
	}
	pr.step("prefix-cache TTFT, 1024-token shared prefix, hit vs miss")
	pt, err := bench.PrefixTTFT(ctx, w, "stories15m@2048", 1024, workers)
	if err != nil {
		return err
	}
	rep.Prefix = &pt
	pr.step("Pause(keep, clear_cache) with 32 running")
	pl, err := bench.PauseLatency(ctx, w, 32, workers)
	if err != nil {
		return err
	}
	rep.Pause = &pl
	if idle > 0 {
		pr.step("idle engine CPU for %s", idle)
		ir, err := bench.IdleCPU(ctx, w, idle, workers)
		if err != nil {
			return err
		}
		rep.Idle = &ir
	}
	return nil
}

// weightUpdate measures one weight update of preset with 32 requests decoding, from an F32
// checkpoint in a temporary directory.
func weightUpdate(ctx context.Context, preset string, workers int) (bench.UpdateResult, error) {
	dir, err := os.MkdirTemp("", "rollout-bench-update-")
	if err != nil {
		return bench.UpdateResult{}, err
	}
	defer os.RemoveAll(dir)
	return bench.WeightUpdate(ctx, preset, 32, 2, workers, weights.F32, dir)
}

func printEngineFigures(out io.Writer, rep *bench.EngineReport) {
	if len(rep.Concurrent) > 0 {
		fmt.Fprintf(out, "\naggregate greedy decode (engine, 8-token prompts; median and range of %d rounds, speedup: median of each round's own ratio)\n", len(rep.Concurrent[0].Runs))
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "preset\tprecision\tconcurrent\ttok/s\tvs batch 1\tmatmul GFLOP/s\tof peak")
		for _, r := range rep.Concurrent {
			spread := ""
			if len(r.Runs) > 1 {
				spread = fmt.Sprintf(" (%.0f-%.0f)", slices.Min(r.Runs), slices.Max(r.Runs))
			}
			speedup := "-" // no concurrency-1 figure to divide by
			if r.SpeedupVsBatch1 > 0 {
				speedup = fmt.Sprintf("%.2fx", r.SpeedupVsBatch1)
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%.1f%s\t%s\t%.1f\t%.2f\n", r.Preset, r.Precision, r.Concurrency, r.TokensPerSec, spread, speedup, r.MatMulGFLOPs, r.OfPeak)
		}
		_ = tw.Flush()
	}
	if len(rep.Updates) > 0 {
		fmt.Fprintln(out, "\nweight update (the second of two) with 32 requests decoding: load and stage while serving, then the cut pause(keep, clear_cache) -> commit -> resume")
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "preset\tcheckpoint\tload ms\tload GB/s\tread GB/s\tsha256 GB/s\tstage ms (first)\tsteps served\tcut ms\tcut steps\tstep ms")
		for _, u := range rep.Updates {
			fmt.Fprintf(tw, "%s\t%.0f MB %s\t%.0f\t%.2f\t%.2f\t%.2f\t%.0f (%.0f)\t%d\t%.1f\t%d\t%.1f\n", u.Preset, float64(u.Bytes)/1e6, u.DType,
				u.LoadMs, u.LoadGBs, u.ReadGBs, u.SHA256GBs, u.StageMs, u.FirstStageMs, u.ServedSteps, u.CutMs, u.CutSteps, u.StepMillis)
		}
		_ = tw.Flush()
	}
	for _, why := range rep.UpdatesSkipped {
		fmt.Fprintf(out, "weight update skipped: %s\n", why)
	}
	if p := rep.Prefix; p != nil {
		fmt.Fprintf(out, "\nTTFT with a %d-token shared prefix on %s: miss %.1f ms, hit %.1f ms (%d cached) = %.3fx (goal <= 0.1x)\n",
			p.PrefixTokens, p.Preset, p.MissTTFTms, p.HitTTFTms, p.CachedTokens, p.Ratio)
	}
	if p := rep.Pause; p != nil {
		fmt.Fprintf(out, "Pause(keep, clear_cache) with %d running: %d engine steps, %.2f ms (mean step %.2f ms; goal <= 2 steps)\n",
			p.Running, p.Steps, p.Milliseconds, p.StepMillis)
	}
	if i := rep.Idle; i != nil {
		fmt.Fprintf(out, "idle engine CPU over %.1f s: %.2f%% of one core (goal < 1%%)\n", i.Seconds, i.CPUCorePercent)
	}
}

// parsePrecisions reads --precision's list, refusing unknown names and repeats.
func parsePrecisions(names []string) ([]kernels.Precision, error) {
	var out []kernels.Precision
	for _, n := range names {
		p, err := kernels.ParsePrecision(n)
		if err != nil {
			return nil, fmt.Errorf("--precision: %w", err)
		}
		if slices.Contains(out, p) {
			return nil, fmt.Errorf("--precision: %s given twice", p)
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--precision: no precision given")
	}
	return out, nil
}
