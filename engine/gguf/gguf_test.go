package gguf

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	parser "github.com/gpustack/gguf-parser-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/x448/float16"

	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/tokenizer"
)

// cases are small models covering each architecture and vocabulary form: the byte-level tiny
// preset (llama, sentencepiece-style bytes), a Qwen2-shaped one with a synthetic byte-level
// BPE (qwen2, gpt2 vocabulary, untied), and a Llama 3-shaped one with RoPE scaling and a
// llama2.c vocabulary (llama, rope_freqs).
func cases(t *testing.T) map[string]struct {
	w   *model.Weights
	tok tokenizer.Tokenizer
} {
	t.Helper()
	tiny, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	base := tiny.Config
	base.VocabSize = 512
	qc := base
	qc.AttentionBias, qc.TieWordEmbeddings = true, false
	qw, err := model.Random(qc, 2)
	require.NoError(t, err)
	lc := base
	lc.RopeScaling = &model.RopeScaling{RopeType: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 64}
	lw, err := model.Random(lc, 3)
	require.NoError(t, err)
	syn, err := tokenizer.Synthetic(512)
	require.NoError(t, err)
	return map[string]struct {
		w   *model.Weights
		tok tokenizer.Tokenizer
	}{
		"tiny":   {tiny, tokenizer.NewByte()},
		"qwen2":  {qw, syn},
		"llama3": {lw, syn.Llama2C()},
	}
}

// TestWriteParses writes every case in every type, parses the file with gguf-parser-go (an
// independent reader of the format) and checks the metadata llama.cpp reads and every
// tensor's bytes against the weights they came from.
func TestWriteParses(t *testing.T) {
	for name, tc := range cases(t) {
		for _, typ := range []Type{F32, BF16, F16, Q8_0} {
			t.Run(fmt.Sprint(name, "/", typ), func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "m.gguf")
				require.NoError(t, WriteFile(path, tc.w, tc.tok, typ, name))
				gf, err := parser.ParseGGUFFile(path)
				require.NoError(t, err)
				c := tc.w.Config
				assert.EqualValues(t, 3, gf.Header.Version)
				arch := gf.Architecture()
				assert.Equal(t, Architecture(c), arch.Architecture)
				assert.EqualValues(t, c.HiddenSize, arch.EmbeddingLength)
				assert.EqualValues(t, c.NumHiddenLayers, arch.BlockCount)
				assert.EqualValues(t, c.NumAttentionHeads, arch.AttentionHeadCount)
				assert.EqualValues(t, c.NumKeyValueHeads, arch.AttentionHeadCountKV)
				assert.EqualValues(t, c.HeadDim(), arch.RoPEDimensionCount)
				assert.EqualValues(t, float32(c.RopeTheta), arch.RoPEFrequencyBase)
				assert.EqualValues(t, float32(c.RMSNormEps), arch.AttentionLayerNormRMSEpsilon)
				assert.EqualValues(t, c.MaxPositionEmbeddings, arch.MaximumContextLength)
				tk := gf.Tokenizer()
				assert.EqualValues(t, c.VocabSize, tk.TokensLength)
				assert.EqualValues(t, tc.tok.BOS(), tk.BOSTokenID)
				assert.EqualValues(t, tc.tok.EOS(), tk.EOSTokenID)
				if _, ok := tc.tok.(*tokenizer.SyntheticTokenizer); ok {
					assert.Equal(t, "gpt2", tk.Model)
					assert.Positive(t, tk.MergesLength)
				} else {
					assert.Equal(t, "llama", tk.Model)
				}
				ft, ok := gf.Header.MetadataKV.Get("general.file_type")
				require.True(t, ok)
				assert.Equal(t, typ.fileType(), ft.ValueUint32())

				file, err := os.ReadFile(path)
				require.NoError(t, err)
				want := tensors(tc.w, typ)
				require.Len(t, gf.TensorInfos, len(want))
				assert.Zero(t, gf.TensorDataStartOffset%alignment)
				for i, ti := range gf.TensorInfos {
					wt := want[i]
					require.Equal(t, wt.name, ti.Name)
					require.Equal(t, wt.dims, ti.Dimensions, wt.name)
					require.EqualValues(t, wt.typ, ti.Type, wt.name)
					require.Zero(t, ti.Offset%alignment, wt.name)
					require.EqualValues(t, wt.bytes(), ti.Bytes(), "%s: the parser's size of its type and dims", wt.name)
					data := file[gf.TensorDataStartOffset+int64(ti.Offset):][:wt.bytes()]
					checkData(t, tc.w, wt, data)
				}
			})
		}
	}
}

// checkData decodes data as wt's type and compares it with the HF tensor it came from, rows
// in llama.cpp's order.
func checkData(t *testing.T, w *model.Weights, wt tensor, data []byte) {
	t.Helper()
	src, perm := hfSource(t, w, wt.name)
	rb := int(wt.typ.rowBytes(wt.cols))
	for r := range wt.rows {
		sr := r
		if perm != nil {
			sr = perm(r)
		}
		x := src[sr*wt.cols : (sr+1)*wt.cols]
		row := data[r*rb : (r+1)*rb]
		var q8 []float32
		if wt.typ == Q8_0 {
			q8 = Q8Dequantize(x)
		}
		for j := range wt.cols {
			var got, exp float32
			switch wt.typ {
			case F32:
				got, exp = math.Float32frombits(binary.LittleEndian.Uint32(row[4*j:])), x[j]
			case F16:
				got, exp = float16.Frombits(binary.LittleEndian.Uint16(row[2*j:])).Float32(), float16.Fromfloat32(x[j]).Float32()
			case BF16:
				got = math.Float32frombits(uint32(binary.LittleEndian.Uint16(row[2*j:])) << 16)
				exp = bf16Round(x[j])
				require.LessOrEqual(t, math.Abs(float64(got-x[j])), math.Abs(float64(x[j]))/256, "%s[%d][%d]", wt.name, r, j)
			case Q8_0:
				blk := row[(j/q8Block)*(2+q8Block):]
				d := float16.Frombits(binary.LittleEndian.Uint16(blk)).Float32()
				got, exp = d*float32(int8(blk[2+j%q8Block])), q8[j]
				// Independently of Q8Dequantize: within half a step of the weight, plus the
				// scale's f16 rounding (2^-11 relative) over up to 127 steps.
				require.LessOrEqual(t, math.Abs(float64(got-x[j])), float64(d)*(0.5+127.0/2048)+1e-7, "%s[%d][%d]", wt.name, r, j)
			}
			require.Equal(t, exp, got, "%s[%d][%d]", wt.name, r, j)
		}
	}
}

// hfSource names the HF tensor behind a GGUF tensor and the row map of q and k in the llama
// architecture (nil for none), spelt out here rather than taken from tensors().
func hfSource(t *testing.T, w *model.Weights, name string) ([]float32, func(int) int) {
	t.Helper()
	c := w.Config
	switch name {
	case "token_embd.weight":
		return w.Embed, nil
	case "output_norm.weight":
		return w.FinalNorm, nil
	case "output.weight":
		return w.LMHead, nil
	case "rope_freqs.weight":
		base := c
		base.RopeScaling = nil
		plain, scaled := base.RopeInvFreq(), c.RopeInvFreq()
		out := make([]float32, len(plain))
		for i := range out {
			out[i] = float32(plain[i] / scaled[i])
		}
		return out, nil
	}
	var li int
	var rest string
	_, err := fmt.Sscanf(name, "blk.%d.%s", &li, &rest)
	require.NoError(t, err, name)
	l := w.Layers[li]
	hd := c.HeadDim()
	// llama.cpp's llama RoPE turns adjacent pairs: its row 2j+k of a head is HF's row
	// k*hd/2+j, HF turning the halves.
	pairs := func(r int) int { return r/hd*hd + (r%hd%2)*(hd/2) + r%hd/2 }
	if c.AttentionBias {
		pairs = nil
	}
	m := map[string][]float32{"attn_norm.weight": l.AttnNorm, "attn_v.weight": l.Wv, "attn_output.weight": l.Wo,
		"ffn_norm.weight": l.FFNNorm, "ffn_gate.weight": l.WGate, "ffn_down.weight": l.WDown, "ffn_up.weight": l.WUp,
		"attn_q.bias": l.Bq, "attn_k.bias": l.Bk, "attn_v.bias": l.Bv}
	switch rest {
	case "attn_q.weight":
		return l.Wq, pairs
	case "attn_k.weight":
		return l.Wk, pairs
	}
	s, ok := m[rest]
	require.True(t, ok, name)
	return s, nil
}

// TestInterleavedRopeEqualsRotateHalf: the permuted q rows under llama.cpp's adjacent-pair
// RoPE give HF's rotate-half result, permuted the same way. This is what makes greedy tokens
// agree, checked on the arithmetic rather than on the index formula.
func TestInterleavedRopeEqualsRotateHalf(t *testing.T) {
	const hd, heads, cols, pos = 8, 2, 5, 7
	w := make([]float32, heads*hd*cols)
	x := make([]float32, cols)
	for i := range w {
		w[i] = float32(math.Sin(float64(i) * 1.3))
	}
	for i := range x {
		x[i] = float32(math.Cos(float64(i)))
	}
	mat := func(r int, perm func(int) int) float64 {
		if perm != nil {
			r = perm(r)
		}
		s := 0.0
		for k := range cols {
			s += float64(w[r*cols+k]) * float64(x[k])
		}
		return s
	}
	freq := func(i int) float64 { return math.Pow(10000, -2*float64(i)/hd) }
	hf := make([]float64, heads*hd)
	cpp := make([]float64, heads*hd)
	perm := interleave(hd)
	for h := range heads {
		for i := range hd / 2 {
			s, co := math.Sincos(pos * freq(i))
			a, b := mat(h*hd+i, nil), mat(h*hd+i+hd/2, nil)
			hf[h*hd+i], hf[h*hd+i+hd/2] = a*co-b*s, b*co+a*s
			a, b = mat(h*hd+2*i, perm), mat(h*hd+2*i+1, perm)
			cpp[h*hd+2*i], cpp[h*hd+2*i+1] = a*co-b*s, b*co+a*s
		}
	}
	for r := range cpp {
		require.InDelta(t, hf[perm(r)], cpp[r], 1e-12, "row %d", r)
	}
}

func TestWriteRefuses(t *testing.T) {
	w, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	dir := t.TempDir()
	_, err = ParseType("q4_0")
	require.ErrorIs(t, err, ErrUnsupported)
	require.ErrorIs(t, WriteFile(filepath.Join(dir, "a.gguf"), w, tokenizer.NewByte(), Type(2), ""), ErrUnsupported)
	syn, err := tokenizer.Synthetic(1000)
	require.NoError(t, err)
	require.ErrorIs(t, WriteFile(filepath.Join(dir, "b.gguf"), w, syn, F32, ""), ErrUnsupported, "vocabulary larger than the model")
	require.ErrorIs(t, WriteFile(filepath.Join(dir, "c.gguf"), w, nil, F32, ""), ErrUnsupported)
	broken := w.Clone()
	broken.Layers[0].Wq = broken.Layers[0].Wq[:5]
	require.Error(t, WriteFile(filepath.Join(dir, "d.gguf"), broken, tokenizer.NewByte(), F32, ""))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, entries, "a refused write leaves no file behind")
	for _, s := range Types() {
		typ, err := ParseType(s)
		require.NoError(t, err)
		require.Equal(t, s, typ.String())
	}
}

// bf16Round is x rounded to bfloat16, ties to even, spelt out apart from the writer's: the
// discarded low 16 bits decide, above half rounding up, at half to the even neighbour.
func bf16Round(x float32) float32 {
	u := math.Float32bits(x)
	hi, lo := u>>16, u&0xffff
	if lo > 0x8000 || lo == 0x8000 && hi&1 == 1 {
		hi++
	}
	return math.Float32frombits(hi << 16)
}

// TestVocabularyPadding: a model whose vocabulary is larger than its tokenizer's (as real
// checkpoints pad theirs to a multiple of 64 or 128) gets one token per embedding row, the
// extra ones unused, and the specials are control tokens.
func TestVocabularyPadding(t *testing.T) {
	c, err := model.PresetConfig("tiny")
	require.NoError(t, err)
	c.VocabSize = 600
	w, err := model.Random(c, 1)
	require.NoError(t, err)
	syn, err := tokenizer.Synthetic(512)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "p.gguf")
	require.NoError(t, WriteFile(path, w, syn, F32, "padded"))
	gf, err := parser.ParseGGUFFile(path)
	require.NoError(t, err)
	toks, ok := gf.Header.MetadataKV.Get("tokenizer.ggml.tokens")
	require.True(t, ok)
	types, ok := gf.Header.MetadataKV.Get("tokenizer.ggml.token_type")
	require.True(t, ok)
	names, kinds := toks.ValueArray().ValuesString(), types.ValueArray().ValuesInt32()
	require.Len(t, names, 600)
	require.Len(t, kinds, 600)
	require.Equal(t, "[PAD599]", names[599])
	require.Equal(t, typeUnused, kinds[599])
	require.Equal(t, typeNormal, kinds[300])
	require.Equal(t, typeControl, kinds[syn.BOS()])
	require.Equal(t, typeControl, kinds[syn.EOS()])
	seen := map[string]bool{}
	for _, n := range names {
		require.False(t, seen[n], "token %q twice: llama.cpp maps text to one id", n)
		seen[n] = true
	}
}
