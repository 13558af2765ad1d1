package trainer

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/model"
)

// The last-digit task of the learning test: the prompt is BOS, three digits and "=", the answer
// is the last digit. Tokens 0..9 are the digits.
const (
	ldBOS   = 10
	ldEq    = 11
	ldVocab = 12
)

type ldProblem struct {
	prompt []int
	answer int
}

// ldSplit returns the 1000 prompts split, with a fixed seed, into 800 training and 200
// held-out prompts.
func ldSplit() (train, heldOut []ldProblem) {
	var all []ldProblem
	for n := range 1000 {
		a, b, c := n/100, n/10%10, n%10
		all = append(all, ldProblem{prompt: []int{ldBOS, a, b, c, ldEq}, answer: c})
	}
	r := rand.New(rand.NewPCG(27, 0))
	r.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	return all[200:], all[:200]
}

// nextToken returns the distribution of the token after prompt (temperature 1, raw, float32
// logits as a server computes them) and its argmax.
func nextToken(t testing.TB, w *model.Weights, prompt []int) ([]float64, int) {
	lg, err := model.Reference(w, prompt)
	require.NoError(t, err)
	last := lg[len(lg)-1]
	mx := kernels.MaxF32(last)
	lse := math.Log(kernels.SumExpShifted(last, mx))
	lp := make([]float64, len(last))
	best := 0
	for i, x := range last {
		lp[i] = float64(x) - float64(mx) - lse
		if x > last[best] {
			best = i
		}
	}
	return lp, best
}

// heldOutAccuracy is the greedy accuracy on the held-out prompts.
func heldOutAccuracy(t testing.TB, w *model.Weights, heldOut []ldProblem) float64 {
	ok := 0
	for _, p := range heldOut {
		if _, best := nextToken(t, w, p.prompt); best == p.answer {
			ok++
		}
	}
	return float64(ok) / float64(len(heldOut))
}

// trainLastDigit runs GRPO on the training prompts (16 groups of 8 one-token completions per
// step, sampled from the trainer's own weights at temperature 1, a KL penalty to the initial
// policy) with the given reward, and returns the held-out greedy accuracy before and after.
func trainLastDigit(t *testing.T, steps int, reward func(p ldProblem, tok int) float64) (before, after float64) {
	c := tinyConfig(true)
	c.VocabSize, c.BOSTokenID, c.EOSTokenID = ldVocab, ldBOS, ldEq
	w, err := model.Random(c, 3)
	require.NoError(t, err)
	tr, err := New(w, Config{LR: 1e-2, KLCoef: 0.05, DrGRPO: true, Workers: 1})
	require.NoError(t, err)
	defer tr.Close()
	train, heldOut := ldSplit()
	before = heldOutAccuracy(t, w, heldOut)
	r := rand.New(rand.NewPCG(1, 2))
	for range steps {
		w, v := tr.Weights(), tr.Version()
		var batch []Sample
		for g := range 16 {
			p := train[r.IntN(len(train))]
			lp, _ := nextToken(t, w, p.prompt)
			for range 8 {
				u, acc, tok := r.Float64(), 0.0, len(lp)-1
				for i, l := range lp {
					if acc += math.Exp(l); u < acc {
						tok = i
						break
					}
				}
				batch = append(batch, Sample{Prompt: p.prompt, Completion: []int{tok}, Logprobs: []float32{float32(lp[tok])},
					Versions: []int64{v}, Reward: reward(p, tok), Group: g})
			}
		}
		st, err := tr.Step(t.Context(), batch)
		require.NoError(t, err)
		require.Less(t, st.MismatchMax, 1e-5)
	}
	return before, heldOutAccuracy(t, tr.Weights(), heldOut)
}

// TestGRPOLearnsHeldOutTask (issue 27, item 7): GRPO learns a prompt-conditional task and the
// claim is checked on prompts the training never saw. A constant answer is right on about 1
// prompt in 10, so no prompt-independent habit passes; the control below shows the check
// failing for a reward that such a habit earns.
func TestGRPOLearnsHeldOutTask(t *testing.T) {
	before, after := trainLastDigit(t, 150, func(p ldProblem, tok int) float64 {
		if tok == p.answer {
			return 1
		}
		return 0
	})
	t.Logf("held-out greedy accuracy: before %.3f, after %.3f", before, after)
	require.LessOrEqual(t, before, 0.2)
	require.GreaterOrEqual(t, after, 0.9)

	// Control: rewarding a prompt-independent habit (always 7) raises the reward but not the
	// held-out accuracy.
	_, habit := trainLastDigit(t, 40, func(_ ldProblem, tok int) float64 {
		if tok == 7 {
			return 1
		}
		return 0
	})
	t.Logf("held-out greedy accuracy after rewarding the habit: %.3f", habit)
	require.Less(t, habit, 0.2)
}
