package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
)

// ErrUnknownPreset is returned for a preset name that does not exist.
var ErrUnknownPreset = fmt.Errorf("model: unknown preset")

// Byte-level vocabulary of the tiny preset: 256 bytes then the specials.
const (
	TinyBOS   = 256
	TinyEOS   = 257
	TinyPAD   = 258
	TinyVocab = 259
)

var presets = map[string]Config{
	// tiny serves in milliseconds: byte-level vocab, GQA (4 query heads share 2 KV heads).
	"tiny": {HiddenSize: 64, IntermediateSize: 176, NumHiddenLayers: 2, NumAttentionHeads: 4,
		NumKeyValueHeads: 2, VocabSize: TinyVocab, MaxPositionEmbeddings: 2048, RopeTheta: 10000,
		RMSNormEps: 1e-5, TieWordEmbeddings: true, BOSTokenID: TinyBOS, EOSTokenID: TinyEOS},
	// The shapes of Karpathy's TinyStories llama2.c models.
	"stories15m": {HiddenSize: 288, IntermediateSize: 768, NumHiddenLayers: 6, NumAttentionHeads: 6,
		NumKeyValueHeads: 6, VocabSize: 32000, MaxPositionEmbeddings: 256, RopeTheta: 10000,
		RMSNormEps: 1e-5, TieWordEmbeddings: true, BOSTokenID: 1, EOSTokenID: 2},
	"stories110m": {HiddenSize: 768, IntermediateSize: 2048, NumHiddenLayers: 12, NumAttentionHeads: 12,
		NumKeyValueHeads: 12, VocabSize: 32000, MaxPositionEmbeddings: 1024, RopeTheta: 10000,
		RMSNormEps: 1e-5, TieWordEmbeddings: true, BOSTokenID: 1, EOSTokenID: 2},
	// The shapes of two checkpoints RL is run on, with random weights. BOS and EOS are those of
	// the synthetic vocabulary their tokenizer is (1 and 2), not Llama 3's 128000 or Qwen's
	// 151643, which would name ordinary pieces of it.
	"llama3.2-1b-shape": {HiddenSize: 2048, IntermediateSize: 8192, NumHiddenLayers: 16, NumAttentionHeads: 32,
		NumKeyValueHeads: 8, VocabSize: 128256, MaxPositionEmbeddings: 131072, RopeTheta: 500000,
		RMSNormEps: 1e-5, TieWordEmbeddings: true, BOSTokenID: 1, EOSTokenID: 2,
		RopeScaling: Llama3RopeScaling()},
	"qwen2.5-0.5b-shape": {HiddenSize: 896, IntermediateSize: 4864, NumHiddenLayers: 24, NumAttentionHeads: 14,
		NumKeyValueHeads: 2, VocabSize: 151936, MaxPositionEmbeddings: 32768, RopeTheta: 1e6,
		RMSNormEps: 1e-6, TieWordEmbeddings: true, BOSTokenID: 1, EOSTokenID: 2, AttentionBias: true,
		ModelType: "qwen2", Architectures: []string{"Qwen2ForCausalLM"}},
}

// Presets lists the preset names.
func Presets() []string {
	names := make([]string, 0, len(presets))
	for n := range presets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// PresetConfig returns the configuration of a preset.
func PresetConfig(name string) (Config, error) {
	c, ok := presets[name]
	if !ok {
		return Config{}, fmt.Errorf("%w %q (have %v)", ErrUnknownPreset, name, Presets())
	}
	if c.ModelType == "" {
		c.ModelType, c.Architectures = "llama", []string{"LlamaForCausalLM"}
	}
	c.Architectures = slices.Clone(c.Architectures)
	if c.RopeScaling != nil {
		rs := *c.RopeScaling // callers may change their copy
		c.RopeScaling = &rs
	}
	c.TorchDtype = "float32"
	return c, nil
}

// Preset generates a preset's weights deterministically from seed: the same name and seed
// give bitwise identical weights on every machine.
func Preset(name string, seed uint64) (*Weights, error) {
	c, err := PresetConfig(name)
	if err != nil {
		return nil, err
	}
	return Random(c, seed)
}

// Random fills a checkpoint of shape c with seeded Gaussian weights: linear layers with
// std 1/sqrt(fan_in) (so activations neither vanish nor explode through depth), norms at 1,
// and embeddings with HF's initializer_range 0.02: larger embeddings dominate the residual
// stream of a random tied model, which then only repeats its input token.
func Random(c Config, seed uint64) (*Weights, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	w := &Weights{Config: c}
	w.Allocate()
	ts := w.Tensors()
	// Each tensor has its own stream, so filling them concurrently stays deterministic.
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for i, t := range ts {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			fillTensor(t, seed, i)
		}()
	}
	wg.Wait()
	return w, nil
}

// fillTensor fills t's allocated data (Weights.Allocate).
func fillTensor(t Tensor, seed uint64, i int) {
	data := *t.Data
	if strings.HasSuffix(t.Name, ".bias") {
		// Qwen2's q/k biases are large next to its projections; 0.5 gives the attention
		// logits an offset the forward must not lose, without saturating the softmax.
		r := rand.New(rand.NewPCG(seed, uint64(i)+0x9e3779b97f4a7c15))
		for j := range data {
			data[j] = float32(r.NormFloat64() * 0.5)
		}
		return
	}
	if len(t.Shape) == 1 {
		for j := range data {
			data[j] = 1
		}
		return
	}
	std := 1 / math.Sqrt(float64(t.Shape[1]))
	if t.Name == "model.embed_tokens.weight" || t.Name == "lm_head.weight" {
		std = 0.3
	}
	// One stream per tensor, so tensors do not depend on each other's sizes.
	r := rand.New(rand.NewPCG(seed, uint64(i)+0x9e3779b97f4a7c15))
	for j := range data {
		data[j] = float32(r.NormFloat64() * std)
	}
}
