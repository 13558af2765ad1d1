package model

import (
	"errors"
	"fmt"
	"math"

	"github.com/rolloutkit/rollout/engine/kvcache"
)

// ErrInvalidConfig is returned (wrapped) for a configuration that cannot describe a model.
var ErrInvalidConfig = errors.New("model: invalid config")

// Config mirrors the fields of a Hugging Face Llama config.json that the engine uses.
type Config struct {
	HiddenSize            int      `json:"hidden_size"`
	IntermediateSize      int      `json:"intermediate_size"`
	NumHiddenLayers       int      `json:"num_hidden_layers"`
	NumAttentionHeads     int      `json:"num_attention_heads"`
	NumKeyValueHeads      int      `json:"num_key_value_heads"`
	VocabSize             int      `json:"vocab_size"`
	MaxPositionEmbeddings int      `json:"max_position_embeddings"`
	RopeTheta             float64  `json:"rope_theta"`
	RMSNormEps            float64  `json:"rms_norm_eps"`
	TieWordEmbeddings     bool     `json:"tie_word_embeddings"`
	ModelType             string   `json:"model_type,omitempty"`
	Architectures         []string `json:"architectures,omitempty"`
	BOSTokenID            int      `json:"bos_token_id"`
	EOSTokenID            int      `json:"eos_token_id"`
	TorchDtype            string   `json:"torch_dtype,omitempty"`
	// AttentionBias adds a bias to the q, k and v projections (Qwen2; Llama's
	// attention_bias, which also biases o_proj, is not supported).
	AttentionBias bool `json:"attention_bias"`
	// RopeScaling is Llama 3's frequency-dependent RoPE scaling; nil for plain RoPE.
	RopeScaling *RopeScaling `json:"rope_scaling"`
}

// RopeScaling is the "llama3" rope_scaling of a Hugging Face config: long wavelengths are
// stretched by Factor, short ones kept, and the band between interpolated.
type RopeScaling struct {
	RopeType                      string  `json:"rope_type"`
	Factor                        float64 `json:"factor"`
	LowFreqFactor                 float64 `json:"low_freq_factor"`
	HighFreqFactor                float64 `json:"high_freq_factor"`
	OriginalMaxPositionEmbeddings int     `json:"original_max_position_embeddings"`
}

// Llama3RopeScaling is the rope_scaling of Llama 3.1 and 3.2 checkpoints.
func Llama3RopeScaling() *RopeScaling {
	return &RopeScaling{RopeType: "llama3", Factor: 32, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192}
}

// RopeInvFreq returns RoPE's inverse frequency of each of the HeadDim/2 rotated pairs:
// theta^(-2i/d), divided per pair by the scaling's factor (transformers'
// _compute_llama3_parameters, step for step).
func (c Config) RopeInvFreq() []float64 {
	hd := c.HeadDim()
	inv := make([]float64, hd/2)
	for i := range inv {
		inv[i] = math.Pow(c.RopeTheta, -2*float64(i)/float64(hd))
	}
	s := c.RopeScaling
	if s == nil {
		return inv
	}
	old := float64(s.OriginalMaxPositionEmbeddings)
	lowWave, highWave := old/s.LowFreqFactor, old/s.HighFreqFactor
	for i, f := range inv {
		wave := 2 * math.Pi / f
		switch {
		case wave < highWave:
		case wave > lowWave:
			inv[i] = f / s.Factor
		default:
			smooth := (old/wave - s.LowFreqFactor) / (s.HighFreqFactor - s.LowFreqFactor)
			inv[i] = (1-smooth)*f/s.Factor + smooth*f
		}
	}
	return inv
}

// KVLayout returns the KV pool layout of a model with this config: numBlocks blocks of
// blockSize tokens.
func (c Config) KVLayout(numBlocks, blockSize int) kvcache.Layout {
	return kvcache.Layout{NumLayers: c.NumHiddenLayers, NumBlocks: numBlocks, BlockSize: blockSize, KVDim: c.KVDim()}
}

// KVBlockBytes is the size in bytes of one KV block of blockSize tokens (keys and values of
// every layer, float32): the unit the engine sizes its pool in and the offload connector
// copies.
func (c Config) KVBlockBytes(blockSize int) int64 {
	return int64(c.KVLayout(0, blockSize).BlockBytes())
}

// Limits bound what Validate accepts, so that an untrusted config.json cannot make the
// loader allocate unbounded memory.
const (
	MaxHidden   = 1 << 14
	MaxLayers   = 256
	MaxVocab    = 1 << 20
	MaxContext  = 1 << 20
	MaxHeads    = 1 << 10
	maxParamsGB = 64
)

// HeadDim is the per-head width.
func (c Config) HeadDim() int { return c.HiddenSize / c.NumAttentionHeads }

// KVDim is the width of one token's keys (or values) across all KV heads.
func (c Config) KVDim() int { return c.NumKeyValueHeads * c.HeadDim() }

// NumParams counts the float parameters, the untied classifier included.
func (c Config) NumParams() int64 {
	h, f, kv := int64(c.HiddenSize), int64(c.IntermediateSize), int64(c.KVDim())
	perLayer := 2*h + h*h + 2*h*kv + h*h + 3*h*f
	if c.AttentionBias {
		perLayer += h + 2*kv
	}
	n := int64(c.VocabSize)*h + int64(c.NumHiddenLayers)*perLayer + h
	if !c.TieWordEmbeddings {
		n += int64(c.VocabSize) * h
	}
	return n
}

// Validate checks that the shape is consistent and within Limits.
func (c Config) Validate() error {
	bad := func(field string, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...))
	}
	switch {
	case c.HiddenSize <= 0 || c.HiddenSize > MaxHidden:
		return bad("hidden_size", "%d not in [1,%d]", c.HiddenSize, MaxHidden)
	case c.IntermediateSize <= 0 || c.IntermediateSize > 8*MaxHidden:
		return bad("intermediate_size", "%d not in [1,%d]", c.IntermediateSize, 8*MaxHidden)
	case c.NumHiddenLayers <= 0 || c.NumHiddenLayers > MaxLayers:
		return bad("num_hidden_layers", "%d not in [1,%d]", c.NumHiddenLayers, MaxLayers)
	case c.NumAttentionHeads <= 0 || c.NumAttentionHeads > MaxHeads:
		return bad("num_attention_heads", "%d not in [1,%d]", c.NumAttentionHeads, MaxHeads)
	case c.HiddenSize%c.NumAttentionHeads != 0:
		return bad("num_attention_heads", "%d does not divide hidden_size %d", c.NumAttentionHeads, c.HiddenSize)
	case c.HeadDim()%2 != 0:
		return bad("num_attention_heads", "head dim %d is odd (RoPE needs pairs)", c.HeadDim())
	case c.NumKeyValueHeads <= 0 || c.NumAttentionHeads%c.NumKeyValueHeads != 0:
		return bad("num_key_value_heads", "%d does not divide num_attention_heads %d", c.NumKeyValueHeads, c.NumAttentionHeads)
	case c.VocabSize <= 0 || c.VocabSize > MaxVocab:
		return bad("vocab_size", "%d not in [1,%d]", c.VocabSize, MaxVocab)
	case c.MaxPositionEmbeddings <= 0 || c.MaxPositionEmbeddings > MaxContext:
		return bad("max_position_embeddings", "%d not in [1,%d]", c.MaxPositionEmbeddings, MaxContext)
	case !(c.RopeTheta > 0):
		return bad("rope_theta", "%v must be > 0", c.RopeTheta)
	case !(c.RMSNormEps > 0 && c.RMSNormEps < 1):
		return bad("rms_norm_eps", "%v not in (0,1)", c.RMSNormEps)
	case c.BOSTokenID < 0 || c.BOSTokenID >= c.VocabSize:
		return bad("bos_token_id", "%d outside vocab %d", c.BOSTokenID, c.VocabSize)
	case c.EOSTokenID < 0 || c.EOSTokenID >= c.VocabSize:
		return bad("eos_token_id", "%d outside vocab %d", c.EOSTokenID, c.VocabSize)
	case c.RopeScaling != nil && c.RopeScaling.validate() != nil:
		return bad("rope_scaling", "%v", c.RopeScaling.validate())
	case c.NumParams() > maxParamsGB<<30/4:
		return bad("shape", "%d parameters exceed the %d GiB limit", c.NumParams(), maxParamsGB)
	}
	return nil
}

// validate checks a llama3 scaling's parameters are those the formula can use.
func (s *RopeScaling) validate() error {
	switch {
	case s.RopeType != "llama3":
		return fmt.Errorf("rope_type %q is not supported (want llama3)", s.RopeType)
	case !(s.Factor >= 1) || math.IsInf(s.Factor, 0):
		return fmt.Errorf("factor %v must be finite and >= 1", s.Factor)
	case !(s.LowFreqFactor > 0) || !(s.HighFreqFactor > s.LowFreqFactor) || math.IsInf(s.HighFreqFactor, 0):
		return fmt.Errorf("need 0 < low_freq_factor %v < high_freq_factor %v", s.LowFreqFactor, s.HighFreqFactor)
	case s.OriginalMaxPositionEmbeddings <= 0 || s.OriginalMaxPositionEmbeddings > MaxContext:
		return fmt.Errorf("original_max_position_embeddings %d not in [1,%d]", s.OriginalMaxPositionEmbeddings, MaxContext)
	}
	return nil
}
