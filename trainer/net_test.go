package trainer

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/kvcache"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/sample"
)

// tinyConfig is a small Llama with GQA (4 query heads share 2 KV heads).
func tinyConfig(tied bool) model.Config {
	return model.Config{HiddenSize: 16, IntermediateSize: 24, NumHiddenLayers: 2, NumAttentionHeads: 4,
		NumKeyValueHeads: 2, VocabSize: 19, MaxPositionEmbeddings: 64, RopeTheta: 10000,
		RMSNormEps: 1e-5, TieWordEmbeddings: tied, BOSTokenID: 0, EOSTokenID: 1}
}

// randomWeights are model.Random weights with the norm gains moved off 1, so that every
// tensor's gradient is exercised by a non-trivial value.
func randomWeights(t testing.TB, c model.Config, seed uint64) *model.Weights {
	t.Helper()
	w, err := model.Random(c, seed)
	require.NoError(t, err)
	r := rand.New(rand.NewPCG(seed, 7))
	for _, ts := range w.Tensors() {
		if len(ts.Shape) == 1 {
			for i := range *ts.Data {
				(*ts.Data)[i] = float32(0.5 + r.Float64())
			}
		}
	}
	return w
}

type seqPair struct{ prompt, completion []int }

func randomPairs(r *rand.Rand, vocab int, lens ...[2]int) []seqPair {
	var out []seqPair
	for _, l := range lens {
		p := seqPair{make([]int, l[0]), make([]int, l[1])}
		for i := range p.prompt {
			p.prompt[i] = r.IntN(vocab)
		}
		for i := range p.completion {
			p.completion[i] = r.IntN(vocab)
		}
		out = append(out, p)
	}
	return out
}

func buildBatch(c model.Config, pairs []seqPair) *batch {
	b := &batch{}
	for _, p := range pairs {
		b.addSequence(p.prompt, p.completion, c.NumAttentionHeads)
	}
	return b
}

// rawLogprob is the engine sampler's raw logprob of tok: x_tok − max − log Σ exp(x − max).
func rawLogprob(logits []float32, tok int) float64 {
	mx := kernels.MaxF32(logits)
	return float64(logits[tok]) - float64(mx) - math.Log(kernels.SumExpShifted(logits, mx))
}

// engineLogprobs runs the engine's paged forward over prompt+completion[:len-1] as one prefill
// and returns the raw logprobs of the completion tokens.
func engineLogprobs(t *testing.T, w *model.Weights, p seqPair) []float64 {
	t.Helper()
	return engineLogprobsAt(t, w, p, kernels.F32)
}

// engineLogprobsAt is engineLogprobs from an engine model storing w at precision prec.
func engineLogprobsAt(t *testing.T, w *model.Weights, p seqPair, prec kernels.Precision) []float64 {
	t.Helper()
	m, err := model.NewAs(w, nil, nil, prec)
	require.NoError(t, err)
	toks := append(append([]int(nil), p.prompt...), p.completion[:len(p.completion)-1]...)
	const bs = 16
	kv, err := kvcache.NewStorage(m.KVLayout(len(toks)/bs+2, bs))
	require.NoError(t, err)
	var b model.Batch
	b.BlockTables = [][]int32{{}}
	for i := 0; i <= len(toks)/bs; i++ {
		b.BlockTables[0] = append(b.BlockTables[0], int32(i+1))
	}
	for i, id := range toks {
		b.Tokens = append(b.Tokens, int32(id))
		b.Positions = append(b.Positions, int32(i))
		b.Seq = append(b.Seq, 0)
		if i >= len(p.prompt)-1 {
			b.Logits = append(b.Logits, int32(i))
		}
	}
	v := w.Config.VocabSize
	logits := make([]float32, len(b.Logits)*v)
	require.NoError(t, m.Forward(&b, kv, logits))
	out := make([]float64, len(p.completion))
	for i, tok := range p.completion {
		out[i] = rawLogprob(logits[i*v:(i+1)*v], tok)
	}
	return out
}

func referenceLogprobs(t *testing.T, w *model.Weights, p seqPair) []float64 {
	t.Helper()
	toks := append(append([]int(nil), p.prompt...), p.completion[:len(p.completion)-1]...)
	lg, err := model.Reference(w, toks)
	require.NoError(t, err)
	out := make([]float64, len(p.completion))
	for i, tok := range p.completion {
		out[i] = rawLogprob(lg[len(p.prompt)-1+i], tok)
	}
	return out
}

// TestForwardMatchesEngine checks that the trainer's float32 logprobs equal the engine's paged
// forward (the servers' numbers) and model.Reference (float64) for the same weights and tokens,
// for tied and untied classifiers, several sequences in one batch.
func TestForwardMatchesEngine(t *testing.T) {
	pool := kernels.NewPool(2)
	defer pool.Close()
	for _, tied := range []bool{true, false} {
		c := tinyConfig(tied)
		w := randomWeights(t, c, 3)
		pairs := randomPairs(rand.New(rand.NewPCG(1, 2)), c.VocabSize, [2]int{5, 9}, [2]int{1, 30}, [2]int{12, 4})
		n := newNet(paramsFrom[float32](w), pool)
		b := buildBatch(c, pairs)
		var a acts[float32]
		n.forward(b, &a)
		var maxEngine, maxRef float64
		k := 0
		for _, p := range pairs {
			eng, ref := engineLogprobs(t, w, p), referenceLogprobs(t, w, p)
			for i := range p.completion {
				maxEngine = max(maxEngine, math.Abs(a.logp[k]-eng[i]))
				maxRef = max(maxRef, math.Abs(a.logp[k]-ref[i]))
				k++
			}
		}
		t.Logf("tied=%v: max |trainer-engine| logprob %.3g, max |trainer-reference| %.3g over %d tokens", tied, maxEngine, maxRef, k)
		require.Less(t, maxEngine, 1e-5)
		require.Less(t, maxRef, 1e-4)
	}
}

// TestGradientFiniteDifference checks the backward pass in float64 against central finite
// differences of L = Σ c_i·logp_i for sampled entries of every parameter tensor (the largest
// gradient entry and random ones), tied and untied, with GQA.
func TestGradientFiniteDifference(t *testing.T) {
	pool := kernels.NewPool(2)
	defer pool.Close()
	// processed: the logprobs of temperature 0.7 and top-p 0.9 (trainer.Config.Sampling),
	// whose gradient holds the kept set fixed.
	processed := Sampling{Temperature: 0.7, TopP: 0.9}.params()
	for _, tc := range []struct {
		tied bool
		proc *sample.Params
	}{{true, nil}, {false, nil}, {true, &processed}, {false, &processed}} {
		tied := tc.tied
		c := tinyConfig(tied)
		w := randomWeights(t, c, 11)
		r := rand.New(rand.NewPCG(5, 6))
		pairs := randomPairs(r, c.VocabSize, [2]int{3, 6}, [2]int{1, 5}, [2]int{6, 2})
		p := paramsFrom[float64](w)
		n := newNet(p, pool)
		n.proc = tc.proc
		b := buildBatch(c, pairs)
		coef := make([]float64, len(b.targets))
		for i := range coef {
			coef[i] = r.NormFloat64()
		}
		loss := func() float64 {
			var a acts[float64]
			n.forward(b, &a)
			s := 0.0
			for i, lp := range a.logp {
				if !math.IsInf(lp, -1) { // outside the kept set: no gradient
					s += coef[i] * lp
				}
			}
			return s
		}
		var a acts[float64]
		n.forward(b, &a)
		kept := 0
		for _, lp := range a.logp {
			if !math.IsInf(lp, -1) {
				kept++
			}
		}
		require.Positive(t, kept)
		g := newGrads[float64](c)
		n.backward(b, &a, coef, g, &work[float64]{})
		g.flush()

		names := w.Tensors()
		gts := g.p.tensors()
		worst := 0.0
		for ti, pt := range p.tensors() {
			gt := *gts[ti]
			idx := []int{argmaxAbs(gt)}
			for range 4 {
				idx = append(idx, r.IntN(len(gt)))
			}
			for _, i := range idx {
				const h = 1e-5
				old := (*pt)[i]
				(*pt)[i] = old + h
				lp := loss()
				(*pt)[i] = old - h
				lm := loss()
				(*pt)[i] = old
				num := (lp - lm) / (2 * h)
				den := max(math.Abs(num), math.Abs(gt[i]))
				if den < 1e-7 {
					require.InDelta(t, num, gt[i], 1e-8, "%s[%d]", names[ti].Name, i)
					continue
				}
				rel := math.Abs(num-gt[i]) / den
				worst = max(worst, rel)
				require.LessOrEqual(t, rel, 1e-3, "%s[%d]: analytic %g numeric %g", names[ti].Name, i, gt[i], num)
			}
		}
		t.Logf("tied=%v processed=%v: %d tensors, worst relative error %.3g", tied, tc.proc != nil, len(gts), worst)
	}
}

func argmaxAbs(x []float64) int {
	best := 0
	for i, v := range x {
		if math.Abs(v) > math.Abs(x[best]) {
			best = i
		}
	}
	return best
}

// TestGradientFloat32MatchesFloat64 checks the float32 backward (the packed-kernel matmuls that
// training runs) against the float64 one the finite differences verified, tensor by tensor.
func TestGradientFloat32MatchesFloat64(t *testing.T) {
	pool := kernels.NewPool(2)
	defer pool.Close()
	for _, tied := range []bool{true, false} {
		c := tinyConfig(tied)
		c.VocabSize = 97 // a classifier 6x taller than wide takes the transposed gradient path
		w := randomWeights(t, c, 21)
		r := rand.New(rand.NewPCG(8, 9))
		pairs := randomPairs(r, c.VocabSize, [2]int{4, 20}, [2]int{2, 7}, [2]int{9, 3})
		b := buildBatch(c, pairs)
		coef := make([]float64, len(b.targets))
		for i := range coef {
			coef[i] = r.NormFloat64()
		}
		n64 := newNet(paramsFrom[float64](w), pool)
		var a64 acts[float64]
		n64.forward(b, &a64)
		g64 := newGrads[float64](c)
		n64.backward(b, &a64, coef, g64, &work[float64]{})
		g64.flush()

		n32 := newNet(paramsFrom[float32](w), pool)
		var a32 acts[float32]
		n32.forward(b, &a32)
		g32 := newGrads[float32](c)
		n32.backward(b, &a32, coef, g32, &work[float32]{})
		g32.flush()

		names := w.Tensors()
		t64, t32 := g64.p.tensors(), g32.p.tensors()
		worst := 0.0
		for i := range t64 {
			var diff, norm float64
			for j, v := range *t64[i] {
				d := v - float64((*t32[i])[j])
				diff += d * d
				norm += v * v
			}
			rel := math.Sqrt(diff / norm)
			worst = max(worst, rel)
			require.Less(t, rel, 1e-4, names[i].Name)
		}
		t.Logf("tied=%v: worst relative L2 difference float32 vs float64 gradient %.3g", tied, worst)
	}
}
