package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// byteLevel is GPT-2's bytes_to_unicode() table and its inverse: printable Latin-1 bytes map
// to themselves, the other 68 bytes to U+0100.. in byte order, so every byte string becomes
// a printable string (space is "Ġ", newline "Ċ").
type byteLevel struct {
	toRune [256]rune
	toByte map[rune]byte
}

// gpt2 is the immutable table, built once.
var gpt2 = newByteLevel()

func newByteLevel() *byteLevel {
	bl := &byteLevel{toByte: make(map[rune]byte, 256)}
	n := 0
	for b := 0; b < 256; b++ {
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		r := rune(b)
		if !printable {
			r = rune(256 + n)
			n++
		}
		bl.toRune[b] = r
		bl.toByte[r] = byte(b)
	}
	return bl
}

// encode maps bytes to their byte-level string.
func (bl *byteLevel) encode(b []byte) string {
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = utf8.AppendRune(out, bl.toRune[c])
	}
	return string(out)
}

// decode maps a byte-level string back to bytes; like Hugging Face's ByteLevel decoder, a
// token with any character outside the table is kept as its own UTF-8 bytes.
func (bl *byteLevel) decode(s string) []byte {
	out := make([]byte, 0, len(s))
	for _, r := range s {
		b, ok := bl.toByte[r]
		if !ok {
			return []byte(s)
		}
		out = append(out, b)
	}
	return out
}

// Character classes of the GPT-2 pattern. Go's unicode.IsSpace is Unicode White_Space, the
// set Oniguruma's \s matches; invalid UTF-8 bytes count as "other".
const (
	classOther = iota
	classSpace
	classLetter
	classNumber
)

func classOf(r rune, n int) int {
	switch {
	case r == utf8.RuneError && n <= 1:
		return classOther
	case unicode.IsSpace(r):
		return classSpace
	case unicode.IsLetter(r):
		return classLetter
	case unicode.IsNumber(r):
		return classNumber
	}
	return classOther
}

// splitGPT2 splits s like the GPT-2 pre-tokenizer regex
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// by hand, since Go's regexp has no lookahead. It appends the pieces (substrings of s, which
// concatenate back to s) to dst.
func splitGPT2(dst []string, s string) []string {
	for i := 0; i < len(s); {
		if s[i] == '\'' {
			if n := contraction(s[i+1:]); n > 0 {
				dst = append(dst, s[i:i+1+n])
				i += 1 + n
				continue
			}
		}
		j := i
		if s[i] == ' ' {
			j++
		}
		if j < len(s) {
			if c, _ := classAt(s, j); c != classSpace {
				end := runEnd(s, j, c)
				dst = append(dst, s[i:end])
				i = end
				continue
			}
		}
		// Whitespace at i: \s+(?!\S) takes the run but leaves its last character when a
		// non-space follows (so that " word" keeps its space); a single space followed by a
		// non-space falls through to \s+, which takes it alone.
		end := runEnd(s, i, classSpace)
		if end < len(s) {
			_, last := utf8.DecodeLastRuneInString(s[i:end])
			if end-last > i {
				end -= last
			}
		}
		dst = append(dst, s[i:end])
		i = end
	}
	return dst
}

// contraction returns the length of 's 't 're 've 'm 'll 'd after the apostrophe, 0 if none.
func contraction(s string) int {
	if len(s) >= 2 {
		switch s[:2] {
		case "re", "ve", "ll":
			return 2
		}
	}
	if len(s) >= 1 {
		switch s[0] {
		case 's', 't', 'm', 'd':
			return 1
		}
	}
	return 0
}
