package model

import (
	"errors"
	"fmt"

	"github.com/rolloutkit/rollout/engine/kernels"
)

// ErrIncomplete is returned (wrapped) by Builder.Model when a tensor was never put.
var ErrIncomplete = errors.New("model: incomplete weights")

// Builder packs a model one tensor at a time, as a loader decodes them, so that no complete
// float32 set exists: a bf16 checkpoint loads into a bf16 model in about the model's own
// memory plus the float32 tensors of the matrices not yet complete (a stacked matrix, such as
// q, k and v, is packed once all its parts are in; in file order that is within one layer)
// and the embedding's. The loader asks for each tensor's memory (Buffer), fills it with the
// tensor's float32 values and hands it over (Put); the builder packs it and reuses the memory
// for the next tensor of that size. It is not safe for concurrent use.
type Builder struct {
	cfg   Config
	prec  kernels.Precision
	m     *Model
	reuse *Model
	roles map[string]role
	mats  []buildMat
	// embedDone says the embedding is in; head holds a tied checkpoint's lm_head.weight put
	// before the embedding, to compare with it then.
	embedDone bool
	head      []float32
	free      map[int][]float32
	// held is the float32 scratch the builder holds (pending parts and free buffers), peak its
	// largest value: what loading costs beyond the packed model.
	held, peak int64
}

type roleKind int

const (
	roleNorm roleKind = iota
	rolePart
	roleEmbed
	roleTiedHead
	roleBias
)

// role is what a tensor of the checkpoint becomes.
type role struct {
	kind roleKind
	n    int        // values
	norm *[]float32 // roleNorm: where the model keeps it; roleBias: the stacked biases
	off  int        // roleBias: where in them
	mat  int        // rolePart: the matrix (Builder.mats)
	part int        // rolePart: its index among the matrix's parts
}

// buildMat is one packed matrix being assembled from its parts.
type buildMat struct {
	dst        **kernels.Matrix
	old        *kernels.Matrix
	rows, cols int
	parts      [][]float32
	missing    int
}

// NewBuilder starts a model of config c at precision prec, packed into the memory of reuse
// (as NewAs) when it fits.
func NewBuilder(c Config, prec kernels.Precision, reuse *Model) (*Builder, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if _, err := newEmbedding(nil, c.HiddenSize, prec); err != nil { // an unknown precision
		return nil, err
	}
	if reuse != nil && (reuse.Precision != prec || len(reuse.layers) != c.NumHiddenLayers) {
		reuse = nil
	}
	h, f, kvd := c.HiddenSize, c.IntermediateSize, c.KVDim()
	m := &Model{Config: c, Precision: prec, layers: make([]packedLayer, c.NumHiddenLayers), finalNorm: make([]float32, h)}
	b := &Builder{cfg: c, prec: prec, m: m, reuse: reuse, roles: map[string]role{}, free: map[int][]float32{}}
	var old packedLayer
	mat := func(dst **kernels.Matrix, oldm *kernels.Matrix, rows, cols int, names ...string) {
		b.mats = append(b.mats, buildMat{dst: dst, old: oldm, rows: rows, cols: cols, parts: make([][]float32, len(names)), missing: len(names)})
		for i, name := range names {
			b.roles[name] = role{kind: rolePart, n: rows / len(names) * cols, mat: len(b.mats) - 1, part: i}
		}
	}
	norm := func(name string, dst *[]float32) {
		*dst = make([]float32, h)
		b.roles[name] = role{kind: roleNorm, n: h, norm: dst}
	}
	for i := range m.layers {
		pl := &m.layers[i]
		if reuse != nil {
			old = reuse.layers[i]
		}
		p := fmt.Sprintf("model.layers.%d.", i) // the names of Weights.Tensors
		norm(p+"input_layernorm.weight", &pl.attnNorm)
		mat(&pl.qkv, old.qkv, h+2*kvd, h, p+"self_attn.q_proj.weight", p+"self_attn.k_proj.weight", p+"self_attn.v_proj.weight")
		b.setPartLen(p+"self_attn.q_proj.weight", h*h)
		b.setPartLen(p+"self_attn.k_proj.weight", kvd*h)
		b.setPartLen(p+"self_attn.v_proj.weight", kvd*h)
		if c.AttentionBias {
			pl.qkvBias = make([]float32, h+2*kvd)
			b.roles[p+"self_attn.q_proj.bias"] = role{kind: roleBias, n: h, norm: &pl.qkvBias}
			b.roles[p+"self_attn.k_proj.bias"] = role{kind: roleBias, n: kvd, norm: &pl.qkvBias, off: h}
			b.roles[p+"self_attn.v_proj.bias"] = role{kind: roleBias, n: kvd, norm: &pl.qkvBias, off: h + kvd}
		}
		mat(&pl.wo, old.wo, h, h, p+"self_attn.o_proj.weight")
		norm(p+"post_attention_layernorm.weight", &pl.ffnNorm)
		mat(&pl.gateUp, old.gateUp, 2*f, h, p+"mlp.gate_proj.weight", p+"mlp.up_proj.weight")
		mat(&pl.down, old.down, h, f, p+"mlp.down_proj.weight")
	}
	norm("model.norm.weight", &m.finalNorm)
	var oldCls *kernels.Matrix
	if reuse != nil {
		oldCls = reuse.cls
	}
	b.roles["model.embed_tokens.weight"] = role{kind: roleEmbed, n: c.VocabSize * h}
	if c.TieWordEmbeddings {
		b.mats = append(b.mats, buildMat{dst: &m.cls, old: oldCls, rows: c.VocabSize, cols: h, parts: make([][]float32, 1), missing: 1})
		b.roles["lm_head.weight"] = role{kind: roleTiedHead, n: c.VocabSize * h}
	} else {
		mat(&m.cls, oldCls, c.VocabSize, h, "lm_head.weight")
	}
	return b, nil
}

// ErrShape is returned (wrapped) by Builder.SetConfig for a checkpoint of another shape.
var ErrShape = errors.New("model: another shape")

// SetConfig takes the configuration of the checkpoint being loaded, before its tensors: it
// must have the builder's shape (Config.SameShape), else ErrShape; its other fields (RoPE
// theta, norm epsilon, token ids) become the model's, as NewAs takes them from the set.
func (b *Builder) SetConfig(c Config) error {
	if b.m == nil {
		return fmt.Errorf("%w: the builder's model was taken", ErrIncomplete)
	}
	if !c.SameShape(b.cfg) {
		return fmt.Errorf("%w: the checkpoint has shape %+v, the model %+v", ErrShape, c, b.cfg)
	}
	if err := c.Validate(); err != nil {
		return err
	}
	b.m.Config, b.cfg = c, c
	return nil
}

// Config returns the model's configuration: the one NewBuilder was given, or the last
// SetConfig's.
func (b *Builder) Config() Config { return b.cfg }

// Precision returns the precision the model is packed at.
func (b *Builder) Precision() kernels.Precision { return b.prec }

// setPartLen sets the length of a part of a stacked matrix whose parts differ in size (q, k
// and v with grouped-query attention).
func (b *Builder) setPartLen(name string, n int) {
	r := b.roles[name]
	r.n = n
	b.roles[name] = r
}

// Len returns the number of float32 values of tensor name (its HF name), and whether the
// model has such a tensor. A tied model also accepts lm_head.weight, which must equal the
// embedding at the model's precision.
func (b *Builder) Len(name string) (int, bool) {
	r, ok := b.roles[name]
	return r.n, ok
}

// Buffer returns memory for n float32 values, for the loader to decode a tensor into and
// Put: memory a packed tensor of that size left when there is one.
func (b *Builder) Buffer(n int) []float32 {
	if buf, ok := b.free[n]; ok {
		delete(b.free, n)
		return buf
	}
	b.grow(int64(n) * 4)
	return make([]float32, n)
}

func (b *Builder) grow(n int64) {
	b.held += n
	b.peak = max(b.peak, b.held)
}

// release keeps buf for the next tensor of its size; a second one of that size is dropped.
func (b *Builder) release(buf []float32) {
	if _, ok := b.free[len(buf)]; ok {
		b.held -= int64(len(buf)) * 4
		return
	}
	b.free[len(buf)] = buf
}

// drop forgets buf (the model keeps it, or it is not needed again).
func (b *Builder) drop(buf []float32) { b.held -= int64(len(buf)) * 4 }

// Put hands over tensor name's float32 values, which must be finite (a loader checks them),
// in memory from Buffer: the builder owns it from now on. A matrix is packed as soon as all
// its parts are in.
func (b *Builder) Put(name string, v []float32) error {
	r, ok := b.roles[name]
	switch {
	case !ok:
		return fmt.Errorf("model: unexpected tensor %q", name)
	case len(v) != r.n:
		return fmt.Errorf("model: tensor %s has %d values, want %d", name, len(v), r.n)
	}
	delete(b.roles, name) // each tensor once
	switch r.kind {
	case roleNorm:
		copy(*r.norm, v)
		b.release(v)
	case roleBias:
		copy((*r.norm)[r.off:], v)
		b.release(v)
	case rolePart:
		return b.putPart(r, v)
	case roleEmbed:
		return b.putEmbed(v)
	case roleTiedHead:
		if !b.embedDone {
			b.head = v
			return nil
		}
		return b.checkHead(v)
	}
	return nil
}

func (b *Builder) putPart(r role, v []float32) error {
	mt := &b.mats[r.mat]
	mt.parts[r.part] = v
	if mt.missing--; mt.missing > 0 {
		return nil
	}
	mat, err := kernels.PackStackedAs(b.m.Precision, mt.old, mt.rows, mt.cols, mt.parts...)
	if err != nil {
		return fmt.Errorf("model: packing weights: %w", err)
	}
	*mt.dst = mat
	for _, p := range mt.parts {
		b.release(p)
	}
	mt.parts = nil
	return nil
}

func (b *Builder) putEmbed(v []float32) error {
	c := b.m.Config
	var err error
	if b.m.embed, err = newEmbedding(v, c.HiddenSize, b.m.Precision); err != nil {
		return err
	}
	b.embedDone = true
	if c.TieWordEmbeddings {
		mt := &b.mats[len(b.mats)-1]
		mat, err := kernels.PackStackedAs(b.m.Precision, mt.old, mt.rows, mt.cols, v)
		if err != nil {
			return fmt.Errorf("model: packing weights: %w", err)
		}
		*mt.dst, mt.missing = mat, 0
	}
	// Not kept for reuse either way: at F32 the embedding is v itself, and at a lower
	// precision v is the largest tensor, whose memory a free buffer would hold to the end.
	b.drop(v)
	if b.head != nil {
		head := b.head
		b.head = nil
		return b.checkHead(head)
	}
	return nil
}

// checkHead compares a tied checkpoint's lm_head.weight with the embedding, as the model
// stores them (at a low precision, their effective values).
func (b *Builder) checkHead(v []float32) error {
	defer b.drop(v)
	h := b.m.Config.HiddenSize
	got, want := make([]float32, h), make([]float32, h)
	for r := range b.m.Config.VocabSize {
		e, err := newEmbedding(v[r*h:(r+1)*h], h, b.m.Precision)
		if err != nil {
			return err
		}
		e.row(got, 0)
		b.m.embed.row(want, r)
		for i := range got {
			if got[i] != want[i] {
				return fmt.Errorf("model: tie_word_embeddings is true but lm_head.weight differs from model.embed_tokens.weight (row %d)", r)
			}
		}
	}
	return nil
}

// ScratchPeak is the most float32 scratch memory, in bytes, the builder held at once (parts
// of matrices not yet complete and buffers kept for reuse): what building costs beyond the
// packed model.
func (b *Builder) ScratchPeak() int64 { return b.peak }

// Model returns the packed model once every tensor is in (else ErrIncomplete), running its
// kernels on pool (nil: the caller alone). The builder must not be used again.
func (b *Builder) Model(pool *kernels.Pool) (*Model, error) {
	if b.m == nil {
		return nil, fmt.Errorf("%w: the builder's model was taken", ErrIncomplete)
	}
	var missing []string
	for name, r := range b.roles {
		if r.kind != roleTiedHead {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 || b.head != nil {
		return nil, fmt.Errorf("%w: %d tensors missing (e.g. %v)", ErrIncomplete, len(missing), missing[:min(3, len(missing))])
	}
	if pool == nil {
		pool = kernels.NewPool(1)
	}
	m := b.m
	m.pool = pool
	m.setRope(b.reuse)
	b.free, b.m, b.reuse, b.roles = nil, nil, nil, nil
	return m, nil
}
