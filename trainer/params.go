package trainer

import (
	"fmt"

	"github.com/rolloutkit/rollout/engine/model"
)

// float is the element type of a network: float32 for training (the engine's type), float64
// for the finite-difference check of the backward pass.
type float interface{ ~float32 | ~float64 }

// layerParams is one decoder layer's tensors in the engine's HF layout (row-major [out][in]).
type layerParams[F float] struct {
	attnNorm, wq, wk, wv, wo, ffnNorm, wGate, wDown, wUp []F
	// qkv and gateUp view wq|wk|wv and wGate|wUp, which newParams allocates adjacently, so a
	// stacked gradient can be written in one piece.
	qkv, gateUp []F
}

// params is a whole checkpoint of element type F, shaped like model.Weights. It also holds
// gradients and optimizer moments, which have the same shape.
type params[F float] struct {
	cfg       model.Config
	embed     []F
	layers    []layerParams[F]
	finalNorm []F
	lmHead    []F // nil when tied
}

// tensors lists pointers to every tensor in model.Weights.Tensors order, so that index i here
// and there name the same tensor.
func (p *params[F]) tensors() []*[]F {
	ts := []*[]F{&p.embed}
	for i := range p.layers {
		l := &p.layers[i]
		ts = append(ts, &l.attnNorm, &l.wq, &l.wk, &l.wv, &l.wo, &l.ffnNorm, &l.wGate, &l.wDown, &l.wUp)
	}
	ts = append(ts, &p.finalNorm)
	if !p.cfg.TieWordEmbeddings {
		ts = append(ts, &p.lmHead)
	}
	return ts
}

// cls is the output projection: the embedding when tied.
func (p *params[F]) cls() []F {
	if p.cfg.TieWordEmbeddings {
		return p.embed
	}
	return p.lmHead
}

// newParams allocates zeroed tensors of shape c, each layer's in one block with the stacked
// projections adjacent.
func newParams[F float](c model.Config) *params[F] {
	h, f, kvd, v := c.HiddenSize, c.IntermediateSize, c.KVDim(), c.VocabSize
	p := &params[F]{cfg: c, layers: make([]layerParams[F], c.NumHiddenLayers)}
	p.embed = make([]F, v*h)
	for i := range p.layers {
		l := &p.layers[i]
		slab := make([]F, 2*h+2*h*h+2*kvd*h+3*f*h)
		take := func(n int) []F {
			s := slab[:n:n]
			slab = slab[n:]
			return s
		}
		l.attnNorm, l.ffnNorm = take(h), take(h)
		l.qkv = slab[:(h+2*kvd)*h]
		l.wq, l.wk, l.wv = take(h*h), take(kvd*h), take(kvd*h)
		l.wo = take(h * h)
		l.gateUp = slab[:2*f*h]
		l.wGate, l.wUp = take(f*h), take(f*h)
		l.wDown = take(h * f)
	}
	p.finalNorm = make([]F, h)
	if !c.TieWordEmbeddings {
		p.lmHead = make([]F, v*h)
	}
	return p
}

// paramsFrom copies w (which must have passed Check) into a new params of type F.
func paramsFrom[F float](w *model.Weights) *params[F] {
	p := newParams[F](w.Config)
	src := w.Tensors()
	for i, t := range p.tensors() {
		for j, v := range *src[i].Data {
			(*t)[j] = F(v)
		}
	}
	return p
}

// weights copies p into a new model.Weights.
func (p *params[F]) weights() *model.Weights {
	w := &model.Weights{Config: p.cfg}
	dst := w.Tensors()
	for i, t := range p.tensors() {
		out := make([]float32, len(*t))
		for j, v := range *t {
			out[j] = float32(v)
		}
		*dst[i].Data = out
	}
	return w
}

// zero clears every tensor.
func (p *params[F]) zero() {
	for _, t := range p.tensors() {
		clear(*t)
	}
}

// CheckShape returns ErrShapeMismatch unless got has the tensor shapes of want (every field
// that changes a tensor's size or the model's arithmetic; token ids and names may differ).
func CheckShape(want, got model.Config) error {
	type shape struct {
		h, f, l, heads, kv, v int
		tied                  bool
		theta, eps            float64
	}
	s := func(c model.Config) shape {
		return shape{c.HiddenSize, c.IntermediateSize, c.NumHiddenLayers, c.NumAttentionHeads,
			c.NumKeyValueHeads, c.VocabSize, c.TieWordEmbeddings, c.RopeTheta, c.RMSNormEps}
	}
	if s(want) != s(got) {
		return fmt.Errorf("%w: want hidden %d, intermediate %d, layers %d, heads %d/%d, vocab %d, tied %v, rope_theta %v, eps %v; "+
			"got hidden %d, intermediate %d, layers %d, heads %d/%d, vocab %d, tied %v, rope_theta %v, eps %v",
			ErrShapeMismatch, want.HiddenSize, want.IntermediateSize, want.NumHiddenLayers, want.NumAttentionHeads,
			want.NumKeyValueHeads, want.VocabSize, want.TieWordEmbeddings, want.RopeTheta, want.RMSNormEps,
			got.HiddenSize, got.IntermediateSize, got.NumHiddenLayers, got.NumAttentionHeads,
			got.NumKeyValueHeads, got.VocabSize, got.TieWordEmbeddings, got.RopeTheta, got.RMSNormEps)
	}
	return nil
}
