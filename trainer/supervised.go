package trainer

import (
	"context"
	"time"
)

// Example is one supervised sequence: the completion is the target, the prompt the context.
type Example struct {
	// Prompt is the context's token ids (at least one).
	Prompt []int
	// Completion is the target token ids (at least one).
	Completion []int
}

// SupervisedStep applies one cross-entropy update: the token-mean negative log-likelihood of
// the examples' completions under the model's raw distribution (temperature 1, no filters,
// whatever Config.Sampling says), with the same micro-batching, gradient clipping, AdamW and
// schedule as Step. It is the warm start (SFT) before GRPO: it increments Steps and Version
// like Step. StepStats carry Loss (the mean NLL before the update), Entropy, Tokens, GradNorm,
// LR and the times; the GRPO fields are zero.
func (t *Trainer) SupervisedStep(ctx context.Context, examples []Example) (StepStats, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return StepStats{}, ErrClosed
	}
	start := time.Now()
	if len(examples) == 0 {
		return StepStats{}, ErrEmptyBatch
	}
	for i, e := range examples {
		s := Sample{Prompt: e.Prompt, Completion: e.Completion, Logprobs: make([]float32, len(e.Completion)),
			Versions: make([]int64, len(e.Completion))}
		if err := t.checkSample(i, &s); err != nil {
			return StepStats{}, err
		}
	}
	proc := t.net.proc
	t.net.proc = nil // cross-entropy is on the model's own distribution
	defer func() { t.net.proc = proc }()
	st := StepStats{Samples: len(examples)}
	for _, e := range examples {
		st.Tokens += len(e.Completion)
	}
	norm := 1 / float64(st.Tokens)
	t.g.zero()
	inputTokens := 0
	for lo := 0; lo < len(examples); {
		if err := ctx.Err(); err != nil {
			return StepStats{}, err
		}
		hi, n := lo, 0
		for hi < len(examples) {
			k := len(examples[hi].Prompt) + len(examples[hi].Completion) - 1
			if hi > lo && n+k > t.cfg.MicroBatchTokens {
				break
			}
			n += k
			hi++
		}
		b := &batch{}
		for _, e := range examples[lo:hi] {
			b.addSequence(e.Prompt, e.Completion, t.p.cfg.NumAttentionHeads)
		}
		inputTokens += n
		st.MicroBatches++
		t0 := time.Now()
		t.net.forward(b, &t.a)
		st.Time.Forward += time.Since(t0)
		glogp := make([]float64, len(b.targets))
		for k := range glogp {
			st.Loss -= t.a.logp[k] * norm
			st.Entropy += t.a.entropy[k] * norm
			glogp[k] = -norm
		}
		t0 = time.Now()
		t.net.backward(b, &t.a, glogp, t.g, &t.w)
		st.BackwardPasses++
		st.Time.Backward += time.Since(t0)
		lo = hi
	}
	return t.applyGradients(st, start, inputTokens)
}
