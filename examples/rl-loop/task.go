package main

import (
	"fmt"
	"math/rand/v2"
)

// The task: after the prompt "n=D" (D a random digit), write digits, ideally D itself. Each
// token earns 0.5 for being a digit and another 0.5 for being D; the reward is the mean over
// the token budget, so stopping early earns nothing for the missing tokens. A random model
// scores about 0.02 (10 of ~260 byte-level tokens are digits); a model that writes digits
// scores 0.5 and up, one that repeats the prompt's digit scores 1. The reward is verifiable
// (no reward model) and shaped: the digit half gives a random model a gradient at once, the
// copy half needs the prompt.

// task describes prompts and scores completions.
type task struct {
	bos       int // token prepended to every prompt
	maxTokens int
}

// prompt returns the prompt of digit d, as byte-level token ids after BOS.
func (t task) prompt(d int) []int {
	ids := []int{t.bos}
	for _, b := range []byte(fmt.Sprintf("n=%d", d)) {
		ids = append(ids, int(b))
	}
	return ids
}

// reward scores a completion of the prompt for digit d.
func (t task) reward(d int, completion []int) float64 {
	if t.maxTokens <= 0 {
		return 0
	}
	score := 0.0
	for _, id := range completion {
		if id >= '0' && id <= '9' {
			score += 0.5
			if id == '0'+d {
				score += 0.5
			}
		}
	}
	return score / float64(t.maxTokens)
}

// digits draws the prompt digits of one step.
func digits(r *rand.Rand, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = r.IntN(10)
	}
	return out
}

// render shows a completion as text (bytes below 256, other ids as ⟨id⟩).
func render(ids []int) string {
	b := make([]byte, 0, len(ids))
	for _, id := range ids {
		switch {
		case id >= 32 && id < 127:
			b = append(b, byte(id))
		case id < 256:
			b = append(b, '.')
		default:
			b = append(b, fmt.Sprintf("⟨%d⟩", id)...)
		}
	}
	return string(b)
}
