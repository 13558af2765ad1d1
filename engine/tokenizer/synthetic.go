package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
)

// maxSyntheticVocab bounds Synthetic's work.
const maxSyntheticVocab = 1 << 20

// SyntheticTokenizer is a deterministic vocabulary of a given size for presets that have no
// tokenizer files (stories15m's 32000). Its ids are laid out like Llama's sentencepiece
// vocabulary: 0 `<unk>`, 1 `<s>` (BOS), 2 `</s>` (EOS), 3..258 the bytes 0x00..0xFF, then the
// single characters of an embedded English text, pieces learned from that text by byte-pair
// merging, and filler pieces (each an earlier piece plus one character, in order) up to
// exactly the requested size. Every piece is distinct. Its tokenizer.json has been checked to
// encode and decode like Hugging Face's tokenizers.js on ~1500 mixed texts (whitespace runs,
// contractions, digits, CJK, emoji, special tokens), apart from the deliberate refusal to match
// control-token text.
//
// In memory it behaves as the byte-level BPE that [SyntheticTokenizer.WriteHF] writes (no
// dummy prefix; Decode(Encode(s)) == s). The two file formats agree on every id except the
// single-character ids 259..259+k-1: llama2.c's encode() looks characters up as text pieces,
// so tokenizer.bin holds them there (its ids 3..258 being <0x00>..<0xFF> byte pieces), while
// byte-level BPE already has every byte at 3..258 and holds further filler pieces there.
type SyntheticTokenizer struct {
	*HF
	llamaPieces []string  // tokenizer.bin pieces by id
	llamaScores []float32 // tokenizer.bin scores by id
	hfPieces    []string  // raw bytes of the HF pieces by id
	hfMerges    [][2]string
}

var _ Tokenizer = (*SyntheticTokenizer)(nil)

var syntheticSpecials = [3]string{"<unk>", "<s>", "</s>"}

// Synthetic builds the deterministic vocabulary of vocabSize pieces. It needs room for the
// 259 specials and bytes plus the embedded text's distinct characters (about 70).
func Synthetic(vocabSize int) (*SyntheticTokenizer, error) {
	var singles []byte
	{
		var seen [256]bool
		for i := 0; i < len(corpus); i++ {
			seen[corpus[i]] = true
		}
		for b := range 256 {
			if seen[b] {
				singles = append(singles, byte(b))
			}
		}
	}
	first := byteFallbackBase + 256 // id of the first single
	k := len(singles)
	if vocabSize < first+k || vocabSize > maxSyntheticVocab {
		return nil, fmt.Errorf("%w: synthetic vocabulary of %d: want %d..%d", ErrVocabSize, vocabSize, first+k, maxSyntheticVocab)
	}
	// p holds the text of ids >= first, in the llama2.c layout; ids indexes it by content.
	p := make([]string, 0, vocabSize-first)
	ids := make(map[string]int, vocabSize)
	add := func(s string) {
		ids[s] = first + len(p)
		p = append(p, s)
	}
	for _, c := range singles {
		add(string(c))
	}
	type pair struct{ a, b string }
	var merges []pair // in rank order, raw-byte strings
	learnMerges(vocabSize-first, ids, add, func(a, b string) { merges = append(merges, pair{a, b}) })
	nLlama := vocabSize - first - len(p) // llama2.c fillers still needed
	var extra []string                   // the k fillers that take the singles' ids in HF
	for x := 0; nLlama+k > 0; x++ {
		for _, c := range singles {
			if nLlama+k == 0 {
				break
			}
			var base string
			switch {
			case x < len(p):
				base = p[x]
			case x-len(p) < len(extra):
				base = extra[x-len(p)]
			default:
				return nil, fmt.Errorf("tokenizer: synthetic vocabulary of %d: ran out of filler pieces", vocabSize)
			}
			s := base + string(c)
			if _, dup := ids[s]; dup {
				continue
			}
			merges = append(merges, pair{base, string(c)})
			if nLlama > 0 {
				add(s)
				nLlama--
			} else {
				ids[s] = -1
				extra = append(extra, s)
				k--
			}
		}
	}
	st := &SyntheticTokenizer{}
	st.llamaPieces = make([]string, 0, vocabSize)
	st.llamaScores = make([]float32, vocabSize)
	st.llamaPieces = append(st.llamaPieces, "<unk>", "\n<s>\n", "\n</s>\n") // llama2.c's export spells BOS/EOS so
	for b := range 256 {
		st.llamaPieces = append(st.llamaPieces, fmt.Sprintf("<0x%02X>", b))
	}
	st.llamaPieces = append(st.llamaPieces, p...)
	for id := first; id < vocabSize; id++ {
		st.llamaScores[id] = -float32(id - first)
	}
	st.hfPieces = make([]string, 0, vocabSize)
	st.hfPieces = append(st.hfPieces, syntheticSpecials[:]...)
	for b := range 256 {
		st.hfPieces = append(st.hfPieces, string([]byte{byte(b)}))
	}
	st.hfPieces = append(st.hfPieces, extra...)
	st.hfPieces = append(st.hfPieces, p[len(singles):]...)
	for _, m := range merges {
		st.hfMerges = append(st.hfMerges, [2]string{m.a, m.b})
	}
	spec := st.hfSpec()
	h, err := buildHF(spec)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: synthetic vocabulary: %w", err)
	}
	st.HF = h
	return st, nil
}

// learnMerges learns byte-pair merges from the GPT-2-split corpus until limit pieces exist
// or no pair occurs twice. Ties go to the lexicographically smallest pair, so the result is
// deterministic. add records a new piece, merged each merge rule in rank order.
func learnMerges(limit int, ids map[string]int, add func(string), merged func(a, b string)) {
	counts := map[string]int{}
	for _, c := range splitGPT2(nil, corpus) {
		counts[c]++
	}
	keys := make([]string, 0, len(counts))
	for c := range counts {
		keys = append(keys, c)
	}
	sort.Strings(keys)
	words := make([][]string, len(keys))
	freq := make([]int, len(keys))
	for i, c := range keys {
		for j := 0; j < len(c); j++ {
			words[i] = append(words[i], c[j:j+1])
		}
		freq[i] = counts[c]
	}
	type pair struct{ a, b string }
	for len(ids) < limit {
		pc := map[pair]int{}
		for i, w := range words {
			for j := 0; j+1 < len(w); j++ {
				pc[pair{w[j], w[j+1]}] += freq[i]
			}
		}
		var best pair
		bestN := 1
		for pr, n := range pc {
			if n > bestN || (n == bestN && n > 1 && (pr.a < best.a || (pr.a == best.a && pr.b < best.b))) {
				best, bestN = pr, n
			}
		}
		if bestN < 2 {
			break
		}
		s := best.a + best.b
		if _, ok := ids[s]; !ok {
			add(s)
		}
		merged(best.a, best.b)
		for i, w := range words {
			out := w[:0]
			for j := 0; j < len(w); j++ {
				if j+1 < len(w) && w[j] == best.a && w[j+1] == best.b {
					out = append(out, s)
					j++
				} else {
					out = append(out, w[j])
				}
			}
			words[i] = out
		}
	}
}

func (st *SyntheticTokenizer) hfSpec() hfSpec {
	spec := hfSpec{vocab: make(map[string]int, len(st.hfPieces)), useRegex: true}
	for id, p := range st.hfPieces {
		if id < len(syntheticSpecials) {
			spec.vocab[p] = id
			spec.added = append(spec.added, hfAdded{id: id, content: p, special: true})
			continue
		}
		spec.vocab[gpt2.encode([]byte(p))] = id
	}
	for _, m := range st.hfMerges {
		spec.merges = append(spec.merges, [2]string{gpt2.encode([]byte(m[0])), gpt2.encode([]byte(m[1]))})
	}
	return spec
}

// Llama2C returns the vocabulary as the llama2.c tokenizer that WriteLlama2C writes.
func (st *SyntheticTokenizer) Llama2C() *Llama2C {
	return newLlama2C(st.llamaPieces, st.llamaScores)
}

// WriteLlama2C writes the vocabulary as a llama2.c tokenizer.bin.
func (st *SyntheticTokenizer) WriteLlama2C(w io.Writer) error {
	_, err := writeLlama2CPieces(w, st.llamaPieces, st.llamaScores)
	return err
}

// WriteHF writes the vocabulary as a Hugging Face byte-level BPE tokenizer.json.
func (st *SyntheticTokenizer) WriteHF(w io.Writer) error {
	spec := st.hfSpec()
	vocab := make([]string, len(st.hfPieces))
	for p, id := range spec.vocab {
		vocab[id] = p
	}
	return writeHFJSON(w, vocab, spec.added, spec.merges)
}

// WriteLlama2C writes tok as a llama2.c tokenizer.bin: a *SyntheticTokenizer or a *Llama2C.
// Other tokenizers return ErrNotWritable (the byte-level vocabulary has no llama2.c form:
// run.c hard-codes BOS=1, EOS=2 and bytes at 3..258).
func WriteLlama2C(tok Tokenizer, w io.Writer) error {
	switch t := tok.(type) {
	case *SyntheticTokenizer:
		return t.WriteLlama2C(w)
	case *Llama2C:
		_, err := t.WriteTo(w)
		return err
	}
	return fmt.Errorf("%w: %s tokenizer as llama2.c tokenizer.bin", ErrNotWritable, tok.Kind())
}

// WriteHF writes tok as a Hugging Face tokenizer.json that LoadHF reads back to an equivalent
// tokenizer: a *SyntheticTokenizer, or Byte (ids 0..255 the byte-level characters, no merges,
// <s>/</s>/<pad> as added tokens 256..258). Others return ErrNotWritable.
func WriteHF(tok Tokenizer, w io.Writer) error {
	switch t := tok.(type) {
	case *SyntheticTokenizer:
		return t.WriteHF(w)
	case Byte:
		return t.WriteHF(w)
	}
	return fmt.Errorf("%w: %s tokenizer as tokenizer.json", ErrNotWritable, tok.Kind())
}

// WriteHF writes the byte-level vocabulary as a tokenizer.json (see the package-level WriteHF).
func (Byte) WriteHF(w io.Writer) error {
	vocab := make([]string, 256)
	for b := range 256 {
		vocab[b] = string(gpt2.toRune[b])
	}
	added := []hfAdded{{id: ByteBOS, content: "<s>", special: true}, {id: ByteEOS, content: "</s>", special: true},
		{id: BytePAD, content: "<pad>", special: true}}
	return writeHFJSON(w, vocab, added, nil)
}

// WriteHFConfig writes a tokenizer_config.json naming tok's BOS, EOS and PAD tokens (what
// Hugging Face's AutoTokenizer and LoadHF read them from). tok must be writable by WriteHF.
func WriteHFConfig(tok Tokenizer, w io.Writer) error {
	var names [3]string
	switch tok.(type) {
	case *SyntheticTokenizer:
		names = [3]string{"<s>", "</s>", ""}
	case Byte:
		names = [3]string{"<s>", "</s>", "<pad>"}
	default:
		return fmt.Errorf("%w: %s tokenizer config", ErrNotWritable, tok.Kind())
	}
	cfg := map[string]any{
		"tokenizer_class":              "PreTrainedTokenizerFast",
		"bos_token":                    names[0],
		"eos_token":                    names[1],
		"add_bos_token":                true,
		"clean_up_tokenization_spaces": false,
		"model_max_length":             1 << 20,
	}
	if names[2] != "" {
		cfg["pad_token"] = names[2]
	}
	if _, ok := tok.(*SyntheticTokenizer); ok {
		cfg["unk_token"] = "<unk>"
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return fmt.Errorf("tokenizer: tokenizer_config.json: %w", err)
	}
	if _, err := w.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("tokenizer: writing tokenizer_config.json: %w", err)
	}
	return nil
}

// writeHFJSON writes a byte-level BPE tokenizer.json; vocab is by id ("" for none), in id
// order so the file reads naturally.
func writeHFJSON(w io.Writer, vocab []string, added []hfAdded, merges [][2]string) error {
	// Built in memory (a 32000-piece file is ~1 MB) so one Write reports any error.
	bw := &bytes.Buffer{}
	q := func(s string) {
		b, _ := json.Marshal(s) // strings always marshal
		bw.Write(b)
	}
	bw.WriteString("{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [")
	for i, a := range added {
		if i > 0 {
			bw.WriteString(",")
		}
		fmt.Fprintf(bw, "\n    {\"id\": %d, \"content\": ", a.id)
		q(a.content)
		fmt.Fprintf(bw, ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": %t}", a.special)
	}
	bw.WriteString("\n  ],\n  \"normalizer\": null,\n")
	bw.WriteString("  \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": true},\n")
	bw.WriteString("  \"post_processor\": null,\n")
	bw.WriteString("  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, \"use_regex\": true},\n")
	bw.WriteString("  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": null,\n")
	bw.WriteString("    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n    \"fuse_unk\": false,\n")
	bw.WriteString("    \"byte_fallback\": false,\n    \"ignore_merges\": false,\n    \"vocab\": {")
	n := 0
	for id, p := range vocab {
		if p == "" {
			continue
		}
		if n > 0 {
			bw.WriteString(",")
		}
		bw.WriteString("\n      ")
		q(p)
		fmt.Fprintf(bw, ": %d", id)
		n++
	}
	bw.WriteString("\n    },\n    \"merges\": [")
	for i, m := range merges {
		if i > 0 {
			bw.WriteString(",")
		}
		bw.WriteString("\n      ")
		q(m[0] + " " + m[1])
	}
	bw.WriteString("\n    ]\n  }\n}\n")
	if _, err := w.Write(bw.Bytes()); err != nil {
		return fmt.Errorf("tokenizer: writing tokenizer.json: %w", err)
	}
	return nil
}
