package bench

import (
	"context"
	"fmt"
	"runtime/debug"
	"slices"
	"time"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/kvcache"
	"github.com/rolloutkit/rollout/engine/model"
)

// DecodeResult is one model's batch-1 figures.
type DecodeResult struct {
	Preset string `json:"preset"`
	// Precision is the weights' storage (kernels.Precision): WeightBytes counts it.
	Precision          string  `json:"precision"`
	Params             int64   `json:"params"`
	WeightBytes        int64   `json:"weight_bytes"`
	Tokens             int     `json:"tokens"`
	DecodeTokensPerSec float64 `json:"decode_tokens_per_s"`
	// WeightGBPerSec is the weight bytes streamed per second by decode.
	WeightGBPerSec float64 `json:"weight_gb_per_s"`
	// BandwidthRatio is WeightGBPerSec over the machine's measured read bandwidth: with
	// repeats, the median over them of each run's rate over the bandwidth probed just before
	// it (BandwidthRuns), so that a shared host's load, which moves both, cancels out.
	BandwidthRatio float64 `json:"bandwidth_ratio"`
	// BandwidthRuns is the read bandwidth probed before each repeat, in GB/s.
	BandwidthRuns       []float64 `json:"bandwidth_runs_gb_per_s,omitempty"`
	PrefillTokens       int       `json:"prefill_tokens"`
	PrefillTokensPerSec float64   `json:"prefill_tokens_per_s"`
	// Llama2CTokensPerSec is the published range for llama2.c's run.c on this machine kind
	// (docs/perf.md), the baseline for DecodeTokensPerSec when none is measured.
	Llama2CTokensPerSec [2]float64 `json:"llama2c_tokens_per_s"`
	// VsF32 is, where f32 was measured in the same rounds, the median of each round's decode
	// rate over the f32 run's in that round.
	VsF32 float64 `json:"vs_f32,omitempty"`
	// Runs and Llama2CRuns are every repeat's decode rate, Rollout's and (with a llama2.c
	// binary) llama2.c's, measured alternately in this run; DecodeTokensPerSec and
	// Llama2CMeasured are their medians.
	Runs            []float64 `json:"decode_runs_tokens_per_s,omitempty"`
	Llama2CRuns     []float64 `json:"llama2c_runs_tokens_per_s,omitempty"`
	Llama2CMeasured float64   `json:"llama2c_measured_tokens_per_s,omitempty"`
	// Greedy are the tokens decoded from BOS, which a peer engine on the same weights must
	// reproduce.
	Greedy []int `json:"-"`
}

// Ratio is decode speed over the baseline: the llama2.c rate measured in this run, else the
// top of the published range.
func (r DecodeResult) Ratio() float64 {
	if r.Llama2CMeasured > 0 {
		return r.DecodeTokensPerSec / r.Llama2CMeasured
	}
	if r.Llama2CTokensPerSec[1] > 0 {
		return r.DecodeTokensPerSec / r.Llama2CTokensPerSec[1]
	}
	return 0
}

// Median returns the median of v (the mean of the middle two for an even count), 0 if empty.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// MedianRatio is the median of a[k]/b[k] over the rounds k both have (skipping b[k] = 0), 0
// when there are none: the ratio of two figures measured in alternating rounds, each round's
// pair under the same machine conditions.
func MedianRatio(a, b []float64) float64 {
	var r []float64
	for k := range min(len(a), len(b)) {
		if b[k] > 0 {
			r = append(r, a[k]/b[k])
		}
	}
	return Median(r)
}

// Llama2C holds llama2.c run.c's batch-1 greedy decode rates on this machine kind
// (-Ofast -march=native -fopenmp, 2 threads; docs/perf.md).
var llama2c = map[string][2]float64{"stories15m": {690, 800}, "stories110m": {47, 55}}

// Decode measures batch-1 greedy decode of tokens tokens from BOS on a random preset with its
// weights stored at prec, and a prefill of prefill tokens in one chunk.
func Decode(ctx context.Context, pool *kernels.Pool, preset string, prec kernels.Precision, tokens, prefill int, bandwidthGBs float64) (DecodeResult, error) {
	w, err := model.Preset(preset, 1)
	if err != nil {
		return DecodeResult{}, err
	}
	return DecodeWeights(ctx, pool, w, preset, prec, tokens, prefill, bandwidthGBs)
}

// DecodeWeights is Decode on weights the caller has (which a caller measuring several
// engines on one 1B model then holds once, not once per figure).
func DecodeWeights(ctx context.Context, pool *kernels.Pool, w *model.Weights, preset string, prec kernels.Precision, tokens, prefill int, bandwidthGBs float64) (DecodeResult, error) {
	freshHeap()
	m, err := model.NewAs(w, pool, nil, prec)
	if err != nil {
		return DecodeResult{}, err
	}
	c := m.Config
	tokens = min(tokens, c.MaxPositionEmbeddings)
	prefill = min(prefill, c.MaxPositionEmbeddings)
	const bs = engine.DefaultBlockSize
	// Enough blocks for the positions used, not the whole context: Llama 3.2's 131072
	// positions would take 8.6 GB of KV in float32.
	blocks := (max(tokens, prefill)+bs-1)/bs + 1
	kv, err := kvcache.NewStorage(m.KVLayout(blocks, bs))
	if err != nil {
		return DecodeResult{}, err
	}
	kv.Prefault(pool.Workers()) // as a serving engine's pool (runEngine)
	table := make([]int32, blocks-1)
	for i := range table {
		table[i] = int32(i + 1)
	}
	logits := make([]float32, c.VocabSize)
	b := &model.Batch{Tokens: []int32{int32(c.BOSTokenID)}, Positions: []int32{0}, Seq: []int32{0},
		BlockTables: [][]int32{table}, Logits: []int32{0}}
	// Warm up caches and the worker pool.
	if err := m.Forward(b, kv, logits); err != nil {
		return DecodeResult{}, err
	}
	greedy := make([]int, 0, tokens)
	start := time.Now()
	for pos := range tokens {
		if err := ctx.Err(); err != nil {
			return DecodeResult{}, err
		}
		b.Positions[0] = int32(pos)
		if err := m.Forward(b, kv, logits); err != nil {
			return DecodeResult{}, fmt.Errorf("bench: decode step %d: %w", pos, err)
		}
		b.Tokens[0] = int32(argmax(logits))
		greedy = append(greedy, int(b.Tokens[0]))
	}
	dec := time.Since(start).Seconds()

	pb := &model.Batch{BlockTables: [][]int32{table}, Logits: []int32{int32(prefill - 1)}}
	for i := range prefill {
		pb.Tokens = append(pb.Tokens, int32((i*7919)%c.VocabSize))
		pb.Positions = append(pb.Positions, int32(i))
		pb.Seq = append(pb.Seq, 0)
	}
	start = time.Now()
	if err := m.Forward(pb, kv, logits); err != nil {
		return DecodeResult{}, fmt.Errorf("bench: prefill: %w", err)
	}
	pre := time.Since(start).Seconds()

	r := DecodeResult{Preset: preset, Precision: prec.String(), Params: c.NumParams(), WeightBytes: m.WeightBytes(), Tokens: tokens,
		DecodeTokensPerSec: float64(tokens) / dec, PrefillTokens: prefill, PrefillTokensPerSec: float64(prefill) / pre,
		Llama2CTokensPerSec: llama2c[preset], Greedy: greedy}
	r.WeightGBPerSec = r.DecodeTokensPerSec * float64(r.WeightBytes) / 1e9
	if bandwidthGBs > 0 {
		r.BandwidthRatio = r.WeightGBPerSec / bandwidthGBs
	}
	return r, nil
}

func argmax(x []float32) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}

// EngineReport is what `rollout bench engine` prints.
type EngineReport struct {
	CPU        CPUInfo `json:"cpu"`
	GOMAXPROCS int     `json:"gomaxprocs"`
	Kernel     string  `json:"kernel"`
	// KernelBuild is the kernel family built in (kernels.KernelBuild): "assembly",
	// "archsimd, GOEXPERIMENT=simd", "portable, purego", …
	KernelBuild string `json:"kernel_build"`
	// W8A8Kernel is the w8a8 precision's kernel on this CPU (kernels.W8A8KernelName):
	// "amx+vnni", "vnni", "avx2", "sdot" or "generic".
	W8A8Kernel       string  `json:"w8a8_kernel"`
	ReadBandwidthGBs float64 `json:"read_bandwidth_gb_per_s"`
	// PeakGFLOPs is the register-only FMA throughput of the kernel in use on all workers
	// (kernels.PeakFMA), the ceiling of MatMul and of the aggregate decode's MatMul share.
	PeakGFLOPs float64            `json:"peak_gflop_per_s"`
	MatMul     []MatMulResult     `json:"batched_matmul,omitempty"`
	Decode     []DecodeResult     `json:"decode"`
	Concurrent []ConcurrentResult `json:"concurrent,omitempty"`
	Prefix     *PrefixResult      `json:"prefix_cache,omitempty"`
	Pause      *PauseResult       `json:"pause_keep_clear_cache,omitempty"`
	Updates    []UpdateResult     `json:"weight_update,omitempty"`
	// UpdatesSkipped says why a preset's weight update was not measured (ErrNotEnoughMemory).
	UpdatesSkipped []string    `json:"weight_update_skipped,omitempty"`
	Idle           *IdleResult `json:"idle,omitempty"`
	// Peers are rollout and llama.cpp side by side on the same weights (`--peer llamacpp`).
	Peers []PeerResult `json:"peers,omitempty"`
}

// freshHeap collects the garbage of earlier benchmarks and returns its pages to the OS
// (debug.FreeOSMemory collects first), so that the model and KV pool allocated next are fresh
// memory, as in a server that has just started: only fresh memory takes the huge pages they
// ask for (MADV_HUGEPAGE), and reused heap pages would measure a configuration no server runs.
func freshHeap() { debug.FreeOSMemory() }
