package sample

import (
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestPropertyMatchesReference checks random rows (with many ties) and random parameters
// against the full-sort reference: the token is in the reference kept set, its processed
// logprob is the reference's, and its raw logprob is log_softmax.
func TestPropertyMatchesReference(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(1, 300).Draw(rt, "n")
		ints := rapid.SliceOfN(rapid.IntRange(-12, 12), n, n).Draw(rt, "logits")
		row := make([]float32, n)
		for i, v := range ints {
			row[i] = float32(v) / 4
		}
		p := Params{
			Temperature: rapid.Float64Range(0.05, 4).Draw(rt, "temperature"),
			TopK:        rapid.IntRange(0, n+2).Draw(rt, "top_k"),
			TopP:        rapid.SampledFrom([]float64{1, rapid.Float64Range(0.01, 0.999).Draw(rt, "p")}).Draw(rt, "top_p"),
			MinP:        rapid.SampledFrom([]float64{0, rapid.Float64Range(0.001, 0.9).Draw(rt, "m")}).Draw(rt, "min_p"),
			Logprobs:    rapid.IntRange(0, MaxLogprobs).Draw(rt, "logprobs"),
		}
		seed := rapid.Uint64().Draw(rt, "seed")
		kept := refKept(row, p.Temperature, p.TopK, p.TopP, p.MinP)
		if p.TopP < 1 && (len(refKept(row, p.Temperature, p.TopK, p.TopP*(1-1e-9), p.MinP)) != len(kept) ||
			len(refKept(row, p.Temperature, p.TopK, min(p.TopP*(1+1e-9), 1), p.MinP)) != len(kept)) {
			// The nucleus ends exactly at top_p (e.g. 6 of 12 tied tokens at 0.5): whether the
			// sum reaches it is a rounding of the summation order, which the sampler and the
			// reference need not share.
			rt.Skip("top_p boundary within rounding")
		}
		raw := logSoftmax(row, 1)

		pp := p
		pp.LogprobMode = LogprobProcessed
		sr, sp := New(p, seed), New(pp, seed)
		for range 20 {
			a, b := sr.Sample(row), sp.Sample(row)
			require.Equal(rt, a.Token, b.Token)
			want, ok := kept[a.Token]
			require.True(rt, ok, "token %d outside the kept set %v", a.Token, kept)
			require.InDelta(rt, math.Log(want), b.Logprob, 1e-4)
			require.InDelta(rt, raw[a.Token], a.Logprob, 1e-5)
			require.Len(rt, a.Top, min(p.Logprobs, n))
			require.True(rt, slices.IsSortedFunc(a.Top, cmpTop))
			require.True(rt, slices.IsSortedFunc(b.Top, cmpTop))
			for _, e := range b.Top {
				if w, in := kept[e.Token]; in {
					require.InDelta(rt, math.Log(w), e.Logprob, 1e-4)
				} else {
					require.True(rt, math.IsInf(float64(e.Logprob), -1))
				}
			}
		}
	})
}

func cmpTop(a, b TokenLogprob) int {
	switch {
	case a.Logprob > b.Logprob:
		return -1
	case a.Logprob < b.Logprob:
		return 1
	}
	return a.Token - b.Token
}
