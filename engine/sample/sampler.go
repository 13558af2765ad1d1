package sample

import (
	"math"
	"math/rand/v2"

	"github.com/rolloutkit/rollout/engine/kernels"
)

// TokenLogprob is one entry of a top-logprobs list.
type TokenLogprob struct {
	// Token is the token id.
	Token int `json:"token"`
	// Logprob is its log-probability in the Sampler's LogprobMode.
	Logprob float32 `json:"logprob"`
}

// Result is the outcome of one sampling step.
type Result struct {
	// Token is the sampled token id.
	Token int
	// Logprob is the log-probability of Token in the configured LogprobMode (-Inf when undefined).
	Logprob float32
	// Top holds the Params.Logprobs most likely tokens (fewer only when the vocabulary is
	// smaller), sorted by logprob desc then token id asc. It is freshly allocated, so the caller
	// may keep it; it is nil when Params.Logprobs is 0.
	Top []TokenLogprob
	// Degenerate is set when no token could be sampled: every logit was -Inf or NaN, or every
	// valid token was excluded. Token is then 0 and the request should end with an error.
	Degenerate bool
}

// cand is a candidate token: its cleaned logit, its unnormalised probability and its id.
type cand struct {
	x  float32
	w  float32
	id int32
}

// better is the one total order every filter uses: higher logit first, lower id on ties.
func better(ax float32, aid int32, bx float32, bid int32) bool {
	return ax > bx || (ax == bx && aid < bid)
}

var negInf32 = float32(math.Inf(-1))

// clean maps NaN to -Inf (never sampled) and +Inf to the largest float32, which keeps every
// later subtraction finite while still giving such tokens all the probability mass.
func clean(x float32) float32 {
	if x != x {
		return negInf32
	}
	if x > math.MaxFloat32 {
		return math.MaxFloat32
	}
	return x
}

// Sampler samples the tokens of one request. It owns its random stream and scratch buffers, so
// it must not be used from several goroutines at once; use one Sampler per request (or per
// choice when n > 1).
type Sampler struct {
	greedy bool
	temp   float64
	invT   float64
	topP   float64 // 1 = off
	topK   int     // 0 = off
	minP   float64 // 0 = off
	nTop   int
	mode   LogprobMode

	rng rand.PCG

	w     []float32 // per-token weights on the full-vocabulary path
	c     []cand    // candidates (top-k heap, top-p nucleus)
	best  []cand    // top-logprobs working list
	ban   []uint32  // ban[i] == epoch marks token i excluded for the current call
	epoch uint32
}

// New returns a Sampler for p whose random stream is seeded from seed (pass p.SeedOr(engineSeed)).
// p should have passed Validate; New never panics and clamps out-of-range values instead
// (NaN or negative temperature means greedy, an invalid top_p means off, and so on).
func New(p Params, seed uint64) *Sampler {
	s := &Sampler{topP: 1, mode: LogprobRaw}
	t := p.Temperature
	switch {
	case !(t >= GreedyEpsilon): // also NaN
		s.greedy = true
	case t > MaxTemperature: // also +Inf
		t = MaxTemperature
	}
	if !s.greedy {
		s.temp, s.invT = t, 1/t
	}
	if p.TopP > 0 && p.TopP < 1 {
		s.topP = p.TopP
	}
	if p.TopK > 0 {
		s.topK = p.TopK
	}
	if p.MinP > 0 {
		s.minP = math.Min(p.MinP, 1)
	}
	s.nTop = min(max(p.Logprobs, 0), MaxLogprobs)
	if p.LogprobMode == LogprobProcessed {
		s.mode = LogprobProcessed
	}
	// Split the seed into two decorrelated words so that nearby seeds (1, 2, ...) start far apart.
	a := splitmix64(seed)
	s.rng.Seed(a, splitmix64(a^0x6a09e667f3bcc909))
	return s
}

func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// uniform returns a float64 in [0, 1) from exactly one 64-bit draw.
func (s *Sampler) uniform() float64 { return float64(s.rng.Uint64()>>11) * 0x1p-53 }

// Advance skips the draws of n sampling steps, so a request resumed after n tokens (for example
// re-submitted with prompt + tokens so far) continues the stream it would have used unbroken.
func (s *Sampler) Advance(n int) {
	for range n {
		s.rng.Uint64()
	}
}

// Sample draws the next token from one row of logits. It consumes exactly one random draw.
func (s *Sampler) Sample(logits []float32) Result { return s.SampleExcept(logits, nil) }

// SampleExcept is Sample with the tokens in exclude never sampled (ids outside the row are
// ignored). It implements min_tokens: pass Params.StopTokens while Params.SuppressStops holds.
// Raw logprobs ignore the exclusion (they describe the model); processed ones do not.
func (s *Sampler) SampleExcept(logits []float32, exclude []int) Result {
	u := s.uniform() // first, so every path consumes exactly one draw
	hasBan := s.setBan(exclude, len(logits))

	// Pass A: global max (for raw logprobs), max and argmax over sampleable tokens.
	maxAll, maxOK, arg, nOK := negInf32, negInf32, -1, 0
	if !hasBan {
		// Nothing excluded: the sampleable max is the global one, found by the vector kernel
		// (which cleans like clean). nOK is exact only
		// where a filter reads it (top-k); elsewhere only nOK == 0 matters.
		maxAll = kernels.MaxF32(logits)
		if maxAll != negInf32 {
			// The first token at least the max is the argmax, lowest id on ties (+Inf
			// counting as MaxFloat32, NaN never).
			maxOK, arg = maxAll, kernels.FirstAtLeast(logits, maxAll)
			nOK = 1
			if s.topK > 0 && !s.greedy {
				nOK = countValid(logits)
			}
		}
	} else {
		for i, x := range logits {
			x = clean(x)
			if x > maxAll {
				maxAll = x
			}
			if x == negInf32 || s.ban[i] == s.epoch {
				continue
			}
			nOK++
			if x > maxOK { // strict: lowest id wins ties
				maxOK, arg = x, i
			}
		}
	}

	// rawLSE = log(sum(exp(x - maxAll))), computed lazily: processed mode never needs it.
	rawLSE, haveRaw := 0.0, false
	raw := func() float64 {
		if !haveRaw {
			rawLSE, haveRaw = s.logSumExp(logits, maxAll), true
		}
		return rawLSE
	}

	var res Result
	var rule keepRule
	var logZ float64 // log of the kept mass, relative to maxOK, after temperature
	switch {
	case nOK == 0:
		res.Degenerate = true
		rule = keepRule{none: true}
	case s.greedy:
		res.Token = arg
		rule = keepRule{thr: math.Inf(-1), bx: maxOK, bid: int32(arg)}
	default:
		res.Token, rule, logZ = s.sampleDist(logits, u, hasBan, maxAll, maxOK, nOK, &rawLSE, &haveRaw)
	}

	switch {
	case s.mode == LogprobRaw && len(logits) > 0 && maxAll != negInf32:
		res.Logprob = float32(float64(clean(logits[res.Token])) - float64(maxAll) - raw())
	case s.mode == LogprobRaw || res.Degenerate:
		res.Logprob = negInf32
	case s.greedy:
		res.Logprob = 0 // all mass on the argmax
	default:
		res.Logprob = float32((float64(clean(logits[res.Token]))-float64(maxOK))*s.invT - logZ)
	}

	if s.nTop > 0 {
		if s.mode == LogprobRaw {
			lse := math.Inf(1) // no valid token: every entry is -Inf
			if maxAll != negInf32 {
				lse = raw()
			}
			res.Top = s.topRaw(logits, float64(maxAll), lse)
		} else {
			res.Top = s.topProcessed(logits, hasBan, rule, float64(maxOK), logZ)
		}
	}
	return res
}

// keepRule describes the kept set of a step: valid, not excluded, logit >= thr, and at least
// (bx, bid) in the (logit desc, id asc) order. Every filter keeps a prefix of that order, so this
// describes any combination of them in O(1) per token.
type keepRule struct {
	none bool
	thr  float64
	bx   float32
	bid  int32
}

func (r keepRule) kept(x float32, id int32) bool {
	if r.none || x == negInf32 || float64(x) < r.thr {
		return false
	}
	return x > r.bx || (x == r.bx && id <= r.bid)
}

// sampleDist samples with temperature and filters. It returns the token, the kept set and the log
// of the kept mass (weights are exp((x-maxOK)/T)).
func (s *Sampler) sampleDist(logits []float32, u float64, hasBan bool, maxAll, maxOK float32, nOK int,
	rawLSE *float64, haveRaw *bool) (int, keepRule, float64) {
	mb := float64(maxOK)
	thr := math.Inf(-1)
	if s.minP > 0 {
		// p_i >= minP * p_max  <=>  (x_i - max)/T >= ln(minP).
		thr = mb + s.temp*math.Log(s.minP)
	}
	if s.topK > 0 && s.topK < nOK {
		c := s.selectTopK(logits, hasBan)
		if s.minP > 0 {
			n := 0
			for _, e := range c {
				if float64(e.x) >= thr {
					c[n] = e
					n++
				}
			}
			c = c[:n]
		}
		z := 0.0
		for i := range c {
			c[i].w = float32(expNeg((float64(c[i].x) - mb) * s.invT))
			z += float64(c[i].w)
		}
		if s.topP < 1 && len(c) > 1 {
			c = c[:nucleus(c, s.topP*z)]
			z = sumW(c)
		}
		return s.fromCands(c, z, u)
	}

	// Full-vocabulary path: weights for every token, zero for those not kept.
	if cap(s.w) < len(logits) {
		s.w = make([]float32, len(logits))
	}
	w := s.w[:len(logits)]
	z, nKept := 0.0, 0
	if fused := s.mode == LogprobRaw && s.invT == 1 && !hasBan && !*haveRaw; fused {
		// At temperature 1 with nothing excluded the sampling weights are the raw softmax
		// numerators, so the raw normaliser comes for free.
		sumAll := 0.0
		for i, x := range logits {
			x = clean(x)
			if x == negInf32 {
				w[i] = 0
				continue
			}
			e := expNeg(float64(x) - mb)
			sumAll += e
			if float64(x) < thr {
				w[i] = 0
				continue
			}
			w[i] = float32(e)
			z += float64(w[i])
			nKept++
		}
		*rawLSE, *haveRaw = math.Log(sumAll), true
	} else {
		for i, x := range logits {
			x = clean(x)
			if x == negInf32 || float64(x) < thr || (hasBan && s.ban[i] == s.epoch) {
				w[i] = 0
				continue
			}
			w[i] = float32(expNeg((float64(x) - mb) * s.invT))
			z += float64(w[i])
			nKept++
		}
	}

	if s.topP < 1 && nKept > 1 {
		// llama2.c's cutoff: a token with probability below (1-p)/(n-1) cannot be in the nucleus,
		// because all such tokens together weigh less than 1-p. The margin absorbs rounding.
		// The bound needs one token above the cutoff; capping it at the argmax's weight (exactly
		// 1) guarantees that when n*p < 1 would otherwise put every token below it.
		cut := float32(min((1-s.topP)/float64(nKept-1)*z*(1-1e-6), 1))
		c := s.c[:0]
		for i, wi := range w {
			if wi > 0 && wi >= cut {
				c = append(c, cand{x: clean(logits[i]), w: wi, id: int32(i)})
			}
		}
		s.c = c
		c = c[:nucleus(c, s.topP*z)]
		return s.fromCands(c, sumW(c), u)
	}

	// Inverse CDF over the whole row, in id order.
	target, cum, tok := u*z, 0.0, -1
	for i, wi := range w {
		if wi == 0 {
			continue
		}
		cum += float64(wi)
		tok = i
		if cum > target {
			break
		}
	}
	// tok is the first token whose cumulative mass passes the target, or the last positive one
	// when rounding leaves the target unreached.
	return tok, keepRule{thr: thr, bx: negInf32, bid: math.MaxInt32}, math.Log(z)
}

// fromCands samples from candidates with total weight z (> 0: the argmax always has weight 1) and
// returns the kept set as the prefix ending at the worst candidate.
func (s *Sampler) fromCands(c []cand, z, u float64) (int, keepRule, float64) {
	target, cum, tok := u*z, 0.0, -1
	worst := c[0]
	for _, e := range c {
		if better(worst.x, worst.id, e.x, e.id) {
			worst = e
		}
		if tok >= 0 && cum > target {
			continue // token found; keep scanning only for the boundary
		}
		if e.w > 0 {
			cum += float64(e.w)
			tok = int(e.id)
		}
	}
	return tok, keepRule{thr: math.Inf(-1), bx: worst.x, bid: worst.id}, math.Log(z)
}

func sumW(c []cand) float64 {
	z := 0.0
	for _, e := range c {
		z += float64(e.w)
	}
	return z
}

// setBan marks exclude in the epoch-stamped ban array and reports whether any id is in range.
func (s *Sampler) setBan(exclude []int, n int) bool {
	if len(exclude) == 0 {
		return false
	}
	if len(s.ban) < n {
		s.ban = make([]uint32, n)
		s.epoch = 0
	}
	s.epoch++
	if s.epoch == 0 { // wrapped: old stamps could collide
		clear(s.ban)
		s.epoch = 1
	}
	ok := false
	for _, id := range exclude {
		if id >= 0 && id < n {
			s.ban[id] = s.epoch
			ok = true
		}
	}
	return ok
}

// logSumExp returns log(sum(exp(x - maxAll))) over valid logits. It is kept relative to the
// maximum because adding a small log-sum to a logit near MaxFloat32 would lose it entirely.
// The sum runs in the vector kernel, which cleans like clean and skips -Inf.
func (s *Sampler) logSumExp(logits []float32, maxAll float32) float64 {
	return math.Log(kernels.SumExpShifted(logits, maxAll))
}

// countValid counts the logits that are neither NaN nor -Inf.
func countValid(logits []float32) int {
	n := 0
	for _, x := range logits {
		if clean(x) != negInf32 {
			n++
		}
	}
	return n
}

// selectTopK returns the topK best sampleable tokens (unordered) using a size-k min-heap whose
// root is the worst kept candidate: O(V log k), and O(V) comparisons in the common case.
func (s *Sampler) selectTopK(logits []float32, hasBan bool) []cand {
	k := s.topK
	h := s.c[:0]
	for i, x := range logits {
		x = clean(x)
		if x == negInf32 || (hasBan && s.ban[i] == s.epoch) {
			continue
		}
		id := int32(i)
		if len(h) < k {
			h = append(h, cand{x: x, id: id})
			// sift up
			j := len(h) - 1
			for j > 0 {
				p := (j - 1) / 2
				if !better(h[p].x, h[p].id, h[j].x, h[j].id) {
					break
				}
				h[p], h[j] = h[j], h[p]
				j = p
			}
			continue
		}
		if !better(x, id, h[0].x, h[0].id) {
			continue
		}
		h[0] = cand{x: x, id: id}
		// sift down
		j := 0
		for {
			l := 2*j + 1
			if l >= len(h) {
				break
			}
			m := l
			if r := l + 1; r < len(h) && better(h[l].x, h[l].id, h[r].x, h[r].id) {
				m = r // the worse child
			}
			if !better(h[j].x, h[j].id, h[m].x, h[m].id) {
				break
			}
			h[j], h[m] = h[m], h[j]
			j = m
		}
	}
	s.c = h
	return h
}

// nucleus reorders c so that c[:n] is the smallest prefix of c in (logit desc, id asc) order
// whose weight reaches target, and returns n. It is a quickselect on cumulative mass (expected
// O(len(c))), so a flat distribution does not cost a full sort; only the final small range is
// sorted. If rounding leaves target unreached, everything up to the last range is kept.
func nucleus(c []cand, target float64) int {
	lo, hi := 0, len(c)
	acc := 0.0
	for hi-lo > 24 {
		// Median of three as pivot, moved to hi-1.
		mid := lo + (hi-lo)/2
		if better(c[mid].x, c[mid].id, c[lo].x, c[lo].id) {
			c[mid], c[lo] = c[lo], c[mid]
		}
		if better(c[hi-1].x, c[hi-1].id, c[lo].x, c[lo].id) {
			c[hi-1], c[lo] = c[lo], c[hi-1]
		}
		if better(c[hi-1].x, c[hi-1].id, c[mid].x, c[mid].id) {
			c[hi-1], c[mid] = c[mid], c[hi-1]
		}
		c[mid], c[hi-1] = c[hi-1], c[mid]
		pv := c[hi-1]
		// Lomuto partition: c[lo:i] better than the pivot, then the pivot, then worse.
		i, g := lo, 0.0
		for j := lo; j < hi-1; j++ {
			if better(c[j].x, c[j].id, pv.x, pv.id) {
				g += float64(c[j].w)
				c[i], c[j] = c[j], c[i]
				i++
			}
		}
		c[i], c[hi-1] = c[hi-1], c[i]
		switch {
		case acc+g >= target:
			hi = i // the nucleus ends among the better ones
		case acc+g+float64(pv.w) >= target:
			return i + 1 // the pivot completes it
		default:
			acc += g + float64(pv.w)
			lo = i + 1
		}
	}
	// Insertion sort of the small remaining range, then a cumulative scan.
	for i := lo + 1; i < hi; i++ {
		for j := i; j > lo && better(c[j].x, c[j].id, c[j-1].x, c[j-1].id); j-- {
			c[j], c[j-1] = c[j-1], c[j]
		}
	}
	for j := lo; j < hi; j++ {
		acc += float64(c[j].w)
		if acc >= target {
			return j + 1
		}
	}
	return hi
}

// insertTop inserts (x, id) into the sorted working list s.best of capacity n.
func (s *Sampler) insertTop(x float32, id int32, n int) {
	b := s.best
	if len(b) == n {
		last := b[n-1]
		if !better(x, id, last.x, last.id) {
			return
		}
		b = b[:n-1]
	}
	j := len(b)
	b = append(b, cand{})
	for j > 0 && better(x, id, b[j-1].x, b[j-1].id) {
		b[j] = b[j-1]
		j--
	}
	b[j] = cand{x: x, id: id}
	s.best = b
}

// topRaw returns the top tokens by raw logit with their raw logprobs x - maxAll - lse
// (lse = +Inf gives -Inf).
func (s *Sampler) topRaw(logits []float32, maxAll, lse float64) []TokenLogprob {
	n := min(s.nTop, len(logits))
	s.best = s.best[:0]
	for i, x := range logits {
		x = clean(x)
		// Inline rejection against the current worst: almost every token stops here.
		if b := s.best; len(b) == n && !better(x, int32(i), b[n-1].x, b[n-1].id) {
			continue
		}
		s.insertTop(x, int32(i), n)
	}
	out := make([]TokenLogprob, len(s.best))
	for i, e := range s.best {
		lp := negInf32
		if e.x != negInf32 {
			lp = float32(float64(e.x) - maxAll - lse)
		}
		out[i] = TokenLogprob{Token: int(e.id), Logprob: lp}
	}
	return out
}

// topProcessed returns the top tokens under the processed distribution: kept tokens by logit,
// then (with -Inf) the lowest ids outside the kept set.
func (s *Sampler) topProcessed(logits []float32, hasBan bool, r keepRule, maxOK, logZ float64) []TokenLogprob {
	n := min(s.nTop, len(logits))
	s.best = s.best[:0]
	for i, x := range logits {
		x = clean(x)
		id := int32(i)
		if (hasBan && s.ban[i] == s.epoch) || !r.kept(x, id) {
			x = negInf32
		}
		if b := s.best; len(b) == n && !better(x, id, b[n-1].x, b[n-1].id) {
			continue
		}
		s.insertTop(x, id, n)
	}
	out := make([]TokenLogprob, len(s.best))
	for i, e := range s.best {
		lp := negInf32
		switch {
		case e.x == negInf32:
		case s.greedy:
			lp = 0
		default:
			lp = float32((float64(e.x)-maxOK)*s.invT - logZ)
		}
		out[i] = TokenLogprob{Token: int(e.id), Logprob: lp}
	}
	return out
}
