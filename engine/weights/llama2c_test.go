package weights

import (
	"encoding/binary"
	"math"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/model"
)

func TestLlama2CRoundTrip(t *testing.T) {
	tied := smallConfig()
	tied.TieWordEmbeddings = true
	for _, c := range []model.Config{smallConfig(), tied} {
		w := randomWeights(t, c, 21)
		path := filepath.Join(t.TempDir(), "model.bin")
		require.NoError(t, SaveLlama2C(path, w))
		b := readFile(t, path)
		require.EqualValues(t, llama2cSize(c), len(b))
		vocab := int32(binary.LittleEndian.Uint32(b[20:]))
		if c.TieWordEmbeddings {
			assert.EqualValues(t, c.VocabSize, vocab)
		} else {
			assert.EqualValues(t, -c.VocabSize, vocab, "untied is marked by a negative vocab_size")
		}
		got, err := LoadLlama2C(path)
		require.NoError(t, err)
		requireSameWeights(t, w, got)
	}
}

func TestLlama2CPresetRoundTrip(t *testing.T) {
	w, err := model.Preset("tiny", 3)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "tiny.bin")
	require.NoError(t, SaveLlama2C(path, w))
	got, err := LoadLlama2C(path)
	require.NoError(t, err)
	// The .bin format has no bos/eos fields: the loader reports llama2.c's.
	assert.Equal(t, 1, got.Config.BOSTokenID)
	assert.Equal(t, 2, got.Config.EOSTokenID)
	got.Config.BOSTokenID, got.Config.EOSTokenID = w.Config.BOSTokenID, w.Config.EOSTokenID
	requireSameWeights(t, w, got)
}

func TestInterleavePermutation(t *testing.T) {
	// One head of width 4 with 1 column: llama2.c rows (0,1) and (2,3) are RoPE pairs; in HF
	// layout the pairs are rows (0,2) and (1,3).
	assert.Equal(t, []float32{10, 12, 11, 13}, fromInterleaved(make([]float32, 4), []float32{10, 11, 12, 13}, 1, 4, 1))
	x := make([]float32, 3*6*5)
	for i := range x {
		x[i] = float32(i)
	}
	assert.Equal(t, x, fromInterleaved(make([]float32, len(x)), toInterleaved(x, 3, 6, 5), 3, 6, 5))
	assert.Equal(t, x, toInterleaved(fromInterleaved(make([]float32, len(x)), x, 3, 6, 5), 3, 6, 5))
	assert.NotEqual(t, x, fromInterleaved(make([]float32, len(x)), x, 3, 6, 5))
}

func TestSaveLlama2CRefusesWhatItCannotCarry(t *testing.T) {
	c := smallConfig()
	c.RopeTheta = 500000
	err := SaveLlama2C(filepath.Join(t.TempDir(), "m.bin"), randomWeights(t, c, 1))
	require.ErrorIs(t, err, ErrUnsupportedFormat)
	c = smallConfig()
	c.RMSNormEps = 1e-6
	err = SaveLlama2C(filepath.Join(t.TempDir(), "m.bin"), randomWeights(t, c, 1))
	require.ErrorIs(t, err, ErrUnsupportedFormat)
}

func TestLlama2CBadInputs(t *testing.T) {
	w := randomWeights(t, smallConfig(), 8)
	path := filepath.Join(t.TempDir(), "model.bin")
	require.NoError(t, SaveLlama2C(path, w))
	good := readFile(t, path)

	withHeader := func(h [7]int32, tail int) []byte {
		b := make([]byte, 28, 28+tail)
		for i, v := range h {
			binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
		}
		return append(b, make([]byte, tail)...)
	}
	field := func(i int, v int32) []byte {
		b := append([]byte{}, good...)
		binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
		return b
	}
	cases := []struct {
		name string
		file []byte
		want string
	}{
		{"empty", nil, "truncated"},
		{"short header", good[:20], "truncated"},
		{"truncated data", good[:len(good)-4], "implies"},
		{"trailing data", append(append([]byte{}, good...), 1, 2, 3, 4), "implies"},
		{"header only", good[:28], "implies"},
		{"lying dim", field(0, 16), "implies"},
		{"lying layers", field(2, 3), "implies"},
		{"tied flag flipped", field(5, 10), "implies"},
		{"negative dim", field(0, -8), "dim is -8"},
		{"zero layers", field(2, 0), "n_layers is 0"},
		{"negative seq_len", field(6, -1), "seq_len is -1"},
		{"zero vocab", field(5, 0), "vocab_size is 0"},
		{"min int32 vocab", field(5, math.MinInt32), "vocab_size"},
		{"huge dim", withHeader([7]int32{1 << 30, 12, 1, 2, 1, 10, 16}, 0), "hidden_size"},
		{"huge hidden_dim", withHeader([7]int32{8, math.MaxInt32, 1, 2, 1, 10, 16}, 0), "intermediate_size"},
		{"huge vocab", withHeader([7]int32{8, 12, 1, 2, 1, math.MaxInt32, 16}, 0), "vocab_size"},
		{"huge seq_len", withHeader([7]int32{8, 12, 1, 2, 1, 10, math.MaxInt32}, 0), "max_position_embeddings"},
		{"huge everything", withHeader([7]int32{1 << 14, 1 << 17, 256, 1 << 10, 1 << 10, 1 << 20, 1 << 20}, 0), "parameters exceed"},
		{"heads do not divide dim", field(3, 3), "num_attention_heads"},
		{"kv heads do not divide heads", field(4, 3), "num_key_value_heads"},
		{"odd head size", withHeader([7]int32{6, 12, 1, 2, 1, 10, 16}, 0), "odd"},
		{"nan weight", func() []byte {
			b := append([]byte{}, good...)
			binary.LittleEndian.PutUint32(b[28+4*13:], 0x7fc00000)
			return b
		}(), "token_embedding_table: element 13 is NaN"},
		{"inf in wq", func() []byte {
			b := append([]byte{}, good...)
			c := smallConfig()
			off := 28 + 4*(c.VocabSize*8+c.NumHiddenLayers*8+70)
			binary.LittleEndian.PutUint32(b[off:], 0xff800000)
			return b
		}(), "wq[1]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "model.bin")
			writeFile(t, p, c.file)
			var got *model.Weights
			var err error
			require.NotPanics(t, func() { got, err = LoadLlama2C(p) })
			require.ErrorIs(t, err, ErrBadCheckpoint)
			assert.Nil(t, got)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}
