package tokenizer

import "unicode/utf8"

// StreamDecoder turns a stream of token ids into text as it is generated. Push returns only
// complete, valid UTF-8: a character split across tokens is held back until its last byte
// arrives, and bytes that cannot become valid are replaced by U+FFFD (one per byte, as
// [ValidUTF8] does). For any ids, the concatenated Push results plus Flush equal
// ValidUTF8 of Decode(ids), so for ids decoding to valid UTF-8 they equal Decode(ids).
// A StreamDecoder is not safe for concurrent use.
type StreamDecoder struct {
	tok     Tokenizer
	prev    int
	pending []byte
}

// NewStreamDecoder returns a decoder at the start of a sequence.
func NewStreamDecoder(tok Tokenizer) *StreamDecoder {
	return &StreamDecoder{tok: tok, prev: -1}
}

// Push decodes id and returns the text it completes. A bad id returns an error wrapping
// ErrInvalidID and leaves the decoder unchanged.
func (d *StreamDecoder) Push(id int) (string, error) {
	b, err := d.tok.AppendToken(d.pending, d.prev, id)
	if err != nil {
		return "", err
	}
	d.prev = id
	cut := incompleteTail(b)
	out := ValidUTF8(b[:cut])
	d.pending = append(b[:0], b[cut:]...)
	return out, nil
}

// Flush returns the held-back bytes, invalid ones as U+FFFD, and empties the buffer. The
// previous id is kept, so pushing may continue.
func (d *StreamDecoder) Flush() string {
	out := ValidUTF8(d.pending)
	d.pending = d.pending[:0]
	return out
}

// Pending reports how many bytes are held back.
func (d *StreamDecoder) Pending() int { return len(d.pending) }

// incompleteTail returns where b's trailing incomplete-but-still-valid UTF-8 prefix starts,
// len(b) if there is none. Such a prefix starts at most 3 bytes from the end, at the last
// byte that is not a continuation byte.
func incompleteTail(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-3; i-- {
		if b[i]&0xC0 == 0x80 {
			continue
		}
		if !utf8.FullRune(b[i:]) {
			return i
		}
		break
	}
	return len(b)
}
