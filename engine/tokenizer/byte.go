package tokenizer

// Ids of the byte-level vocabulary's control tokens.
const (
	ByteBOS       = 256
	ByteEOS       = 257
	BytePAD       = 258
	ByteVocabSize = 259
)

// Byte is the byte-level vocabulary: ids 0..255 are the bytes, 256 is BOS `<s>`, 257 EOS
// `</s>`, 258 PAD `<pad>`. It encodes any byte string, so Decode(Encode(s)) == s for all s.
type Byte struct{}

var _ Tokenizer = Byte{}

// NewByte returns the byte-level tokenizer, the default of the `tiny` preset.
func NewByte() Byte { return Byte{} }

// Kind returns KindByte.
func (Byte) Kind() string { return KindByte }

// VocabSize returns 259.
func (Byte) VocabSize() int { return ByteVocabSize }

// BOS returns 256.
func (Byte) BOS() int { return ByteBOS }

// EOS returns 257.
func (Byte) EOS() int { return ByteEOS }

// PAD returns 258.
func (Byte) PAD() int { return BytePAD }

// IsControl reports whether id is 256, 257 or 258.
func (Byte) IsControl(id int) bool { return id >= ByteBOS && id < ByteVocabSize }

// Encode returns the bytes of text as ids.
func (Byte) Encode(text string) ([]int, error) {
	ids := make([]int, len(text))
	for i := 0; i < len(text); i++ {
		ids[i] = int(text[i])
	}
	return ids, nil
}

// Decode returns the bytes of ids, skipping control tokens.
func (b Byte) Decode(ids []int) (string, error) { return decodeWith(b, ids) }

// TokenBytes returns the byte of id (nothing for a control token).
func (b Byte) TokenBytes(id int) ([]byte, error) { return b.AppendToken(nil, -1, id) }

// AppendToken appends the byte of id (nothing for a control token).
func (Byte) AppendToken(dst []byte, _, id int) ([]byte, error) {
	switch {
	case id >= 0 && id < 256:
		return append(dst, byte(id)), nil
	case id >= ByteBOS && id < ByteVocabSize:
		return dst, nil
	}
	return dst, invalidID(id, ByteVocabSize)
}
