package tokenizer

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func TestStreamDecoderHoldsPartialCharacters(t *testing.T) {
	d := NewStreamDecoder(NewByte())
	euro := []byte("€") // E2 82 AC
	var outs []string
	for _, b := range euro {
		out, err := d.Push(int(b))
		require.NoError(t, err)
		outs = append(outs, out)
	}
	assert.Equal(t, []string{"", "", "€"}, outs)
	assert.Equal(t, 0, d.Pending())

	out, err := d.Push(0xF0) // starts a 4-byte character that never completes
	require.NoError(t, err)
	assert.Empty(t, out)
	out, err = d.Push('a') // 'a' makes F0 invalid: both come out
	require.NoError(t, err)
	assert.Equal(t, "\uFFFDa", out)

	_, err = d.Push(0xE2)
	require.NoError(t, err)
	_, err = d.Push(999)
	require.ErrorIs(t, err, ErrInvalidID)
	assert.Equal(t, 1, d.Pending(), "a bad id leaves the decoder unchanged")
	assert.Equal(t, "\uFFFD", d.Flush())
	assert.Equal(t, "", d.Flush())

	out, err = d.Push(0x80) // a lone continuation byte is invalid at once
	require.NoError(t, err)
	assert.Equal(t, "\uFFFD", out)
}

func TestStreamDecoderLlamaBOS(t *testing.T) {
	tok := handTokenizer(t)
	d := NewStreamDecoder(tok)
	var sb strings.Builder
	for _, id := range []int{1, 265, 264, 2} {
		out, err := d.Push(id)
		require.NoError(t, err)
		sb.WriteString(out)
	}
	assert.Equal(t, "abc", sb.String())
}

// streamProperty checks, for random id sequences, that every Push is valid UTF-8 and that the
// pushes plus Flush equal ValidUTF8(Decode(ids)) — Decode(ids) itself when that is valid.
func streamProperty(t *rapid.T, tok Tokenizer, gen *rapid.Generator[int]) {
	ids := rapid.SliceOfN(gen, 0, 64).Draw(t, "ids")
	d := NewStreamDecoder(tok)
	var sb strings.Builder
	for _, id := range ids {
		out, err := d.Push(id)
		if err != nil {
			t.Fatalf("push %d: %v", id, err)
		}
		if !utf8.ValidString(out) {
			t.Fatalf("push %d emitted invalid UTF-8 %q", id, out)
		}
		sb.WriteString(out)
	}
	tail := d.Flush()
	if !utf8.ValidString(tail) {
		t.Fatalf("flush emitted invalid UTF-8 %q", tail)
	}
	sb.WriteString(tail)
	dec, err := tok.Decode(ids)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := sb.String(), ValidUTF8([]byte(dec)); got != want {
		t.Fatalf("stream %q != decode %q", got, want)
	}
	if utf8.ValidString(dec) && sb.String() != dec {
		t.Fatalf("valid sequence: stream %q != decode %q", sb.String(), dec)
	}
}

func TestStreamDecoderProperty(t *testing.T) {
	st, err := Synthetic(2000)
	require.NoError(t, err)
	// Bytes biased towards UTF-8 lead and continuation bytes, plus the control ids.
	byteIDs := rapid.OneOf(rapid.IntRange(0, 258), rapid.IntRange(0x80, 0xBF), rapid.IntRange(0xC0, 0xF7))
	t.Run("byte", func(t *testing.T) {
		rapid.Check(t, func(rt *rapid.T) { streamProperty(rt, NewByte(), byteIDs) })
	})
	t.Run("synthetic", func(t *testing.T) {
		gen := rapid.OneOf(rapid.IntRange(0, st.VocabSize()-1), rapid.IntRange(3+0x80, 3+0xF7))
		rapid.Check(t, func(rt *rapid.T) { streamProperty(rt, st, gen) })
	})
	t.Run("llama2c", func(t *testing.T) {
		l := st.Llama2C()
		gen := rapid.OneOf(rapid.IntRange(0, l.VocabSize()-1), rapid.IntRange(3+0x80, 3+0xF7), rapid.Just(1))
		rapid.Check(t, func(rt *rapid.T) { streamProperty(rt, l, gen) })
	})
}
