package model

import (
	"fmt"

	"github.com/rolloutkit/rollout/engine/kernels"
)

// embedding is the token embedding table, row-major [vocab][hidden], stored at the model's
// precision so that a bf16 or int8 model holds no float32 copy of it: rows are widened one
// token at a time, with the effective values kernels.PackStackedAs gives the same row (int8
// blocks of kernels.Int8Block along the row). A W8A8 model stores it as an Int8 one does: an
// embedding row is looked up, not multiplied, so there is no input to quantize.
type embedding struct {
	prec   kernels.Precision
	h      int
	f32    []float32 // F32: the checkpoint's own slice
	half   []uint16  // BF16
	q      []int8    // Int8, W8A8
	scales []float32 // Int8, W8A8: one per block of each row
}

// blocksPerRow is the number of int8 blocks of a row of h values.
func blocksPerRow(h int) int { return (h + kernels.Int8Block - 1) / kernels.Int8Block }

// newEmbedding stores e (row-major, rows of h values) at prec; at F32 it keeps e itself.
func newEmbedding(e []float32, h int, prec kernels.Precision) (embedding, error) {
	out := embedding{prec: prec, h: h}
	switch prec {
	case kernels.F32:
		out.f32 = e
	case kernels.BF16:
		out.half = make([]uint16, len(e))
		for i, v := range e {
			out.half[i] = kernels.ToBF16(v)
		}
	case kernels.Int8, kernels.W8A8:
		rows, nb := len(e)/h, blocksPerRow(h)
		out.q = make([]int8, len(e))
		out.scales = make([]float32, rows*nb)
		for r := range rows {
			for b := range nb {
				k0, k1 := r*h+b*kernels.Int8Block, r*h+min(h, (b+1)*kernels.Int8Block)
				s, err := kernels.QuantizeInt8(out.q[k0:k1], e[k0:k1])
				if err != nil {
					return embedding{}, fmt.Errorf("model: embedding row %d: %w", r, err)
				}
				out.scales[r*nb+b] = s
			}
		}
	default:
		return embedding{}, fmt.Errorf("%w: unknown precision %d", kernels.ErrPrecision, prec)
	}
	return out, nil
}

// row writes token id's embedding (effective values) into dst (len h).
func (e *embedding) row(dst []float32, id int) {
	h := e.h
	switch e.prec {
	case kernels.F32:
		copy(dst, e.f32[id*h:(id+1)*h])
	case kernels.BF16:
		for i, v := range e.half[id*h : (id+1)*h] {
			dst[i] = kernels.FromBF16(v)
		}
	case kernels.Int8, kernels.W8A8:
		nb := blocksPerRow(h)
		q := e.q[id*h : (id+1)*h]
		for i, v := range q {
			dst[i] = float32(v) * e.scales[id*nb+i/kernels.Int8Block]
		}
	}
}

// bytes is the table's size in memory.
func (e *embedding) bytes() int64 {
	return int64(len(e.f32))*4 + int64(len(e.half))*2 + int64(len(e.q)) + int64(len(e.scales))*4
}

// ModelBytes is the ResidentBytes of a model of this config packed at prec (NewAs), computed
// without packing one: what a memory budget has to leave the weights.
func (c Config) ModelBytes(prec kernels.Precision) int64 {
	h, f, kvd, v := c.HiddenSize, c.IntermediateSize, c.KVDim(), c.VocabSize
	layer := kernels.PackedBytes(prec, h+2*kvd, h) + kernels.PackedBytes(prec, h, h) +
		kernels.PackedBytes(prec, 2*f, h) + kernels.PackedBytes(prec, h, f) + int64(2*h)*4
	n := int64(c.NumHiddenLayers)*layer + kernels.PackedBytes(prec, v, h)
	var e int64
	switch prec {
	case kernels.F32:
		e = int64(v*h) * 4
	case kernels.BF16:
		e = int64(v*h) * 2
	case kernels.Int8, kernels.W8A8:
		e = int64(v*h) + int64(v*blocksPerRow(h))*4
	}
	rope := int64(c.MaxPositionEmbeddings*(c.HeadDim()/2)) * 2 * 4
	return n + e + rope
}

// Effective returns a copy of w whose matrices and embedding hold the effective weights of
// precision prec (kernels.Precision): a float32 model of the copy computes, bit for bit, what
// a prec model of w does. The norms are float32 at every precision. It is the reference the
// numerics tests hold a low-precision model against, and what a trainer should score a
// low-precision rollout's tokens with to see the sampler's own policy.
//
// W8A8 has no such exact meaning, since its MatMuls also round their inputs: Effective(W8A8)
// is Effective(Int8), the weights a W8A8 model stores, and a float32 model of them only
// approximates a W8A8 model (the gap is the input rounding; see docs/precision.md).
func (w *Weights) Effective(prec kernels.Precision) (*Weights, error) {
	if err := w.Check(); err != nil {
		return nil, err
	}
	out := w.Clone()
	if prec == kernels.F32 {
		return out, nil
	}
	round := func(s []float32, cols int) error {
		m, err := kernels.PackStackedAs(prec, nil, len(s)/cols, cols, s)
		if err != nil {
			return err
		}
		for r := range m.Rows {
			m.Row(s[r*cols:(r+1)*cols], r)
		}
		return nil
	}
	for _, t := range out.Tensors() {
		if len(t.Shape) != 2 {
			continue // norms
		}
		if err := round(*t.Data, t.Shape[1]); err != nil {
			return nil, fmt.Errorf("model: %s at %s: %w", t.Name, prec, err)
		}
	}
	return out, nil
}
