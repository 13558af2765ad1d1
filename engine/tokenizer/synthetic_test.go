package tokenizer

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSyntheticLayout(t *testing.T) {
	st, err := Synthetic(32000)
	require.NoError(t, err)
	assert.Equal(t, 32000, st.VocabSize())
	assert.Equal(t, []int{1, 2, -1}, []int{st.BOS(), st.EOS(), st.PAD()})
	assert.Len(t, st.llamaPieces, 32000)
	assert.Len(t, st.hfPieces, 32000)
	assert.Len(t, st.HF.vocab, 32000, "HF pieces are distinct")
	seen := map[string]bool{}
	for _, p := range st.llamaPieces {
		require.False(t, seen[p], "duplicate llama2.c piece %q", p)
		seen[p] = true
	}
	assert.Equal(t, "<0x00>", st.llamaPieces[3])
	assert.Equal(t, "<0xFF>", st.llamaPieces[258])
	l := st.Llama2C()
	assert.True(t, l.byteFallback)
	assert.True(t, l.HasDummyPrefix())
	// The formats agree on every id but the single characters.
	singles := 0
	for id := 259; len(st.llamaPieces[id]) == 1; id++ {
		singles++
	}
	for id := 0; id < 32000; id++ {
		if id >= 259 && id < 259+singles {
			continue
		}
		a, err := l.TokenBytes(id)
		require.NoError(t, err)
		b, err := st.TokenBytes(id)
		require.NoError(t, err)
		if id == 1 || id == 2 {
			continue
		}
		require.Equal(t, string(a), string(b), "id %d", id)
	}
	// Merges learned from English text compress it.
	text := "Once upon a time, the little girl and her dog walked to the river."
	ids, err := st.Encode(text)
	require.NoError(t, err)
	assert.Less(t, len(ids), len(text)/3)
	lids, err := l.Encode(text)
	require.NoError(t, err)
	assert.Less(t, len(lids), len(text)/3)

	_, err = Synthetic(300)
	require.ErrorIs(t, err, ErrVocabSize)
	_, err = Synthetic(259 + singles - 1)
	require.ErrorIs(t, err, ErrVocabSize)
	small, err := Synthetic(259 + singles)
	require.NoError(t, err)
	assert.Equal(t, 259+singles, small.VocabSize())
}

func TestSyntheticDeterministic(t *testing.T) {
	a, err := Synthetic(5000)
	require.NoError(t, err)
	b, err := Synthetic(5000)
	require.NoError(t, err)
	var ha, hb, la, lb bytes.Buffer
	require.NoError(t, WriteHF(a, &ha))
	require.NoError(t, WriteHF(b, &hb))
	require.NoError(t, WriteLlama2C(a, &la))
	require.NoError(t, WriteLlama2C(b, &lb))
	assert.Equal(t, ha.Bytes(), hb.Bytes())
	assert.Equal(t, la.Bytes(), lb.Bytes())
}

func syntheticTexts() []string {
	return append(roundTripTexts, corpus, "\xff\xfe broken \xc3", strings.Repeat("ab", 3000))
}

func TestSyntheticFilesRoundTrip(t *testing.T) {
	for _, size := range []int{32000, 600} {
		st, err := Synthetic(size)
		require.NoError(t, err)
		dir := t.TempDir()
		hfPath, binPath := filepath.Join(dir, "tokenizer.json"), filepath.Join(dir, "tokenizer.bin")
		writeFile(t, hfPath, func(f *os.File) error { return WriteHF(st, f) })
		writeFile(t, filepath.Join(dir, "tokenizer_config.json"), func(f *os.File) error { return WriteHFConfig(st, f) })
		writeFile(t, binPath, func(f *os.File) error { return WriteLlama2C(st, f) })

		hf, err := Load(hfPath, size)
		require.NoError(t, err)
		require.Equal(t, KindHF, hf.Kind())
		require.Equal(t, size, hf.VocabSize())
		assert.Equal(t, []int{1, 2, -1}, []int{hf.BOS(), hf.EOS(), hf.PAD()})
		l2, err := Load(binPath, size)
		require.NoError(t, err)
		require.Equal(t, KindLlama2C, l2.Kind())
		_, err = Load(binPath, size+1)
		require.Error(t, err)

		for _, s := range syntheticTexts() {
			mem, err := st.Encode(s)
			require.NoError(t, err)
			got, err := hf.Encode(s)
			require.NoError(t, err)
			require.Equal(t, mem, got, "loaded tokenizer.json encodes like the in-memory vocabulary")
			requireRoundTrip(t, st, s, s)
			requireRoundTrip(t, hf, s, s)
			want := s
			if s != "" {
				want = " " + s
			}
			requireRoundTrip(t, l2, s, want)
		}
	}
}

func requireRoundTrip(t *testing.T, tok Tokenizer, s, want string) {
	t.Helper()
	ids, err := tok.Encode(s)
	require.NoError(t, err)
	for _, id := range ids {
		require.False(t, tok.IsControl(id), "%s: Encode(%q) produced control id %d", tok.Kind(), s, id)
	}
	got, err := tok.Decode(ids)
	require.NoError(t, err)
	require.Equal(t, want, got, "%s round trip", tok.Kind())
	// The stream decoder agrees with Decode.
	d := NewStreamDecoder(tok)
	var sb strings.Builder
	for _, id := range ids {
		out, err := d.Push(id)
		require.NoError(t, err)
		sb.WriteString(out)
	}
	sb.WriteString(d.Flush())
	require.Equal(t, ValidUTF8([]byte(want)), sb.String())
}

func writeFile(t *testing.T, path string, write func(*os.File) error) {
	t.Helper()
	f, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, write(f))
	require.NoError(t, f.Close())
}

func TestByteAsHF(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, WriteHF(NewByte(), &buf))
	hf, err := ParseHF(buf.Bytes())
	require.NoError(t, err)
	b := NewByte()
	assert.Equal(t, []int{b.VocabSize(), b.BOS(), b.EOS(), b.PAD()}, []int{hf.VocabSize(), hf.BOS(), hf.EOS(), hf.PAD()})
	for _, s := range syntheticTexts() {
		want, _ := b.Encode(s)
		got, err := hf.Encode(s)
		require.NoError(t, err)
		require.Equal(t, want, got)
		requireRoundTrip(t, hf, s, s)
	}
	require.ErrorIs(t, WriteLlama2C(b, &buf), ErrNotWritable)
	require.ErrorIs(t, WriteHF(hf, &buf), ErrNotWritable)
}

// TestHFMergesRoundTrip: Merges lists the file's merges in rank order, so a converter that
// writes them (GGUF) and a reader of that file rebuild the same BPE; IsSpecial marks the added
// control tokens only.
func TestHFMergesRoundTrip(t *testing.T) {
	st, err := Synthetic(600)
	require.NoError(t, err)
	var buf bytes.Buffer
	require.NoError(t, st.WriteHF(&buf))
	var file struct {
		Model struct {
			Merges []string `json:"merges"`
		} `json:"model"`
	}
	require.NoError(t, json.Unmarshal(buf.Bytes(), &file))
	require.NotEmpty(t, file.Model.Merges)
	var want [][2]string
	for _, m := range file.Model.Merges {
		a, b, ok := strings.Cut(m, " ")
		require.True(t, ok, m)
		want = append(want, [2]string{a, b})
	}
	hf, err := ParseHF(buf.Bytes())
	require.NoError(t, err)
	require.Equal(t, want, hf.Merges())
	require.Equal(t, want, st.Merges(), "the synthetic tokenizer is that BPE in memory")
	require.True(t, hf.IsSpecial(1))
	require.False(t, hf.IsSpecial(300))
}
