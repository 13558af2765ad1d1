package sample

import "math"

// Processed returns the log-probability of token under the distribution this Sampler samples
// from (temperature, then min-p, top-k and top-p over the row, renormalised): exactly the
// Result.Logprob a Sampler with the same Params in LogprobProcessed mode reports when it samples
// token from the same logits, bit for bit. It is how a trainer recomputes the behaviour
// policy's logprobs of a rollout. Tokens outside the kept set get -Inf; greedy Params give 0 to
// the argmax and -Inf to every other token.
//
// When probs is not nil (len(probs) >= len(logits)) it receives that distribution: the
// probability of each kept token, 0 elsewhere. Processed consumes no random draw and ignores
// the Sampler's LogprobMode.
func (s *Sampler) Processed(logits []float32, token int, probs []float32) float32 {
	if probs != nil {
		clear(probs[:len(logits)])
	}
	maxOK := negInf32
	arg := -1
	for i, x := range logits {
		if x = clean(x); x > maxOK {
			maxOK, arg = x, i
		}
	}
	if arg < 0 {
		return negInf32
	}
	var rule keepRule
	var logZ float64
	if s.greedy {
		rule = keepRule{thr: math.Inf(-1), bx: maxOK, bid: int32(arg)}
	} else {
		nOK := 1
		if s.topK > 0 {
			nOK = countValid(logits)
		}
		// haveRaw true: the raw normaliser is not wanted, so sampleDist takes the plain path
		// (the fused one computes the same weights).
		rawLSE, haveRaw := 0.0, true
		_, rule, logZ = s.sampleDist(logits, 0, false, maxOK, maxOK, nOK, &rawLSE, &haveRaw)
	}
	lp := func(i int) float64 {
		x := clean(logits[i])
		if !rule.kept(x, int32(i)) {
			return math.Inf(-1)
		}
		if s.greedy {
			return 0
		}
		return (float64(x)-float64(maxOK))*s.invT - logZ
	}
	if probs != nil {
		for i := range logits {
			if l := lp(i); !math.IsInf(l, -1) {
				probs[i] = float32(math.Exp(l))
			}
		}
	}
	if token < 0 || token >= len(logits) {
		return negInf32
	}
	return float32(lp(token))
}
