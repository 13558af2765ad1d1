package tokenizer

import (
	"strings"
	"testing"
)

func BenchmarkEncode(b *testing.B) {
	st, err := Synthetic(32000)
	if err != nil {
		b.Fatal(err)
	}
	text := strings.Repeat(corpus, 4)
	for _, tok := range []Tokenizer{NewByte(), st, st.Llama2C()} {
		b.Run(tok.Kind(), func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				if _, err := tok.Encode(text); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkStreamDecode(b *testing.B) {
	st, err := Synthetic(32000)
	if err != nil {
		b.Fatal(err)
	}
	ids, err := st.Encode(corpus)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(corpus)))
	for b.Loop() {
		d := NewStreamDecoder(st)
		for _, id := range ids {
			if _, err := d.Push(id); err != nil {
				b.Fatal(err)
			}
		}
		d.Flush()
	}
}

func BenchmarkSynthetic32000(b *testing.B) {
	for b.Loop() {
		if _, err := Synthetic(32000); err != nil {
			b.Fatal(err)
		}
	}
}
