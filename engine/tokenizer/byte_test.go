package tokenizer

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// roundTripTexts are the texts every tokenizer must round-trip.
var roundTripTexts = []string{
	"",
	"hello world",
	"Once upon a time, there was a little girl.",
	"naïve café, Grüße, Ελληνικά, русский, 日本語のテキスト",
	"emoji 👋🏽 family 👨‍👩‍👧 flag 🇫🇷",
	"   leading and trailing   ",
	"tabs\t\tand\nnew\n\nlines\r\n",
	"  \n  \t ",
	"it's don't I'll we're they've 3.14 100%",
	"<s> not a control token </s> <pad> <unk>",
	"\x00\x01\x7f",
}

func TestByteRoundTrip(t *testing.T) {
	b := NewByte()
	for _, s := range append(roundTripTexts, "\xff\xfe invalid \xc3") {
		ids, err := b.Encode(s)
		require.NoError(t, err)
		require.Len(t, ids, len(s))
		for _, id := range ids {
			assert.False(t, b.IsControl(id))
		}
		got, err := b.Decode(ids)
		require.NoError(t, err)
		assert.Equal(t, s, got)
	}
}

func TestByteSpecials(t *testing.T) {
	b := NewByte()
	assert.Equal(t, 259, b.VocabSize())
	assert.Equal(t, []int{256, 257, 258}, []int{b.BOS(), b.EOS(), b.PAD()})
	assert.Equal(t, KindByte, b.Kind())
	got, err := b.Decode([]int{256, 'h', 'i', 257, 258})
	require.NoError(t, err)
	assert.Equal(t, "hi", got)
	for _, id := range []int{-1, 259, 1 << 40} {
		_, err := b.Decode([]int{'a', id})
		require.ErrorIs(t, err, ErrInvalidID)
		_, err = b.TokenBytes(id)
		require.ErrorIs(t, err, ErrInvalidID)
	}
}
