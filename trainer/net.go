package trainer

import (
	"math"

	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/sample"
)

// net is a network of element type F over params p, with the projections grouped as the
// engine groups them (QKV stacked, gate and up stacked) so that the float32 forward runs the
// engine's kernels on the engine's matrices.
type net[F float] struct {
	cfg    model.Config
	p      *params[F]
	pool   *kernels.Pool
	eps    float64
	scale  F
	cos    []F // RoPE tables [MaxPositionEmbeddings][headDim/2], as the engine builds them
	sin    []F
	layers []netLayer[F]
	cls    *mat[F]
	// proc, when set, makes logprobs those of the processed distribution these sampling
	// parameters sample from (temperature and filters); nil means raw (temperature 1, no
	// filters).
	proc *sample.Params
}

type netLayer[F float] struct {
	qkv, wo, gateUp, down *mat[F]
}

func newNet[F float](p *params[F], pool *kernels.Pool) *net[F] {
	c := p.cfg
	h, f, kvd, hd := c.HiddenSize, c.IntermediateSize, c.KVDim(), c.HeadDim()
	n := &net[F]{cfg: c, p: p, pool: pool, eps: float64(F(c.RMSNormEps))}
	n.scale = F(1 / math.Sqrt(float64(hd)))
	for i := range p.layers {
		l := &p.layers[i]
		n.layers = append(n.layers, netLayer[F]{
			qkv:    newMat(h+2*kvd, h, l.wq, l.wk, l.wv),
			wo:     newMat(h, h, l.wo),
			gateUp: newMat(2*f, h, l.wGate, l.wUp),
			down:   newMat(h, f, l.wDown),
		})
	}
	n.cls = newMat(c.VocabSize, h, p.cls())
	half := hd / 2
	n.cos = make([]F, c.MaxPositionEmbeddings*half)
	n.sin = make([]F, c.MaxPositionEmbeddings*half)
	for pos := range c.MaxPositionEmbeddings {
		for i := range half {
			freq := math.Pow(c.RopeTheta, -2*float64(i)/float64(hd))
			s, co := math.Sincos(float64(pos) * freq)
			n.cos[pos*half+i], n.sin[pos*half+i] = F(co), F(s)
		}
	}
	return n
}

// invalidate drops the packed matrices after the parameters changed.
func (n *net[F]) invalidate() {
	for _, l := range n.layers {
		l.qkv.invalidate()
		l.wo.invalidate()
		l.gateUp.invalidate()
		l.down.invalidate()
	}
	n.cls.invalidate()
}

// span is one sequence of a batch: tokens start..start+n-1 at positions 0..n-1.
type span struct{ start, n int }

// batch is sequences concatenated for the projections (which treat tokens independently);
// attention runs per span. targets[i] is the index of the token whose next-token logprob of
// targetTok[i] is wanted.
type batch struct {
	tokens    []int
	pos       []int
	spans     []span
	probOff   []int // offset of each span's attention probabilities in layerActs.probs
	probLen   int
	targets   []int
	targetTok []int
}

// addSequence appends prompt+completion as one sequence whose targets are the completion:
// the input is prompt and completion[:len-1], and the logits at position len(prompt)-1+i
// predict completion[i].
func (b *batch) addSequence(prompt, completion []int, heads int) {
	start := len(b.tokens)
	b.tokens = append(b.tokens, prompt...)
	b.tokens = append(b.tokens, completion[:len(completion)-1]...)
	n := len(b.tokens) - start
	for i := range n {
		b.pos = append(b.pos, i)
	}
	b.spans = append(b.spans, span{start, n})
	b.probOff = append(b.probOff, b.probLen)
	b.probLen += heads * n * (n + 1) / 2
	for i, tok := range completion {
		b.targets = append(b.targets, start+len(prompt)-1+i)
		b.targetTok = append(b.targetTok, tok)
	}
}

// layerActs are the activations of one layer the backward pass needs.
type layerActs[F float] struct {
	x     []F // residual stream entering the layer [N][h]
	inv1  []F // RMSNorm scale of x [N]
	xn1   []F // attention input [N][h]
	qkv   []F // q and k after RoPE, then v [N][h+2kvd]
	probs []F // attention probabilities per span, head and query row (lower triangle)
	att   []F // attention output before o_proj [N][h]
	xmid  []F // residual after attention [N][h]
	inv2  []F
	xn2   []F // MLP input [N][h]
	gu    []F // gate then up projections [N][2f]
	act   []F // silu(gate)·up [N][f]
}

// acts are a forward pass's saved activations and results.
type acts[F float] struct {
	layers []layerActs[F]
	x      []F // final residual [N][h]
	tmp    []F
	xnF    []F // final-normed rows of the targets [M][h]
	invF   []F
	logits []F // [M][vocab]
	maxL   []F
	lse    []float64
	logp   []float64 // log p(target) per target, as the engine's sampler computes it
	// entropy is the entropy (nats) of each target's next-token distribution (the processed one
	// when the net has proc).
	entropy []float64
	// probs is each target's processed distribution [M][vocab], only with proc.
	probs []float32
}

// forward runs b, saving what backward needs in a and the targets' logprobs in a.logp.
func (n *net[F]) forward(b *batch, a *acts[F]) {
	c := n.cfg
	N, M := len(b.tokens), len(b.targets)
	h, f, kvd := c.HiddenSize, c.IntermediateSize, c.KVDim()
	qkvW := h + 2*kvd
	if len(a.layers) != c.NumHiddenLayers {
		a.layers = make([]layerActs[F], c.NumHiddenLayers)
	}
	a.x = grow(a.x, N*h)
	a.tmp = grow(a.tmp, N*h)
	for t, id := range b.tokens {
		copy(a.x[t*h:(t+1)*h], n.p.embed[id*h:(id+1)*h])
	}
	for li := range n.layers {
		l, pl, la := &n.layers[li], &n.p.layers[li], &a.layers[li]
		la.x = grow(la.x, N*h)
		copy(la.x, a.x)
		la.inv1 = grow(la.inv1, N)
		la.xn1 = grow(la.xn1, N*h)
		rmsNormRows(la.xn1, la.inv1, la.x, pl.attnNorm, N, h, n.eps)
		la.qkv = grow(la.qkv, N*qkvW)
		mul(n.pool, l.qkv, la.qkv, la.xn1, N)
		for t := range N {
			n.rope(la.qkv[t*qkvW:t*qkvW+h+kvd], b.pos[t])
		}
		la.probs = grow(la.probs, b.probLen)
		la.att = grow(la.att, N*h)
		n.attention(b, la)
		mul(n.pool, l.wo, a.tmp, la.att, N)
		la.xmid = grow(la.xmid, N*h)
		addTo(la.xmid, la.x, a.tmp)
		la.inv2 = grow(la.inv2, N)
		la.xn2 = grow(la.xn2, N*h)
		rmsNormRows(la.xn2, la.inv2, la.xmid, pl.ffnNorm, N, h, n.eps)
		la.gu = grow(la.gu, N*2*f)
		mul(n.pool, l.gateUp, la.gu, la.xn2, N)
		la.act = grow(la.act, N*f)
		n.pool.Parallel(N, func(lo, hi int) {
			for t := lo; t < hi; t++ {
				swiglu(la.act[t*f:(t+1)*f], la.gu[t*2*f:t*2*f+f], la.gu[t*2*f+f:(t+1)*2*f])
			}
		})
		mul(n.pool, l.down, a.tmp, la.act, N)
		addTo(a.x, la.xmid, a.tmp)
	}
	a.xnF = grow(a.xnF, M*h)
	a.invF = grow(a.invF, M)
	for i, t := range b.targets {
		a.invF[i] = rmsNorm(a.xnF[i*h:(i+1)*h], a.x[t*h:(t+1)*h], n.p.finalNorm, n.eps)
	}
	v := c.VocabSize
	a.logits = grow(a.logits, M*v)
	mul(n.pool, n.cls, a.logits, a.xnF, M)
	a.maxL = grow(a.maxL, M)
	a.lse = grow(a.lse, M)
	a.logp = grow(a.logp, M)
	a.entropy = grow(a.entropy, M)
	if n.proc != nil {
		a.probs = grow(a.probs, M*v)
		n.pool.Parallel(M, func(lo, hi int) {
			s := sample.New(*n.proc, 0)
			var r32 []float32
			for i := lo; i < hi; i++ {
				row := a.logits[i*v : (i+1)*v]
				x, ok := any(row).([]float32)
				if !ok {
					r32 = grow(r32, v)
					for j, e := range row {
						r32[j] = float32(e)
					}
					x = r32
				}
				q := a.probs[i*v : (i+1)*v]
				a.logp[i] = float64(s.Processed(x, b.targetTok[i], q))
				if !ok {
					// The float64 check path: the same kept set, the logprob in float64.
					a.logp[i] = processed64(row, q, b.targetTok[i], n.proc.Temperature)
				}
				h := 0.0
				for _, pj := range q {
					if pj > 0 {
						h -= float64(pj) * math.Log(float64(pj))
					}
				}
				a.entropy[i] = h
			}
		})
		return
	}
	n.pool.Parallel(M, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			row := a.logits[i*v : (i+1)*v]
			a.maxL[i] = maxOf(row)
			a.lse[i] = logSumExpShifted(row, a.maxL[i])
			a.logp[i] = float64(row[b.targetTok[i]]) - float64(a.maxL[i]) - a.lse[i]
			// H = lse - Σ p_j (x_j - max), p_j = exp(x_j - max - lse).
			m, lse, h := float64(a.maxL[i]), a.lse[i], 0.0
			for _, x := range row {
				if d := float64(x) - m; !math.IsInf(d, -1) {
					h -= math.Exp(d-lse) * d
				}
			}
			a.entropy[i] = lse + h
		}
	})
}

// rope rotates every head of row (q heads then k heads) to position pos, HF rotate-half style.
func (n *net[F]) rope(row []F, pos int) {
	hd := n.cfg.HeadDim()
	half := hd / 2
	cs, sn := n.cos[pos*half:(pos+1)*half], n.sin[pos*half:(pos+1)*half]
	for h0 := 0; h0+hd <= len(row); h0 += hd {
		a, b := row[h0:h0+half], row[h0+half:h0+hd]
		for i := range half {
			x, y := a[i], b[i]
			a[i] = x*cs[i] - y*sn[i]
			b[i] = y*cs[i] + x*sn[i]
		}
	}
}

// ropeBack maps the gradient of a rotated row back through the rotation (its transpose).
func (n *net[F]) ropeBack(row []F, pos int) {
	hd := n.cfg.HeadDim()
	half := hd / 2
	cs, sn := n.cos[pos*half:(pos+1)*half], n.sin[pos*half:(pos+1)*half]
	for h0 := 0; h0+hd <= len(row); h0 += hd {
		a, b := row[h0:h0+half], row[h0+half:h0+hd]
		for i := range half {
			x, y := a[i], b[i]
			a[i] = x*cs[i] + y*sn[i]
			b[i] = y*cs[i] - x*sn[i]
		}
	}
}

func tri(n int) int { return n * (n + 1) / 2 }

// attention computes softmax(q·K/sqrt(d))·V causally within each span, in the engine's order
// (scores, max, shifted exponentials, unnormalised weighted sum, one scaling at the end), and
// keeps the normalised probabilities for backward.
func (n *net[F]) attention(b *batch, la *layerActs[F]) {
	c := n.cfg
	h, kvd, hd := c.HiddenSize, c.KVDim(), c.HeadDim()
	heads := c.NumAttentionHeads
	group := heads / c.NumKeyValueHeads
	qkvW := h + 2*kvd
	units := len(b.spans) * heads
	n.pool.Parallel(units, func(lo, hi int) {
		for u := lo; u < hi; u++ {
			sp, head := b.spans[u/heads], u%heads
			kh := head / group
			base := b.probOff[u/heads] + head*tri(sp.n)
			rows := la.qkv[sp.start*qkvW:]
			for t := range sp.n {
				q := la.qkv[(sp.start+t)*qkvW+head*hd : (sp.start+t)*qkvW+(head+1)*hd]
				out := la.att[(sp.start+t)*h+head*hd : (sp.start+t)*h+(head+1)*hd]
				p := la.probs[base+tri(t) : base+tri(t+1)]
				dotRows(p, q, rows, qkvW, h+kh*hd, t+1, n.scale)
				sum := expShifted(p, p, maxOf(p))
				inv := F(1 / sum)
				clear(out)
				accumRows(out, p, rows, qkvW, h+kvd+kh*hd, t+1)
				for i := range out {
					out[i] *= inv
				}
				for i := range p {
					p[i] *= inv
				}
			}
		}
	})
}

func addTo[F float](dst, a, b []F) {
	kernels.ClearUpper()
	for i := range dst {
		dst[i] = a[i] + b[i]
	}
}

// rmsNorm is the engine's RMSNorm: the mean square in float64, the scale rounded to F. It
// returns the scale. In float32 it is kernels.RMSNorm itself (eps is float64(float32(eps))
// there, as in the engine), so the trainer's forward is bit-identical to the engine's.
func rmsNorm[F float](dst, x, g []F, eps float64) F {
	kernels.ClearUpper()
	if x32, ok := any(x).([]float32); ok {
		inv := kernels.RMSNorm(any(dst).([]float32), x32, any(g).([]float32), float32(eps))
		kernels.ClearUpper()
		return F(inv)
	}
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	inv := F(1 / math.Sqrt(ss/float64(len(x))+eps))
	for i, v := range x {
		dst[i] = v * inv * g[i]
	}
	return inv
}

func rmsNormRows[F float](dst, inv, x, g []F, n, h int, eps float64) {
	for t := range n {
		inv[t] = rmsNorm(dst[t*h:(t+1)*h], x[t*h:(t+1)*h], g, eps)
	}
}

// swiglu writes a = silu(g)·u exactly as the engine does: kernels.SwiGLU in float32, the same
// formula with math.Exp in float64.
func swiglu[F float](a, g, u []F) {
	kernels.ClearUpper()
	if a32, ok := any(a).([]float32); ok {
		kernels.SwiGLU(a32, any(g).([]float32), any(u).([]float32))
		kernels.ClearUpper()
		return
	}
	for i, x := range g {
		e := F(math.Exp(-math.Abs(float64(x))))
		if x >= 0 {
			a[i] = x / (1 + e) * u[i]
		} else {
			a[i] = x * e / (1 + e) * u[i]
		}
	}
}

// processed64 is the logprob of token under temperature t renormalised over the kept set
// (the tokens of nonzero probability in q), computed in float64 from row.
func processed64[F float](row []F, q []float32, token int, t float64) float64 {
	if q[token] == 0 {
		return math.Inf(-1)
	}
	m := math.Inf(-1)
	for j, x := range row {
		if q[j] > 0 {
			m = max(m, float64(x))
		}
	}
	z := 0.0
	for j, x := range row {
		if q[j] > 0 {
			z += math.Exp((float64(x) - m) / t)
		}
	}
	return (float64(row[token])-m)/t - math.Log(z)
}
