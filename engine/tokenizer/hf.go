package tokenizer

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Bounds on HF vocabularies: the largest real ones have ~260k entries, and ids may leave a
// few gaps but not enough to make a tiny file allocate a huge table.
const (
	maxHFID  = 1 << 21
	maxHFGap = 1 << 16
)

// HF is a Hugging Face tokenizer.json byte-level BPE (GPT-2 style): added tokens matched
// first (leftmost-longest), the GPT-2 regex split, bytes mapped through GPT-2's
// bytes_to_unicode table, BPE merges by rank, and the ByteLevel decoder. Files with any
// other model, normalizer, pre-tokenizer or decoder are refused with ErrUnsupported.
//
// BOS, EOS and PAD come from tokenizer_config.json beside the file when it names them, else
// from well-known token contents ("<s>", "<|begin_of_text|>", "</s>", "<|endoftext|>",
// "<pad>", ...); use [HF.WithSpecials] to set them from the model's config.
type HF struct {
	pieces    []string // id -> token ("" in gaps)
	valid     []bool
	dec       [][]byte // id -> decoded bytes
	vocab     map[string]int
	merges    map[uint64]hfMerge
	added     []hfAdded
	byFirst   map[byte][]int // first byte of content -> indices into added, longest first
	byteID    [256]int
	prefixSp  bool
	useRegex  bool
	ignoreMrg bool
	fuseUnk   bool
	unk       int
	bos, eos  int
	pad       int
}

type hfMerge struct {
	rank int32
	id   int32
}

type hfAdded struct {
	id                         int
	content                    string
	singleWord, lstrip, rstrip bool
	special                    bool
}

var _ Tokenizer = (*HF)(nil)

// hfSpec is what a tokenizer.json says, after validation of its shape; buildHF checks the
// references.
type hfSpec struct {
	vocab          map[string]int
	merges         [][2]string
	added          []hfAdded
	unkToken       string
	addPrefixSpace bool
	useRegex       bool
	ignoreMerges   bool
	fuseUnk        bool
}

// LoadHF reads a tokenizer.json, and tokenizer_config.json beside it if present for the
// BOS/EOS/PAD tokens.
func LoadHF(path string) (*HF, error) {
	b, err := readFileLimited(path)
	if err != nil {
		return nil, err
	}
	t, err := ParseHF(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	cfgPath := filepath.Join(filepath.Dir(path), "tokenizer_config.json")
	if cb, err := os.ReadFile(cfgPath); err == nil {
		if t, err = t.withConfig(cb); err != nil {
			return nil, fmt.Errorf("%s: %w", cfgPath, err)
		}
	}
	return t, nil
}

// ReadHF is ParseHF from a reader (at most 256 MiB).
func ReadHF(r io.Reader) (*HF, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("tokenizer: reading tokenizer.json: %w", err)
	}
	if len(b) > maxFileSize {
		return nil, fmt.Errorf("%w: tokenizer.json larger than %d bytes", ErrMalformed, maxFileSize)
	}
	return ParseHF(b)
}

type hfFile struct {
	AddedTokens []struct {
		ID         *int64 `json:"id"`
		Content    string `json:"content"`
		SingleWord bool   `json:"single_word"`
		Lstrip     bool   `json:"lstrip"`
		Rstrip     bool   `json:"rstrip"`
		Special    bool   `json:"special"`
	} `json:"added_tokens"`
	Normalizer   json.RawMessage `json:"normalizer"`
	PreTokenizer json.RawMessage `json:"pre_tokenizer"`
	Decoder      json.RawMessage `json:"decoder"`
	Model        json.RawMessage `json:"model"`
}

type hfModel struct {
	Type                    string            `json:"type"`
	Vocab                   map[string]int64  `json:"vocab"`
	Merges                  []json.RawMessage `json:"merges"`
	UnkToken                *string           `json:"unk_token"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	ByteFallback            bool              `json:"byte_fallback"`
	Dropout                 *float64          `json:"dropout"`
	FuseUnk                 bool              `json:"fuse_unk"`
	IgnoreMerges            bool              `json:"ignore_merges"`
}

type hfComponent struct {
	Type           string            `json:"type"`
	AddPrefixSpace *bool             `json:"add_prefix_space"`
	UseRegex       *bool             `json:"use_regex"`
	PreTokenizers  []json.RawMessage `json:"pretokenizers"`
	Decoders       []json.RawMessage `json:"decoders"`
	Normalizers    []json.RawMessage `json:"normalizers"`
}

func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}

// component parses a normalizer/pre-tokenizer/decoder object, unwrapping a Sequence of one.
func component(what string, raw json.RawMessage) (*hfComponent, error) {
	var c hfComponent
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("%w: tokenizer.json: %s: %w", ErrMalformed, what, err)
	}
	if c.Type == "Sequence" {
		list := c.PreTokenizers
		if what == "decoder" {
			list = c.Decoders
		} else if what == "normalizer" {
			list = c.Normalizers
		}
		if len(list) == 0 {
			return nil, nil
		}
		if len(list) != 1 {
			return nil, fmt.Errorf("%w: tokenizer.json: %s Sequence of %d steps (only a single ByteLevel is supported)",
				ErrUnsupported, what, len(list))
		}
		return component(what, list[0])
	}
	return &c, nil
}

// ParseHF parses a tokenizer.json. BOS/EOS/PAD are guessed from token contents (ParseHF sees
// no tokenizer_config.json).
func ParseHF(data []byte) (*HF, error) {
	var f hfFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("%w: tokenizer.json: %w", ErrMalformed, err)
	}
	if isNull(f.Model) {
		return nil, fmt.Errorf("%w: tokenizer.json: no model", ErrMalformed)
	}
	var mt struct {
		Type   string          `json:"type"`
		Merges json.RawMessage `json:"merges"`
	}
	if err := json.Unmarshal(f.Model, &mt); err != nil {
		return nil, fmt.Errorf("%w: tokenizer.json: model: %w", ErrMalformed, err)
	}
	if mt.Type != "BPE" && (mt.Type != "" || isNull(mt.Merges)) {
		return nil, fmt.Errorf("%w: tokenizer.json: model type %q (only byte-level BPE is supported)", ErrUnsupported, mt.Type)
	}
	var m hfModel
	if err := json.Unmarshal(f.Model, &m); err != nil {
		return nil, fmt.Errorf("%w: tokenizer.json: model: %w", ErrMalformed, err)
	}
	switch {
	case m.ByteFallback:
		return nil, fmt.Errorf("%w: tokenizer.json: BPE with byte_fallback (a SentencePiece-style vocabulary)", ErrUnsupported)
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "":
		return nil, fmt.Errorf("%w: tokenizer.json: continuing_subword_prefix %q", ErrUnsupported, *m.ContinuingSubwordPrefix)
	case m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return nil, fmt.Errorf("%w: tokenizer.json: end_of_word_suffix %q", ErrUnsupported, *m.EndOfWordSuffix)
	case m.Dropout != nil && *m.Dropout > 0:
		return nil, fmt.Errorf("%w: tokenizer.json: BPE dropout %g", ErrUnsupported, *m.Dropout)
	}
	spec := hfSpec{vocab: make(map[string]int, len(m.Vocab)), ignoreMerges: m.IgnoreMerges, fuseUnk: m.FuseUnk, useRegex: true}
	for p, id := range m.Vocab {
		if id < 0 || id >= maxHFID {
			return nil, fmt.Errorf("%w: tokenizer.json: vocab %q: id %d outside 0..%d", ErrMalformed, p, id, maxHFID-1)
		}
		spec.vocab[p] = int(id)
	}
	if m.UnkToken != nil {
		spec.unkToken = *m.UnkToken
	}
	for i, raw := range m.Merges {
		var pair [2]string
		var s string
		if err := json.Unmarshal(raw, &s); err == nil {
			a, b, ok := strings.Cut(s, " ")
			if !ok || strings.Contains(b, " ") {
				return nil, fmt.Errorf("%w: tokenizer.json: merge %d %q: want two pieces separated by one space", ErrMalformed, i, s)
			}
			pair = [2]string{a, b}
		} else if err := json.Unmarshal(raw, &pair); err != nil {
			return nil, fmt.Errorf("%w: tokenizer.json: merge %d: want \"a b\" or [\"a\", \"b\"]: %w", ErrMalformed, i, err)
		}
		spec.merges = append(spec.merges, pair)
	}
	for i, a := range f.AddedTokens {
		if a.ID == nil || *a.ID < 0 || *a.ID >= maxHFID {
			return nil, fmt.Errorf("%w: tokenizer.json: added_tokens[%d] %q: missing or bad id", ErrMalformed, i, a.Content)
		}
		spec.added = append(spec.added, hfAdded{id: int(*a.ID), content: a.Content, singleWord: a.SingleWord,
			lstrip: a.Lstrip, rstrip: a.Rstrip, special: a.Special})
	}
	if !isNull(f.Normalizer) {
		c, err := component("normalizer", f.Normalizer)
		if err != nil {
			return nil, err
		}
		if c != nil {
			return nil, fmt.Errorf("%w: tokenizer.json: normalizer %q", ErrUnsupported, c.Type)
		}
	}
	if isNull(f.PreTokenizer) {
		return nil, fmt.Errorf("%w: tokenizer.json: no pre_tokenizer (only ByteLevel is supported)", ErrUnsupported)
	}
	pt, err := component("pre_tokenizer", f.PreTokenizer)
	if err != nil {
		return nil, err
	}
	switch {
	case pt == nil:
		return nil, fmt.Errorf("%w: tokenizer.json: empty pre_tokenizer Sequence", ErrUnsupported)
	case pt.Type == "Metaspace":
		return nil, fmt.Errorf("%w: tokenizer.json: Metaspace pre-tokenizer (a SentencePiece-style vocabulary; use its tokenizer.bin or a byte-level BPE)", ErrUnsupported)
	case pt.Type != "ByteLevel":
		return nil, fmt.Errorf("%w: tokenizer.json: pre_tokenizer %q (only ByteLevel is supported)", ErrUnsupported, pt.Type)
	}
	spec.addPrefixSpace = pt.AddPrefixSpace == nil || *pt.AddPrefixSpace // HF's default is true
	spec.useRegex = pt.UseRegex == nil || *pt.UseRegex
	if isNull(f.Decoder) {
		return nil, fmt.Errorf("%w: tokenizer.json: no decoder (only ByteLevel is supported)", ErrUnsupported)
	}
	dc, err := component("decoder", f.Decoder)
	if err != nil {
		return nil, err
	}
	if dc == nil || dc.Type != "ByteLevel" {
		typ := "empty Sequence"
		if dc != nil {
			typ = dc.Type
		}
		return nil, fmt.Errorf("%w: tokenizer.json: decoder %q (only ByteLevel is supported)", ErrUnsupported, typ)
	}
	return buildHF(spec)
}

// buildHF checks the references of spec and builds the tokenizer.
func buildHF(spec hfSpec) (*HF, error) {
	size := 0
	for _, id := range spec.vocab {
		size = max(size, id+1)
	}
	for _, a := range spec.added {
		size = max(size, a.id+1)
	}
	if size == 0 {
		return nil, fmt.Errorf("%w: tokenizer.json: empty vocabulary", ErrMalformed)
	}
	if size > len(spec.vocab)+len(spec.added)+maxHFGap {
		return nil, fmt.Errorf("%w: tokenizer.json: largest id %d but only %d tokens", ErrMalformed, size-1, len(spec.vocab)+len(spec.added))
	}
	t := &HF{
		pieces: make([]string, size), valid: make([]bool, size), dec: make([][]byte, size),
		vocab: spec.vocab, merges: make(map[uint64]hfMerge, len(spec.merges)),
		prefixSp: spec.addPrefixSpace, useRegex: spec.useRegex, ignoreMrg: spec.ignoreMerges, fuseUnk: spec.fuseUnk,
		unk: -1, bos: -1, eos: -1, pad: -1, byFirst: map[byte][]int{},
	}
	for p, id := range spec.vocab {
		if t.valid[id] {
			return nil, fmt.Errorf("%w: tokenizer.json: id %d used by both %q and %q", ErrMalformed, id, t.pieces[id], p)
		}
		t.pieces[id], t.valid[id] = p, true
	}
	for _, a := range spec.added {
		// An added token may repeat a vocab entry (GPT-2's <|endoftext|>); its content wins.
		t.pieces[a.id], t.valid[a.id] = a.content, true
		if a.content != "" {
			t.added = append(t.added, a)
		}
	}
	for id := range t.pieces {
		if t.valid[id] {
			t.dec[id] = gpt2.decode(t.pieces[id])
		}
	}
	for i := range t.added {
		c := t.added[i].content[0]
		t.byFirst[c] = append(t.byFirst[c], i)
	}
	for _, list := range t.byFirst {
		sort.SliceStable(list, func(i, j int) bool { return len(t.added[list[i]].content) > len(t.added[list[j]].content) })
	}
	for rank, mg := range spec.merges {
		a, okA := spec.vocab[mg[0]]
		b, okB := spec.vocab[mg[1]]
		if !okA || !okB {
			return nil, fmt.Errorf("%w: tokenizer.json: merge %d %q %q: piece not in vocab", ErrMalformed, rank, mg[0], mg[1])
		}
		r, ok := spec.vocab[mg[0]+mg[1]]
		if !ok {
			return nil, fmt.Errorf("%w: tokenizer.json: merge %d %q %q: result %q not in vocab", ErrMalformed, rank, mg[0], mg[1], mg[0]+mg[1])
		}
		// Later duplicates override earlier ones, as in Hugging Face's HashMap build.
		t.merges[uint64(a)<<32|uint64(b)] = hfMerge{rank: int32(rank), id: int32(r)}
	}
	for b := range 256 {
		t.byteID[b] = -1
		if id, ok := spec.vocab[string(gpt2.toRune[b])]; ok {
			t.byteID[b] = id
		}
	}
	if spec.unkToken != "" {
		id, ok := spec.vocab[spec.unkToken]
		if !ok {
			return nil, fmt.Errorf("%w: tokenizer.json: unk_token %q not in vocab", ErrMalformed, spec.unkToken)
		}
		t.unk = id
	}
	t.bos = t.firstOf("<s>", "<|begin_of_text|>", "<|startoftext|>", "<bos>", "<|endoftext|>")
	t.eos = t.firstOf("</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>")
	t.pad = t.firstOf("<pad>", "<|pad|>", "[PAD]", "<|padding|>")
	return t, nil
}

// firstOf returns the id of the first of contents that is a token (added tokens first).
func (t *HF) firstOf(contents ...string) int {
	for _, c := range contents {
		if id := t.idOf(c); id >= 0 {
			return id
		}
	}
	return -1
}

func (t *HF) idOf(content string) int {
	for _, a := range t.added {
		if a.content == content {
			return a.id
		}
	}
	if id, ok := t.vocab[content]; ok {
		return id
	}
	return -1
}

// withConfig applies tokenizer_config.json's bos_token/eos_token/pad_token (each a string or
// {"content": ...}); tokens it names that do not exist are an error.
func (t *HF) withConfig(data []byte) (*HF, error) {
	var cfg struct {
		BOS json.RawMessage `json:"bos_token"`
		EOS json.RawMessage `json:"eos_token"`
		PAD json.RawMessage `json:"pad_token"`
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, fmt.Errorf("%w: tokenizer_config.json: %w", ErrMalformed, err)
	}
	bos, eos, pad := t.bos, t.eos, t.pad
	for _, f := range []struct {
		name string
		raw  json.RawMessage
		dst  *int
	}{{"bos_token", cfg.BOS, &bos}, {"eos_token", cfg.EOS, &eos}, {"pad_token", cfg.PAD, &pad}} {
		if isNull(f.raw) {
			continue
		}
		var s string
		if json.Unmarshal(f.raw, &s) != nil {
			var obj struct {
				Content string `json:"content"`
			}
			if err := json.Unmarshal(f.raw, &obj); err != nil {
				return nil, fmt.Errorf("%w: tokenizer_config.json: %s: %w", ErrMalformed, f.name, err)
			}
			s = obj.Content
		}
		id := t.idOf(s)
		if id < 0 {
			return nil, fmt.Errorf("%w: tokenizer_config.json: %s %q is not a token", ErrMalformed, f.name, s)
		}
		*f.dst = id
	}
	return t.WithSpecials(bos, eos, pad)
}

// WithSpecials returns a copy of t with the given BOS, EOS and PAD ids (-1 for none), e.g. from
// the model's config.json. t itself is unchanged.
func (t *HF) WithSpecials(bos, eos, pad int) (*HF, error) {
	for _, id := range []int{bos, eos, pad} {
		if id != -1 && (id < 0 || id >= len(t.pieces) || !t.valid[id]) {
			return nil, invalidID(id, len(t.pieces))
		}
	}
	c := *t
	c.bos, c.eos, c.pad = bos, eos, pad
	return &c, nil
}

// Kind returns KindHF.
func (t *HF) Kind() string { return KindHF }

// VocabSize is one more than the largest id of the vocab and the added tokens.
func (t *HF) VocabSize() int { return len(t.pieces) }

// BOS returns the beginning-of-sequence id, -1 if none.
func (t *HF) BOS() int { return t.bos }

// EOS returns the end-of-sequence id, -1 if none.
func (t *HF) EOS() int { return t.eos }

// PAD returns the padding id, -1 if none.
func (t *HF) PAD() int { return t.pad }

// IsControl reports whether id is BOS, EOS or PAD.
func (t *HF) IsControl(id int) bool {
	return id >= 0 && (id == t.bos || id == t.eos || id == t.pad)
}

// Piece returns the token string of id as the file spells it (byte-level, e.g. "Ġthe").
func (t *HF) Piece(id int) (string, error) {
	if id < 0 || id >= len(t.pieces) || !t.valid[id] {
		return "", invalidID(id, len(t.pieces))
	}
	return t.pieces[id], nil
}

// Encode splits text around added tokens (leftmost-longest; control tokens excepted), then
// pre-tokenizes and BPE-encodes each stretch between them.
func (t *HF) Encode(text string) ([]int, error) {
	ids := make([]int, 0, len(text)/3+1)
	var chunks []string
	var err error
	for pos := 0; pos < len(text); {
		s, e, id, ok := t.findAdded(text, pos)
		if !ok {
			s, e = len(text), len(text)
		}
		if ids, chunks, err = t.encodeSegment(ids, chunks, text[pos:s]); err != nil {
			return nil, err
		}
		if ok {
			ids = append(ids, id)
		}
		pos = e
	}
	return ids, nil
}

// findAdded finds the leftmost-longest added token in text[from:], returning the span it
// consumes (widened by lstrip/rstrip).
func (t *HF) findAdded(text string, from int) (start, end, id int, ok bool) {
	if len(t.added) == 0 {
		return 0, 0, 0, false
	}
	for i := from; i < len(text); i++ {
		for _, ai := range t.byFirst[text[i]] {
			a := &t.added[ai]
			if t.IsControl(a.id) || !strings.HasPrefix(text[i:], a.content) {
				continue
			}
			s, e := i, i+len(a.content)
			if a.singleWord && (isWordBefore(text[from:s]) || isWordAfter(text[e:])) {
				continue
			}
			if a.lstrip {
				for s > from {
					r, n := utf8.DecodeLastRuneInString(text[from:s])
					if !unicode.IsSpace(r) {
						break
					}
					s -= n
				}
			}
			if a.rstrip {
				for e < len(text) {
					r, n := utf8.DecodeRuneInString(text[e:])
					if !unicode.IsSpace(r) {
						break
					}
					e += n
				}
			}
			return s, e, a.id, true
		}
	}
	return 0, 0, 0, false
}

func isWordRune(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r) }

func isWordBefore(s string) bool {
	r, n := utf8.DecodeLastRuneInString(s)
	return n > 0 && isWordRune(r)
}

func isWordAfter(s string) bool {
	r, n := utf8.DecodeRuneInString(s)
	return n > 0 && isWordRune(r)
}

func (t *HF) encodeSegment(ids []int, chunks []string, seg string) ([]int, []string, error) {
	if seg == "" {
		return ids, chunks, nil
	}
	if t.prefixSp && seg[0] != ' ' {
		seg = " " + seg
	}
	chunks = chunks[:0]
	if t.useRegex {
		chunks = splitGPT2(chunks, seg)
	} else {
		chunks = append(chunks, seg)
	}
	for _, c := range chunks {
		var err error
		if ids, err = t.bpe(ids, c); err != nil {
			return nil, chunks, err
		}
	}
	return ids, chunks, nil
}

// bpe appends the BPE encoding of one pre-tokenized chunk.
func (t *HF) bpe(ids []int, chunk string) ([]int, error) {
	if t.ignoreMrg {
		if id, ok := t.vocab[gpt2.encode([]byte(chunk))]; ok && !t.IsControl(id) {
			return append(ids, id), nil
		}
	}
	syms := make([]int, 0, len(chunk))
	for i := 0; i < len(chunk); i++ {
		id := t.byteID[chunk[i]]
		if id < 0 {
			if t.unk < 0 {
				return nil, fmt.Errorf("%w: byte 0x%02X has no byte-level piece and there is no unk_token", ErrUnencodable, chunk[i])
			}
			if t.fuseUnk && len(syms) > 0 && syms[len(syms)-1] == t.unk {
				continue
			}
			id = t.unk
		}
		syms = append(syms, id)
	}
	syms = mergeSymbols(syms, func(a, b int) (int, float64, bool) {
		m, ok := t.merges[uint64(a)<<32|uint64(b)]
		// A merge never produces a control token, so text cannot spell BOS/EOS/PAD.
		return int(m.id), float64(m.rank), ok && !t.IsControl(int(m.id))
	})
	return append(ids, syms...), nil
}

// Decode concatenates the decoded bytes of ids, control tokens rendering as nothing.
func (t *HF) Decode(ids []int) (string, error) { return decodeWith(t, ids) }

// TokenBytes returns the decoded bytes of id.
func (t *HF) TokenBytes(id int) ([]byte, error) { return t.AppendToken(nil, -1, id) }

// AppendToken appends the decoded bytes of id; byte-level decoding does not depend on prev.
func (t *HF) AppendToken(dst []byte, _, id int) ([]byte, error) {
	if id < 0 || id >= len(t.pieces) || !t.valid[id] {
		return dst, invalidID(id, len(t.pieces))
	}
	if t.IsControl(id) {
		return dst, nil
	}
	return append(dst, t.dec[id]...), nil
}
