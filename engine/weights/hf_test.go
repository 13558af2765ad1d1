package weights

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/model"
)

func TestHFRoundTrip(t *testing.T) {
	tiny, err := model.Preset("tiny", 7)
	require.NoError(t, err)
	qwen, llama3 := smallConfig(), smallConfig()
	qwen.AttentionBias = true
	llama3.RopeScaling = model.Llama3RopeScaling()
	for i, w := range []*model.Weights{tiny, randomWeights(t, smallConfig(), 3), randomWeights(t, qwen, 4), randomWeights(t, llama3, 5)} {
		for _, d := range []DType{F32, F16, BF16} {
			t.Run(fmt.Sprint(i, d), func(t *testing.T) {
				dir := t.TempDir()
				require.NoError(t, SaveHF(dir, w, d))
				got, err := LoadHF(dir)
				require.NoError(t, err)
				want := convertedCopy(w, d)
				requireSameWeights(t, want, got)
			})
		}
	}
}

// convertedCopy is w as it must come back after a save in dtype d: every value rounded
// through d exactly once, and torch_dtype naming d.
func convertedCopy(w *model.Weights, d DType) *model.Weights {
	c := w.Config
	c.TorchDtype = d.TorchName()
	c.ModelType = "llama"
	c.Architectures = []string{"LlamaForCausalLM"}
	if c.AttentionBias {
		c.ModelType = "qwen2"
		c.Architectures = []string{"Qwen2ForCausalLM"}
	}
	out := &model.Weights{Config: c}
	src := w.Tensors()
	for i, t := range out.Tensors() {
		v := append([]float32(nil), *src[i].Data...)
		for j := range v {
			switch d {
			case F16:
				v[j] = F16ToFloat32(Float32ToF16(v[j]))
			case BF16:
				v[j] = BF16ToFloat32(Float32ToBF16(v[j]))
			}
		}
		*t.Data = v
	}
	return out
}

func TestHFShardedRoundTrip(t *testing.T) {
	qwen := smallConfig()
	qwen.AttentionBias = true
	qwen.TieWordEmbeddings = true
	w := randomWeights(t, qwen, 11)
	for _, d := range []DType{F32, BF16} {
		dir := t.TempDir()
		// A stale single file must not shadow the sharded checkpoint.
		require.NoError(t, SaveHF(dir, randomWeights(t, smallConfig(), 99), F32))
		require.NoError(t, SaveHFSharded(dir, w, d, 300))
		assert.NoFileExists(t, filepath.Join(dir, SafetensorsFile))
		shards, err := filepath.Glob(filepath.Join(dir, "model-*-of-*.safetensors"))
		require.NoError(t, err)
		assert.Greater(t, len(shards), 3, "300-byte shards must split the model")
		var idx struct {
			Metadata struct {
				TotalSize int64 `json:"total_size"`
			} `json:"metadata"`
			WeightMap map[string]string `json:"weight_map"`
		}
		require.NoError(t, json.Unmarshal(readFile(t, filepath.Join(dir, IndexFile)), &idx))
		assert.Equal(t, qwen.NumParams()*int64(d.Size()), idx.Metadata.TotalSize)
		assert.Len(t, idx.WeightMap, len(w.Tensors()))

		got, err := LoadHF(dir)
		require.NoError(t, err)
		requireSameWeights(t, convertedCopy(w, d), got)

		// Saving single-file again removes the index.
		require.NoError(t, SaveHF(dir, w, F32))
		assert.NoFileExists(t, filepath.Join(dir, IndexFile))
		got, err = LoadHF(dir)
		require.NoError(t, err)
		requireSameWeights(t, convertedCopy(w, F32), got)
	}
}

// TestHFQwen2ConfigWritten: a checkpoint with q/k/v biases is written as the Qwen2 model
// transformers has for it, with its sliding window off, and loads back with its biases.
func TestHFQwen2ConfigWritten(t *testing.T) {
	c := smallConfig()
	c.AttentionBias = true
	dir := t.TempDir()
	require.NoError(t, SaveHF(dir, randomWeights(t, c, 2), F32))
	var m map[string]any
	require.NoError(t, json.Unmarshal(readFile(t, filepath.Join(dir, ConfigFile)), &m))
	assert.Equal(t, []any{"Qwen2ForCausalLM"}, m["architectures"])
	assert.Equal(t, "qwen2", m["model_type"])
	assert.Equal(t, false, m["use_sliding_window"])
	hdr, _ := splitST(t, readFile(t, filepath.Join(dir, SafetensorsFile)))
	assert.Contains(t, hdr, "model.layers.1.self_attn.k_proj.bias")
	assert.NotContains(t, hdr, "model.layers.1.self_attn.o_proj.bias")
}

func TestHFConfigWritten(t *testing.T) {
	dir := t.TempDir()
	w := randomWeights(t, smallConfig(), 1)
	require.NoError(t, SaveHF(dir, w, BF16))
	var m map[string]any
	require.NoError(t, json.Unmarshal(readFile(t, filepath.Join(dir, ConfigFile)), &m))
	assert.Equal(t, []any{"LlamaForCausalLM"}, m["architectures"])
	assert.Equal(t, "llama", m["model_type"])
	assert.Equal(t, "bfloat16", m["torch_dtype"])
	assert.Equal(t, "silu", m["hidden_act"])
	assert.EqualValues(t, 4, m["head_dim"])
	assert.EqualValues(t, 1, m["num_key_value_heads"])
	assert.Equal(t, false, m["tie_word_embeddings"])
	assert.Contains(t, m, "rope_scaling")
	assert.Nil(t, m["rope_scaling"])
	// The safetensors metadata marks the file as PyTorch, which transformers checks.
	hdr, _ := splitST(t, readFile(t, filepath.Join(dir, SafetensorsFile)))
	assert.Equal(t, map[string]any{"format": "pt"}, hdr["__metadata__"])
}

func TestSaveRefusesBadWeights(t *testing.T) {
	w := randomWeights(t, smallConfig(), 1)
	w.Layers[1].Wq = w.Layers[1].Wq[:3]
	err := SaveHF(t.TempDir(), w, F32)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "model.layers.1.self_attn.q_proj.weight")
	require.ErrorIs(t, SaveHF(t.TempDir(), randomWeights(t, smallConfig(), 1), DType(9)), ErrUnsupportedFormat)
	require.ErrorIs(t, SaveHFSharded(t.TempDir(), randomWeights(t, smallConfig(), 1), F32, 0), ErrUnsupportedFormat)
}

func TestParseHFConfig(t *testing.T) {
	base := `"hidden_size":8,"intermediate_size":12,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":10`
	c, err := parseHFConfig([]byte(`{` + base + `}`))
	require.NoError(t, err)
	// LlamaConfig defaults for absent fields.
	assert.Equal(t, 2, c.NumKeyValueHeads)
	assert.Equal(t, 2048, c.MaxPositionEmbeddings)
	assert.Equal(t, 10000.0, c.RopeTheta)
	assert.Equal(t, 1e-6, c.RMSNormEps)
	assert.False(t, c.TieWordEmbeddings)
	assert.Equal(t, 1, c.BOSTokenID)
	assert.Equal(t, 2, c.EOSTokenID)

	c, err = parseHFConfig([]byte(`{` + base + `,"eos_token_id":[3,4],"bos_token_id":null,"dtype":"bfloat16",
		"rope_parameters":{"rope_type":"default","rope_theta":500000},"rope_scaling":null,"hidden_act":"silu","head_dim":4}`))
	require.NoError(t, err)
	assert.Equal(t, 3, c.EOSTokenID)
	assert.Equal(t, 1, c.BOSTokenID)
	assert.Equal(t, "bfloat16", c.TorchDtype)
	assert.Equal(t, 500000.0, c.RopeTheta)

	// Qwen2: q/k/v biases without a switch; its sliding_window is inert unless enabled.
	c, err = parseHFConfig([]byte(`{` + base + `,"model_type":"qwen2","sliding_window":32768,"use_sliding_window":false}`))
	require.NoError(t, err)
	assert.True(t, c.AttentionBias)
	// Llama 3's scaling, in both the rope_scaling and the transformers v5 spelling.
	l3 := `"rope_type":"llama3","factor":32,"low_freq_factor":1,"high_freq_factor":4,"original_max_position_embeddings":8192`
	for _, js := range []string{`,"rope_scaling":{` + l3 + `}`, `,"rope_parameters":{"rope_theta":500000,` + l3 + `}`} {
		c, err = parseHFConfig([]byte(`{` + base + js + `}`))
		require.NoError(t, err, js)
		assert.Equal(t, model.Llama3RopeScaling(), c.RopeScaling, js)
	}

	bad := []struct{ json, want string }{
		{`{"intermediate_size":12}`, "missing hidden_size"},
		{`{` + base + `,"model_type":"gemma"}`, "model_type"},
		{`{` + base + `,"hidden_act":"gelu"}`, "hidden_act"},
		{`{` + base + `,"attention_bias":true}`, "attention_bias"},
		{`{` + base + `,"mlp_bias":true}`, "mlp_bias"},
		{`{` + base + `,"rope_scaling":{"rope_type":"llama3","factor":8}}`, "rope_scaling"},
		{`{` + base + `,"rope_scaling":{"type":"linear","factor":2}}`, "linear"},
		{`{` + base + `,"rope_scaling":[1]}`, "rope_scaling"},
		{`{` + base + `,"model_type":"qwen2","use_sliding_window":true,"sliding_window":4096}`, "sliding_window"},
		{`{` + base + `,"rope_parameters":{"rope_type":"yarn"}}`, "rope_type"},
		{`{` + base + `,"sliding_window":4096}`, "sliding_window"},
		{`{` + base + `,"head_dim":8}`, "head_dim"},
		{`{` + base + `,"num_key_value_heads":3}`, "num_key_value_heads"},
		{`{` + base + `,"eos_token_id":"x"}`, "eos_token_id"},
		{`{` + base + `,"eos_token_id":10}`, "eos_token_id"},
		{`[1,2]`, "config.json"},
		{`{"hidden_size":1e99}`, "config.json"},
	}
	for _, b := range bad {
		_, err := parseHFConfig([]byte(b.json))
		require.Error(t, err, b.json)
		assert.Contains(t, err.Error(), b.want, b.json)
	}
}

// TestHFBadInputs corrupts a valid checkpoint in one way at a time; each must be refused with
// ErrBadCheckpoint and an error naming the problem.
func TestHFBadInputs(t *testing.T) {
	good := t.TempDir()
	w := randomWeights(t, smallConfig(), 5)
	require.NoError(t, SaveHF(good, w, F32))
	cfg := readFile(t, filepath.Join(good, ConfigFile))
	st := readFile(t, filepath.Join(good, SafetensorsFile))

	hdr := func(mut func(h map[string]any)) func(*testing.T) []byte {
		return func(t *testing.T) []byte {
			h, data := splitST(t, st)
			mut(h)
			return joinST(t, h, data)
		}
	}
	entry := func(h map[string]any, name string) map[string]any { return h[name].(map[string]any) }
	const norm = "model.norm.weight"
	const q0 = "model.layers.0.self_attn.q_proj.weight"
	const gate = "model.layers.0.mlp.gate_proj.weight"

	cases := []struct {
		name string
		file func(*testing.T) []byte
		want string
	}{
		{"empty", func(*testing.T) []byte { return nil }, "truncated"},
		{"short length", func(*testing.T) []byte { return st[:5] }, "truncated"},
		{"truncated header", func(*testing.T) []byte { return st[:20] }, "beyond file size"},
		{"truncated data", func(*testing.T) []byte { return st[:len(st)-10] }, "beyond the"},
		{"trailing bytes", func(*testing.T) []byte { return append(append([]byte{}, st...), 0, 0, 0, 0) }, "data section has"},
		{"header length beyond file", func(*testing.T) []byte {
			b := append([]byte{}, st...)
			b[0], b[1] = 0xff, 0xff
			return b
		}, "beyond file size"},
		{"header length huge", func(*testing.T) []byte {
			b := append([]byte{}, st...)
			b[6] = 0x10
			return b
		}, "byte limit"},
		{"header not json", func(*testing.T) []byte { return joinRawST([]byte("not json"), nil) }, "not a JSON object"},
		{"header array", func(*testing.T) []byte { return joinRawST([]byte("[1,2,3] "), nil) }, "not a JSON object"},
		{"header bad json", func(*testing.T) []byte { return joinRawST([]byte(`{"a":`), nil) }, "header"},
		{"offsets out of range", hdr(func(h map[string]any) { entry(h, norm)["data_offsets"] = []any{0, 1 << 40} }), "beyond the"},
		{"offset end before start", hdr(func(h map[string]any) { entry(h, norm)["data_offsets"] = []any{64, 32} }), "end before start"},
		{"negative offset", hdr(func(h map[string]any) { entry(h, norm)["data_offsets"] = []any{-32, 0} }), "data_offsets"},
		{"overlapping offsets", hdr(func(h map[string]any) {
			// Point the final norm at layer 0's input norm (same size): overlap, and a hole.
			entry(h, norm)["data_offsets"] = entry(h, "model.layers.0.input_layernorm.weight")["data_offsets"]
		}), "overlap"},
		{"hole", hdr(func(h map[string]any) {
			o := entry(h, norm)["data_offsets"].([]any)
			entry(h, norm)["data_offsets"] = []any{o[0].(float64) + 4, o[1].(float64) + 4}
		}), "hole of 4 bytes"},
		{"size mismatch", hdr(func(h map[string]any) { entry(h, norm)["shape"] = []any{7} }), "needs 28"},
		{"dtype size mismatch", hdr(func(h map[string]any) { entry(h, norm)["dtype"] = "F16" }), "needs 16"},
		{"unknown dtype", hdr(func(h map[string]any) { entry(h, norm)["dtype"] = "F8_E4M3" }), "F8_E4M3"},
		{"unsupported dtype", hdr(func(h map[string]any) { entry(h, norm)["dtype"] = "I32" }), "unsupported dtype I32"},
		{"extra key", hdr(func(h map[string]any) { entry(h, norm)["foo"] = 1 }), norm},
		{"missing tensor", hdr(func(h map[string]any) { h[norm+".renamed"] = h[norm]; delete(h, norm) }), `missing tensor "model.norm.weight"`},
		{"wrong shape", hdr(func(h map[string]any) { entry(h, gate)["shape"] = []any{8, 12} }), "shape [8 12], config implies [12 8]"},
		{"wrong rank", hdr(func(h map[string]any) { entry(h, q0)["shape"] = []any{64} }), q0},
		{"huge dims", hdr(func(h map[string]any) { entry(h, q0)["shape"] = []any{1 << 40, 1 << 40} }), "dimension"},
		{"overflowing shape", hdr(func(h map[string]any) {
			entry(h, q0)["shape"] = []any{1 << 30, 1 << 30, 1 << 30}
		}), "overflows"},
		{"nan value", func(t *testing.T) []byte {
			h, data := splitST(t, st)
			o := entry(h, norm)["data_offsets"].([]any)
			d := append([]byte{}, data...)
			copy(d[int(o[0].(float64))+8:], []byte{0, 0, 0xc0, 0x7f})
			return joinST(t, h, d)
		}, "element 2 is NaN"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFile(t, filepath.Join(dir, ConfigFile), cfg)
			writeFile(t, filepath.Join(dir, SafetensorsFile), c.file(t))
			var got *model.Weights
			var err error
			require.NotPanics(t, func() { got, err = LoadHF(dir) })
			require.ErrorIs(t, err, ErrBadCheckpoint)
			assert.Nil(t, got)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

func TestHFBadDirectories(t *testing.T) {
	w := randomWeights(t, smallConfig(), 5)
	sharded := t.TempDir()
	require.NoError(t, SaveHFSharded(sharded, w, F32, 400))
	idx := readFile(t, filepath.Join(sharded, IndexFile))

	copyDir := func(t *testing.T) string {
		dir := t.TempDir()
		ents, err := os.ReadDir(sharded)
		require.NoError(t, err)
		for _, e := range ents {
			writeFile(t, filepath.Join(dir, e.Name()), readFile(t, filepath.Join(sharded, e.Name())))
		}
		return dir
	}
	setIndex := func(mut func(wm map[string]any)) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			var m map[string]any
			require.NoError(t, json.Unmarshal(idx, &m))
			mut(m["weight_map"].(map[string]any))
			b, err := json.Marshal(m)
			require.NoError(t, err)
			writeFile(t, filepath.Join(dir, IndexFile), b)
		}
	}
	cases := []struct {
		name string
		mut  func(t *testing.T, dir string)
		want string
	}{
		{"no config", func(t *testing.T, dir string) { require.NoError(t, os.Remove(filepath.Join(dir, ConfigFile))) }, "config.json"},
		{"no weights", func(t *testing.T, dir string) { require.NoError(t, os.Remove(filepath.Join(dir, IndexFile))) }, "neither"},
		{"bad config", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, ConfigFile), []byte(`{"hidden_size":8}`))
		}, "missing intermediate_size"},
		{"config disagrees with tensors", func(t *testing.T, dir string) {
			c := smallConfig()
			c.IntermediateSize = 16
			b, err := marshalHFConfig(c, F32)
			require.NoError(t, err)
			writeFile(t, filepath.Join(dir, ConfigFile), b)
		}, "config implies [16 8]"},
		{"shard escapes directory", setIndex(func(wm map[string]any) { wm["model.norm.weight"] = "../x.safetensors" }), "not a .safetensors file"},
		{"shard not safetensors", setIndex(func(wm map[string]any) { wm["model.norm.weight"] = "config.json" }), "not a .safetensors file"},
		{"tensor missing from index", setIndex(func(wm map[string]any) { delete(wm, "model.norm.weight") }), `missing tensor "model.norm.weight"`},
		{"index points at wrong shard", setIndex(func(wm map[string]any) {
			wm["model.norm.weight"] = "model-00001-of-" + strings.Split(wm["model.norm.weight"].(string), "-of-")[1]
		}), `missing tensor "model.norm.weight"`},
		{"shard missing", setIndex(func(wm map[string]any) { wm["model.norm.weight"] = "gone.safetensors" }), "gone.safetensors"},
		{"empty index", func(t *testing.T, dir string) { writeFile(t, filepath.Join(dir, IndexFile), []byte(`{}`)) }, "weight_map"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := copyDir(t)
			c.mut(t, dir)
			_, err := LoadHF(dir)
			require.ErrorIs(t, err, ErrBadCheckpoint)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

func TestHFTiedLMHead(t *testing.T) {
	c := smallConfig()
	c.TieWordEmbeddings = true
	w := randomWeights(t, c, 2)
	dir := t.TempDir()
	require.NoError(t, SaveHF(dir, w, F32))
	cfg := readFile(t, filepath.Join(dir, ConfigFile))

	// Write an untied file (with lm_head) under the tied config.
	withHead := func(head []float32) {
		u := *w
		u.Config.TieWordEmbeddings = false
		u.LMHead = head
		tmp := t.TempDir()
		require.NoError(t, SaveHF(tmp, &u, F32))
		writeFile(t, filepath.Join(dir, SafetensorsFile), readFile(t, filepath.Join(tmp, SafetensorsFile)))
		writeFile(t, filepath.Join(dir, ConfigFile), cfg)
	}
	withHead(append([]float32(nil), w.Embed...))
	got, err := LoadHF(dir)
	require.NoError(t, err, "a tied checkpoint may carry lm_head equal to the embedding")
	assert.Nil(t, got.LMHead)
	assert.Equal(t, w.Embed, got.Embed)

	other := append([]float32(nil), w.Embed...)
	other[5]++
	withHead(other)
	_, err = LoadHF(dir)
	require.ErrorIs(t, err, ErrBadCheckpoint)
	assert.Contains(t, err.Error(), "lm_head.weight differs")
}

func TestHFIgnoresExtraTensors(t *testing.T) {
	w := randomWeights(t, smallConfig(), 4)
	dir := t.TempDir()
	require.NoError(t, SaveHF(dir, w, F32))
	h, data := splitST(t, readFile(t, filepath.Join(dir, SafetensorsFile)))
	n := len(data)
	h["model.layers.0.self_attn.rotary_emb.inv_freq"] = map[string]any{"dtype": "F32", "shape": []any{2}, "data_offsets": []any{n, n + 8}}
	writeFile(t, filepath.Join(dir, SafetensorsFile), joinST(t, h, append(append([]byte{}, data...), make([]byte, 8)...)))
	got, err := LoadHF(dir)
	require.NoError(t, err)
	requireSameWeights(t, convertedCopy(w, F32), got)
}

// TestHFConfigLargerThanFilesFailsBeforeAllocating: a config.json that claims a 13B model (52 GB
// of float32, within Validate's limit) beside the files of a small one must be refused on the
// tensors' shapes, before a weight set of the claimed size is allocated (which would end the
// process on a machine without that memory).
func TestHFConfigLargerThanFilesFailsBeforeAllocating(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, SaveHF(dir, randomWeights(t, smallConfig(), 5), F32))
	path := filepath.Join(dir, ConfigFile)
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	var cfg map[string]any
	require.NoError(t, json.Unmarshal(raw, &cfg))
	cfg["hidden_size"], cfg["intermediate_size"] = 5120, 13824
	cfg["num_hidden_layers"], cfg["vocab_size"] = 40, 32000
	cfg["num_attention_heads"], cfg["num_key_value_heads"] = 40, 40
	delete(cfg, "head_dim")
	raw, err = json.Marshal(cfg)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, raw, 0o644))

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = LoadHF(dir)
	runtime.ReadMemStats(&after)
	require.ErrorIs(t, err, ErrBadCheckpoint)
	assert.Contains(t, err.Error(), "config implies")
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(64<<20), "bytes allocated by the refused load")
}

// The config.json files of the two checkpoints the large presets are shaped like, as
// published (Llama-3.2-1B and Qwen2.5-0.5B).
const (
	llama32Config = `{
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256}`
	qwen25Config = `{
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936}`
)

// TestRealConfigsMatchPresets: the published configs load, and describe the model their
// presets build (all but the special token ids, which are the synthetic vocabulary's).
func TestRealConfigsMatchPresets(t *testing.T) {
	for preset, js := range map[string]string{"llama3.2-1b-shape": llama32Config, "qwen2.5-0.5b-shape": qwen25Config} {
		got, err := parseHFConfig([]byte(js))
		require.NoError(t, err, preset)
		want, err := model.PresetConfig(preset)
		require.NoError(t, err)
		got.BOSTokenID, got.EOSTokenID = want.BOSTokenID, want.EOSTokenID
		got.TorchDtype = want.TorchDtype
		require.Equal(t, want, got, preset)
	}
}
