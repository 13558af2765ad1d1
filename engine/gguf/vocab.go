package gguf

import (
	"fmt"

	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/tokenizer"
)

// llama.cpp's token types (llama_token_type).
const (
	typeNormal  int32 = 1
	typeUnknown int32 = 2
	typeControl int32 = 3
	typeUnused  int32 = 5
	typeByte    int32 = 6
)

// vocabulary returns the tokenizer.ggml.* metadata of tok for a model of config c. llama.cpp
// sizes the embedding by the token count, so a vocabulary smaller than the model's is padded
// with unused [PADn] tokens (as its converter does), and ids the file leaves out are filled
// likewise.
func vocabulary(tok tokenizer.Tokenizer, c model.Config) ([]keyValue, error) {
	if tok == nil {
		return nil, fmt.Errorf("%w: no tokenizer", ErrUnsupported)
	}
	if tok.VocabSize() > c.VocabSize {
		return nil, fmt.Errorf("%w: tokenizer has %d tokens, the model %d", ErrUnsupported, tok.VocabSize(), c.VocabSize)
	}
	n := c.VocabSize
	tokens := make([]string, n)
	types := make([]int32, n)
	var kv []keyValue
	switch t := tok.(type) {
	case *tokenizer.SyntheticTokenizer:
		kv = gpt2Vocab(t.HF, tokens, types)
	case *tokenizer.HF:
		kv = gpt2Vocab(t, tokens, types)
	case *tokenizer.Llama2C:
		scores := make([]float32, n)
		for id := range t.VocabSize() {
			p, s, err := t.Piece(id)
			if err != nil {
				return nil, fmt.Errorf("gguf: vocabulary: %w", err)
			}
			tokens[id], scores[id], types[id] = p, s, typeNormal
			if _, ok := bytePiece(p); ok {
				types[id] = typeByte
			}
		}
		types[0] = typeUnknown
		kv = []keyValue{{"tokenizer.ggml.model", "llama"}, {"tokenizer.ggml.scores", scores},
			{"tokenizer.ggml.unknown_token_id", uint32(0)}}
	case tokenizer.Byte:
		// No sentencepiece file exists for it, but its ids are sentencepiece byte pieces
		// followed by the specials, which is what llama.cpp's byte fallback reads.
		scores := make([]float32, n)
		for b := range 256 {
			tokens[b], types[b] = fmt.Sprintf("<0x%02X>", b), typeByte
		}
		tokens[tokenizer.ByteBOS], tokens[tokenizer.ByteEOS], tokens[tokenizer.BytePAD] = "<s>", "</s>", "<pad>"
		kv = []keyValue{{"tokenizer.ggml.model", "llama"}, {"tokenizer.ggml.scores", scores}}
	default:
		return nil, fmt.Errorf("%w: %s vocabulary", ErrUnsupported, tok.Kind())
	}
	for id := range n {
		if tokens[id] == "" {
			tokens[id], types[id] = fmt.Sprintf("[PAD%d]", id), typeUnused
		}
	}
	for _, id := range []int{tok.BOS(), tok.EOS(), tok.PAD()} {
		if id >= 0 {
			types[id] = typeControl
		}
	}
	kv = append(kv, keyValue{"tokenizer.ggml.tokens", tokens}, keyValue{"tokenizer.ggml.token_type", types})
	// Rollout starts every sequence with BOS and never appends EOS itself.
	if id := tok.BOS(); id >= 0 {
		kv = append(kv, keyValue{"tokenizer.ggml.bos_token_id", uint32(id)}, keyValue{"tokenizer.ggml.add_bos_token", true})
	}
	if id := tok.EOS(); id >= 0 {
		kv = append(kv, keyValue{"tokenizer.ggml.eos_token_id", uint32(id)})
	}
	if id := tok.PAD(); id >= 0 {
		kv = append(kv, keyValue{"tokenizer.ggml.padding_token_id", uint32(id)})
	}
	kv = append(kv, keyValue{"tokenizer.ggml.add_eos_token", false})
	return kv, nil
}

// gpt2Vocab fills tokens and types from a byte-level BPE and returns its model, pre-tokenizer
// and merges keys. "default" is llama.cpp's GPT-2 pre-tokenizer, the one tokenizer.json files
// without a model-specific regex (the synthetic vocabularies) use.
func gpt2Vocab(t *tokenizer.HF, tokens []string, types []int32) []keyValue {
	for id := range t.VocabSize() {
		p, err := t.Piece(id)
		if err != nil {
			continue // a gap in the ids: padded by the caller
		}
		tokens[id], types[id] = p, typeNormal
		if t.IsSpecial(id) {
			types[id] = typeControl
		}
	}
	ms := t.Merges()
	merges := make([]string, len(ms))
	for i, m := range ms {
		merges[i] = m[0] + " " + m[1]
	}
	return []keyValue{{"tokenizer.ggml.model", "gpt2"}, {"tokenizer.ggml.pre", "default"},
		{"tokenizer.ggml.merges", merges}}
}

// bytePiece reports whether p is a sentencepiece byte piece "<0xAB>".
func bytePiece(p string) (byte, bool) {
	var b byte
	if len(p) != 6 || p[:3] != "<0x" || p[5] != '>' {
		return 0, false
	}
	if _, err := fmt.Sscanf(p[3:5], "%02X", &b); err != nil {
		return 0, false
	}
	return b, true
}
