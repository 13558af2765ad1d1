package bench

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/model"
)

// MatMulResult is the batched MatMul's throughput at one shape, against the probed FMA peak.
type MatMulResult struct {
	Rows   int     `json:"rows"`
	Cols   int     `json:"cols"`
	N      int     `json:"n"`
	GFLOPs float64 `json:"gflop_per_s"`
	// OfPeak is the median over the passes of each pass's GFLOP/s over the FMA peak probed
	// just before it: on a shared host the peak itself moves, and a peak probed once, at another
	// moment, put the ratio anywhere from 0.65 to 1.01 in one afternoon.
	OfPeak float64 `json:"of_peak"`
	// Runs are the passes' GFLOP/s and PeakRuns the peak probed before each.
	Runs     []float64 `json:"runs_gflop_per_s"`
	PeakRuns []float64 `json:"peak_runs_gflop_per_s"`
}

// matmulPasses is the timed passes of MatMul, each after a probe of the peak.
const matmulPasses = 3

// MatMul measures kernels' batched MatMul of a random rows×cols matrix on n tokens through
// pool, in GFLOP/s (2·rows·cols·n flops per call): after a warm-up pass, matmulPasses passes of
// about d, each right after peak() probes the FMA peak (kernels.PeakFMA); GFLOPs is the
// fastest pass.
func MatMul(pool *kernels.Pool, rows, cols, n int, d time.Duration, peak func() float64) (MatMulResult, error) {
	r := rand.New(rand.NewPCG(uint64(rows), uint64(cols)))
	w := make([]float32, rows*cols)
	for i := range w {
		w[i] = float32(r.NormFloat64())
	}
	m, err := kernels.NewMatrix(w, rows, cols)
	if err != nil {
		return MatMulResult{}, fmt.Errorf("bench: matmul %dx%d: %w", rows, cols, err)
	}
	x, y := make([]float32, n*cols), make([]float32, n*rows)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	start := time.Now()
	m.MatMul(pool, y, x, n)
	calls := max(1, int(d/max(time.Since(start), time.Microsecond)))
	res := MatMulResult{Rows: rows, Cols: cols, N: n}
	ratios := make([]float64, 0, matmulPasses)
	for range matmulPasses {
		p := peak()
		start := time.Now()
		for range calls {
			m.MatMul(pool, y, x, n)
		}
		g := 2 * float64(rows*cols*n*calls) / time.Since(start).Seconds() / 1e9
		res.Runs, res.PeakRuns = append(res.Runs, g), append(res.PeakRuns, p)
		res.GFLOPs = max(res.GFLOPs, g)
		if p > 0 {
			ratios = append(ratios, g/p)
		}
	}
	res.OfPeak = Median(ratios)
	return res, nil
}

// MatMulFlopsPerToken is the MatMul flops of one decoded token of c: every layer's QKV,
// output, gate, up and down projections and the classifier (attention and the vector kernels
// are not counted).
func MatMulFlopsPerToken(c model.Config) float64 {
	return bodyFlops(c) + classifierFlops(c)
}

// MatMulFlopsPerRequest is the MatMul flops of one greedy request of c with a prompt of
// prompt tokens that decodes tokens: every prompt position and every decoded token but the
// last passes through the layers, and only the tokens' logits (the prompt's last position's
// and each decoded one's but the last) go through the classifier. Counting decoded tokens
// alone left out a prompt of 8 tokens' layers, a third of the work of a 16-token request.
func MatMulFlopsPerRequest(c model.Config, prompt, tokens int) float64 {
	if tokens <= 0 {
		return 0
	}
	return float64(prompt+tokens-1)*bodyFlops(c) + float64(tokens)*classifierFlops(c)
}

// bodyFlops is one position's MatMul flops in the layers: QKV, output, gate, up and down.
func bodyFlops(c model.Config) float64 {
	h, f, kv := float64(c.HiddenSize), float64(c.IntermediateSize), float64(c.KVDim())
	return 2 * float64(c.NumHiddenLayers) * (h*(h+2*kv) + h*h + 3*h*f)
}

// classifierFlops is one position's MatMul flops in the classifier.
func classifierFlops(c model.Config) float64 {
	return 2 * float64(c.VocabSize) * float64(c.HiddenSize)
}
