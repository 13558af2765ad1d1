package trainer

import (
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/weights"
)

// sampleFrom draws a completion of n tokens after prompt from w with model.Reference (the
// float64 reference forward) at temperature 1, returning the tokens and their float32 raw
// logprobs as a server would.
func sampleFrom(t testing.TB, w *model.Weights, r *rand.Rand, prompt []int, n int) ([]int, []float32) {
	t.Helper()
	toks := append([]int(nil), prompt...)
	var out []int
	var lps []float32
	for range n {
		lg, err := model.Reference(w, toks)
		require.NoError(t, err)
		last := lg[len(lg)-1]
		mx := kernels.MaxF32(last)
		lse := math.Log(kernels.SumExpShifted(last, mx))
		u, acc, pick := r.Float64(), 0.0, len(last)-1
		for i, x := range last {
			acc += math.Exp(float64(x) - float64(mx) - lse)
			if u < acc {
				pick = i
				break
			}
		}
		out = append(out, pick)
		lps = append(lps, float32(float64(last[pick])-float64(mx)-lse))
		toks = append(toks, pick)
	}
	return out, lps
}

// rollout generates groups of g completions for each prompt with the trainer's current weights
// (tagged with its version) and scores them with reward.
func rollout(t testing.TB, tr *Trainer, r *rand.Rand, prompts [][]int, g, n int, reward func([]int) float64) []Sample {
	t.Helper()
	w, ver := tr.Weights(), tr.Version()
	var out []Sample
	for gi, p := range prompts {
		for range g {
			comp, lps := sampleFrom(t, w, r, p, n)
			vs := make([]int64, n)
			for i := range vs {
				vs[i] = ver
			}
			out = append(out, Sample{Prompt: p, Completion: comp, Logprobs: lps, Versions: vs, Reward: reward(comp), Group: gi})
		}
	}
	return out
}

func meanReward(s []Sample) float64 {
	m := 0.0
	for _, x := range s {
		m += x.Reward
	}
	return m / float64(len(s))
}

// TestGRPORaisesReward runs a real, small GRPO loop on a verifiable task: reward = fraction of
// completion tokens equal to target. A random tiny model emits it about 1/vocab of the time.
func TestGRPORaisesReward(t *testing.T) {
	c := tinyConfig(true)
	c.VocabSize = 8
	w, err := model.Random(c, 42)
	require.NoError(t, err)
	tr, err := New(w, Config{LR: 2e-2, Workers: 1})
	require.NoError(t, err)
	defer tr.Close()
	const target = 3
	reward := func(comp []int) float64 {
		k := 0
		for _, id := range comp {
			if id == target {
				k++
			}
		}
		return float64(k) / float64(len(comp))
	}
	r := rand.New(rand.NewPCG(1, 1))
	prompts := [][]int{{0, 5}, {0, 6}, {0, 7}, {0, 2}}
	var first, last float64
	const steps = 12
	for i := range steps {
		s := rollout(t, tr, r, prompts, 8, 6, reward)
		st, err := tr.Step(t.Context(), s)
		require.NoError(t, err)
		require.Less(t, st.MismatchMax, 1e-4, "trainer and reference logprobs of the same weights")
		if i == 0 {
			first = st.RewardMean
		}
		last = st.RewardMean
		t.Logf("step %d: reward mean %.3f max %.3f loss %.4f grad norm %.3f mismatch mean %.2g max %.2g",
			st.Step, st.RewardMean, st.RewardMax, st.Loss, st.GradNorm, st.MismatchMeanAbs, st.MismatchMax)
	}
	final := meanReward(rollout(t, tr, r, prompts, 8, 6, reward))
	t.Logf("reward: first step %.3f, last step %.3f, after training %.3f", first, last, final)
	require.Greater(t, final, 2*first)
	require.Greater(t, final, 0.5)
}

func testSamples(t testing.TB, tr *Trainer, seed uint64) []Sample {
	r := rand.New(rand.NewPCG(seed, 3))
	return rollout(t, tr, r, [][]int{{0, 5, 2}, {0, 7}}, 3, 5, func(c []int) float64 { return float64(c[0] % 3) })
}

// TestMicroBatchesMatchOneBatch checks that accumulating over micro-batches gives the update
// of one big batch.
func TestMicroBatchesMatchOneBatch(t *testing.T) {
	c := tinyConfig(false)
	c.VocabSize = 97 // the LM head's gradient accumulates transposed across micro-batches
	w := randomWeights(t, c, 4)
	one, err := New(w, Config{Workers: 1})
	require.NoError(t, err)
	defer one.Close()
	many, err := New(w, Config{Workers: 2, MicroBatchTokens: 8})
	require.NoError(t, err)
	defer many.Close()
	s := testSamples(t, one, 1)
	a, err := one.Step(t.Context(), s)
	require.NoError(t, err)
	b, err := many.Step(t.Context(), s)
	require.NoError(t, err)
	require.Equal(t, 1, a.MicroBatches)
	require.Greater(t, b.MicroBatches, 2)
	require.InDelta(t, a.Loss, b.Loss, 1e-6)
	require.InDelta(t, a.GradNorm, b.GradNorm, 1e-5*a.GradNorm)
	wa, wb := one.Weights(), many.Weights()
	ta, tb := wa.Tensors(), wb.Tensors()
	for i := range ta {
		for j, v := range *ta[i].Data {
			require.InDelta(t, v, (*tb[i].Data)[j], 1e-6, ta[i].Name)
		}
	}
}

// TestZeroAdvantageSkipsBackward checks that samples of groups without signal share
// micro-batches of their own, which skip the backward pass, and that the update equals one
// computed in a single micro-batch.
func TestZeroAdvantageSkipsBackward(t *testing.T) {
	w := randomWeights(t, tinyConfig(true), 4)
	whole, err := New(w, Config{Workers: 1})
	require.NoError(t, err)
	defer whole.Close()
	split, err := New(w, Config{Workers: 1, MicroBatchTokens: 7}) // one sample each
	require.NoError(t, err)
	defer split.Close()
	s := testSamples(t, whole, 3)
	for i := range s {
		switch s[i].Group {
		case 0:
			s[i].Reward = 1 // every sample of group 0 alike: no signal
		default:
			s[i].Reward = float64(i % 2)
		}
	}
	a, err := whole.Step(t.Context(), s)
	require.NoError(t, err)
	b, err := split.Step(t.Context(), s)
	require.NoError(t, err)
	require.Equal(t, 1, a.ZeroAdvantageGroups)
	require.Equal(t, 1, a.BackwardPasses)
	require.Equal(t, 6, b.MicroBatches)
	require.Equal(t, 3, b.BackwardPasses, "the three zero-advantage samples skip backward")
	require.InDelta(t, a.MismatchMax, b.MismatchMax, 1e-12)
	wa, wb := whole.Weights(), split.Weights()
	for i, ts := range wa.Tensors() {
		for j, v := range *ts.Data {
			require.InDelta(t, v, (*wb.Tensors()[i].Data)[j], 1e-6, ts.Name)
		}
	}
}

// TestCheckpointResume checks that save+resume continues exactly like an uninterrupted run,
// and that the saved weights are what the engine loads.
func TestCheckpointResume(t *testing.T) {
	w := randomWeights(t, tinyConfig(true), 9)
	cfg := Config{Workers: 1, Schedule: ScheduleCosine, TotalSteps: 5, WarmupSteps: 1, Version: 10}
	straight, err := New(w, cfg)
	require.NoError(t, err)
	defer straight.Close()
	a, err := New(w, cfg)
	require.NoError(t, err)
	ctx := t.Context()
	batches := [][]Sample{}
	for i := range 3 {
		s := testSamples(t, straight, uint64(i))
		batches = append(batches, s)
		_, err := straight.Step(ctx, s)
		require.NoError(t, err)
	}
	for _, s := range batches[:2] {
		_, err := a.Step(ctx, s)
		require.NoError(t, err)
	}
	dir := filepath.Join(t.TempDir(), "ckpt")
	require.False(t, HasCheckpoint(dir))
	require.NoError(t, a.Save(dir))
	require.True(t, HasCheckpoint(dir))
	a.Close()

	loaded, err := weights.LoadHF(dir) // the engine's loader reads the checkpoint as it is
	require.NoError(t, err)
	require.Equal(t, a.p.weights().Embed, loaded.Embed)

	b, err := Resume(dir, cfg)
	require.NoError(t, err)
	defer b.Close()
	require.Equal(t, 2, b.Steps())
	require.Equal(t, int64(12), b.Version())
	st, err := b.Step(ctx, batches[2])
	require.NoError(t, err)
	require.Equal(t, cfg.withDefaults().LRAt(2), st.LR)
	sw, bw := straight.Weights(), b.Weights()
	for i, ts := range sw.Tensors() {
		require.True(t, slices.Equal(*ts.Data, *bw.Tensors()[i].Data), "%s: resumed run equals the uninterrupted one bit for bit", ts.Name)
	}
}

func TestLRSchedule(t *testing.T) {
	c := Config{LR: 1, MinLR: 0.1, WarmupSteps: 2, Schedule: ScheduleCosine, TotalSteps: 6}.withDefaults()
	require.InDelta(t, 0.5, c.LRAt(0), 1e-12)
	require.InDelta(t, 1, c.LRAt(1), 1e-12)
	require.InDelta(t, 1, c.LRAt(2), 1e-12)
	require.InDelta(t, 0.55, c.LRAt(4), 1e-12) // halfway down the cosine
	require.InDelta(t, 0.1, c.LRAt(6), 1e-12)
	require.InDelta(t, 0.1, c.LRAt(100), 1e-12)
	k := Config{LR: 0.3}.withDefaults()
	require.Equal(t, 0.3, k.LRAt(1000))
}

// TestAdamWUpdate checks one AdamW update against the formula on a single value, and that
// clipping scales the gradient and weight decay skips norm gains.
func TestAdamWUpdate(t *testing.T) {
	c := tinyConfig(true)
	p := newParams[float32](c)
	g := newParams[float32](c)
	a := newAdamW(c)
	pool := kernels.NewPool(2)
	defer pool.Close()
	p.embed[0], g.embed[0] = 0.5, 2
	p.finalNorm[0], g.finalNorm[0] = 1, -1
	const lr, b1, b2, eps, wd, scale = 0.1, 0.9, 0.99, 1e-8, 0.01, 0.5
	a.update(pool, p, g, 1, lr, b1, b2, eps, wd, scale)
	// Step 1: m̂ = g·scale, v̂ = (g·scale)², so the Adam step is lr·sign(g) (plus decay).
	require.InDelta(t, 0.5-lr*(1+wd*0.5), p.embed[0], 1e-6)
	require.InDelta(t, 1+lr, p.finalNorm[0], 1e-6, "no decay on norm gains")
	require.InDelta(t, (1-b1)*1, a.m.embed[0], 1e-7)
	require.InDelta(t, (1-b2)*1, a.v.embed[0], 1e-7)
	require.Equal(t, float32(0), p.embed[1], "zero gradient, zero weight: unchanged")
}

// TestMismatchAgainstEngine trains on samples whose rollout logprobs come from the engine's
// paged forward: the reported trainer-rollout mismatch is float32 rounding of the logprob.
func TestMismatchAgainstEngine(t *testing.T) {
	c := tinyConfig(false)
	w := randomWeights(t, c, 5)
	tr, err := New(w, Config{Workers: 1})
	require.NoError(t, err)
	defer tr.Close()
	r := rand.New(rand.NewPCG(3, 3))
	var s []Sample
	for i, p := range randomPairs(r, c.VocabSize, [2]int{3, 12}, [2]int{5, 20}, [2]int{2, 7}, [2]int{4, 9}) {
		eng := engineLogprobs(t, w, p)
		lps := make([]float32, len(eng))
		for j, v := range eng {
			lps[j] = float32(v)
		}
		s = append(s, Sample{Prompt: p.prompt, Completion: p.completion, Logprobs: lps,
			Versions: make([]int64, len(lps)), Reward: float64(i % 2), Group: i / 2})
	}
	st, err := tr.Step(t.Context(), s)
	require.NoError(t, err)
	t.Logf("mismatch vs engine: mean %.3g max %.3g over %d tokens", st.MismatchMeanAbs, st.MismatchMax, st.OnPolicyTokens)
	require.Less(t, st.MismatchMax, 1e-6)
	require.Equal(t, 48, st.OnPolicyTokens)
	require.Zero(t, st.ClipFraction)
}

// TestMismatchAgainstLowPrecisionRollouts: rollout logprobs from a bf16, int8 or w8a8 engine
// of the trainer's float32 weights open a policy gap; MismatchKL reports it as the k3
// estimate of KL(rollout‖trainer) over the sampled tokens, int8's and w8a8's larger than
// bf16's.
func TestMismatchAgainstLowPrecisionRollouts(t *testing.T) {
	c := tinyConfig(false)
	w := randomWeights(t, c, 5)
	r := rand.New(rand.NewPCG(3, 3))
	pairs := randomPairs(r, c.VocabSize, [2]int{3, 12}, [2]int{5, 20}, [2]int{2, 7}, [2]int{4, 9})
	kls := map[kernels.Precision]float64{}
	for _, prec := range []kernels.Precision{kernels.F32, kernels.BF16, kernels.Int8, kernels.W8A8} {
		tr, err := New(w, Config{Workers: 1})
		require.NoError(t, err)
		var s []Sample
		var want float64
		n := 0
		for i, p := range pairs {
			f32, low := engineLogprobs(t, w, p), engineLogprobsAt(t, w, p, prec)
			lps := make([]float32, len(low))
			for j, v := range low {
				lps[j] = float32(v)
				d := f32[j] - float64(lps[j])
				want += math.Expm1(d) - d
				n++
			}
			s = append(s, Sample{Prompt: p.prompt, Completion: p.completion, Logprobs: lps,
				Versions: make([]int64, len(lps)), Reward: float64(i % 2), Group: i / 2})
		}
		st, err := tr.Step(t.Context(), s)
		require.NoError(t, err)
		tr.Close()
		want /= float64(n)
		t.Logf("%s rollouts: mismatch mean %.3g max %.3g, KL %.3g", prec, st.MismatchMeanAbs, st.MismatchMax, st.MismatchKL)
		require.InDelta(t, want, st.MismatchKL, 1e-6+1e-3*want)
		kls[prec] = st.MismatchKL
	}
	require.Less(t, kls[kernels.F32], 1e-10)
	require.Greater(t, kls[kernels.BF16], 1e-9)
	require.Greater(t, kls[kernels.Int8], kls[kernels.BF16])
	require.Greater(t, kls[kernels.W8A8], kls[kernels.BF16])
}

// TestStaleTokensTruncated checks that tokens of an older version count as stale, with
// their ratios truncated at the cap when the rollout was much less likely than the trainer.
func TestStaleTokensTruncated(t *testing.T) {
	w := randomWeights(t, tinyConfig(true), 6)
	tr, err := New(w, Config{Workers: 1, Version: 3, TISCap: 1.5})
	require.NoError(t, err)
	defer tr.Close()
	s := testSamples(t, tr, 2)
	for i := range s {
		for j := range s[i].Versions {
			if j%2 == 0 {
				s[i].Versions[j] = 2
				s[i].Logprobs[j]-- // the old policy found the token e times less likely
			}
		}
	}
	st, err := tr.Step(t.Context(), s)
	require.NoError(t, err)
	require.Equal(t, 18, st.StaleTokens)
	require.Equal(t, 12, st.OnPolicyTokens)
	require.Equal(t, 1.0, st.TruncatedFraction)
	require.Equal(t, int64(4), st.Version)
}

func TestKLReference(t *testing.T) {
	w := randomWeights(t, tinyConfig(true), 6)
	tr, err := New(w, Config{Workers: 1, KLCoef: 0.5, LR: 0.05})
	require.NoError(t, err)
	defer tr.Close()
	st, err := tr.Step(t.Context(), testSamples(t, tr, 1))
	require.NoError(t, err)
	require.InDelta(t, 0, st.KL, 1e-9, "policy equals the reference before the first update")
	st, err = tr.Step(t.Context(), testSamples(t, tr, 2))
	require.NoError(t, err)
	require.Greater(t, st.KL, 0.0)
	require.Greater(t, st.Time.Reference, time.Duration(0))
}

// TestSaveSurvivesACrash: wherever a crash stops Save, a complete checkpoint remains, the
// new one or the one before, and the next Save cleans up after the crash.
func TestSaveSurvivesACrash(t *testing.T) {
	w := randomWeights(t, tinyConfig(true), 3)
	cfg := Config{Workers: 1, Version: 1}
	tr, err := New(w, cfg)
	require.NoError(t, err)
	defer tr.Close()
	dir := filepath.Join(t.TempDir(), "ckpt")
	require.NoError(t, tr.Save(dir))
	_, err = tr.Step(t.Context(), testSamples(t, tr, 1))
	require.NoError(t, err)

	resumedSteps := func() int {
		t.Helper()
		require.True(t, HasCheckpoint(dir))
		r, err := Resume(dir, cfg)
		require.NoError(t, err)
		defer r.Close()
		return r.Steps()
	}
	// A crash while the new checkpoint is being written: the old one is untouched.
	require.NoError(t, os.MkdirAll(filepath.Join(dir+".tmp", StateDir), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir+".tmp", "model.safetensors"), []byte("half"), 0o644))
	require.Equal(t, 0, resumedSteps())

	// A crash between moving the old checkpoint aside and moving the new one in.
	require.NoError(t, os.Rename(dir, dir+".prev"))
	require.Equal(t, 0, resumedSteps(), "the previous checkpoint is found")

	// The next save puts the new checkpoint in place and removes what the crashes left.
	require.NoError(t, tr.Save(dir))
	require.Equal(t, 1, resumedSteps())
	for _, leftover := range []string{dir + ".tmp", dir + ".prev"} {
		_, err := os.Stat(leftover)
		require.ErrorIs(t, err, os.ErrNotExist, leftover)
	}
	// And again over a complete checkpoint.
	require.NoError(t, tr.Save(dir))
	require.Equal(t, 1, resumedSteps())
	_, err = os.Stat(dir + ".prev")
	require.ErrorIs(t, err, os.ErrNotExist)
}
