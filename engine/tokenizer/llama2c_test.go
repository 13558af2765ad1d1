package tokenizer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type testPiece struct {
	s     string
	score float32
}

// handVocab is a llama2.c vocabulary: the sentencepiece prefix (unk, BOS, EOS, 256 byte
// pieces) and then the given pieces from id 259.
func handVocab(extra ...testPiece) ([]string, []float32) {
	pieces := []string{"<unk>", "\n<s>\n", "\n</s>\n"}
	scores := []float32{0, 0, 0}
	for b := range 256 {
		pieces = append(pieces, fmt.Sprintf("<0x%02X>", b))
		scores = append(scores, 0)
	}
	for _, p := range extra {
		pieces = append(pieces, p.s)
		scores = append(scores, p.score)
	}
	return pieces, scores
}

func llamaBin(t testing.TB, pieces []string, scores []float32) []byte {
	var buf bytes.Buffer
	_, err := writeLlama2CPieces(&buf, pieces, scores)
	require.NoError(t, err)
	return buf.Bytes()
}

// The hand vocabulary used by the run.c behaviour tests.
var handPieces = []testPiece{
	{" ", 0},      // 259
	{"a", 0},      // 260
	{"b", 0},      // 261
	{"c", 0},      // 262
	{"ab", -1},    // 263
	{"bc", -0.5},  // 264
	{" a", -2},    // 265
	{"abc", -3},   // 266
	{" ab", -4},   // 267
	{"aa", -1},    // 268
	{"ü", -9},     // 269
	{"ca", -1e10}, // 270: at run.c's -1e10 floor, never merged
	{" c", -1e-3}, // 271
	{"\xffb", -1}, // 272: never formed, <0xFF> is spelled as a byte piece
}

func handTokenizer(t testing.TB) *Llama2C {
	p, s := handVocab(handPieces...)
	tok, err := ParseLlama2C(llamaBin(t, p, s), len(p))
	require.NoError(t, err)
	return tok
}

func TestLlama2CEncodeRunC(t *testing.T) {
	tok := handTokenizer(t)
	tests := []struct {
		text string
		want []int
	}{
		{"", []int{}},
		// " a b c": bc (-0.5) beats ab (-1) and " a" (-2); then " a" (-2) beats abc (-3).
		{"abc", []int{265, 264}},
		// ab (-1) beats " a" (-2), then " ab".
		{"ab", []int{267}},
		// Two aa pairs with equal score: the leftmost merges first.
		{"aaa", []int{259, 268, 260}},
		{"ü", []int{259, 269}},
		// é is not a piece: its two bytes through <0xC3><0xA9>.
		{"é", []int{259, 0xC3 + 3, 0xA9 + 3}},
		// "ca" scores exactly -1e10: never merged.
		{"ca", []int{271, 260}},
		{"c", []int{271}},
		{"\xff", []int{259, 258}},
		{"\xffb", []int{259, 258, 261}},
		// Five continuation bytes: run.c groups the first four, then the fifth.
		{"\x80\x80\x80\x80\x80", []int{259, 131, 131, 131, 131, 131}},
		{"<s>", []int{259, '<' + 3, 's' + 3, '>' + 3}},
	}
	for _, tt := range tests {
		got, err := tok.Encode(tt.text)
		require.NoError(t, err, "%q", tt.text)
		assert.Equal(t, tt.want, got, "%q", tt.text)
		assert.Equal(t, tt.want, runCEncode(tok, tt.text), "%q: reference port", tt.text)
	}
}

// runCEncode is a literal port of llama2.c run.c encode() (bos=0, eos=0), quadratic merge
// loop and all, to check the heap-based Encode against.
func runCEncode(t *Llama2C, text string) []int {
	lookup := func(s string) int {
		if id, ok := t.lookup[s]; ok {
			return id
		}
		return -1
	}
	tokens := []int{}
	if text != "" {
		if d := lookup(" "); d != -1 {
			tokens = append(tokens, d)
		}
	}
	var buf []byte
	for i := 0; i < len(text); i++ {
		c := text[i]
		if c&0xC0 != 0x80 {
			buf = buf[:0]
		}
		buf = append(buf, c)
		if i+1 < len(text) && text[i+1]&0xC0 == 0x80 && len(buf) < 4 {
			continue
		}
		if id := lookup(string(buf)); id != -1 {
			tokens = append(tokens, id)
		} else {
			for _, b := range buf {
				tokens = append(tokens, int(b)+3)
			}
		}
		buf = buf[:0]
	}
	for {
		best, bestID, bestIdx := float32(-1e10), -1, -1
		for i := 0; i < len(tokens)-1; i++ {
			id := lookup(t.pieces[tokens[i]] + t.pieces[tokens[i+1]])
			if id != -1 && t.scores[id] > best {
				best, bestID, bestIdx = t.scores[id], id, i
			}
		}
		if bestIdx == -1 {
			break
		}
		tokens[bestIdx] = bestID
		tokens = append(tokens[:bestIdx+1], tokens[bestIdx+2:]...)
	}
	return tokens
}

func TestLlama2CEncodeMatchesRunCPort(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "b", "c", " ", "ü", "é", "\x80", "\xff", "ab"}
	// A random vocabulary of concatenations over the alphabet with random (often equal) scores.
	var extra []testPiece
	seen := map[string]bool{}
	for _, s := range []string{" ", "a", "b", "c", "ü"} {
		extra = append(extra, testPiece{s, 0})
		seen[s] = true
	}
	for len(extra) < 60 {
		n := 2 + rng.IntN(4)
		s := ""
		for range n {
			s += alphabet[rng.IntN(5)]
		}
		if !seen[s] {
			seen[s] = true
			extra = append(extra, testPiece{s, -float32(rng.IntN(6))})
		}
	}
	p, sc := handVocab(extra...)
	tok := newLlama2C(p, sc)
	for range 2000 {
		s := ""
		for range rng.IntN(30) {
			s += alphabet[rng.IntN(len(alphabet))]
		}
		got, err := tok.Encode(s)
		require.NoError(t, err)
		require.Equal(t, runCEncode(tok, s), got, "%q", s)
		dec, err := tok.Decode(got)
		require.NoError(t, err)
		if s != "" {
			s = " " + s
		}
		require.Equal(t, s, dec)
	}
}

func TestLlama2CDecode(t *testing.T) {
	tok := handTokenizer(t)
	tests := []struct {
		ids  []int
		want string
	}{
		{[]int{265, 264}, " abc"},
		{[]int{1, 265, 264}, "abc"},      // a space right after BOS is stripped
		{[]int{1, ' ' + 3, 260}, " a"},   // but not from a <0x20> byte piece
		{[]int{265, 1, 265, 2}, " aa"},   // BOS/EOS render as nothing
		{[]int{0xC3 + 3, 0xA9 + 3}, "é"}, // byte pieces
		{[]int{0, 259}, "<unk> "},        // unk is not a control token
		{[]int{}, ""},
	}
	for _, tt := range tests {
		got, err := tok.Decode(tt.ids)
		require.NoError(t, err)
		assert.Equal(t, tt.want, got, "%v", tt.ids)
	}
	_, err := tok.Decode([]int{259, tok.VocabSize()})
	require.ErrorIs(t, err, ErrInvalidID)
	_, err = tok.Decode([]int{-1})
	require.ErrorIs(t, err, ErrInvalidID)
	assert.Equal(t, []int{1, 2, -1}, []int{tok.BOS(), tok.EOS(), tok.PAD()})
}

func TestLlama2CNoDummyNoFallback(t *testing.T) {
	// A vocabulary with no " " piece and no byte pieces: no dummy prefix, and bytes that are
	// not pieces are an error instead of run.c's id byte+3.
	pieces := []string{"<unk>", "<s>", "</s>", "a", "b", "ab"}
	scores := []float32{0, 0, 0, 0, 0, -1}
	tok, err := ParseLlama2C(llamaBin(t, pieces, scores), 0)
	require.NoError(t, err)
	assert.False(t, tok.HasDummyPrefix())
	ids, err := tok.Encode("abab")
	require.NoError(t, err)
	assert.Equal(t, []int{5, 5}, ids)
	_, err = tok.Encode("abc")
	require.ErrorIs(t, err, ErrUnencodable)
	// Text spelling BOS does not produce it.
	_, err = tok.Encode("<s>")
	require.ErrorIs(t, err, ErrUnencodable)
}

func TestLlama2CRoundTripAndWrite(t *testing.T) {
	tok := handTokenizer(t)
	for _, s := range roundTripTexts {
		ids, err := tok.Encode(s)
		require.NoError(t, err)
		for _, id := range ids {
			require.False(t, tok.IsControl(id))
		}
		got, err := tok.Decode(ids)
		require.NoError(t, err)
		want := s
		if s != "" {
			want = " " + s
		}
		assert.Equal(t, want, got)
		withBOS, err := tok.Decode(append([]int{tok.BOS()}, ids...))
		require.NoError(t, err)
		assert.Equal(t, s, withBOS, "BOS + Encode(s) decodes to s")
	}
	var buf bytes.Buffer
	require.NoError(t, WriteLlama2C(tok, &buf))
	p, s := handVocab(handPieces...)
	assert.Equal(t, llamaBin(t, p, s), buf.Bytes())
	again, err := ReadLlama2C(&buf, len(p))
	require.NoError(t, err)
	assert.Equal(t, tok.pieces, again.pieces)
	assert.Equal(t, 6, again.MaxTokenLength())
}

func TestLlama2CMalformed(t *testing.T) {
	u32 := func(vs ...uint32) []byte {
		var b []byte
		for _, v := range vs {
			b = binary.LittleEndian.AppendUint32(b, v)
		}
		return b
	}
	neg := func(v int32) uint32 { return uint32(v) }
	one := math.Float32bits(1)
	good := append(u32(4, one, 1), 'a')
	good = append(append(good, u32(one, 1)...), 'b')
	good = append(append(good, u32(one, 1)...), 'c')
	tests := []struct {
		name  string
		data  []byte
		vocab int
		want  error
	}{
		{"empty", nil, 3, ErrMalformed},
		{"short header", []byte{1, 2, 3}, 3, ErrMalformed},
		{"zero max_token_length", u32(0), 3, ErrMalformed},
		{"negative max_token_length", u32(neg(-5)), 3, ErrMalformed},
		{"huge max_token_length", u32(1 << 30), 3, ErrMalformed},
		{"truncated score", append(u32(4), 0, 0), 3, ErrMalformed},
		{"truncated length", append(u32(4, one), 0), 3, ErrMalformed},
		{"negative length", u32(4, one, neg(-1)), 3, ErrMalformed},
		{"length over max", append(u32(4, one, 5), "abcde"...), 3, ErrMalformed},
		{"length over file", append(u32(4, one, 4), "ab"...), 3, ErrMalformed},
		{"huge length", u32(1<<16, one, 1<<16-1), 3, ErrMalformed},
		{"fewer tokens than vocab_size", good, 4, ErrMalformed},
		{"more tokens than vocab_size", good, 2, ErrVocabSize},
		{"too few tokens", good[:len(good)-9], 0, ErrVocabSize},
		{"huge vocab_size", good, 1 << 40, ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseLlama2C(tt.data, tt.vocab)
			require.ErrorIs(t, err, tt.want)
		})
	}
	tok, err := ParseLlama2C(good, 3)
	require.NoError(t, err)
	assert.Equal(t, 3, tok.VocabSize())
	tok, err = ParseLlama2C(good, 0)
	require.NoError(t, err)
	assert.Equal(t, 3, tok.VocabSize())

	path := filepath.Join(t.TempDir(), "tokenizer.bin")
	require.NoError(t, os.WriteFile(path, good[:len(good)-1], 0o600))
	_, err = LoadLlama2C(path, 3)
	require.ErrorIs(t, err, ErrMalformed)
	assert.Contains(t, err.Error(), path)
}
