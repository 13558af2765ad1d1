package tokenizer

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/text/unicode/norm"
)

// layoutMerges are the merges of the synthetic byte-level vocabularies below, in plain text
// (converted to byte-level form by byteLevelDoc).
var layoutMerges = [][2]string{
	{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"}, {"o", "r"}, {" w", "or"}, {"l", "d"},
	{" wor", "ld"}, {"1", "2"}, {"12", "3"}, {"'", "T"}, {"D", "O"}, {"DO", "N"}, {"\n", "\n"},
	{"\xc3", "\xa9"}, {"c", "a"},
}

// byteLevelDoc builds a tokenizer.json with every byte as a piece (ids 0..255), layoutMerges,
// and the given added tokens (ids after the vocabulary), normalizer and pre-tokenizer.
func byteLevelDoc(normalizer, preTokenizer any, added ...string) (map[string]any, map[string]int) {
	vocab := map[string]int{}
	for b := range 256 {
		vocab[gpt2.encode([]byte{byte(b)})] = b
	}
	var merges []any
	for _, m := range layoutMerges {
		a, b := gpt2.encode([]byte(m[0])), gpt2.encode([]byte(m[1]))
		if _, ok := vocab[a+b]; !ok {
			vocab[a+b] = len(vocab)
		}
		merges = append(merges, a+" "+b)
	}
	ids := map[string]int{}
	var addedTokens []any
	for i, a := range added {
		ids[a] = len(vocab) + i
		addedTokens = append(addedTokens, map[string]any{"id": len(vocab) + i, "content": a, "special": true,
			"normalized": false, "lstrip": false, "rstrip": false, "single_word": false})
	}
	return map[string]any{
		"version":        "1.0",
		"added_tokens":   addedTokens,
		"normalizer":     normalizer,
		"pre_tokenizer":  preTokenizer,
		"post_processor": nil,
		"decoder":        map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
			"vocab": vocab, "merges": merges},
	}, ids
}

// splitThenByteLevel is the pre_tokenizer of Llama-3 and Qwen2 with the given Split pattern.
func splitThenByteLevel(pattern string) map[string]any {
	return map[string]any{"type": "Sequence", "pretokenizers": []any{
		map[string]any{"type": "Split", "pattern": map[string]any{"Regex": pattern}, "behavior": "Isolated", "invert": false},
		map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
	}}
}

// want spells expected ids: a string is a piece in plain text (looked up in byte-level
// form), an int an id.
func want(t *testing.T, tok *HF, parts ...any) []int {
	t.Helper()
	var ids []int
	for _, p := range parts {
		switch p := p.(type) {
		case int:
			ids = append(ids, p)
		case string:
			id, ok := tok.vocab[gpt2.encode([]byte(p))]
			require.True(t, ok, "piece %q", p)
			ids = append(ids, id)
		}
	}
	return ids
}

func TestHFLlama3Layout(t *testing.T) {
	doc, added := byteLevelDoc(nil, splitThenByteLevel(patternLlama3),
		"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
	doc["decoder"] = map[string]any{"type": "Sequence", "decoders": []any{doc["decoder"]}}
	path := filepath.Join(t.TempDir(), "tokenizer.json")
	require.NoError(t, os.WriteFile(path, mustJSON(t, doc), 0o600))
	tok, err := LoadHF(path)
	require.NoError(t, err)
	require.Len(t, tok.splits, 1)
	assert.Equal(t, matchLlama3, tok.splits[0].kind, "the Llama-3 pattern is recognised")
	assert.Equal(t, added["<|begin_of_text|>"], tok.BOS())
	assert.Equal(t, added["<|end_of_text|>"], tok.EOS())

	sh, eh, eot := added["<|start_header_id|>"], added["<|end_header_id|>"], added["<|eot_id|>"]
	tests := []struct {
		text string
		want []int
	}{
		{"hello world", want(t, tok, "hello", " world")},
		{"DON'T", want(t, tok, "DON", "'T")}, // GPT-2's split would give "DON", "'", "T"
		{"1234567", want(t, tok, "123", "4", "5", "6", "7")},
		{"hello\n\n world", want(t, tok, "hello", "\n\n", " world")},
		{"<|start_header_id|>user<|end_header_id|>\n\nhello<|eot_id|>",
			want(t, tok, sh, "u", "s", "e", "r", eh, "\n\n", "hello", eot)},
		{"caf\u00e9", want(t, tok, "ca", "f", "\u00e9")},
	}
	for _, tt := range tests {
		got, err := tok.Encode(tt.text)
		require.NoError(t, err)
		assert.Equal(t, tt.want, got, "%q", tt.text)
	}
	assertRoundTrips(t, tok, append(roundTripTexts, splitTexts...))

	// BOS is a control token, so its spelling in text is text; once it is not the BOS, it is
	// matched as a whole token like the other specials.
	ids, err := tok.Encode("<|begin_of_text|>hello")
	require.NoError(t, err)
	assert.NotContains(t, ids, tok.BOS())
	plain, err := tok.WithSpecials(-1, tok.EOS(), -1)
	require.NoError(t, err)
	ids, err = plain.Encode("<|begin_of_text|>hello")
	require.NoError(t, err)
	assert.Equal(t, want(t, tok, added["<|begin_of_text|>"], "hello"), ids)
}

func TestHFQwen2Layout(t *testing.T) {
	doc, added := byteLevelDoc(map[string]any{"type": "NFC"}, splitThenByteLevel(patternQwen2),
		"<|endoftext|>", "<|im_start|>", "<|im_end|>")
	// Normalized added tokens are matched after NFC, by their normalized content (OHM SIGN
	// is NFC GREEK CAPITAL LETTER OMEGA).
	nv := len(doc["model"].(map[string]any)["vocab"].(map[string]int)) + len(added)
	omega, sdots := nv, nv+1
	doc["added_tokens"] = append(doc["added_tokens"].([]any),
		map[string]any{"id": omega, "content": "\u2126", "special": false, "normalized": true},
		map[string]any{"id": sdots, "content": "\u1e69", "special": false, "normalized": true})
	tok, err := ParseHF(mustJSON(t, doc))
	require.NoError(t, err)
	assert.Equal(t, matchQwen2, tok.splits[0].kind)
	assert.Equal(t, []norm.Form{norm.NFC}, tok.norms)

	ims, ime := added["<|im_start|>"], added["<|im_end|>"]
	tests := []struct {
		text string
		want []int
	}{
		{"1234567", want(t, tok, "1", "2", "3", "4", "5", "6", "7")}, // the "123" merges never apply
		{"DON'T", want(t, tok, "DON", "'T")},
		{"<|im_start|>user\nhello world<|im_end|>", want(t, tok, ims, "u", "s", "e", "r", "\n", "hello", " world", ime)},
		{"cafe\u0301", want(t, tok, "ca", "f", "\u00e9")}, // NFC composes e + U+0301
		{"\u03a9!", want(t, tok, omega, "!")},
		{"s\u0307\u0323", want(t, tok, sdots)},             // reordered and composed to U+1E69
		{"e\u0301<|im_end|>", want(t, tok, "\u00e9", ime)}, // normalization stops at specials
		{"<|im_start|>\u2126", want(t, tok, ims, omega)},   // both passes in one text
	}
	for _, tt := range tests {
		got, err := tok.Encode(tt.text)
		require.NoError(t, err)
		assert.Equal(t, tt.want, got, "%q", tt.text)
	}
	for _, s := range append(roundTripTexts, append(splitTexts, "cafe\u0301", "\u212b", "\u1e9b\u0323")...) {
		ids, err := tok.Encode(s)
		require.NoError(t, err)
		dec, err := tok.Decode(ids)
		require.NoError(t, err)
		assert.Equal(t, norm.NFC.String(s), dec, "%q", s)
	}
}

func TestHFSplitVariants(t *testing.T) {
	seq := func(steps ...any) map[string]any { return map[string]any{"type": "Sequence", "pretokenizers": steps} }
	split := func(pattern map[string]any, behavior string, invert bool) map[string]any {
		return map[string]any{"type": "Split", "pattern": pattern, "behavior": behavior, "invert": invert}
	}
	bl := map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}
	tests := []struct {
		name string
		pre  any
		text string
		want []any
	}{
		// An unrecognised pattern runs on regexp2 (here: digits in threes, like DeepSeek's
		// first step), and steps apply in order.
		{"regexp2 steps", seq(split(map[string]any{"Regex": `\p{N}{1,3}`}, "Isolated", false),
			split(map[string]any{"Regex": `\s+(?!\S)|\s+|\S+`}, "Isolated", false), bl),
			"hello 1234567", []any{"hello", " ", "123", "4", "5", "6", "7"}},
		{"string removed", seq(split(map[string]any{"String": " "}, "Removed", false), bl),
			"hello world", []any{"hello", "w", "or", "ld"}},
		{"inverted", seq(split(map[string]any{"Regex": `\d+`}, "MergedWithNext", true), bl),
			"hello123 world", []any{"hello", "123", " world"}},
		{"with GPT-2 regex after", seq(split(map[string]any{"String": "|"}, "Removed", false),
			map[string]any{"type": "ByteLevel", "add_prefix_space": true, "use_regex": true}),
			"hello|world", []any{" ", "hello", " world"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc, _ := byteLevelDoc(nil, tt.pre)
			tok, err := ParseHF(mustJSON(t, doc))
			require.NoError(t, err)
			got, err := tok.Encode(tt.text)
			require.NoError(t, err)
			assert.Equal(t, want(t, tok, tt.want...), got)
		})
	}
}

func TestHFDeepSeekV3Layout(t *testing.T) {
	// DeepSeek-V3's pre-tokenizer: three Splits on regexp2, then ByteLevel; an empty
	// normalizer Sequence.
	pre := map[string]any{"type": "Sequence", "pretokenizers": []any{
		map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `\p{N}{1,3}`}, "behavior": "Isolated", "invert": false},
		map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"},
			"behavior": "Isolated", "invert": false},
		map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|" +
			"[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"},
			"behavior": "Isolated", "invert": false},
		map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
	}}
	doc, _ := byteLevelDoc(map[string]any{"type": "Sequence", "normalizers": []any{}}, pre, "<\uff5cbegin\u2581of\u2581sentence\uff5c>")
	tok, err := ParseHF(mustJSON(t, doc))
	require.NoError(t, err)
	require.Len(t, tok.splits, 3)
	assert.Empty(t, tok.norms)
	got, err := tok.Encode("hello 1234567 .hello")
	require.NoError(t, err)
	assert.Equal(t, want(t, tok, "hello", " ", "123", "4", "5", "6", "7", " ", ".", "hello"), got)
	assertRoundTrips(t, tok, append(roundTripTexts, splitTexts...))
}

func TestHFRejectsLayouts(t *testing.T) {
	bl := map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}
	llama := map[string]any{"type": "Split", "pattern": map[string]any{"Regex": patternLlama3}, "behavior": "Isolated"}
	seq := func(steps ...any) map[string]any { return map[string]any{"type": "Sequence", "pretokenizers": steps} }
	tests := []struct {
		name       string
		normalizer any
		pre        any
		decoder    any
		want       error
		msg        string
	}{
		{name: "unknown behavior", pre: seq(map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `\s`},
			"behavior": "Fused"}, bl), want: ErrUnsupported, msg: `Split behavior "Fused"`},
		{name: "regex regexp2 cannot compile", pre: seq(map[string]any{"type": "Split",
			"pattern": map[string]any{"Regex": `a++(`}, "behavior": "Isolated"}, bl), want: ErrUnsupported, msg: "Split regex"},
		{name: "Split after ByteLevel", pre: seq(bl, llama), want: ErrUnsupported, msg: "step 1 of 2"},
		{name: "Split alone", pre: seq(llama), want: ErrUnsupported, msg: "step 1 of 1"},
		{name: "Digits", pre: seq(map[string]any{"type": "Digits", "individual_digits": true}, bl),
			want: ErrUnsupported, msg: `"Digits"`},
		{name: "Split pattern not an object", pre: seq(map[string]any{"type": "Split", "pattern": "x", "behavior": "Isolated"}, bl),
			want: ErrMalformed},
		{name: "Lowercase normalizer", normalizer: map[string]any{"type": "Lowercase"}, want: ErrUnsupported, msg: `"Lowercase"`},
		{name: "normalizer Sequence with Replace", normalizer: map[string]any{"type": "Sequence", "normalizers": []any{
			map[string]any{"type": "NFC"}, map[string]any{"type": "Replace"}}}, want: ErrUnsupported, msg: `"Replace"`},
		{name: "normalizer not an object", normalizer: "NFC", want: ErrMalformed},
		{name: "decoder Sequence of two", decoder: map[string]any{"type": "Sequence", "decoders": []any{
			map[string]any{"type": "ByteLevel"}, map[string]any{"type": "Strip"}}}, want: ErrUnsupported},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pre := tt.pre
			if pre == nil {
				pre = seq(llama, bl)
			}
			doc, _ := byteLevelDoc(tt.normalizer, pre)
			if tt.decoder != nil {
				doc["decoder"] = tt.decoder
			}
			_, err := ParseHF(mustJSON(t, doc))
			require.ErrorIs(t, err, tt.want)
			assert.Contains(t, err.Error(), tt.msg)
		})
	}
	// And the accepted normalizers.
	for _, n := range []any{nil, map[string]any{"type": "NFKD"}, map[string]any{"type": "Sequence", "normalizers": []any{
		map[string]any{"type": "NFD"}, map[string]any{"type": "Sequence", "normalizers": []any{map[string]any{"type": "NFKC"}}}}}} {
		doc, _ := byteLevelDoc(n, seq(llama, bl))
		_, err := ParseHF(mustJSON(t, doc))
		require.NoError(t, err)
	}
}

// assertRoundTrips checks Decode(Encode(s)) == s for every text.
func assertRoundTrips(t *testing.T, tok *HF, texts []string) {
	t.Helper()
	for _, s := range texts {
		ids, err := tok.Encode(s)
		require.NoError(t, err)
		dec, err := tok.Decode(ids)
		require.NoError(t, err)
		assert.Equal(t, s, dec)
	}
}
