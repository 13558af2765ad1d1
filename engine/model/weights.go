package model

import (
	"fmt"

	"github.com/rolloutkit/rollout/engine/hugepage"
)

// Layer holds one decoder layer's tensors in Hugging Face layout: every matrix is row-major
// [out][in] (the layout of nn.Linear.weight), and Wq/Wk use the HF rotate-half RoPE convention.
type Layer struct {
	AttnNorm []float32 // input_layernorm.weight [hidden]
	Wq       []float32 // self_attn.q_proj.weight [hidden][hidden]
	Wk       []float32 // self_attn.k_proj.weight [kvdim][hidden]
	Wv       []float32 // self_attn.v_proj.weight [kvdim][hidden]
	Bq       []float32 // self_attn.q_proj.bias [hidden]; nil without Config.AttentionBias
	Bk       []float32 // self_attn.k_proj.bias [kvdim]
	Bv       []float32 // self_attn.v_proj.bias [kvdim]
	Wo       []float32 // self_attn.o_proj.weight [hidden][hidden]
	FFNNorm  []float32 // post_attention_layernorm.weight [hidden]
	WGate    []float32 // mlp.gate_proj.weight [inter][hidden] (llama2.c w1)
	WDown    []float32 // mlp.down_proj.weight [hidden][inter] (llama2.c w2)
	WUp      []float32 // mlp.up_proj.weight [inter][hidden] (llama2.c w3)
}

// Weights is a complete float32 checkpoint in Hugging Face layout.
type Weights struct {
	Config    Config
	Embed     []float32 // model.embed_tokens.weight [vocab][hidden]
	Layers    []Layer
	FinalNorm []float32 // model.norm.weight [hidden]
	LMHead    []float32 // lm_head.weight [vocab][hidden]; nil when tied to Embed
}

// Tensor names one tensor of a checkpoint with its shape and its storage in Weights.
type Tensor struct {
	Name  string
	Shape []int
	Data  *[]float32
}

// Len is the number of values the tensor's shape holds.
func (t Tensor) Len() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Tensors lists every tensor with its HF name and expected shape, in a stable order.
// Loaders fill Data through the pointers; savers read it.
func (w *Weights) Tensors() []Tensor {
	c := w.Config
	h, f, kv, v := c.HiddenSize, c.IntermediateSize, c.KVDim(), c.VocabSize
	if len(w.Layers) != c.NumHiddenLayers {
		w.Layers = make([]Layer, c.NumHiddenLayers)
	}
	ts := []Tensor{{"model.embed_tokens.weight", []int{v, h}, &w.Embed}}
	for i := range w.Layers {
		l := &w.Layers[i]
		p := fmt.Sprintf("model.layers.%d.", i)
		ts = append(ts,
			Tensor{p + "input_layernorm.weight", []int{h}, &l.AttnNorm},
			Tensor{p + "self_attn.q_proj.weight", []int{h, h}, &l.Wq},
			Tensor{p + "self_attn.k_proj.weight", []int{kv, h}, &l.Wk},
			Tensor{p + "self_attn.v_proj.weight", []int{kv, h}, &l.Wv},
		)
		if c.AttentionBias {
			ts = append(ts,
				Tensor{p + "self_attn.q_proj.bias", []int{h}, &l.Bq},
				Tensor{p + "self_attn.k_proj.bias", []int{kv}, &l.Bk},
				Tensor{p + "self_attn.v_proj.bias", []int{kv}, &l.Bv},
			)
		}
		ts = append(ts,
			Tensor{p + "self_attn.o_proj.weight", []int{h, h}, &l.Wo},
			Tensor{p + "post_attention_layernorm.weight", []int{h}, &l.FFNNorm},
			Tensor{p + "mlp.gate_proj.weight", []int{f, h}, &l.WGate},
			Tensor{p + "mlp.down_proj.weight", []int{h, f}, &l.WDown},
			Tensor{p + "mlp.up_proj.weight", []int{f, h}, &l.WUp},
		)
	}
	ts = append(ts, Tensor{"model.norm.weight", []int{h}, &w.FinalNorm})
	if !c.TieWordEmbeddings {
		ts = append(ts, Tensor{"lm_head.weight", []int{v, h}, &w.LMHead})
	}
	return ts
}

// Allocate points every tensor of w (whose Config is set) at its own part of one new zeroed
// allocation advised for huge pages (hugepage.Make). One allocation, not one per tensor, so
// that the matrices under 4 MB (stories110m's attention projections) get huge pages too; a
// weight set is written once and then read whole, by the packing and by every load reusing it.
func (w *Weights) Allocate() {
	ts := w.Tensors()
	total := 0
	for _, t := range ts {
		total += t.Len()
	}
	slab := hugepage.Make[float32](total)
	for _, t := range ts {
		n := t.Len()
		*t.Data, slab = slab[:n:n], slab[n:]
	}
}

// Check verifies that every tensor is present with the size its shape implies.
func (w *Weights) Check() error {
	if err := w.Config.Validate(); err != nil {
		return err
	}
	for _, t := range w.Tensors() {
		if n := t.Len(); len(*t.Data) != n {
			return fmt.Errorf("model: tensor %s has %d values, want %d (shape %v)", t.Name, len(*t.Data), n, t.Shape)
		}
	}
	if !w.Config.AttentionBias {
		for i, l := range w.Layers {
			if l.Bq != nil || l.Bk != nil || l.Bv != nil {
				return fmt.Errorf("model: layer %d has q/k/v biases but attention_bias is not set", i)
			}
		}
	}
	if w.Config.TieWordEmbeddings && w.LMHead != nil {
		return fmt.Errorf("model: tie_word_embeddings is set but lm_head.weight is present")
	}
	return nil
}

// Clone returns a deep copy: writing to it leaves w unchanged.
func (w *Weights) Clone() *Weights {
	c := &Weights{Config: w.Config, Embed: clone(w.Embed), FinalNorm: clone(w.FinalNorm), LMHead: clone(w.LMHead)}
	if w.Layers != nil {
		c.Layers = make([]Layer, len(w.Layers))
	}
	for i, l := range w.Layers {
		c.Layers[i] = Layer{AttnNorm: clone(l.AttnNorm), Wq: clone(l.Wq), Wk: clone(l.Wk), Wv: clone(l.Wv),
			Bq: clone(l.Bq), Bk: clone(l.Bk), Bv: clone(l.Bv), Wo: clone(l.Wo),
			FFNNorm: clone(l.FFNNorm), WGate: clone(l.WGate), WDown: clone(l.WDown), WUp: clone(l.WUp)}
	}
	return c
}

// clone copies s, keeping nil as nil.
func clone(s []float32) []float32 {
	if s == nil {
		return nil
	}
	return append(make([]float32, 0, len(s)), s...)
}

// Classifier returns the output projection, which is the embedding when tied.
func (w *Weights) Classifier() []float32 {
	if w.Config.TieWordEmbeddings {
		return w.Embed
	}
	return w.LMHead
}
