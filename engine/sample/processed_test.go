package sample

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestProcessedMatchesSampler: for every sampled token, Processed returns the very bits the
// Sampler reported in processed mode, and its distribution sums to 1 over the kept set.
func TestProcessedMatchesSampler(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	logits := make([]float32, 300)
	probs := make([]float32, len(logits))
	for _, p := range []Params{
		{Temperature: 1, TopP: 1},
		{Temperature: 0.7, TopP: 0.9},
		{Temperature: 1.3, TopK: 20, TopP: 1},
		{Temperature: 0.5, MinP: 0.05, TopP: 0.95},
		{Temperature: 0, TopP: 1},
	} {
		p.LogprobMode = LogprobProcessed
		s := New(p, 7)
		check := New(p, 0)
		for range 200 {
			for i := range logits {
				logits[i] = float32(r.NormFloat64() * 3)
			}
			res := s.Sample(logits)
			got := check.Processed(logits, res.Token, probs)
			if math.Float32bits(got) != math.Float32bits(res.Logprob) {
				t.Fatalf("%+v: token %d: Processed %v, Sampler %v", p, res.Token, got, res.Logprob)
			}
			sum := 0.0
			for _, q := range probs {
				sum += float64(q)
			}
			if math.Abs(sum-1) > 1e-5 {
				t.Fatalf("%+v: probabilities sum to %v", p, sum)
			}
		}
	}
}
