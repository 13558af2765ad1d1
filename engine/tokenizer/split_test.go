package tokenizer

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// splitTexts are inputs where the Llama-3-family patterns are easy to get wrong.
var splitTexts = []string{
	"", "Hello world", "DON'T", "don't", "'S", "'s", "I'M WE'RE THEY'VE YOU'LL HE'D", "we'Re they'vE",
	"'ll", "''s", "'x", "!'s", "'sx", "'\u017fx", " 's", "1234567", "12 345", "\u0663\u0664\u0665\u0666",
	"\u216b\u00b2\u00b3", "h\u00e9llo\u4e16\u754c123", "\r\n\n  x", "x   ", "x  \ny", "\t\tx\t", "\r", "a\rb",
	"a\r\rb", "\n", "   ", "  \n  ", "x\n\ty", "hi \U0001F44B\U0001F3FD there", "!!!\n\n", " !!!\nx", " ...",
	"...\r\n\r\nx", "foo.bar", "$100", "\xffab\xfe", "a\xff", " \xff", "\xff\n", "a\u00a0b", "\u3000x",
	"x \u3000 y", "e\u0301x", "\u01c5ungla", " \u0301", "\u00a0\u00a0x", "\u2028x", "x\u0085\u0085y",
	"a  b", "a \n b", "\t!", " !a", "!a", "\u00bfQu\u00e9?", "(x)", "x\r\n", "  \r\n  x", "\v\fx",
	"they'rex", "a'LLama b'VEry c'Dog d'Mx e'tx f'Sx", "'rE're'",
}

// compiled caches the regexp2 form of the patterns, compiled once for the fuzz targets.
var compiled sync.Map

// regexpPieces is st's regexp2 path, as the fallback for unrecognised patterns runs it.
func regexpPieces(t testing.TB, pattern, s string) []string {
	re, ok := compiled.Load(pattern)
	if !ok {
		re, _ = compiled.LoadOrStore(pattern, regexp2.MustCompile(pattern))
	}
	st := &splitStep{kind: matchRegex, re: re.(*regexp2.Regexp), pattern: pattern}
	got, _, err := st.split(nil, s, nil)
	require.NoError(t, err)
	return got
}

// patternGPT2 is GPT-2's pattern, which splitGPT2 implements.
const patternGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

func TestSplitLlama3AgreesWithRegexp2(t *testing.T) {
	for _, s := range splitTexts {
		assert.Equal(t, regexpPieces(t, patternGPT2, s), splitGPT2(nil, s), "%q", s)
		assert.Equal(t, regexpPieces(t, patternLlama3, s), splitLlama3(nil, s), "%q", s)
		assert.Equal(t, regexpPieces(t, patternQwen2, s), splitQwen2(nil, s), "%q", s)
	}
}

func TestSplitLlama3Pieces(t *testing.T) {
	// Checked against Oniguruma 6.9.8, the engine of Hugging Face tokenizers.
	tests := []struct {
		in           string
		llama3, qwen []string
	}{
		{"DON'T", []string{"DON", "'T"}, nil},
		{"'\u017fx", []string{"'\u017f", "x"}, nil},
		{"1234567", []string{"123", "456", "7"}, []string{"1", "2", "3", "4", "5", "6", "7"}},
		{"h\u00e9llo\u4e16\u754c123", []string{"h\u00e9llo\u4e16\u754c", "123"}, []string{"h\u00e9llo\u4e16\u754c", "1", "2", "3"}},
		{"\r\n\n  x", []string{"\r\n\n", " ", " x"}, nil},
		{"x   ", []string{"x", "   "}, nil},
		{"\t\tx\t", []string{"\t", "\tx", "\t"}, nil},
		{"!!!\n\nx", []string{"!!!\n\n", "x"}, nil},
		{" !!!\nx", []string{" !!!\n", "x"}, nil},
		{"a \n b", []string{"a", " \n", " b"}, nil},
		{"e\u0301x", []string{"e", "\u0301x"}, nil},
		{"hi \U0001F44B\U0001F3FD", []string{"hi", " \U0001F44B\U0001F3FD"}, nil},
		{"$100", []string{"$", "100"}, []string{"$", "1", "0", "0"}},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.llama3, splitLlama3(nil, tt.in), "%q", tt.in)
		want := tt.qwen
		if want == nil {
			want = tt.llama3
		}
		assert.Equal(t, want, splitQwen2(nil, tt.in), "%q", tt.in)
	}
}

// checkSplitAgrees fails unless split and regexp2 running pattern give the same pieces, which
// concatenate back to s.
func checkSplitAgrees(t *testing.T, pattern string, split func([]string, string) []string, s string) {
	got := split(nil, s)
	if strings.Join(got, "") != s {
		t.Fatalf("pieces %q do not concatenate to %q", got, s)
	}
	for _, p := range got {
		if p == "" {
			t.Fatalf("empty piece in %q", got)
		}
	}
	if want := regexpPieces(t, pattern, s); !slices.Equal(got, want) {
		t.Fatalf("%q: hand-written %q, regexp2 %q", s, got, want)
	}
}

func FuzzSplitLlama3(f *testing.F) {
	for _, s := range splitTexts {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { checkSplitAgrees(t, patternLlama3, splitLlama3, s) })
}

func FuzzSplitQwen2(f *testing.F) {
	for _, s := range splitTexts {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { checkSplitAgrees(t, patternQwen2, splitQwen2, s) })
}

func FuzzSplitGPT2(f *testing.F) {
	for _, s := range splitTexts {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { checkSplitAgrees(t, patternGPT2, splitGPT2, s) })
}

// TestSplitClassesMatchRegexp2 checks, for every code point, that the classes the
// hand-written splitters use are regexp2's \s, \p{L} and \p{N}.
func TestSplitClassesMatchRegexp2(t *testing.T) {
	if testing.Short() {
		t.Skip("scans every code point")
	}
	res := []*regexp2.Regexp{regexp2.MustCompile(`^\s$`), regexp2.MustCompile(`^\p{L}$`), regexp2.MustCompile(`^\p{N}$`)}
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if !utf8.ValidRune(r) {
			continue
		}
		c, _ := classAt(string(r), 0)
		for i, want := range []int{classSpace, classLetter, classNumber} {
			m, err := res[i].MatchString(string(r))
			require.NoError(t, err)
			if m != (c == want) {
				t.Fatalf("%U: class %d, regexp2 %s %v", r, c, res[i], m)
			}
		}
	}
}

func TestSplitBehaviors(t *testing.T) {
	// The examples of Hugging Face's Split documentation, with a String and a Regex pattern.
	dash, regex := "-", "-"
	tests := []struct {
		behavior string
		invert   bool
		want     []string
	}{
		{"Removed", false, []string{"the", "final", "countdown"}},
		{"Isolated", false, []string{"the", "-", "final", "-", "-", "countdown"}},
		{"MergedWithPrevious", false, []string{"the-", "final-", "-", "countdown"}},
		{"MergedWithNext", false, []string{"the", "-final", "-", "-countdown"}},
		{"Contiguous", false, []string{"the", "-", "final", "--", "countdown"}},
		{"Removed", true, []string{"-", "-", "-"}},
		{"Isolated", true, []string{"the", "-", "final", "-", "-", "countdown"}},
		{"MergedWithPrevious", true, []string{"the", "-final", "-", "-countdown"}},
		{"MergedWithNext", true, []string{"the-", "final-", "-", "countdown"}},
	}
	for _, tt := range tests {
		for _, pat := range []struct{ re, lit *string }{{nil, &dash}, {&regex, nil}} {
			st, err := newSplitStep(pat.re, pat.lit, tt.behavior, tt.invert)
			require.NoError(t, err)
			got, _, err := st.split(nil, "the-final--countdown", nil)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got, "%s invert=%v regex=%v", tt.behavior, tt.invert, pat.re != nil)
		}
	}
	// The hand-written splitters feed the other behaviors like regexp2 does.
	for _, b := range []string{"Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"} {
		for _, invert := range []bool{false, true} {
			for _, pattern := range []string{patternLlama3, patternQwen2} {
				st, err := newSplitStep(&pattern, nil, b, invert)
				require.NoError(t, err)
				require.NotEqual(t, matchRegex, st.kind)
				slow := &splitStep{kind: matchRegex, re: regexp2.MustCompile(pattern), behavior: st.behavior, invert: invert}
				for _, s := range splitTexts {
					want, _, err := slow.split(nil, s, nil)
					require.NoError(t, err)
					got, _, err := st.split(nil, s, nil)
					require.NoError(t, err)
					assert.Equal(t, want, got, "%s invert=%v %q", b, invert, s)
				}
			}
		}
	}
	// ^ matches after every line break in Oniguruma.
	anchor := `^ +`
	st, err := newSplitStep(&anchor, nil, "Removed", false)
	require.NoError(t, err)
	got, _, err := st.split(nil, "a\n  b\n c", nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"a\n", "b\n", "c"}, got)
	// An empty String pattern matches everywhere, so every character is a piece.
	empty := ""
	st, err = newSplitStep(nil, &empty, "Isolated", false)
	require.NoError(t, err)
	got, _, err = st.split(nil, "ab\u00e9", nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b", "\u00e9"}, got)
}

func TestSplitStepRejects(t *testing.T) {
	re, bad := `\s+`, `a++b(`
	_, err := newSplitStep(&re, nil, "Fused", false)
	require.ErrorIs(t, err, ErrUnsupported)
	assert.Contains(t, err.Error(), `"Fused"`)
	_, err = newSplitStep(&bad, nil, "Isolated", false)
	require.ErrorIs(t, err, ErrUnsupported)
	for _, p := range []string{`[[:alpha:]]+`, `[a[b]]`, `[a-z&&[^c]]`, `a{,2}`, `\pL+`, `\X`, `(?m:.)`, `(?s).`, `(?im-x)a`} {
		_, err = newSplitStep(&p, nil, "Isolated", false)
		require.ErrorIs(t, err, ErrUnsupported, p)
		assert.Contains(t, err.Error(), "outside Oniguruma", p)
	}
	for _, p := range []string{`[\[\]]`, `[]a]`, `[^]a]`, `(?i:ab)`, `(?x) a`, `(?<n>a)\k<n>`, `(?<=a)b`, `a{2,}`, `\p{L}`, `^a$`} {
		assert.Empty(t, onigOnly(p), p)
	}
	_, err = newSplitStep(&re, &re, "Isolated", false)
	require.ErrorIs(t, err, ErrMalformed)
	_, err = newSplitStep(nil, nil, "Isolated", false)
	require.ErrorIs(t, err, ErrMalformed)
}

func BenchmarkSplit(b *testing.B) {
	text := strings.Repeat(corpus, 4)
	for _, c := range []struct {
		name  string
		split func([]string, string) []string
	}{
		{"gpt2", splitGPT2},
		{"llama3", splitLlama3},
		{"qwen2", splitQwen2},
		{"regexp2-llama3", func(dst []string, s string) []string {
			st := &splitStep{kind: matchRegex, re: regexp2.MustCompile(patternLlama3)}
			dst, _, _ = st.split(dst, s, nil)
			return dst
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			var dst []string
			for b.Loop() {
				dst = c.split(dst[:0], text)
			}
		})
	}
}

// BenchmarkEncodeLayouts encodes with the synthetic 32000 vocabulary under the GPT-2,
// Llama-3 and Qwen2 (+NFC) pre-tokenizers.
func BenchmarkEncodeLayouts(b *testing.B) {
	st, err := Synthetic(32000)
	if err != nil {
		b.Fatal(err)
	}
	var buf bytes.Buffer
	if err := st.WriteHF(&buf); err != nil {
		b.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		b.Fatal(err)
	}
	text := strings.Repeat(corpus, 4)
	for _, c := range []struct {
		name       string
		normalizer any
		pre        any
	}{
		{"gpt2", nil, doc["pre_tokenizer"]},
		{"llama3", nil, splitThenByteLevel(patternLlama3)},
		{"qwen2-nfc", map[string]any{"type": "NFC"}, splitThenByteLevel(patternQwen2)},
	} {
		doc["normalizer"], doc["pre_tokenizer"] = c.normalizer, c.pre
		tok, err := ParseHF(mustJSON(b, doc))
		if err != nil {
			b.Fatal(err)
		}
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				if _, err := tok.Encode(text); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
