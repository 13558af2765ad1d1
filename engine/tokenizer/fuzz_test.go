package tokenizer

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

// fuzzProbe exercises a tokenizer that parsed: Encode must either fail cleanly or give ids
// that Decode accepts, and bad ids must be errors.
func fuzzProbe(t *testing.T, tok Tokenizer) {
	for _, s := range []string{"", "hello world", "héllo 👋 \xff", "<s></s>", "aaaa bbbb"} {
		ids, err := tok.Encode(s)
		if err != nil {
			if !errors.Is(err, ErrUnencodable) {
				t.Fatalf("Encode(%q): unexpected error %v", s, err)
			}
			continue
		}
		for _, id := range ids {
			if id < 0 || id >= tok.VocabSize() || tok.IsControl(id) {
				t.Fatalf("Encode(%q) produced id %d (vocab %d)", s, id, tok.VocabSize())
			}
		}
		if _, err := tok.Decode(ids); err != nil {
			t.Fatalf("Decode(Encode(%q)): %v", s, err)
		}
	}
	for _, id := range []int{-1, tok.VocabSize(), tok.VocabSize() + 1000} {
		if _, err := tok.Decode([]int{id}); !errors.Is(err, ErrInvalidID) {
			t.Fatalf("Decode(%d): %v", id, err)
		}
	}
	d := NewStreamDecoder(tok)
	for id := range min(tok.VocabSize(), 300) {
		out, err := d.Push(id)
		if err == nil && !utf8.ValidString(out) {
			t.Fatalf("stream: invalid UTF-8 %q", out)
		}
	}
	d.Flush()
}

func FuzzLlama2CTokenizerFile(f *testing.F) {
	st, err := Synthetic(400)
	if err != nil {
		f.Fatal(err)
	}
	var good bytes.Buffer
	if err := st.WriteLlama2C(&good); err != nil {
		f.Fatal(err)
	}
	p, s := handVocab(handPieces...)
	hand := llamaBin(f, p, s)
	f.Add(good.Bytes(), 400)
	f.Add(good.Bytes(), 0)
	f.Add(good.Bytes()[:good.Len()/2], 400)
	f.Add(hand, len(p))
	f.Add(hand, 3)
	f.Add([]byte{1, 0, 0, 0}, 1)
	f.Add([]byte{4, 0, 0, 0, 0, 0, 128, 63, 255, 255, 255, 255}, 3)
	f.Add([]byte{}, 0)
	f.Fuzz(func(t *testing.T, data []byte, vocabSize int) {
		tok, err := ParseLlama2C(data, vocabSize)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrVocabSize) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		fuzzProbe(t, tok)
		var out bytes.Buffer
		if err := WriteLlama2C(tok, &out); err != nil {
			t.Fatal(err)
		}
		again, err := ParseLlama2C(out.Bytes(), tok.VocabSize())
		if err != nil || again.VocabSize() != tok.VocabSize() {
			t.Fatalf("rewrite does not parse: %v", err)
		}
	})
}

func FuzzHFTokenizerJSON(f *testing.F) {
	st, err := Synthetic(340)
	if err != nil {
		f.Fatal(err)
	}
	var good, byteTok bytes.Buffer
	if err := st.WriteHF(&good); err != nil {
		f.Fatal(err)
	}
	if err := NewByte().WriteHF(&byteTok); err != nil {
		f.Fatal(err)
	}
	f.Add(good.Bytes())
	f.Add(byteTok.Bytes())
	f.Add(mustJSON(f, hfDoc(false)))
	f.Add(mustJSON(f, hfDoc(true)))
	f.Add([]byte(`{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b", ["b", "a"]]},
		"pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"},
		"added_tokens": [{"id": 3, "content": "<s>", "lstrip": true, "rstrip": true, "single_word": true}]}`))
	llama, _ := byteLevelDoc(nil, splitThenByteLevel(patternLlama3), "<|begin_of_text|>", "<|eot_id|>")
	qwen, _ := byteLevelDoc(map[string]any{"type": "NFC"}, splitThenByteLevel(patternQwen2), "<|im_start|>")
	custom, _ := byteLevelDoc(map[string]any{"type": "Sequence", "normalizers": []any{map[string]any{"type": "NFKD"}}},
		splitThenByteLevel(`\s+|\p{L}+`))
	f.Add(mustJSON(f, llama))
	f.Add(mustJSON(f, qwen))
	f.Add(mustJSON(f, custom))
	f.Add([]byte(`{"model": {"type": "Unigram"}}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tok, err := ParseHF(data)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrUnsupported) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		fuzzProbe(t, tok)
	})
}

func FuzzEncodeDecode(f *testing.F) {
	st, err := Synthetic(1000)
	if err != nil {
		f.Fatal(err)
	}
	var bin bytes.Buffer
	if err := st.WriteLlama2C(&bin); err != nil {
		f.Fatal(err)
	}
	l2, err := ParseLlama2C(bin.Bytes(), 1000)
	if err != nil {
		f.Fatal(err)
	}
	doc, _ := byteLevelDoc(nil, splitThenByteLevel(patternLlama3), "<|eot_id|>")
	llama, err := ParseHF(mustJSON(f, doc))
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range roundTripTexts {
		f.Add(s)
	}
	f.Add("\xff\xfe\xc3 \xe2\x82")
	f.Add(strings.Repeat("the ", 50))
	f.Fuzz(func(t *testing.T, s string) {
		for _, c := range []struct {
			tok  Tokenizer
			want string
		}{{NewByte(), s}, {st, s}, {llama, s}, {l2, map[bool]string{true: "", false: " " + s}[s == ""]}} {
			ids, err := c.tok.Encode(s)
			if err != nil {
				t.Fatalf("%s: Encode(%q): %v", c.tok.Kind(), s, err)
			}
			got, err := c.tok.Decode(ids)
			if err != nil {
				t.Fatalf("%s: Decode: %v", c.tok.Kind(), err)
			}
			if got != c.want {
				t.Fatalf("%s: Decode(Encode(%q)) = %q", c.tok.Kind(), s, got)
			}
			d := NewStreamDecoder(c.tok)
			var sb strings.Builder
			for _, id := range ids {
				out, err := d.Push(id)
				if err != nil {
					t.Fatal(err)
				}
				sb.WriteString(out)
			}
			sb.WriteString(d.Flush())
			if sb.String() != ValidUTF8([]byte(c.want)) {
				t.Fatalf("%s: stream %q != %q", c.tok.Kind(), sb.String(), c.want)
			}
		}
	})
}
