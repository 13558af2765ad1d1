package weights

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/rolloutkit/rollout/engine/model"
)

// maxJSONBytes caps config.json and the shard index: real ones are a few KiB (configs) to a
// few hundred KiB (indexes of huge models).
const maxJSONBytes = 16 << 20

// hfConfigIn is config.json as written by transformers, with optional fields as pointers so
// that LlamaConfig's defaults apply only when a field is absent.
type hfConfigIn struct {
	HiddenSize            *int            `json:"hidden_size"`
	IntermediateSize      *int            `json:"intermediate_size"`
	NumHiddenLayers       *int            `json:"num_hidden_layers"`
	NumAttentionHeads     *int            `json:"num_attention_heads"`
	NumKeyValueHeads      *int            `json:"num_key_value_heads"`
	VocabSize             *int            `json:"vocab_size"`
	MaxPositionEmbeddings *int            `json:"max_position_embeddings"`
	RopeTheta             *float64        `json:"rope_theta"`
	RMSNormEps            *float64        `json:"rms_norm_eps"`
	TieWordEmbeddings     *bool           `json:"tie_word_embeddings"`
	ModelType             string          `json:"model_type"`
	Architectures         []string        `json:"architectures"`
	BOSTokenID            json.RawMessage `json:"bos_token_id"`
	EOSTokenID            json.RawMessage `json:"eos_token_id"`
	TorchDtype            string          `json:"torch_dtype"`
	Dtype                 string          `json:"dtype"` // transformers >= 4.56 name for torch_dtype
	HiddenAct             *string         `json:"hidden_act"`
	HeadDim               *int            `json:"head_dim"`
	AttentionBias         bool            `json:"attention_bias"`
	MLPBias               bool            `json:"mlp_bias"`
	RopeScaling           json.RawMessage `json:"rope_scaling"`
	RopeParameters        *struct {       // transformers v5 groups RoPE settings here
		model.RopeScaling
		RopeTheta *float64 `json:"rope_theta"`
	} `json:"rope_parameters"`
	SlidingWindow    json.RawMessage `json:"sliding_window"`
	UseSlidingWindow bool            `json:"use_sliding_window"` // Qwen2: sliding_window applies only when set
}

// parseRopeScaling reads a rope_scaling object: null, the "default" type, or llama3's.
func parseRopeScaling(m json.RawMessage) (*model.RopeScaling, error) {
	if isNull(m) {
		return nil, nil
	}
	var s model.RopeScaling
	var legacy struct {
		Type string `json:"type"` // the name before transformers 4.45
	}
	if err := json.Unmarshal(m, &s); err != nil {
		return nil, fmt.Errorf("rope_scaling: %w", err)
	}
	if err := json.Unmarshal(m, &legacy); err == nil && s.RopeType == "" {
		s.RopeType = legacy.Type
	}
	return ropeScaling(s, "rope_scaling")
}

// ropeScaling returns s as the model takes it: nil for plain RoPE, an error for types the
// model does not implement.
func ropeScaling(s model.RopeScaling, field string) (*model.RopeScaling, error) {
	switch s.RopeType {
	case "", "default":
		return nil, nil
	case "llama3":
		return &s, nil
	}
	return nil, fmt.Errorf("%s: rope_type %q is not supported (default and llama3 are)", field, s.RopeType)
}

func isNull(m json.RawMessage) bool {
	m = bytes.TrimSpace(m)
	return len(m) == 0 || string(m) == "null"
}

// tokenID reads an int, null (default) or a list of ints (the first is used, as for Llama 3's
// several EOS ids).
func tokenID(m json.RawMessage, def int, field string) (int, error) {
	if isNull(m) {
		return def, nil
	}
	var id int
	if err := json.Unmarshal(m, &id); err == nil {
		return id, nil
	}
	var ids []int
	if err := json.Unmarshal(m, &ids); err != nil || len(ids) == 0 {
		return 0, fmt.Errorf("%s: want an int or a non-empty list of ints, got %s", field, m)
	}
	return ids[0], nil
}

// parseHFConfig decodes and validates a Llama config.json. Features the model does not
// implement (biases, RoPE scaling, sliding windows, other activations) are rejected rather
// than silently ignored, since ignoring them would produce wrong logits.
func parseHFConfig(data []byte) (model.Config, error) {
	var in hfConfigIn
	if err := json.Unmarshal(data, &in); err != nil {
		return model.Config{}, fmt.Errorf("config.json: %w", err)
	}
	req := func(p *int, field string) (int, error) {
		if p == nil {
			return 0, fmt.Errorf("config.json: missing %s", field)
		}
		return *p, nil
	}
	var c model.Config
	var err error
	if c.HiddenSize, err = req(in.HiddenSize, "hidden_size"); err != nil {
		return c, err
	}
	if c.IntermediateSize, err = req(in.IntermediateSize, "intermediate_size"); err != nil {
		return c, err
	}
	if c.NumHiddenLayers, err = req(in.NumHiddenLayers, "num_hidden_layers"); err != nil {
		return c, err
	}
	if c.NumAttentionHeads, err = req(in.NumAttentionHeads, "num_attention_heads"); err != nil {
		return c, err
	}
	if c.VocabSize, err = req(in.VocabSize, "vocab_size"); err != nil {
		return c, err
	}
	// Defaults are LlamaConfig's.
	c.NumKeyValueHeads = c.NumAttentionHeads
	if in.NumKeyValueHeads != nil {
		c.NumKeyValueHeads = *in.NumKeyValueHeads
	}
	c.MaxPositionEmbeddings = 2048
	if in.MaxPositionEmbeddings != nil {
		c.MaxPositionEmbeddings = *in.MaxPositionEmbeddings
	}
	c.RopeTheta = 10000
	if in.RopeTheta != nil {
		c.RopeTheta = *in.RopeTheta
	}
	if c.RopeScaling, err = parseRopeScaling(in.RopeScaling); err != nil {
		return c, fmt.Errorf("config.json: %w", err)
	}
	if p := in.RopeParameters; p != nil {
		if c.RopeScaling, err = ropeScaling(p.RopeScaling, "rope_parameters"); err != nil {
			return c, fmt.Errorf("config.json: %w", err)
		}
		if p.RopeTheta != nil {
			c.RopeTheta = *p.RopeTheta
		}
	}
	c.RMSNormEps = 1e-6
	if in.RMSNormEps != nil {
		c.RMSNormEps = *in.RMSNormEps
	}
	if in.TieWordEmbeddings != nil {
		c.TieWordEmbeddings = *in.TieWordEmbeddings
	}
	if c.BOSTokenID, err = tokenID(in.BOSTokenID, 1, "bos_token_id"); err != nil {
		return c, fmt.Errorf("config.json: %w", err)
	}
	if c.EOSTokenID, err = tokenID(in.EOSTokenID, 2, "eos_token_id"); err != nil {
		return c, fmt.Errorf("config.json: %w", err)
	}
	c.ModelType = in.ModelType
	c.Architectures = in.Architectures
	c.TorchDtype = in.TorchDtype
	if c.TorchDtype == "" {
		c.TorchDtype = in.Dtype
	}

	// Qwen2 is Llama with biases on q, k and v (always: its config has no switch for them).
	qwen2 := in.ModelType == "qwen2"
	c.AttentionBias = qwen2
	switch {
	case in.ModelType != "" && in.ModelType != "llama" && in.ModelType != "mistral" && !qwen2:
		return c, fmt.Errorf("config.json: model_type %q is not a Llama-family decoder", in.ModelType)
	case in.HiddenAct != nil && *in.HiddenAct != "silu":
		return c, fmt.Errorf("config.json: hidden_act %q is not supported (want silu)", *in.HiddenAct)
	case in.AttentionBias && !qwen2:
		return c, fmt.Errorf("config.json: attention_bias (on q, k, v and o) is not supported; Qwen2's q/k/v biases are")
	case in.MLPBias:
		return c, fmt.Errorf("config.json: mlp_bias is not supported")
	case !isNull(in.SlidingWindow) && (!qwen2 || in.UseSlidingWindow):
		return c, fmt.Errorf("config.json: sliding_window is not supported")
	case in.HeadDim != nil && c.NumAttentionHeads > 0 && *in.HeadDim != c.HiddenSize/c.NumAttentionHeads:
		return c, fmt.Errorf("config.json: head_dim %d differs from hidden_size/num_attention_heads %d",
			*in.HeadDim, c.HiddenSize/c.NumAttentionHeads)
	}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("config.json: %w", err)
	}
	return c, nil
}

// hfConfigOut is what SaveHF writes: model.Config plus the LlamaConfig fields that pin down
// the architecture, so transformers builds exactly the model the engine runs.
type hfConfigOut struct {
	model.Config
	HiddenAct        string `json:"hidden_act"`
	HeadDim          int    `json:"head_dim"`
	MLPBias          bool   `json:"mlp_bias"`
	UseSlidingWindow bool   `json:"use_sliding_window"`
}

// marshalHFConfig writes c as a Llama config or, with q/k/v biases (which LlamaConfig cannot
// express: its attention_bias biases o_proj too), as a Qwen2 one.
func marshalHFConfig(c model.Config, d DType) ([]byte, error) {
	c.ModelType = "llama"
	c.Architectures = []string{"LlamaForCausalLM"}
	if c.AttentionBias {
		c.ModelType = "qwen2"
		c.Architectures = []string{"Qwen2ForCausalLM"}
	}
	c.TorchDtype = d.TorchName()
	b, err := json.MarshalIndent(hfConfigOut{Config: c, HiddenAct: "silu", HeadDim: c.HeadDim()}, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
