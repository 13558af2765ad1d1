package tokenizer

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSplitGPT2(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"Hello world", []string{"Hello", " world"}},
		{"it's", []string{"it", "'s"}},
		{"I'll we're they've I'm he'd don't", []string{"I", "'ll", " we", "'re", " they", "'ve", " I", "'m", " he", "'d", " don", "'t"}},
		{"a'S", []string{"a", "'", "S"}}, // contractions are case-sensitive
		{"'x", []string{"'", "x"}},
		{"!'s", []string{"!'", "s"}},
		{"a  b", []string{"a", " ", " b"}},
		{"a \n b", []string{"a", " \n", " b"}},
		{"\t\tx", []string{"\t", "\t", "x"}},
		{"\n\nb", []string{"\n", "\n", "b"}},
		{" \nb", []string{" ", "\n", "b"}},
		{"  ", []string{"  "}},
		{"x  ", []string{"x", "  "}},
		{" ", []string{" "}},
		{"123abc", []string{"123", "abc"}},
		{" 3.14", []string{" 3", ".", "14"}},
		{"hi!! !!", []string{"hi", "!!", " !!"}},
		{"héllo wörld", []string{"héllo", " wörld"}},
		{"hi 👋🏽", []string{"hi", " 👋🏽"}},
		{"\xffab", []string{"\xff", "ab"}},
		{"x\u00a0y", []string{"x", "\u00a0", "y"}}, // NBSP is \s
		{"", nil},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, splitGPT2(nil, tt.in), "%q", tt.in)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	alphabet := []string{"a", "Z", "1", " ", "  ", "\n", "\t", "'", "'s", "!", "é", "٣", "👋", "\xff", "\u3000"}
	for range 2000 {
		var sb strings.Builder
		for range rng.IntN(20) {
			sb.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		parts := splitGPT2(nil, sb.String())
		require.Equal(t, sb.String(), strings.Join(parts, ""))
		for _, p := range parts {
			require.NotEmpty(t, p)
		}
	}
}

func TestByteLevelTable(t *testing.T) {
	assert.Equal(t, 'Ġ', gpt2.toRune[' '])
	assert.Equal(t, 'Ċ', gpt2.toRune['\n'])
	assert.Equal(t, 'a', gpt2.toRune['a'])
	assert.Equal(t, 'Ā', gpt2.toRune[0])
	assert.Len(t, gpt2.toByte, 256)
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	assert.Equal(t, all, gpt2.decode(gpt2.encode(all)))
}

// hfDoc builds a tokenizer.json document; mutate the map to make variants.
func hfDoc(mergesAsPairs bool) map[string]any {
	vocab := map[string]int{}
	for i, p := range []string{"h", "e", "l", "o", "Ġ", "w", "r", "d", "he", "ll", "llo", "hello",
		"Ġw", "or", "Ġwor", "Ġworl", "Ġworld"} {
		vocab[p] = i
	}
	merges := [][2]string{{"h", "e"}, {"l", "l"}, {"ll", "o"}, {"he", "llo"}, {"Ġ", "w"}, {"o", "r"},
		{"Ġw", "or"}, {"Ġwor", "l"}, {"Ġworl", "d"}}
	var m []any
	for _, mg := range merges {
		if mergesAsPairs {
			m = append(m, []string{mg[0], mg[1]})
		} else {
			m = append(m, mg[0]+" "+mg[1])
		}
	}
	return map[string]any{
		"version": "1.0",
		"added_tokens": []any{
			map[string]any{"id": 17, "content": "<|end|>", "special": true},
			map[string]any{"id": 18, "content": "</s>", "special": true},
		},
		"normalizer":    nil,
		"pre_tokenizer": map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
		"decoder":       map[string]any{"type": "ByteLevel"},
		"model":         map[string]any{"type": "BPE", "vocab": vocab, "merges": m, "unk_token": nil},
	}
}

func mustJSON(t testing.TB, v any) []byte {
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

func TestHFEncodeHandBuilt(t *testing.T) {
	for _, pairs := range []bool{false, true} {
		tok, err := ParseHF(mustJSON(t, hfDoc(pairs)))
		require.NoError(t, err)
		assert.Equal(t, 19, tok.VocabSize())
		assert.Equal(t, 18, tok.EOS())
		assert.Equal(t, -1, tok.BOS())
		tests := []struct {
			text string
			want []int
		}{
			{"hello world", []int{11, 16}},
			{"hell", []int{8, 9}},
			{"lol", []int{2, 3, 2}},
			{"hello<|end|>world", []int{11, 17, 5, 13, 2, 7}},
			{"", []int{}},
		}
		for _, tt := range tests {
			got, err := tok.Encode(tt.text)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got, "%q", tt.text)
			dec, err := tok.Decode(got)
			require.NoError(t, err)
			assert.Equal(t, tt.text, dec)
		}
		// EOS is a control token: its text is not matched, and "<", "/" are not in vocab.
		_, err = tok.Encode("</s>")
		require.ErrorIs(t, err, ErrUnencodable)
		dec, err := tok.Decode([]int{11, 18})
		require.NoError(t, err)
		assert.Equal(t, "hello", dec)
		_, err = tok.Decode([]int{19})
		require.ErrorIs(t, err, ErrInvalidID)
	}
}

func TestHFAddedTokenOptions(t *testing.T) {
	doc := hfDoc(false)
	doc["added_tokens"] = []any{
		map[string]any{"id": 17, "content": "ll", "special": false, "single_word": true},
		map[string]any{"id": 18, "content": "oo", "special": true, "lstrip": true, "rstrip": true},
		map[string]any{"id": 19, "content": "ooo", "special": true},
	}
	tok, err := ParseHF(mustJSON(t, doc))
	require.NoError(t, err)
	tests := []struct {
		text string
		want []int
	}{
		{"hello", []int{11}},               // single_word: "ll" inside a word is not the added token
		{"he ll o", []int{8, 4, 17, 4, 3}}, // but alone it is
		{"h  oo  h", []int{0, 18, 0}},      // lstrip/rstrip swallow the spaces
		{"hoooo", []int{0, 19, 3}},         // leftmost-longest
	}
	for _, tt := range tests {
		got, err := tok.Encode(tt.text)
		require.NoError(t, err)
		assert.Equal(t, tt.want, got, "%q", tt.text)
	}
}

func TestHFPrefixSpaceAndNoRegex(t *testing.T) {
	doc := hfDoc(false)
	doc["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
		map[string]any{"type": "ByteLevel", "add_prefix_space": true, "use_regex": false}}}
	tok, err := ParseHF(mustJSON(t, doc))
	require.NoError(t, err)
	got, err := tok.Encode("world")
	require.NoError(t, err)
	assert.Equal(t, []int{16}, got)
	// Without the regex split the whole text is one chunk: "hello world" → "Ġhello" + ... .
	got, err = tok.Encode("hello world")
	require.NoError(t, err)
	assert.Equal(t, []int{4, 11, 16}, got)
}

func TestHFRejects(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(d map[string]any)
		raw    string
		want   error
	}{
		{name: "bad json", raw: `{"model": `, want: ErrMalformed},
		{name: "not an object", raw: `[1,2]`, want: ErrMalformed},
		{name: "no model", raw: `{}`, want: ErrMalformed},
		{name: "wordpiece", mutate: func(d map[string]any) { d["model"].(map[string]any)["type"] = "WordPiece" }, want: ErrUnsupported},
		{name: "unigram", raw: `{"model": {"type": "Unigram", "vocab": [["a", -1.0]]}}`, want: ErrUnsupported},
		{name: "byte fallback", mutate: func(d map[string]any) { d["model"].(map[string]any)["byte_fallback"] = true }, want: ErrUnsupported},
		{name: "subword prefix", mutate: func(d map[string]any) { d["model"].(map[string]any)["continuing_subword_prefix"] = "##" }, want: ErrUnsupported},
		{name: "dropout", mutate: func(d map[string]any) { d["model"].(map[string]any)["dropout"] = 0.1 }, want: ErrUnsupported},
		{name: "metaspace", mutate: func(d map[string]any) {
			d["pre_tokenizer"] = map[string]any{"type": "Metaspace", "replacement": "▁"}
		}, want: ErrUnsupported},
		{name: "split without pattern", mutate: func(d map[string]any) {
			d["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
				map[string]any{"type": "Split"}, map[string]any{"type": "ByteLevel"}}}
		}, want: ErrMalformed},
		{name: "no pre-tokenizer", mutate: func(d map[string]any) { d["pre_tokenizer"] = nil }, want: ErrUnsupported},
		{name: "normalizer", mutate: func(d map[string]any) { d["normalizer"] = map[string]any{"type": "Lowercase"} }, want: ErrUnsupported},
		{name: "metaspace decoder", mutate: func(d map[string]any) { d["decoder"] = map[string]any{"type": "Metaspace"} }, want: ErrUnsupported},
		{name: "no decoder", mutate: func(d map[string]any) { delete(d, "decoder") }, want: ErrUnsupported},
		{name: "merge of unknown piece", mutate: func(d map[string]any) {
			m := d["model"].(map[string]any)
			m["merges"] = append(m["merges"].([]any), "x y")
		}, want: ErrMalformed},
		{name: "merge result not in vocab", mutate: func(d map[string]any) {
			m := d["model"].(map[string]any)
			m["merges"] = append(m["merges"].([]any), "h o")
		}, want: ErrMalformed},
		{name: "merge of three", mutate: func(d map[string]any) {
			m := d["model"].(map[string]any)
			m["merges"] = append(m["merges"].([]any), "h e l")
		}, want: ErrMalformed},
		{name: "merge not a string or pair", mutate: func(d map[string]any) {
			m := d["model"].(map[string]any)
			m["merges"] = append(m["merges"].([]any), 7)
		}, want: ErrMalformed},
		{name: "negative id", mutate: func(d map[string]any) { d["model"].(map[string]any)["vocab"].(map[string]int)["x"] = -1 }, want: ErrMalformed},
		{name: "huge id", mutate: func(d map[string]any) { d["model"].(map[string]any)["vocab"].(map[string]int)["x"] = 1 << 30 }, want: ErrMalformed},
		{name: "sparse ids", mutate: func(d map[string]any) { d["model"].(map[string]any)["vocab"].(map[string]int)["x"] = 1 << 20 }, want: ErrMalformed},
		{name: "duplicate id", mutate: func(d map[string]any) { d["model"].(map[string]any)["vocab"].(map[string]int)["x"] = 3 }, want: ErrMalformed},
		{name: "fractional id", raw: `{"model": {"type": "BPE", "vocab": {"a": 1.5}, "merges": []}}`, want: ErrMalformed},
		{name: "added token without id", mutate: func(d map[string]any) {
			d["added_tokens"] = []any{map[string]any{"content": "x"}}
		}, want: ErrMalformed},
		{name: "unknown unk", mutate: func(d map[string]any) { d["model"].(map[string]any)["unk_token"] = "<unk>" }, want: ErrMalformed},
		{name: "empty vocab", raw: `{"model": {"type": "BPE", "vocab": {}, "merges": []}, "pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"}}`, want: ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := []byte(tt.raw)
			if tt.mutate != nil {
				d := hfDoc(false)
				tt.mutate(d)
				data = mustJSON(t, d)
			}
			_, err := ParseHF(data)
			require.ErrorIs(t, err, tt.want)
		})
	}
}

func TestHFUnk(t *testing.T) {
	doc := hfDoc(false)
	m := doc["model"].(map[string]any)
	m["vocab"].(map[string]int)["<unk>"] = 19
	m["unk_token"] = "<unk>"
	m["fuse_unk"] = true
	tok, err := ParseHF(mustJSON(t, doc))
	require.NoError(t, err)
	got, err := tok.Encode("he!!")
	require.NoError(t, err)
	assert.Equal(t, []int{8, 19}, got)
}

func TestHFTokenizerConfigAndLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tokenizer.json")
	require.NoError(t, os.WriteFile(path, mustJSON(t, hfDoc(false)), 0o600))
	tok, err := LoadHF(path)
	require.NoError(t, err)
	assert.Equal(t, []int{-1, 18, -1}, []int{tok.BOS(), tok.EOS(), tok.PAD()})

	cfg := `{"bos_token": {"content": "<|end|>"}, "eos_token": "</s>", "pad_token": null}`
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(cfg), 0o600))
	tok, err = LoadHF(path)
	require.NoError(t, err)
	assert.Equal(t, []int{17, 18, -1}, []int{tok.BOS(), tok.EOS(), tok.PAD()})
	assert.True(t, tok.IsControl(17))

	loaded, err := Load(dir, 0)
	require.NoError(t, err)
	assert.Equal(t, KindHF, loaded.Kind())
	_, err = Load(path, 10)
	require.ErrorIs(t, err, ErrVocabSize)

	w, err := tok.WithSpecials(-1, 11, 0)
	require.NoError(t, err)
	assert.Equal(t, []int{-1, 11, 0}, []int{w.BOS(), w.EOS(), w.PAD()})
	assert.Equal(t, 17, tok.BOS(), "WithSpecials leaves the original alone")
	_, err = tok.WithSpecials(99, 1, 1)
	require.ErrorIs(t, err, ErrInvalidID)

	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{"eos_token": "nope"}`), 0o600))
	_, err = LoadHF(path)
	require.ErrorIs(t, err, ErrMalformed)
}

func TestHFMergeNeverProducesControl(t *testing.T) {
	doc := hfDoc(false)
	m := doc["model"].(map[string]any)
	// Make "hello" (reachable by merges) the EOS.
	tok, err := ParseHF(mustJSON(t, doc))
	require.NoError(t, err)
	tok, err = tok.WithSpecials(-1, 11, -1)
	require.NoError(t, err)
	got, err := tok.Encode("hello")
	require.NoError(t, err)
	assert.Equal(t, []int{8, 10}, got)
	m["ignore_merges"] = true
	tok, err = ParseHF(mustJSON(t, doc))
	require.NoError(t, err)
	got, err = tok.Encode("hello")
	require.NoError(t, err)
	assert.Equal(t, []int{11}, got, "ignore_merges takes the whole word")
	tok, err = tok.WithSpecials(-1, 11, -1)
	require.NoError(t, err)
	got, err = tok.Encode("hello")
	require.NoError(t, err)
	assert.Equal(t, []int{8, 10}, got)
}

func TestLoadSniffsFormat(t *testing.T) {
	dir := t.TempDir()
	p, s := handVocab(handPieces...)
	bin := llamaBin(t, p, s)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "vocab"), bin, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tok"), append([]byte(" \n"), mustJSON(t, hfDoc(true))...), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokenizer.bin"), bin, 0o600))
	tok, err := Load(filepath.Join(dir, "vocab"), len(p))
	require.NoError(t, err)
	assert.Equal(t, KindLlama2C, tok.Kind())
	tok, err = Load(filepath.Join(dir, "tok"), 0)
	require.NoError(t, err)
	assert.Equal(t, KindHF, tok.Kind())
	tok, err = Load(dir, len(p))
	require.NoError(t, err)
	assert.Equal(t, KindLlama2C, tok.Kind())
	_, err = Load(filepath.Join(dir, "missing"), 0)
	require.ErrorIs(t, err, os.ErrNotExist)
	_, err = Load(t.TempDir(), 0)
	require.ErrorIs(t, err, os.ErrNotExist)
}

// TestHFEncodeProtected: special tokens inside a protected range are encoded as text; outside
// it they stay special.
func TestHFEncodeProtected(t *testing.T) {
	doc := hfDoc(false)
	vocab := doc["model"].(map[string]any)["vocab"].(map[string]int)
	for i, p := range []string{"<", "|", "n", ">"} {
		vocab[p] = 19 + i
	}
	tok, err := ParseHF(mustJSON(t, doc))
	require.NoError(t, err)
	text := "hello<|end|> world<|end|>"
	all, err := tok.Encode(text)
	require.NoError(t, err)
	assert.Equal(t, 2, countID(all, 17))
	// Protect the first "<|end|>" (bytes 5..12): only the second stays special.
	got, err := tok.EncodeProtected(text, [][2]int{{0, 12}})
	require.NoError(t, err)
	assert.Equal(t, 1, countID(got, 17))
	assert.Equal(t, 17, got[len(got)-1])
	dec, err := tok.Decode(got)
	require.NoError(t, err)
	assert.Equal(t, text, dec, "the protected token's text survives as text")
	// A range touching only part of a special token protects it too.
	got, err = tok.EncodeProtected(text, [][2]int{{8, 9}})
	require.NoError(t, err)
	assert.Equal(t, 1, countID(got, 17))
	none, err := tok.EncodeProtected(text, nil)
	require.NoError(t, err)
	assert.Equal(t, all, none)
}

func countID(ids []int, id int) int {
	n := 0
	for _, x := range ids {
		if x == id {
			n++
		}
	}
	return n
}
