package trainer

import (
	"math"

	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/model"
)

// grads are the gradient tensors of a net, each matrix's (stacked ones included) contiguous.
type grads[F float] struct {
	p      *params[F]
	layers []gradLayer[F]
	cls    []F
	// fresh is set by zero: the next product into each matrix's gradient may overwrite it
	// instead of adding (the first micro-batch of a step).
	fresh map[*mat[F]]bool
}

type gradLayer[F float] struct {
	qkv, wo, gateUp, down []F
}

// newGrads returns zeroed gradients for a model of shape c.
func newGrads[F float](c model.Config) *grads[F] {
	p := newParams[F](c)
	g := &grads[F]{p: p, cls: p.cls(), fresh: map[*mat[F]]bool{}}
	for i := range p.layers {
		l := &p.layers[i]
		g.layers = append(g.layers, gradLayer[F]{qkv: l.qkv, wo: l.wo, gateUp: l.gateUp, down: l.wDown})
	}
	return g
}

// zero clears the gradients for a new step.
func (g *grads[F]) zero() {
	g.p.zero()
	for m := range g.fresh {
		m.gTPending = false
	}
	clear(g.fresh)
}

// flush completes the gradients after a step's last backward pass (the LM head's is
// accumulated transposed; see addGrad).
func (g *grads[F]) flush() {
	for m := range g.fresh {
		m.flushTransposed()
	}
}

// add runs addGrad into dst, overwriting on the first product since zero.
func (g *grads[F]) add(pool *kernels.Pool, m *mat[F], dst, dy, x []F, n int) {
	overwrite := !g.fresh[m]
	g.fresh[m] = true
	addGrad(pool, m, dst, dy, x, n, overwrite)
}

// work holds the backward pass's scratch buffers, reused across calls.
type work[F float] struct {
	dlogits, dxnF, dx, dxn, dtmp, dact, dgu, datt, dqkv []F
}

// backward adds to g the gradient of Σ_i glogp[i]·logp[i] (the targets' logprobs of the
// forward that filled a) with respect to every parameter.
func (n *net[F]) backward(b *batch, a *acts[F], glogp []float64, g *grads[F], w *work[F]) {
	M, v := len(b.targets), n.cfg.VocabSize

	// LM head: d logp / d logit_j = 1[j = target] - softmax_j; for the processed distribution
	// (temperature T, a kept set S held fixed) (1[j = target] - q_j)/T on S and 0 elsewhere.
	w.dlogits = grow(w.dlogits, M*v)
	if n.proc != nil {
		invT := 1 / n.proc.Temperature
		n.pool.Parallel(M, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				q, d := a.probs[i*v:(i+1)*v], w.dlogits[i*v:(i+1)*v]
				gi := glogp[i] * invT
				if gi == 0 || math.IsInf(a.logp[i], -1) {
					clear(d)
					continue
				}
				for j, pj := range q {
					d[j] = F(-gi * float64(pj))
				}
				d[b.targetTok[i]] += F(gi)
			}
		})
	} else {
		n.lmHeadRaw(b, a, glogp, w, M, v)
	}
	n.backwardBody(b, a, g, w)
}

// lmHeadRaw fills w.dlogits for raw logprobs.
func (n *net[F]) lmHeadRaw(b *batch, a *acts[F], glogp []float64, w *work[F], M, v int) {
	n.pool.Parallel(M, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			row, d := a.logits[i*v:(i+1)*v], w.dlogits[i*v:(i+1)*v]
			gi := glogp[i]
			if gi == 0 {
				clear(d)
				continue
			}
			// softmax_j = exp(l_j - max - lse); the shifted exponentials reuse the engine's kernel.
			s := F(-gi / expShifted(d, row, a.maxL[i]))
			kernels.ClearUpper()
			for j := range d {
				d[j] *= s
			}
			d[b.targetTok[i]] += F(gi)
		}
	})
}

// backwardBody propagates w.dlogits through the LM head and the layers into g.
func (n *net[F]) backwardBody(b *batch, a *acts[F], g *grads[F], w *work[F]) {
	c := n.cfg
	N, M := len(b.tokens), len(b.targets)
	h, f, kvd := c.HiddenSize, c.IntermediateSize, c.KVDim()
	qkvW := h + 2*kvd
	g.add(n.pool, n.cls, g.cls, w.dlogits, a.xnF, M)
	w.dxnF = grow(w.dxnF, M*h)
	mulT(n.pool, n.cls, w.dxnF, w.dlogits, M)
	w.dx = grow(w.dx, N*h)
	clear(w.dx)
	for i, t := range b.targets {
		rmsNormBack(w.dx[t*h:(t+1)*h], g.p.finalNorm, a.x[t*h:(t+1)*h], w.dxnF[i*h:(i+1)*h], n.p.finalNorm, a.invF[i])
	}

	w.dxn = grow(w.dxn, N*h)
	w.dtmp = grow(w.dtmp, N*h)
	w.dact = grow(w.dact, N*f)
	w.dgu = grow(w.dgu, N*2*f)
	w.datt = grow(w.datt, N*h)
	w.dqkv = grow(w.dqkv, N*qkvW)
	for li := len(n.layers) - 1; li >= 0; li-- {
		l, pl, gl, la := &n.layers[li], &n.p.layers[li], &g.layers[li], &a.layers[li]
		gp := &g.p.layers[li]
		// MLP: x_out = xmid + down(silu(gate)·up).
		mulT(n.pool, l.down, w.dact, w.dx, N)
		g.add(n.pool, l.down, gl.down, w.dx, la.act, N)
		n.pool.Parallel(N, func(lo, hi int) {
			for t := lo; t < hi; t++ {
				swigluBack(w.dgu[t*2*f:(t+1)*2*f], la.gu[t*2*f:(t+1)*2*f], w.dact[t*f:(t+1)*f])
			}
		})
		g.add(n.pool, l.gateUp, gl.gateUp, w.dgu, la.xn2, N)
		mulT(n.pool, l.gateUp, w.dxn, w.dgu, N)
		for t := range N {
			rmsNormBack(w.dx[t*h:(t+1)*h], gp.ffnNorm, la.xmid[t*h:(t+1)*h], w.dxn[t*h:(t+1)*h], pl.ffnNorm, la.inv2[t])
		}
		// Attention: xmid = x + o_proj(attention(rope(q), rope(k), v)).
		mulT(n.pool, l.wo, w.datt, w.dx, N)
		g.add(n.pool, l.wo, gl.wo, w.dx, la.att, N)
		clear(w.dqkv)
		n.attentionBack(b, la, w.datt, w.dqkv)
		for t := range N {
			n.ropeBack(w.dqkv[t*qkvW:t*qkvW+h+kvd], b.pos[t])
		}
		g.add(n.pool, l.qkv, gl.qkv, w.dqkv, la.xn1, N)
		mulT(n.pool, l.qkv, w.dxn, w.dqkv, N)
		for t := range N {
			rmsNormBack(w.dx[t*h:(t+1)*h], gp.attnNorm, la.x[t*h:(t+1)*h], w.dxn[t*h:(t+1)*h], pl.attnNorm, la.inv1[t])
		}
	}
	kernels.ClearUpper()
	for t, id := range b.tokens {
		ge, d := g.p.embed[id*h:(id+1)*h], w.dx[t*h:(t+1)*h]
		for i := range ge {
			ge[i] += d[i]
		}
	}
}

// rmsNormBack adds the gradient of y = g·x·r (r = 1/sqrt(mean(x²)+eps), which inv holds)
// given dy: dg_i += dy_i·x_i·r and dx_i += r·g_i·dy_i − x_i·r³·Σ_j g_j·dy_j·x_j / h.
func rmsNormBack[F float](dx, dg, x, dy, g []F, inv F) {
	kernels.ClearUpper()
	s := 0.0
	for j, xv := range x {
		s += float64(g[j]) * float64(dy[j]) * float64(xv)
	}
	r := float64(inv)
	k := s * r * r * r / float64(len(x))
	for i, xv := range x {
		dg[i] += dy[i] * xv * inv
		dx[i] += F(r*float64(g[i])*float64(dy[i]) - k*float64(xv))
	}
}

// swigluBack writes the gradients of gate and up (dgu, laid out like gu: gate then up) of
// act = silu(gate)·up given dact. e^-|x| comes from the vector exponential, as in swiglu; the
// up half of dgu holds it until it is overwritten.
func swigluBack[F float](dgu, gu, dact []F) {
	f := len(dact)
	g, u := gu[:f], gu[f:]
	dg, du := dgu[:f], dgu[f:]
	kernels.ClearUpper()
	for i, x := range g {
		du[i] = -F(math.Abs(float64(x)))
	}
	expShifted(du, du, 0)
	kernels.ClearUpper()
	for i, x := range g {
		e := du[i]
		sig := 1 / (1 + e)
		if x < 0 {
			sig = e / (1 + e)
		}
		silu := x * sig
		d := dact[i]
		dg[i] = d * u[i] * sig * (1 + x*(1-sig))
		du[i] = d * silu
	}
}

// attentionBack adds to dqkv the gradients of the post-RoPE q and k and of v given datt, the
// gradient of the attention output. Work is split by (span, KV head) so that the K and V rows
// a unit writes are its own. Per head, a first pass over query rows t computes
// dS[t][j] = P[t][j]·(dP[t][j] − Σ_j P·dP) with dP[t][j] = dO_t·v_j, and dq_t = scale·Σ_j dS·k_j;
// a second pass over key rows j gathers column j of P and dS and accumulates
// dv_j = Σ_t P[t][j]·dO_t and dk_j = scale·Σ_t dS[t][j]·q_t with the vector kernel.
func (n *net[F]) attentionBack(b *batch, la *layerActs[F], datt, dqkv []F) {
	c := n.cfg
	h, kvd, hd := c.HiddenSize, c.KVDim(), c.HeadDim()
	heads, kvHeads := c.NumAttentionHeads, c.NumKeyValueHeads
	group := heads / kvHeads
	qkvW := h + 2*kvd
	units := len(b.spans) * kvHeads
	n.pool.Parallel(units, func(lo, hi int) {
		var ds, pcol, dcol []F
		for u := lo; u < hi; u++ {
			sp, kh := b.spans[u/kvHeads], u%kvHeads
			ds = grow(ds, tri(sp.n))
			pcol, dcol = grow(pcol, sp.n), grow(dcol, sp.n)
			rows := la.qkv[sp.start*qkvW:]
			kOff, vOff := h+kh*hd, h+kvd+kh*hd
			for head := kh * group; head < (kh+1)*group; head++ {
				base := b.probOff[u/kvHeads] + head*tri(sp.n)
				probs := la.probs[base : base+tri(sp.n)]
				for t := range sp.n {
					row := sp.start + t
					p := probs[tri(t):tri(t+1)]
					do := datt[row*h+head*hd : row*h+(head+1)*hd]
					d := ds[tri(t):tri(t+1)]
					dotRows(d, do, rows, qkvW, vOff, t+1, 1) // dP_j = dO_t·v_j
					kernels.ClearUpper()
					dot := 0.0
					for j, pj := range p {
						dot += float64(pj) * float64(d[j])
					}
					for j, pj := range p {
						d[j] = F(float64(pj)*(float64(d[j])-dot)) * n.scale
					}
					accumRows(dqkv[row*qkvW+head*hd:][:hd], d, rows, qkvW, kOff, t+1)
				}
				for j := range sp.n {
					m := sp.n - j
					for s := range m {
						o := tri(j+s) + j
						pcol[s], dcol[s] = probs[o], ds[o]
					}
					accumRows(dqkv[(sp.start+j)*qkvW+vOff:][:hd], pcol[:m], datt[(sp.start+j)*h:], h, head*hd, m)
					accumRows(dqkv[(sp.start+j)*qkvW+kOff:][:hd], dcol[:m], la.qkv[(sp.start+j)*qkvW:], qkvW, head*hd, m)
				}
			}
		}
	})
}
