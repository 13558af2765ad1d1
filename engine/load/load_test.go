package load

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/tokenizer"
	"github.com/rolloutkit/rollout/engine/weights"
)

func TestOpenBuiltin(t *testing.T) {
	m, err := Open("builtin:tiny", "")
	require.NoError(t, err)
	assert.Equal(t, "byte", m.Tokenizer.Kind())
	m2, err := Open("builtin:tiny@7", "")
	require.NoError(t, err)
	assert.NotEqual(t, m.Weights.Embed[:8], m2.Weights.Embed[:8])
	for _, bad := range []string{"", "builtin:nope", "builtin:tiny@x", "/no/such/dir", "README.md"} {
		_, err := Open(bad, "")
		assert.Error(t, err, bad)
	}
}

// TestCheckpointsRoundTrip writes each format the way `rollout model init` does and loads it
// back: same weights, same tokenizer behaviour, specials restored.
func TestCheckpointsRoundTrip(t *testing.T) {
	for _, preset := range []string{"tiny", "stories15m"} {
		w, err := model.Preset(preset, 3)
		require.NoError(t, err)
		tok, err := BuiltinTokenizer(w.Config)
		require.NoError(t, err)

		hf := t.TempDir()
		require.NoError(t, weights.SaveHF(hf, w, weights.F32))
		writeFile(t, filepath.Join(hf, "tokenizer.json"), tok, tokenizer.WriteHF)
		m, err := Open(hf, "")
		require.NoError(t, err)
		assert.Equal(t, w.Layers[0].Wq, m.Weights.Layers[0].Wq)
		ids, err := m.Tokenizer.Encode("Once upon a time")
		require.NoError(t, err)
		text, err := m.Tokenizer.Decode(ids)
		require.NoError(t, err)
		assert.Equal(t, "Once upon a time", text)
		assert.Equal(t, w.Config.EOSTokenID, m.Weights.Config.EOSTokenID)

		l2 := t.TempDir()
		require.NoError(t, weights.SaveLlama2C(filepath.Join(l2, "model.bin"), w))
		if tok.Kind() != "byte" {
			writeFile(t, filepath.Join(l2, "tokenizer.bin"), tok, tokenizer.WriteLlama2C)
		}
		m, err = Open(filepath.Join(l2, "model.bin"), "")
		require.NoError(t, err)
		assert.Equal(t, w.Config.BOSTokenID, m.Weights.Config.BOSTokenID, preset)
		assert.Equal(t, w.Config.EOSTokenID, m.Weights.Config.EOSTokenID, preset)
		assert.Equal(t, w.Layers[0].WUp, m.Weights.Layers[0].WUp)

		// The directory `model init --format llama2c --out` wrote names the model too.
		d, err := Open(l2, "")
		require.NoError(t, err, preset)
		assert.Equal(t, m.Weights.Layers[0].WUp, d.Weights.Layers[0].WUp)
		assert.Equal(t, m.Tokenizer.VocabSize(), d.Tokenizer.VocabSize())
	}
}

func writeFile(t *testing.T, path string, tok tokenizer.Tokenizer, write func(tokenizer.Tokenizer, io.Writer) error) {
	t.Helper()
	f, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, write(tok, f))
	require.NoError(t, f.Close())
}

// TestOpenAsLoadsIntoABuilder: below F32 a checkpoint directory opens into a model.Builder
// (no float32 set), whose model is NewAs's of the checkpoint, with the tokenizer's special
// tokens in its config; builtin presets and llama2.c files still load whole.
func TestOpenAsLoadsIntoABuilder(t *testing.T) {
	w, err := model.Preset("tiny", 4)
	require.NoError(t, err)
	hf := t.TempDir()
	require.NoError(t, weights.SaveHF(hf, w, weights.BF16))
	whole, err := Open(hf, "")
	require.NoError(t, err)
	for _, prec := range []kernels.Precision{kernels.BF16, kernels.Int8, kernels.W8A8} {
		m, err := OpenAs(hf, "", prec)
		require.NoError(t, err)
		require.Nil(t, m.Weights)
		require.NotNil(t, m.Builder)
		assert.Equal(t, whole.Config, m.Config)
		assert.Equal(t, whole.Config, m.Builder.Config())
		got, err := m.Builder.Model(nil)
		require.NoError(t, err)
		want, err := model.NewAs(whole.Weights, nil, nil, prec)
		require.NoError(t, err)
		assert.Equal(t, want.Weights(), got.Weights(), "%s", prec)
	}
	b, err := OpenAs("builtin:tiny", "", kernels.BF16)
	require.NoError(t, err)
	assert.NotNil(t, b.Weights)
	assert.Nil(t, b.Builder)
	_, err = OpenAs(t.TempDir(), "", kernels.BF16)
	assert.Error(t, err, "an empty directory")
}
