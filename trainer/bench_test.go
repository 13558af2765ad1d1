package trainer

import (
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/model"
)

// benchPairs are 4 sequences of 16 prompt and 112 completion tokens: 508 input tokens, 448
// targets, a GRPO-sized micro-batch for the stories15m shape (context 256).
func benchPairs(c model.Config) []seqPair {
	r := rand.New(rand.NewPCG(1, 1))
	return randomPairs(r, c.VocabSize, [2]int{16, 112}, [2]int{16, 112}, [2]int{16, 112}, [2]int{16, 112})
}

// BenchmarkForwardBackward times the forward and the backward pass of stories15m on one
// micro-batch in the same iterations and reports both rates (input tokens per second) and
// their ratio. Each iteration starts from repacked matrices, as a training step does after
// its update, so both passes pay their packing.
func BenchmarkForwardBackward(b *testing.B) {
	w, err := model.Preset("stories15m", 1)
	require.NoError(b, err)
	pool := kernels.NewPool(runtime.GOMAXPROCS(0))
	defer pool.Close()
	n := newNet(paramsFrom[float32](w), pool)
	bt := buildBatch(w.Config, benchPairs(w.Config))
	g := newGrads[float32](w.Config)
	glogp := make([]float64, len(bt.targets))
	for i := range glogp {
		glogp[i] = 1 / float64(len(glogp))
	}
	var a acts[float32]
	var wk work[float32]
	var fwd, bwd time.Duration
	b.ResetTimer()
	for b.Loop() {
		n.invalidate()
		t0 := time.Now()
		n.forward(bt, &a)
		t1 := time.Now()
		n.backward(bt, &a, glogp, g, &wk)
		g.flush()
		fwd += t1.Sub(t0)
		bwd += time.Since(t1)
	}
	tok := float64(len(bt.tokens) * b.N)
	b.ReportMetric(tok/fwd.Seconds(), "fwd_tok/s")
	b.ReportMetric(tok/bwd.Seconds(), "bwd_tok/s")
	b.ReportMetric(fwd.Seconds()/bwd.Seconds(), "bwd/fwd")
}

// BenchmarkStep times a whole Trainer.Step on stories15m (8 samples in 2 groups, 1016 input
// tokens, two micro-batches) and reports its breakdown.
func BenchmarkStep(b *testing.B) {
	w, err := model.Preset("stories15m", 1)
	require.NoError(b, err)
	tr, err := New(w, Config{MicroBatchTokens: 512})
	require.NoError(b, err)
	defer tr.Close()
	pairs := append(benchPairs(w.Config), benchPairs(w.Config)...)
	samples := make([]Sample, len(pairs))
	for i, p := range pairs {
		lps := make([]float32, len(p.completion))
		for j := range lps {
			lps[j] = -10
		}
		samples[i] = Sample{Prompt: p.prompt, Completion: p.completion, Logprobs: lps,
			Versions: make([]int64, len(lps)), Reward: float64(i % 3), Group: i % 2}
	}
	var sum StepTimes
	var tps float64
	b.ResetTimer()
	for b.Loop() {
		for i := range samples {
			for j := range samples[i].Versions {
				samples[i].Versions[j] = tr.Version()
			}
		}
		st, err := tr.Step(b.Context(), samples)
		require.NoError(b, err)
		sum.Forward += st.Time.Forward
		sum.Backward += st.Time.Backward
		sum.Optimizer += st.Time.Optimizer
		sum.Total += st.Time.Total
		tps += st.TokensPerSec
	}
	ms := func(d time.Duration) float64 { return d.Seconds() * 1e3 / float64(b.N) }
	b.ReportMetric(ms(sum.Forward), "forward_ms")
	b.ReportMetric(ms(sum.Backward), "backward_ms")
	b.ReportMetric(ms(sum.Optimizer), "optimizer_ms")
	b.ReportMetric(ms(sum.Total), "step_ms")
	b.ReportMetric(tps/float64(b.N), "tok/s")
}
