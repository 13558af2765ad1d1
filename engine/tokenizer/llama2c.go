package tokenizer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
)

// Llama2C ids fixed by llama2.c's run.c.
const (
	llamaUnk = 0
	llamaBOS = 1
	llamaEOS = 2
	// byteFallbackBase is the id of the piece <0x00>; byte b is id b+3.
	byteFallbackBase = 3
	// maxPieceLen bounds max_token_length (Llama 2's is 27).
	maxPieceLen = 1 << 16
)

// mergeFloor is run.c's initial best_score: a pair whose piece scores at or below it never merges.
const mergeFloor = -1e10

// Llama2C is a llama2.c tokenizer.bin vocabulary (sentencepiece pieces with "▁" already turned
// into " "). Ids 1 and 2 are BOS and EOS, as run.c hard-codes; there is no PAD.
//
// Encode follows run.c's encode(), with three deliberate differences, each of which only
// avoids emitting an id run.c would emit wrongly: a vocabulary with no " " piece gets no
// dummy prefix (run.c would emit -1); bytes needing the <0xXX> fallback are an error wrapping
// ErrUnencodable when ids 3..258 are not exactly <0x00>..<0xFF> (run.c would emit id byte+3
// whatever it is); and BOS/EOS are never looked up, so text cannot produce them. When several
// pieces are equal strings, the lowest id is used (run.c's bsearch picks any of them).
type Llama2C struct {
	pieces       []string
	scores       []float32
	maxTokenLen  int
	lookup       map[string]int
	byteFallback bool
	dummy        int // id of the " " piece, -1 if none
}

var _ Tokenizer = (*Llama2C)(nil)

// LoadLlama2C reads a llama2.c tokenizer.bin holding vocabSize tokens (the model config's
// vocab_size, which the file does not record). vocabSize <= 0 reads tokens to the end of file.
func LoadLlama2C(path string, vocabSize int) (*Llama2C, error) {
	b, err := readFileLimited(path)
	if err != nil {
		return nil, err
	}
	t, err := ParseLlama2C(b, vocabSize)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// ReadLlama2C is LoadLlama2C from a reader (read to EOF, at most 256 MiB).
func ReadLlama2C(r io.Reader, vocabSize int) (*Llama2C, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("tokenizer: reading llama2.c tokenizer: %w", err)
	}
	if len(b) > maxFileSize {
		return nil, fmt.Errorf("%w: llama2.c tokenizer larger than %d bytes", ErrMalformed, maxFileSize)
	}
	return ParseLlama2C(b, vocabSize)
}

// ParseLlama2C parses the bytes of a tokenizer.bin: int32 max_token_length, then per token a
// float32 score, an int32 length and that many bytes, all little-endian. Every length is
// checked against max_token_length and the bytes left before anything is allocated; the file
// must hold exactly vocabSize tokens (vocabSize <= 0: as many as it holds, at least 3).
func ParseLlama2C(data []byte, vocabSize int) (*Llama2C, error) {
	if len(data) < 4 {
		return nil, fmt.Errorf("%w: llama2.c tokenizer: %d bytes, no max_token_length header", ErrMalformed, len(data))
	}
	maxLen := int32(binary.LittleEndian.Uint32(data))
	if maxLen <= 0 || maxLen > maxPieceLen {
		return nil, fmt.Errorf("%w: llama2.c tokenizer: max_token_length %d outside 1..%d", ErrMalformed, maxLen, maxPieceLen)
	}
	rest := data[4:]
	capHint := len(rest) / 8
	if vocabSize > 0 && vocabSize < capHint {
		capHint = vocabSize
	}
	t := &Llama2C{
		pieces:      make([]string, 0, capHint),
		scores:      make([]float32, 0, capHint),
		maxTokenLen: int(maxLen),
	}
	for i := 0; vocabSize <= 0 || i < vocabSize; i++ {
		if vocabSize <= 0 && len(rest) == 0 {
			break
		}
		if len(rest) < 8 {
			return nil, fmt.Errorf("%w: llama2.c tokenizer: token %d: truncated (%d bytes left, want score and length)",
				ErrMalformed, i, len(rest))
		}
		score := math.Float32frombits(binary.LittleEndian.Uint32(rest))
		n := int32(binary.LittleEndian.Uint32(rest[4:]))
		rest = rest[8:]
		switch {
		case n < 0:
			return nil, fmt.Errorf("%w: llama2.c tokenizer: token %d: negative length %d", ErrMalformed, i, n)
		case n > maxLen:
			return nil, fmt.Errorf("%w: llama2.c tokenizer: token %d: length %d > max_token_length %d", ErrMalformed, i, n, maxLen)
		case int(n) > len(rest):
			return nil, fmt.Errorf("%w: llama2.c tokenizer: token %d: truncated (length %d, %d bytes left)", ErrMalformed, i, n, len(rest))
		}
		t.pieces = append(t.pieces, string(rest[:n]))
		t.scores = append(t.scores, score)
		rest = rest[n:]
	}
	if len(rest) > 0 {
		return nil, fmt.Errorf("%w: llama2.c tokenizer: %d bytes left after %d tokens (is vocab_size right?)",
			ErrVocabSize, len(rest), vocabSize)
	}
	if len(t.pieces) < 3 {
		return nil, fmt.Errorf("%w: llama2.c tokenizer: %d tokens, need at least unk, BOS and EOS", ErrVocabSize, len(t.pieces))
	}
	t.index()
	return t, nil
}

// newLlama2C builds a tokenizer from pieces and scores (the synthetic vocabulary).
func newLlama2C(pieces []string, scores []float32) *Llama2C {
	t := &Llama2C{pieces: pieces, scores: scores}
	for _, p := range pieces {
		t.maxTokenLen = max(t.maxTokenLen, len(p))
	}
	t.maxTokenLen = max(t.maxTokenLen, 1)
	t.index()
	return t
}

func (t *Llama2C) index() {
	t.lookup = make(map[string]int, len(t.pieces))
	for id := len(t.pieces) - 1; id >= 0; id-- {
		if id == llamaBOS || id == llamaEOS {
			continue
		}
		t.lookup[t.pieces[id]] = id // descending, so the lowest id wins
	}
	t.dummy = -1
	if id, ok := t.lookup[" "]; ok {
		t.dummy = id
	}
	t.byteFallback = len(t.pieces) >= byteFallbackBase+256
	for b := 0; b < 256 && t.byteFallback; b++ {
		v, ok := parseBytePiece(t.pieces[byteFallbackBase+b])
		t.byteFallback = ok && int(v) == b
	}
}

// parseBytePiece recognises the sentencepiece byte piece "<0xXX>".
func parseBytePiece(p string) (byte, bool) {
	if len(p) != 6 || p[:3] != "<0x" || p[5] != '>' {
		return 0, false
	}
	hi, ok1 := unhex(p[3])
	lo, ok2 := unhex(p[4])
	return hi<<4 | lo, ok1 && ok2
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// Kind returns KindLlama2C.
func (t *Llama2C) Kind() string { return KindLlama2C }

// VocabSize returns the number of pieces.
func (t *Llama2C) VocabSize() int { return len(t.pieces) }

// BOS returns 1.
func (t *Llama2C) BOS() int { return llamaBOS }

// EOS returns 2.
func (t *Llama2C) EOS() int { return llamaEOS }

// PAD returns -1: llama2.c has no padding token.
func (t *Llama2C) PAD() int { return -1 }

// IsControl reports whether id is BOS or EOS.
func (t *Llama2C) IsControl(id int) bool { return id == llamaBOS || id == llamaEOS }

// MaxTokenLength is the file's max_token_length.
func (t *Llama2C) MaxTokenLength() int { return t.maxTokenLen }

// HasDummyPrefix reports whether Encode prepends the " " piece to non-empty text.
func (t *Llama2C) HasDummyPrefix() bool { return t.dummy >= 0 }

// Piece returns the raw piece of id and its score.
func (t *Llama2C) Piece(id int) (string, float32, error) {
	if id < 0 || id >= len(t.pieces) {
		return "", 0, invalidID(id, len(t.pieces))
	}
	return t.pieces[id], t.scores[id], nil
}

// Encode tokenizes text like run.c's encode() without BOS/EOS: the " " dummy prefix, each
// UTF-8 character (up to 4 bytes, invalid bytes grouped as run.c groups them) looked up as a
// piece or else spelled with <0xXX> byte pieces, then repeated merging of the adjacent pair
// whose concatenation is the best-scoring piece (leftmost on ties).
func (t *Llama2C) Encode(text string) ([]int, error) {
	if text == "" {
		return []int{}, nil
	}
	ids := make([]int, 0, len(text)+1)
	if t.dummy >= 0 {
		ids = append(ids, t.dummy)
	}
	start := 0
	for i := 0; i < len(text); i++ {
		if text[i]&0xC0 != 0x80 {
			start = i
		}
		if i+1 < len(text) && text[i+1]&0xC0 == 0x80 && i+1-start < 4 {
			continue
		}
		group := text[start : i+1]
		start = i + 1 // run.c resets str_len after every lookup
		if id, ok := t.lookup[group]; ok {
			ids = append(ids, id)
			continue
		}
		if !t.byteFallback {
			return nil, fmt.Errorf("%w: %q is not a piece and ids 3..258 are not <0x00>..<0xFF> byte pieces", ErrUnencodable, group)
		}
		for j := 0; j < len(group); j++ {
			ids = append(ids, byteFallbackBase+int(group[j]))
		}
	}
	var buf []byte
	return mergeSymbols(ids, func(a, b int) (int, float64, bool) {
		buf = append(append(buf[:0], t.pieces[a]...), t.pieces[b]...)
		id, ok := t.lookup[string(buf)]
		if !ok || !(t.scores[id] > mergeFloor) {
			return 0, 0, false
		}
		return id, -float64(t.scores[id]), true
	}), nil
}

// Decode concatenates the pieces of ids like run.c's decode(): a piece right after BOS loses
// its leading space, <0xXX> pieces become the byte, BOS and EOS render as nothing.
func (t *Llama2C) Decode(ids []int) (string, error) { return decodeWith(t, ids) }

// TokenBytes returns the bytes of id at the start of a sequence.
func (t *Llama2C) TokenBytes(id int) ([]byte, error) { return t.AppendToken(nil, -1, id) }

// AppendToken appends the bytes of id following prev (see Decode).
func (t *Llama2C) AppendToken(dst []byte, prev, id int) ([]byte, error) {
	if id < 0 || id >= len(t.pieces) {
		return dst, invalidID(id, len(t.pieces))
	}
	if t.IsControl(id) {
		return dst, nil
	}
	p := t.pieces[id]
	if prev == llamaBOS && len(p) > 0 && p[0] == ' ' {
		p = p[1:]
	}
	if b, ok := parseBytePiece(p); ok {
		return append(dst, b), nil
	}
	return append(dst, p...), nil
}

// WriteTo writes the vocabulary in tokenizer.bin format.
func (t *Llama2C) WriteTo(w io.Writer) (int64, error) {
	return writeLlama2CPieces(w, t.pieces, t.scores)
}

func writeLlama2CPieces(w io.Writer, pieces []string, scores []float32) (int64, error) {
	maxLen := 1
	size := 4
	for _, p := range pieces {
		maxLen = max(maxLen, len(p))
		size += 8 + len(p)
	}
	if maxLen > maxPieceLen {
		return 0, fmt.Errorf("%w: piece of %d bytes exceeds %d", ErrNotWritable, maxLen, maxPieceLen)
	}
	var buf bytes.Buffer
	buf.Grow(size)
	var u [4]byte
	put := func(v uint32) {
		binary.LittleEndian.PutUint32(u[:], v)
		buf.Write(u[:])
	}
	put(uint32(maxLen))
	for i, p := range pieces {
		put(math.Float32bits(scores[i]))
		put(uint32(len(p)))
		buf.WriteString(p)
	}
	n, err := w.Write(buf.Bytes())
	if err != nil {
		return int64(n), fmt.Errorf("tokenizer: writing tokenizer.bin: %w", err)
	}
	return int64(n), nil
}
