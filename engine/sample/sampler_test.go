package sample

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var inf = float32(math.Inf(1))

// randLogits returns n logits shaped roughly like a language model's (a few large ones).
func randLogits(r *rand.Rand, n int) []float32 {
	l := make([]float32, n)
	for i := range l {
		l[i] = float32(r.NormFloat64() * 3)
	}
	return l
}

// logSoftmax is the float64 reference.
func logSoftmax(l []float32, temp float64) []float64 {
	m := math.Inf(-1)
	for _, x := range l {
		m = math.Max(m, float64(x))
	}
	s := 0.0
	for _, x := range l {
		s += math.Exp((float64(x) - m) / temp)
	}
	out := make([]float64, len(l))
	for i, x := range l {
		out[i] = (float64(x)-m)/temp - math.Log(s)
	}
	return out
}

// order returns token ids by (logit desc, id asc).
func order(l []float32) []int {
	ids := make([]int, len(l))
	for i := range ids {
		ids[i] = i
	}
	slices.SortStableFunc(ids, func(a, b int) int {
		switch {
		case l[a] > l[b]:
			return -1
		case l[a] < l[b]:
			return 1
		}
		return a - b
	})
	return ids
}

// refKept is the reference kept set and its renormalised probabilities, computed by full sort.
func refKept(l []float32, temp float64, topK int, topP, minP float64) map[int]float64 {
	ls := logSoftmax(l, temp)
	ids := order(l)
	if topK > 0 && topK < len(ids) {
		ids = ids[:topK]
	}
	if minP > 0 {
		pmax := math.Exp(ls[ids[0]])
		var kept []int
		for _, id := range ids {
			if math.Exp(ls[id]) >= minP*pmax {
				kept = append(kept, id)
			}
		}
		ids = kept
	}
	z := 0.0
	for _, id := range ids {
		z += math.Exp(ls[id])
	}
	if topP < 1 {
		acc := 0.0
		for i, id := range ids {
			acc += math.Exp(ls[id]) / z
			if acc >= topP {
				ids = ids[:i+1]
				break
			}
		}
	}
	out := map[int]float64{}
	z = 0
	for _, id := range ids {
		z += math.Exp(ls[id])
	}
	for _, id := range ids {
		out[id] = math.Exp(ls[id]) / z
	}
	return out
}

func TestGreedyArgmaxAndTieBreak(t *testing.T) {
	l := []float32{1, 5, 2, 5, 5, -3}
	want := logSoftmax(l, 1)
	s := New(Params{Temperature: 0, Logprobs: 3}, 1)
	for range 10 {
		r := s.Sample(l)
		require.Equal(t, 1, r.Token, "lowest id among the tied maxima")
		assert.InDelta(t, want[1], r.Logprob, 1e-6, "greedy still reports the raw logprob")
		require.Len(t, r.Top, 3)
		assert.Equal(t, []int{1, 3, 4}, []int{r.Top[0].Token, r.Top[1].Token, r.Top[2].Token})
		assert.False(t, r.Degenerate)
	}

	// NaN is never chosen, +Inf always is.
	r := New(Params{}, 1).Sample([]float32{float32(math.NaN()), 0, inf, 3})
	assert.Equal(t, 2, r.Token)
	assert.InDelta(t, 0, r.Logprob, 1e-6)

	// Processed greedy: all mass on the argmax.
	s = New(Params{Logprobs: 2, LogprobMode: LogprobProcessed}, 1)
	r = s.Sample(l)
	assert.Equal(t, 1, r.Token)
	assert.Equal(t, float32(0), r.Logprob)
	assert.Equal(t, []TokenLogprob{{1, 0}, {0, float32(math.Inf(-1))}}, r.Top)

	// Temperatures below GreedyEpsilon are greedy.
	assert.Equal(t, 1, New(Params{Temperature: GreedyEpsilon / 2}, 3).Sample(l).Token)
}

func TestSeedStability(t *testing.T) {
	rl := rand.New(rand.NewPCG(1, 2))
	rows := make([][]float32, 300)
	for i := range rows {
		rows[i] = randLogits(rl, 50)
	}
	run := func(seed uint64) []int {
		s := New(Params{Temperature: 1.5, TopP: 0.95}, seed)
		out := make([]int, len(rows))
		for i, row := range rows {
			out[i] = s.Sample(row).Token
		}
		return out
	}
	a, b := run(42), run(42)
	assert.Equal(t, a, b, "same seed, same sequence")
	c := run(43)
	diff := 0
	for i := range a {
		if a[i] != c[i] {
			diff++
		}
	}
	assert.Greater(t, diff, len(a)/4, "different seeds give different sequences")

	// Nearby seeds must not share a stream prefix.
	first := map[uint64]bool{}
	for seed := range uint64(64) {
		s := New(Params{}, seed)
		first[s.rng.Uint64()] = true
	}
	assert.Len(t, first, 64)
}

func TestDeterminismIndependentOfInterleaving(t *testing.T) {
	rl := rand.New(rand.NewPCG(3, 4))
	rows := make([][]float32, 200)
	for i := range rows {
		rows[i] = randLogits(rl, 100)
	}
	p := Params{Temperature: 1, TopK: 20, TopP: 0.9, Logprobs: 2}
	alone := New(p, 7)
	var want []Result
	for _, row := range rows {
		want = append(want, alone.Sample(row))
	}

	// Same request, interleaved with others that use different filters and ask for exclusions.
	a := New(p, 7)
	others := []*Sampler{
		New(Params{Temperature: 0.3, MinP: 0.1}, 7),
		New(Params{}, 8),
		New(Params{Temperature: 2, LogprobMode: LogprobProcessed, Logprobs: 5}, 9),
	}
	for i, row := range rows {
		for j, o := range others {
			if (i+j)%2 == 0 {
				o.SampleExcept(rows[(i*7+j)%len(rows)], []int{1, 2, 3})
			}
		}
		got := a.Sample(row)
		require.Equal(t, want[i], got, "step %d", i)
	}
}

func TestOneDrawPerStep(t *testing.T) {
	rl := rand.New(rand.NewPCG(5, 6))
	row := randLogits(rl, 64)
	allNegInf := []float32{float32(math.Inf(-1)), float32(math.Inf(-1))}
	configs := []Params{
		{},
		{Temperature: 1},
		{Temperature: 0.7, TopK: 5},
		{Temperature: 0.7, TopP: 0.5},
		{Temperature: 0.7, TopK: 10, TopP: 0.8, MinP: 0.05},
		{Temperature: 1.2, MinP: 0.2, Logprobs: 4, LogprobMode: LogprobProcessed},
	}
	for i, p := range configs {
		s := New(p, 99)
		ref := New(Params{}, 99)
		for step := range 10 {
			switch step % 3 {
			case 0:
				s.Sample(row)
			case 1:
				s.SampleExcept(row, []int{0, 5})
			default:
				s.Sample(allNegInf)
			}
		}
		ref.Advance(10)
		assert.Equal(t, ref.rng.Uint64(), s.rng.Uint64(), "config %d consumed other than one draw per step", i)
	}

	// Advance lets a resumed request continue its unbroken stream.
	p := Params{Temperature: 1}
	full := New(p, 5)
	var tail []int
	for i := range 20 {
		tok := full.Sample(row).Token
		if i >= 12 {
			tail = append(tail, tok)
		}
	}
	resumed := New(p, 5)
	resumed.Advance(12)
	for i := range 8 {
		assert.Equal(t, tail[i], resumed.Sample(row).Token)
	}
}

// draw samples n tokens from one row and returns their counts.
func draw(s *Sampler, row []float32, n int) map[int]int {
	counts := map[int]int{}
	for range n {
		counts[s.Sample(row).Token]++
	}
	return counts
}

// chiSquare compares counts with expected probabilities; cells must have expected >= 5.
func chiSquare(t *testing.T, counts map[int]int, probs map[int]float64, n int) (stat float64, df int) {
	t.Helper()
	for tok := range counts {
		_, ok := probs[tok]
		require.True(t, ok, "token %d sampled outside the support", tok)
	}
	for tok, p := range probs {
		e := p * float64(n)
		if e < 5 {
			continue
		}
		d := float64(counts[tok]) - e
		stat += d * d / e
		df++
	}
	return stat, df - 1
}

func TestFrequenciesMatchSoftmax(t *testing.T) {
	const n = 40000
	rl := rand.New(rand.NewPCG(7, 8))
	row := randLogits(rl, 12)
	cases := []struct {
		name string
		p    Params
	}{
		{"temperature 1", Params{Temperature: 1}},
		{"temperature 0.6", Params{Temperature: 0.6}},
		{"temperature 2.5", Params{Temperature: 2.5}},
		{"top-k 6", Params{Temperature: 1, TopK: 6}},
		{"top-p 0.8", Params{Temperature: 1.3, TopP: 0.8}},
		{"min-p 0.05", Params{Temperature: 0.9, MinP: 0.05}},
		{"all three", Params{Temperature: 1.1, TopK: 8, TopP: 0.9, MinP: 0.02}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			probs := refKept(row, tc.p.Temperature, tc.p.TopK, orOne(tc.p.TopP), tc.p.MinP)
			counts := draw(New(tc.p, 11), row, n)
			stat, df := chiSquare(t, counts, probs, n)
			require.Positive(t, df)
			// The 99.99th percentile of chi-square is below 3*df+25 for these df; the seed is
			// fixed, so this is a deterministic check of the distribution, not a flaky one.
			assert.Less(t, stat, 3*float64(df)+25, "chi-square %.1f with %d df", stat, df)
		})
	}
}

func orOne(p float64) float64 {
	if p == 0 {
		return 1
	}
	return p
}

func TestTopKNeverOutside(t *testing.T) {
	rl := rand.New(rand.NewPCG(9, 10))
	row := randLogits(rl, 500)
	best := order(row)
	for _, k := range []int{1, 2, 7, 40} {
		allowed := map[int]bool{}
		for _, id := range best[:k] {
			allowed[id] = true
		}
		// High temperature flattens the distribution, so an off-by-one would show up.
		counts := draw(New(Params{Temperature: 5, TopK: k}, uint64(k)), row, 5000)
		for tok := range counts {
			assert.True(t, allowed[tok], "k=%d sampled %d", k, tok)
		}
		assert.Len(t, counts, k, "k=%d: every kept token appears at T=5", k)
	}

	// Ties at the boundary go to the lower id.
	counts := draw(New(Params{Temperature: 1, TopK: 2}, 1), []float32{1, 3, 3, 3}, 2000)
	assert.Equal(t, []int{1, 2}, sortedKeys(counts))
}

func sortedKeys(m map[int]int) []int {
	var k []int
	for id := range m {
		k = append(k, id)
	}
	slices.Sort(k)
	return k
}

func TestTopPNeverOutsideNucleus(t *testing.T) {
	// probs 0.5, 0.3, 0.15, 0.05 (in shuffled ids).
	row := []float32{float32(math.Log(0.15)), float32(math.Log(0.5)), float32(math.Log(0.05)), float32(math.Log(0.3))}
	for _, tc := range []struct {
		p    float64
		want []int
	}{
		{0.4, []int{1}},
		{0.79, []int{1, 3}},
		{0.81, []int{0, 1, 3}},
		{0.99, []int{0, 1, 2, 3}},
	} {
		counts := draw(New(Params{Temperature: 1, TopP: tc.p}, 2), row, 4000)
		assert.Equal(t, tc.want, sortedKeys(counts), "top_p %v", tc.p)
	}

	// n*p < 1 puts every token below llama2.c's cutoff; the argmax must still be kept.
	counts := draw(New(Params{Temperature: 1, TopP: 0.3}, 2), []float32{0, 0.1}, 500)
	assert.Equal(t, []int{1}, sortedKeys(counts))
	counts = draw(New(Params{Temperature: 1, TopP: 0.2}, 2), []float32{0.1, 0, 0.05}, 500)
	assert.Equal(t, []int{0}, sortedKeys(counts))

	// Large vocabularies, sharp and flat, against a full-sort reference.
	rl := rand.New(rand.NewPCG(11, 12))
	for _, scale := range []float32{0.01, 0.3, 3} {
		row := randLogits(rl, 3000)
		for i := range row {
			row[i] *= scale
		}
		for _, p := range []float64{0.1, 0.5, 0.9} {
			nuc := refKept(row, 1, 0, p, 0)
			s := New(Params{Temperature: 1, TopP: p, LogprobMode: LogprobProcessed}, 3)
			for range 300 {
				r := s.Sample(row)
				want, ok := nuc[r.Token]
				require.True(t, ok, "scale %v top_p %v sampled %d outside the nucleus of %d", scale, p, r.Token, len(nuc))
				require.InDelta(t, math.Log(want), r.Logprob, 1e-4)
			}
		}
	}
}

func TestNucleusSelectMatchesSort(t *testing.T) {
	rl := rand.New(rand.NewPCG(13, 14))
	for trial := range 200 {
		n := 1 + rl.IntN(400)
		c := make([]cand, n)
		total := 0.0
		for i := range c {
			x := float32(rl.IntN(20)) // many ties in x, broken by id
			if trial%2 == 0 {
				x = float32(rl.NormFloat64())
			}
			c[i] = cand{x: x, w: float32(math.Exp(float64(x) / 4)), id: int32(i)}
			total += float64(c[i].w)
		}
		target := rl.Float64() * total
		ref := slices.Clone(c)
		slices.SortFunc(ref, func(a, b cand) int {
			if better(a.x, a.id, b.x, b.id) {
				return -1
			}
			return 1
		})
		want := len(ref)
		acc := 0.0
		for i, e := range ref {
			acc += float64(e.w)
			if acc >= target {
				want = i + 1
				break
			}
		}
		got := nucleus(c, target)
		require.Equal(t, want, got, "trial %d", trial)
		var gotIDs, wantIDs []int32
		for i := range got {
			gotIDs = append(gotIDs, c[i].id)
			wantIDs = append(wantIDs, ref[i].id)
		}
		slices.Sort(gotIDs)
		slices.Sort(wantIDs)
		require.Equal(t, wantIDs, gotIDs, "trial %d", trial)
	}
}

func TestMinP(t *testing.T) {
	// probs 0.4, 0.3, 0.2, 0.1 (ratios to the max 1, 0.75, 0.5, 0.25).
	row := []float32{float32(math.Log(0.1)), float32(math.Log(0.4)), float32(math.Log(0.2)), float32(math.Log(0.3))}
	counts := draw(New(Params{Temperature: 1, MinP: 0.45}, 4), row, 4000)
	assert.Equal(t, []int{1, 2, 3}, sortedKeys(counts))
	counts = draw(New(Params{Temperature: 1, MinP: 0.6}, 4), row, 4000)
	assert.Equal(t, []int{1, 3}, sortedKeys(counts))
	counts = draw(New(Params{Temperature: 1, MinP: 1}, 4), row, 1000)
	assert.Equal(t, []int{1}, sortedKeys(counts))

	// min-p applies after temperature: at T=2 the ratios become 1, 0.87, 0.71, 0.5.
	counts = draw(New(Params{Temperature: 2, MinP: 0.45}, 4), row, 4000)
	assert.Equal(t, []int{0, 1, 2, 3}, sortedKeys(counts))
	counts = draw(New(Params{Temperature: 2, MinP: 0.6}, 4), row, 4000)
	assert.Equal(t, []int{1, 2, 3}, sortedKeys(counts))

	// With top-k too (the two commute).
	counts = draw(New(Params{Temperature: 1, MinP: 0.45, TopK: 2}, 4), row, 2000)
	assert.Equal(t, []int{1, 3}, sortedKeys(counts))
	counts = draw(New(Params{Temperature: 1, MinP: 0.6, TopK: 3}, 4), row, 2000)
	assert.Equal(t, []int{1, 3}, sortedKeys(counts))
}

func TestTemperatureToZeroApproachesGreedy(t *testing.T) {
	row := []float32{1, 2, 1.5, 0}
	prev := 0
	for _, temp := range []float64{2, 1, 0.5, 0.2, 0.02} {
		counts := draw(New(Params{Temperature: temp}, 8), row, 4000)
		assert.GreaterOrEqual(t, counts[1], prev, "argmax frequency grows as T falls (T=%v)", temp)
		prev = counts[1]
	}
	assert.Equal(t, 4000, prev, "T=0.02: exp(-25) mass elsewhere, never drawn in 4000")

	// And the processed distribution converges to the point mass.
	r := New(Params{Temperature: 0.01, LogprobMode: LogprobProcessed}, 1).Sample(row)
	assert.Equal(t, 1, r.Token)
	assert.InDelta(t, 0, r.Logprob, 1e-12)
}

func TestRawVsProcessedLogprobs(t *testing.T) {
	rl := rand.New(rand.NewPCG(15, 16))
	row := randLogits(rl, 200)
	raw := logSoftmax(row, 1)
	for _, p := range []Params{
		{Temperature: 1},
		{Temperature: 0.7, TopK: 10, Logprobs: 20},
		{Temperature: 1.3, TopP: 0.7, Logprobs: 20},
		{Temperature: 0.9, MinP: 0.1, Logprobs: 20},
		{Temperature: 0.8, TopK: 50, TopP: 0.8, MinP: 0.01, Logprobs: 20},
		{Temperature: 3, TopK: 150, TopP: 0.5, Logprobs: 20},
	} {
		pr := p
		pr.LogprobMode = LogprobRaw
		sr := New(pr, 21)
		pp := p
		pp.LogprobMode = LogprobProcessed
		sp := New(pp, 21)
		kept := refKept(row, p.Temperature, p.TopK, orOne(p.TopP), p.MinP)
		for range 50 {
			a, b := sr.Sample(row), sp.Sample(row)
			require.Equal(t, a.Token, b.Token, "mode does not change the sampled token")
			assert.InDelta(t, raw[a.Token], a.Logprob, 1e-5, "raw = log_softmax(logits)")
			assert.InDelta(t, math.Log(kept[b.Token]), b.Logprob, 1e-5, "processed = renormalised")
			for _, e := range a.Top {
				assert.InDelta(t, raw[e.Token], e.Logprob, 1e-5)
			}
		}
		if p.Logprobs == 0 {
			continue
		}
		// The processed Top list covers the kept set (all of it when it has <= 20 tokens) and
		// its probabilities sum to 1; entries outside it are -Inf.
		r := sp.Sample(row)
		sum, finite := 0.0, 0
		for _, e := range r.Top {
			if !math.IsInf(float64(e.Logprob), -1) {
				sum += math.Exp(float64(e.Logprob))
				finite++
				assert.InDelta(t, math.Log(kept[e.Token]), e.Logprob, 1e-5)
			} else {
				_, in := kept[e.Token]
				assert.False(t, in)
			}
		}
		if len(kept) <= 20 {
			assert.Equal(t, len(kept), finite)
			assert.InDelta(t, 1, sum, 1e-5)
		}
	}
}

func TestTopList(t *testing.T) {
	rl := rand.New(rand.NewPCG(17, 18))
	row := randLogits(rl, 1000)
	row[10], row[20] = row[order(row)[0]], row[order(row)[0]] // ties for the top, by id
	ls := logSoftmax(row, 1)
	want := order(row)[:MaxLogprobs]
	r := New(Params{Temperature: 1, Logprobs: MaxLogprobs}, 1).Sample(row)
	require.Len(t, r.Top, MaxLogprobs)
	for i, e := range r.Top {
		assert.Equal(t, want[i], e.Token, "rank %d", i)
		assert.InDelta(t, ls[e.Token], e.Logprob, 1e-5)
	}

	// Fewer tokens than requested: the list is the whole vocabulary.
	r = New(Params{Logprobs: 5}, 1).Sample([]float32{0, 1, float32(math.NaN())})
	require.Len(t, r.Top, 3)
	assert.Equal(t, 1, r.Top[0].Token)
	assert.Equal(t, 0, r.Top[1].Token)
	assert.Equal(t, TokenLogprob{2, float32(math.Inf(-1))}, r.Top[2])

	// Logprobs 0: no list and no allocation.
	assert.Nil(t, New(Params{}, 1).Sample(row).Top)
}

func TestSampleExcept(t *testing.T) {
	row := []float32{5, 4, 3, 2, 1}
	ls := logSoftmax(row, 1)
	s := New(Params{Temperature: 1, Logprobs: 2}, 1)
	sp := New(Params{Temperature: 1, Logprobs: 2, LogprobMode: LogprobProcessed}, 1)
	excl := []int{0, 3, 99, -1}
	keptLS := logSoftmax([]float32{4, 3, 1}, 1)
	for range 500 {
		r := s.SampleExcept(row, excl)
		require.NotContains(t, []int{0, 3}, r.Token)
		assert.InDelta(t, ls[r.Token], r.Logprob, 1e-6, "raw logprobs ignore the exclusion")
		assert.Equal(t, 0, r.Top[0].Token, "raw Top describes the model")

		q := sp.SampleExcept(row, excl)
		require.Equal(t, r.Token, q.Token)
		idx := map[int]int{1: 0, 2: 1, 4: 2}[q.Token]
		assert.InDelta(t, keptLS[idx], q.Logprob, 1e-6)
		assert.Equal(t, 1, q.Top[0].Token, "processed Top skips excluded tokens")
	}
	// Greedy with exclusion takes the best remaining token.
	assert.Equal(t, 1, New(Params{}, 1).SampleExcept(row, []int{0}).Token)
	// Exclusions last one call only.
	assert.Equal(t, 0, New(Params{}, 1).Sample(row).Token)
	g := New(Params{}, 1)
	g.SampleExcept(row, []int{0})
	assert.Equal(t, 0, g.Sample(row).Token)
}

func TestDegenerateInputs(t *testing.T) {
	nan := float32(math.NaN())
	ninf := float32(math.Inf(-1))
	cases := []struct {
		name    string
		row     []float32
		exclude []int
	}{
		{"all -Inf", []float32{ninf, ninf, ninf}, nil},
		{"all NaN", []float32{nan, nan}, nil},
		{"empty", nil, nil},
		{"all excluded", []float32{1, 2}, []int{0, 1}},
	}
	for _, tc := range cases {
		for _, p := range []Params{
			{},
			{Temperature: 1, TopK: 1, TopP: 0.5, MinP: 0.5, Logprobs: 3},
			{Temperature: 1, Logprobs: 2, LogprobMode: LogprobProcessed},
		} {
			r := New(p, 1).SampleExcept(tc.row, tc.exclude)
			assert.True(t, r.Degenerate, tc.name)
			assert.Equal(t, 0, r.Token, tc.name)
			assert.LessOrEqual(t, len(r.Top), len(tc.row))
		}
	}

	// A row with +Inf logits gives them all the mass, evenly.
	row := []float32{0, inf, 5, inf}
	counts := draw(New(Params{Temperature: 1}, 3), row, 2000)
	assert.Equal(t, []int{1, 3}, sortedKeys(counts))
	assert.InDelta(t, 1000, counts[1], 150)
	r := New(Params{Temperature: 1}, 3).Sample(row)
	assert.InDelta(t, math.Log(0.5), r.Logprob, 1e-6)

	// Random rows sprinkled with NaN and ±Inf never panic and never yield an invalid token.
	rl := rand.New(rand.NewPCG(19, 20))
	for trial := range 300 {
		row := randLogits(rl, 1+rl.IntN(60))
		for i := range row {
			switch rl.IntN(6) {
			case 0:
				row[i] = nan
			case 1:
				row[i] = ninf
			case 2:
				if rl.IntN(10) == 0 {
					row[i] = inf
				}
			}
		}
		p := Params{
			Temperature: []float64{0, 0.5, 1, 3}[trial%4],
			TopK:        rl.IntN(5),
			TopP:        []float64{0.3, 0.9, 1}[trial%3],
			MinP:        []float64{0, 0.2}[trial%2],
			Logprobs:    rl.IntN(4),
			LogprobMode: []LogprobMode{LogprobRaw, LogprobProcessed}[trial%2],
		}
		r := New(p, uint64(trial)).SampleExcept(row, []int{rl.IntN(len(row))})
		if r.Degenerate {
			continue
		}
		require.GreaterOrEqual(t, r.Token, 0)
		require.Less(t, r.Token, len(row))
		x := row[r.Token]
		require.False(t, x != x || math.IsInf(float64(x), -1), "trial %d sampled invalid logit %v", trial, x)
		require.False(t, math.IsNaN(float64(r.Logprob)), "trial %d", trial)
	}
}

func TestNoAllocations(t *testing.T) {
	rl := rand.New(rand.NewPCG(21, 22))
	row := randLogits(rl, 32000)
	for _, p := range []Params{
		{},
		{Temperature: 1, TopP: 0.9},
		{Temperature: 0.8, TopK: 40},
		{Temperature: 0.8, TopK: 40, TopP: 0.9, MinP: 0.05, LogprobMode: LogprobProcessed},
	} {
		s := New(p, 1)
		s.SampleExcept(row, []int{1}) // warm the buffers
		allocs := testing.AllocsPerRun(5, func() { s.SampleExcept(row, []int{1}) })
		assert.Zero(t, allocs, "%+v", p)
	}
}
