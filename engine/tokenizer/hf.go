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

	"golang.org/x/text/unicode/norm"
)

// Bounds on HF vocabularies: the largest real ones have ~260k entries, and ids may leave a
// few gaps but not enough to make a tiny file allocate a huge table.
const (
	maxHFID  = 1 << 21
	maxHFGap = 1 << 16
)

// HF is a Hugging Face tokenizer.json byte-level BPE, as GPT-2, Llama-3, Qwen2/2.5 and
// DeepSeek use it: added tokens matched first (leftmost-longest), then on each stretch
// between them the normalizer, the pre-tokenizer, bytes mapped through GPT-2's
// bytes_to_unicode table, BPE merges by rank; the ByteLevel decoder back.
//
// Supported: normalizer null, NFC, NFD, NFKC, NFKD or a Sequence of them (added tokens not
// marked "normalized" are then found before normalizing, the others after, as in HF);
// pre_tokenizer ByteLevel (with or without its GPT-2 regex and prefix space) after any number
// of Split steps, a Split having a Regex or String pattern, any behavior (Isolated, Removed,
// MergedWithPrevious, MergedWithNext, Contiguous) and invert. The Llama-3 and Qwen2 Split
// patterns run on hand-written splitters; other regexes on regexp2, refused when they use
// a construct that it reads differently from Oniguruma, HF's engine. Decoder: ByteLevel,
// alone or as the only step of a Sequence. Files with any other model, normalizer,
// pre-tokenizer or decoder are refused with ErrUnsupported.
//
// Character classes follow Go's unicode package (Unicode 15.0); HF's Oniguruma 6.9.8 has
// Unicode 14.0, so the few letters and digits new in 15.0 (e.g. CJK Extension H, Kawi)
// can split differently. Text that is not valid UTF-8, which HF cannot take, is encoded
// with each bad byte as a symbol that is neither letter, digit nor space.
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
	all       addedIndex // every added token, when there is no normalizer
	raw, nrm  addedIndex // with a normalizer: the tokens matched before it, and after it
	norms     []norm.Form
	splits    []*splitStep // Split pre-tokenizers, before ByteLevel
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
	normalized                 bool // matched in normalized text (content normalized too)
}

// addedIndex finds added tokens by the first byte of their content.
type addedIndex struct {
	list    []hfAdded
	byFirst map[byte][]int // first byte of content -> indices into list, longest first
}

func newAddedIndex(list []hfAdded) addedIndex {
	ix := addedIndex{list: list, byFirst: map[byte][]int{}}
	for i := range list {
		c := list[i].content[0]
		ix.byFirst[c] = append(ix.byFirst[c], i)
	}
	for _, l := range ix.byFirst {
		sort.SliceStable(l, func(i, j int) bool { return len(list[l[i]].content) > len(list[l[j]].content) })
	}
	return ix
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
	splits         []*splitStep
	norms          []norm.Form
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
		Normalized *bool  `json:"normalized"`
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
	Type     string            `json:"type"`
	Decoders []json.RawMessage `json:"decoders"`
}

// hfPreTokenizer is any pre-tokenizer: the fields of ByteLevel, Split and Sequence.
type hfPreTokenizer struct {
	Type           string            `json:"type"`
	AddPrefixSpace *bool             `json:"add_prefix_space"`
	UseRegex       *bool             `json:"use_regex"`
	PreTokenizers  []json.RawMessage `json:"pretokenizers"`
	Pattern        *struct {
		Regex  *string `json:"Regex"`
		String *string `json:"String"`
	} `json:"pattern"`
	Behavior string `json:"behavior"`
	Invert   bool   `json:"invert"`
}

func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}

// decoderComponent parses the decoder object, unwrapping a Sequence of one.
func decoderComponent(raw json.RawMessage) (*hfComponent, error) {
	var c hfComponent
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("%w: tokenizer.json: decoder: %w", ErrMalformed, err)
	}
	if c.Type == "Sequence" {
		if len(c.Decoders) == 0 {
			return nil, nil
		}
		if len(c.Decoders) != 1 {
			return nil, fmt.Errorf("%w: tokenizer.json: decoder Sequence of %d steps (only a single ByteLevel is supported)",
				ErrUnsupported, len(c.Decoders))
		}
		return decoderComponent(c.Decoders[0])
	}
	return &c, nil
}

// flattenPreTokenizers appends the steps of a pre-tokenizer, nested Sequences flattened.
func flattenPreTokenizers(raw json.RawMessage, out []hfPreTokenizer) ([]hfPreTokenizer, error) {
	var p hfPreTokenizer
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, fmt.Errorf("%w: tokenizer.json: pre_tokenizer: %w", ErrMalformed, err)
	}
	if p.Type != "Sequence" {
		return append(out, p), nil
	}
	for _, sub := range p.PreTokenizers {
		var err error
		if out, err = flattenPreTokenizers(sub, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// parsePreTokenizer fills spec's pre-tokenization from a pre_tokenizer: Split steps, then
// one ByteLevel last. ByteLevel maps bytes to characters, so a Split after it would see
// "Ġ" instead of " "; that order, and every other pre-tokenizer, is refused.
func parsePreTokenizer(raw json.RawMessage, spec *hfSpec) error {
	if isNull(raw) {
		return fmt.Errorf("%w: tokenizer.json: no pre_tokenizer (only ByteLevel, after Split steps, is supported)", ErrUnsupported)
	}
	steps, err := flattenPreTokenizers(raw, nil)
	if err != nil {
		return err
	}
	if len(steps) == 0 {
		return fmt.Errorf("%w: tokenizer.json: empty pre_tokenizer Sequence", ErrUnsupported)
	}
	for i, p := range steps {
		switch {
		case p.Type == "Metaspace":
			return fmt.Errorf("%w: tokenizer.json: Metaspace pre-tokenizer (a SentencePiece-style vocabulary; use its tokenizer.bin or a byte-level BPE)", ErrUnsupported)
		case p.Type == "Split" && i < len(steps)-1:
			if p.Pattern == nil {
				return fmt.Errorf("%w: tokenizer.json: Split without a pattern", ErrMalformed)
			}
			st, err := newSplitStep(p.Pattern.Regex, p.Pattern.String, p.Behavior, p.Invert)
			if err != nil {
				return err
			}
			spec.splits = append(spec.splits, st)
		case p.Type == "ByteLevel" && i == len(steps)-1:
			spec.addPrefixSpace = p.AddPrefixSpace == nil || *p.AddPrefixSpace // HF's default is true
			spec.useRegex = p.UseRegex == nil || *p.UseRegex
		case p.Type == "Split" || p.Type == "ByteLevel":
			return fmt.Errorf("%w: tokenizer.json: pre_tokenizer %s at step %d of %d (only Split steps followed by one ByteLevel are supported)",
				ErrUnsupported, p.Type, i+1, len(steps))
		default:
			return fmt.Errorf("%w: tokenizer.json: pre_tokenizer %q (only Split and ByteLevel are supported)", ErrUnsupported, p.Type)
		}
	}
	return nil
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
		// A missing "normalized" is HF's AddedToken::from default: special tokens are not.
		normalized := !a.Special
		if a.Normalized != nil {
			normalized = *a.Normalized
		}
		spec.added = append(spec.added, hfAdded{id: int(*a.ID), content: a.Content, singleWord: a.SingleWord,
			lstrip: a.Lstrip, rstrip: a.Rstrip, special: a.Special, normalized: normalized})
	}
	var err error
	if spec.norms, err = parseNormalizer(f.Normalizer, nil); err != nil {
		return nil, err
	}
	if err := parsePreTokenizer(f.PreTokenizer, &spec); err != nil {
		return nil, err
	}
	if isNull(f.Decoder) {
		return nil, fmt.Errorf("%w: tokenizer.json: no decoder (only ByteLevel is supported)", ErrUnsupported)
	}
	dc, err := decoderComponent(f.Decoder)
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
		splits: spec.splits, norms: spec.norms, unk: -1, bos: -1, eos: -1, pad: -1,
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
	t.all = newAddedIndex(t.added)
	if len(t.norms) > 0 {
		// As HF's AddedVocabulary: tokens not marked normalized are found in the raw text,
		// the others in the normalized stretches between them, by their normalized content.
		var raw, nrm []hfAdded
		for _, a := range t.added {
			if !a.normalized {
				raw = append(raw, a)
			} else if a.content = t.normalize(a.content); a.content != "" {
				nrm = append(nrm, a)
			}
		}
		t.raw, t.nrm = newAddedIndex(raw), newAddedIndex(nrm)
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

// Merges returns the BPE merges as the file spells their pieces, in rank order (first merged
// first): what a converter to another format (GGUF's tokenizer.ggml.merges) needs.
func (t *HF) Merges() [][2]string {
	keys := make([]uint64, 0, len(t.merges))
	for k := range t.merges {
		keys = append(keys, k)
	}
	// Ranks can have gaps (a repeated merge keeps its later rank), so sort rather than index.
	sort.Slice(keys, func(i, j int) bool { return t.merges[keys[i]].rank < t.merges[keys[j]].rank })
	out := make([][2]string, len(keys))
	for i, k := range keys {
		out[i] = [2]string{t.pieces[k>>32], t.pieces[uint32(k)]}
	}
	return out
}

// IsSpecial reports whether id is an added token marked special in the file (control tokens
// such as <|endoftext|>), whether or not it is BOS, EOS or PAD.
func (t *HF) IsSpecial(id int) bool {
	for _, a := range t.added {
		if a.id == id {
			return a.special
		}
	}
	return false
}

// Encode splits text around added tokens (leftmost-longest; control tokens excepted), then
// normalizes, pre-tokenizes and BPE-encodes each stretch between them.
func (t *HF) Encode(text string) ([]int, error) {
	ids := make([]int, 0, len(text)/3+1)
	var sc hfScratch
	if len(t.norms) == 0 {
		return t.encodeAdded(ids, &sc, &t.all, text, false)
	}
	return t.encodeAdded(ids, &sc, &t.raw, text, true)
}

// EncodeProtected is Encode, except that special added tokens are not matched where they
// would overlap a protected byte range [start, end) of text: there their text is encoded as
// ordinary text, as transformers' split_special_tokens does for untrusted input. Chat
// templates use it so that only the template, never a message's content, puts special ids
// into a prompt.
func (t *HF) EncodeProtected(text string, protected [][2]int) ([]int, error) {
	ids := make([]int, 0, len(text)/3+1)
	sc := hfScratch{protected: protected}
	if len(t.norms) == 0 {
		return t.encodeAdded(ids, &sc, &t.all, text, false)
	}
	return t.encodeAdded(ids, &sc, &t.raw, text, true)
}

// hfScratch is the working memory of one Encode call, reused across its stretches.
type hfScratch struct {
	pieces, next, chunks []string
	spans                []span
	// protected are the byte ranges of the input where special tokens are not matched;
	// noSpecial disables them altogether (a normalized stretch that overlapped one, whose
	// offsets no longer match the input's).
	protected [][2]int
	noSpecial bool
}

// overlapsProtected reports whether [s, e) of the input overlaps a protected range.
func (sc *hfScratch) overlapsProtected(s, e int) bool {
	for _, p := range sc.protected {
		if s < p[1] && p[0] < e {
			return true
		}
	}
	return false
}

// encodeAdded encodes text, cutting out the added tokens of ix; with normalize, each stretch
// between them is normalized and cut again by the normalized added tokens.
func (t *HF) encodeAdded(ids []int, sc *hfScratch, ix *addedIndex, text string, normalize bool) ([]int, error) {
	for pos := 0; pos < len(text); {
		s, e, id, ok := t.findAdded(sc, ix, text, pos)
		if !ok {
			s, e = len(text), len(text)
		}
		var err error
		if normalize {
			// The normalized stretch has offsets of its own: protect all of it or none.
			saved := sc.noSpecial
			sc.noSpecial = saved || sc.overlapsProtected(pos, s)
			ids, err = t.encodeAdded(ids, sc, &t.nrm, t.normalize(text[pos:s]), false)
			sc.noSpecial = saved
		} else {
			ids, err = t.encodeSegment(ids, sc, text[pos:s])
		}
		if err != nil {
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
func (t *HF) findAdded(sc *hfScratch, ix *addedIndex, text string, from int) (start, end, id int, ok bool) {
	if len(ix.list) == 0 {
		return 0, 0, 0, false
	}
	for i := from; i < len(text); i++ {
		for _, ai := range ix.byFirst[text[i]] {
			a := &ix.list[ai]
			if t.IsControl(a.id) || !strings.HasPrefix(text[i:], a.content) {
				continue
			}
			if a.special && (sc.noSpecial || sc.overlapsProtected(i, i+len(a.content))) {
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

// encodeSegment pre-tokenizes and BPE-encodes a stretch of (normalized) text.
func (t *HF) encodeSegment(ids []int, sc *hfScratch, seg string) ([]int, error) {
	if seg == "" {
		return ids, nil
	}
	if len(t.splits) == 0 {
		return t.encodeByteLevel(ids, sc, seg)
	}
	sc.pieces = append(sc.pieces[:0], seg)
	for _, st := range t.splits {
		sc.next = sc.next[:0]
		for _, p := range sc.pieces {
			var err error
			if sc.next, sc.spans, err = st.split(sc.next, p, sc.spans); err != nil {
				return nil, err
			}
		}
		sc.pieces, sc.next = sc.next, sc.pieces
	}
	for _, p := range sc.pieces {
		var err error
		if ids, err = t.encodeByteLevel(ids, sc, p); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// encodeByteLevel is the ByteLevel pre-tokenizer (prefix space, GPT-2 split) and BPE on one
// piece.
func (t *HF) encodeByteLevel(ids []int, sc *hfScratch, seg string) ([]int, error) {
	if t.prefixSp && seg[0] != ' ' {
		seg = " " + seg
	}
	if !t.useRegex {
		return t.bpe(ids, seg)
	}
	sc.chunks = splitGPT2(sc.chunks[:0], seg)
	for _, c := range sc.chunks {
		var err error
		if ids, err = t.bpe(ids, c); err != nil {
			return nil, err
		}
	}
	return ids, nil
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
