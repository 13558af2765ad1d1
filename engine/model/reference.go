package model

import (
	"fmt"
	"math"

	"github.com/rolloutkit/rollout/engine/kernels"
)

// Reference computes the logits of every position of tokens with no cache and no batching,
// straight from the HF-layout weights, accumulating in float64. It is slow and simple on
// purpose: tests check the paged forward against it.
func Reference(w *Weights, tokens []int) ([][]float32, error) {
	c := w.Config
	if err := w.Check(); err != nil {
		return nil, err
	}
	if len(tokens) == 0 || len(tokens) > c.MaxPositionEmbeddings {
		return nil, fmt.Errorf("model: reference needs 1..%d tokens, got %d", c.MaxPositionEmbeddings, len(tokens))
	}
	h, hd, kvd := c.HiddenSize, c.HeadDim(), c.KVDim()
	group := c.NumAttentionHeads / c.NumKeyValueHeads
	invFreq := c.RopeInvFreq()
	n := len(tokens)
	xs := make([][]float64, n)
	for t, id := range tokens {
		if id < 0 || id >= c.VocabSize {
			return nil, fmt.Errorf("model: token %d outside vocab %d", id, c.VocabSize)
		}
		xs[t] = make([]float64, h)
		for i := range h {
			xs[t][i] = float64(w.Embed[id*h+i])
		}
	}
	keys := make([][]float64, n)
	vals := make([][]float64, n)
	for li := range w.Layers {
		l := &w.Layers[li]
		qs := make([][]float64, n)
		for t := range n {
			xn := refNorm(xs[t], l.AttnNorm, c.RMSNormEps)
			q, k, v := refMatVec(l.Wq, xn, h), refMatVec(l.Wk, xn, kvd), refMatVec(l.Wv, xn, kvd)
			if c.AttentionBias {
				refAdd(q, l.Bq)
				refAdd(k, l.Bk)
				refAdd(v, l.Bv)
			}
			qs[t] = refRope(q, t, hd, invFreq)
			keys[t] = refRope(k, t, hd, invFreq)
			vals[t] = v
		}
		for t := range n {
			att := make([]float64, h)
			for head := range c.NumAttentionHeads {
				kh := head / group
				q := qs[t][head*hd : (head+1)*hd]
				scores := make([]float64, t+1)
				maxS := math.Inf(-1)
				for j := 0; j <= t; j++ {
					s := 0.0
					for d := range hd {
						s += q[d] * keys[j][kh*hd+d]
					}
					scores[j] = s / math.Sqrt(float64(hd))
					maxS = math.Max(maxS, scores[j])
				}
				sum := 0.0
				for j := range scores {
					scores[j] = math.Exp(scores[j] - maxS)
					sum += scores[j]
				}
				for j := range scores {
					p := scores[j] / sum
					for d := range hd {
						att[head*hd+d] += p * vals[j][kh*hd+d]
					}
				}
			}
			o := refMatVec(l.Wo, att, h)
			for i := range h {
				xs[t][i] += o[i]
			}
			xn := refNorm(xs[t], l.FFNNorm, c.RMSNormEps)
			g := refMatVec(l.WGate, xn, c.IntermediateSize)
			u := refMatVec(l.WUp, xn, c.IntermediateSize)
			for i := range g {
				g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
			}
			d := refMatVec(l.WDown, g, h)
			for i := range h {
				xs[t][i] += d[i]
			}
		}
	}
	cls := w.Classifier()
	out := make([][]float32, n)
	for t := range n {
		xn := refNorm(xs[t], w.FinalNorm, c.RMSNormEps)
		lg := refMatVec(cls, xn, c.VocabSize)
		out[t] = make([]float32, c.VocabSize)
		for i, v := range lg {
			out[t][i] = float32(v)
		}
	}
	return out, nil
}

func refMatVec(w []float32, x []float64, rows int) []float64 {
	kernels.ClearUpper() // scalar SSE code after SIMD kernels on this thread: see ClearUpper
	cols := len(x)
	y := make([]float64, rows)
	for r := range rows {
		s := 0.0
		row := w[r*cols : (r+1)*cols]
		for k, v := range row {
			s += float64(v) * x[k]
		}
		y[r] = s
	}
	return y
}

func refNorm(x []float64, g []float32, eps float64) []float64 {
	ss := 0.0
	for _, v := range x {
		ss += v * v
	}
	inv := 1 / math.Sqrt(ss/float64(len(x))+eps)
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = v * inv * float64(g[i])
	}
	return y
}

// refAdd adds the bias b to y.
func refAdd(y []float64, b []float32) {
	for i, v := range b {
		y[i] += float64(v)
	}
}

// refRope applies HF rotate-half RoPE at position pos to every head of v, pair i turning at
// invFreq[i] (Config.RopeInvFreq).
func refRope(v []float64, pos, hd int, invFreq []float64) []float64 {
	half := hd / 2
	for h0 := 0; h0 < len(v); h0 += hd {
		for i := range half {
			s, c := math.Sincos(float64(pos) * invFreq[i])
			a, b := v[h0+i], v[h0+i+half]
			v[h0+i] = a*c - b*s
			v[h0+i+half] = b*c + a*s
		}
	}
	return v
}

// ReferenceGreedy is the greedy continuation of prompt for n tokens under Reference (ties go to
// the lowest id): what every paged, batched, chunked or preempted greedy run must reproduce.
func ReferenceGreedy(w *Weights, prompt []int, n int) ([]int, error) {
	toks := append([]int(nil), prompt...)
	out := make([]int, 0, n)
	for range n {
		lg, err := Reference(w, toks)
		if err != nil {
			return nil, err
		}
		last := lg[len(lg)-1]
		best := 0
		for i, v := range last {
			if v > last[best] {
				best = i
			}
		}
		out = append(out, best)
		toks = append(toks, best)
	}
	return out, nil
}
