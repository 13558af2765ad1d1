package tokenizer

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"
)

// Sentinel errors; every error the package returns wraps one of them.
var (
	// ErrInvalidID is returned for a token id outside the vocabulary (or in a gap of it).
	ErrInvalidID = errors.New("tokenizer: invalid token id")
	// ErrMalformed is returned for a tokenizer file that cannot be parsed.
	ErrMalformed = errors.New("tokenizer: malformed file")
	// ErrUnsupported is returned for a well-formed tokenizer file that uses a feature this
	// package does not implement (it refuses rather than tokenizing wrongly).
	ErrUnsupported = errors.New("tokenizer: unsupported")
	// ErrVocabSize is returned when a file's vocabulary does not match the expected size.
	ErrVocabSize = errors.New("tokenizer: vocabulary size mismatch")
	// ErrUnencodable is returned when text contains bytes the vocabulary cannot represent
	// (no byte fallback, no byte-level piece, no unk token).
	ErrUnencodable = errors.New("tokenizer: text not encodable with this vocabulary")
	// ErrNotWritable is returned when a tokenizer cannot be written in the requested format.
	ErrNotWritable = errors.New("tokenizer: cannot be written in this format")
)

// Kinds returned by [Tokenizer.Kind].
const (
	KindByte    = "byte"
	KindLlama2C = "llama2c"
	KindHF      = "hf-bpe"
)

// maxFileSize caps what the loaders read: the largest real tokenizer.json files are a few tens
// of MB.
const maxFileSize = 256 << 20

// Tokenizer converts between text and token ids. Implementations are immutable after
// construction and safe for concurrent use.
type Tokenizer interface {
	// Kind names the vocabulary family: KindByte, KindLlama2C or KindHF.
	Kind() string
	// VocabSize is one more than the largest valid id.
	VocabSize() int
	// BOS is the beginning-of-sequence id, or -1 when the vocabulary has none.
	BOS() int
	// EOS is the end-of-sequence id, or -1 when the vocabulary has none.
	EOS() int
	// PAD is the padding id, or -1 when the vocabulary has none.
	PAD() int
	// IsControl reports whether id is BOS, EOS or PAD: never produced by Encode, rendered
	// as nothing by Decode.
	IsControl(id int) bool
	// Encode tokenizes text without adding BOS or EOS.
	Encode(text string) ([]int, error)
	// Decode returns the bytes ids stand for (possibly invalid UTF-8 if ids end inside a
	// character). An out-of-range id is an error wrapping ErrInvalidID.
	Decode(ids []int) (string, error)
	// TokenBytes returns the bytes id contributes at the start of a sequence.
	TokenBytes(id int) ([]byte, error)
	// AppendToken appends to dst the bytes id contributes when it follows prev (-1 at the
	// start). Decode is AppendToken over the sequence; llama2.c needs prev because a space
	// after BOS is stripped. On error dst is returned unchanged.
	AppendToken(dst []byte, prev, id int) ([]byte, error)
}

// ProtectedEncoder is implemented by tokenizers whose Encode turns the text of special
// tokens into special ids (HF added tokens). EncodeProtected is Encode except that no special
// token is matched overlapping a protected byte range [start, end) of text. The byte and
// llama2.c tokenizers never produce special ids from text, so they need no such method.
type ProtectedEncoder interface {
	EncodeProtected(text string, protected [][2]int) ([]int, error)
}

// decodeWith is Decode in terms of AppendToken.
func decodeWith(t Tokenizer, ids []int) (string, error) {
	buf := make([]byte, 0, 4*len(ids))
	prev := -1
	for i, id := range ids {
		var err error
		buf, err = t.AppendToken(buf, prev, id)
		if err != nil {
			return "", fmt.Errorf("position %d: %w", i, err)
		}
		prev = id
	}
	return string(buf), nil
}

func invalidID(id, size int) error {
	return fmt.Errorf("%w: %d (vocabulary size %d)", ErrInvalidID, id, size)
}

// Load reads a tokenizer file: a tokenizer.json (by name or when the content is a JSON
// object) with [LoadHF], otherwise a llama2.c tokenizer.bin with [LoadLlama2C] and vocabSize
// (the model config's vocab_size; <= 0 reads every token in the file). A directory is searched
// for tokenizer.json, then tokenizer.bin. For an HF file a positive vocabSize smaller than the
// tokenizer's is an error (ErrVocabSize); a larger one is fine (models pad their embeddings).
func Load(path string, vocabSize int) (Tokenizer, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if st.IsDir() {
		for _, name := range []string{"tokenizer.json", "tokenizer.bin"} {
			p := filepath.Join(path, name)
			if _, err := os.Stat(p); err == nil {
				return Load(p, vocabSize)
			}
		}
		return nil, fmt.Errorf("tokenizer: %s: no tokenizer.json or tokenizer.bin: %w", path, os.ErrNotExist)
	}
	isJSON := strings.HasSuffix(strings.ToLower(path), ".json")
	if !isJSON && !strings.HasSuffix(strings.ToLower(path), ".bin") {
		head, err := readHead(path, 64)
		if err != nil {
			return nil, err
		}
		isJSON = len(head) > 0 && head[0] == '{'
	}
	if !isJSON {
		return LoadLlama2C(path, vocabSize)
	}
	h, err := LoadHF(path)
	if err != nil {
		return nil, err
	}
	if vocabSize > 0 && h.VocabSize() > vocabSize {
		return nil, fmt.Errorf("%w: %s has %d tokens, the model %d", ErrVocabSize, path, h.VocabSize(), vocabSize)
	}
	return h, nil
}

// readHead returns the first n bytes of path with leading whitespace removed.
func readHead(path string, n int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	defer f.Close()
	buf := make([]byte, n)
	m, _ := f.Read(buf)
	return bytes.TrimLeft(buf[:m], " \t\r\n\ufeff"), nil
}

// readFileLimited reads a whole file after checking its size against maxFileSize.
func readFileLimited(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if st.Size() > maxFileSize {
		return nil, fmt.Errorf("%w: %s is %d bytes (limit %d)", ErrMalformed, path, st.Size(), maxFileSize)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	return b, nil
}

// ValidUTF8 returns b as a string with every byte that does not start a valid UTF-8 encoding
// replaced by U+FFFD, one per byte (the decoding of `for range string(b)`), so the result does
// not depend on how b was split into chunks at character boundaries.
func ValidUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var sb strings.Builder
	sb.Grow(len(b) + 8)
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n == 1 {
			sb.WriteRune(utf8.RuneError)
		} else {
			sb.Write(b[:n])
		}
		b = b[n:]
	}
	return sb.String()
}
