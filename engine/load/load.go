package load

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/tokenizer"
	"github.com/rolloutkit/rollout/engine/weights"
)

// ErrBadSpec is returned (wrapped) for a model spec that names nothing loadable.
var ErrBadSpec = errors.New("load: bad model spec")

// DefaultSeed is the seed of `builtin:NAME` without an explicit `@SEED`.
const DefaultSeed = 1

// DefaultSpec is the model spec a server or the CLI uses when none is given: the tiny builtin
// model, which needs no files.
const DefaultSpec = "builtin:tiny"

// Model is a resolved model: its weights, its tokenizer and where they came from.
type Model struct {
	Spec      string
	Weights   *model.Weights
	Tokenizer tokenizer.Tokenizer
	// ChatTemplate is the checkpoint's Jinja chat template (tokenizer_config.json's
	// chat_template, or chat_template.jinja), empty when it has none.
	ChatTemplate string
	// BOSToken and EOSToken are tokenizer_config.json's bos_token and eos_token strings (what
	// chat templates see as bos_token and eos_token), empty when it does not set them.
	BOSToken, EOSToken string
}

// Open resolves spec. tokenizerPath, when not empty, overrides the tokenizer found beside the
// checkpoint.
func Open(spec, tokenizerPath string) (*Model, error) {
	m := &Model{Spec: spec}
	var err error
	switch {
	case strings.HasPrefix(spec, "builtin:"):
		err = m.openBuiltin(strings.TrimPrefix(spec, "builtin:"))
	case spec == "":
		return nil, fmt.Errorf("%w: empty", ErrBadSpec)
	default:
		err = m.openPath(spec)
	}
	if err != nil {
		return nil, err
	}
	if tokenizerPath != "" {
		if m.Tokenizer, err = tokenizer.Load(tokenizerPath, m.Weights.Config.VocabSize); err != nil {
			return nil, fmt.Errorf("load: tokenizer %s: %w", tokenizerPath, err)
		}
	}
	if m.Tokenizer.VocabSize() > m.Weights.Config.VocabSize {
		return nil, fmt.Errorf("load: tokenizer has %d tokens but the model only %d", m.Tokenizer.VocabSize(), m.Weights.Config.VocabSize)
	}
	// A llama2.c .bin has no special-token fields (it implies 1 and 2): the tokenizer knows.
	if b := m.Tokenizer.BOS(); b >= 0 {
		m.Weights.Config.BOSTokenID = b
	}
	if e := m.Tokenizer.EOS(); e >= 0 {
		m.Weights.Config.EOSTokenID = e
	}
	return m, nil
}

func (m *Model) openBuiltin(rest string) error {
	name, seedStr, hasSeed := strings.Cut(rest, "@")
	seed := uint64(DefaultSeed)
	if hasSeed {
		s, err := strconv.ParseUint(seedStr, 10, 64)
		if err != nil {
			return fmt.Errorf("%w: builtin seed %q: %w", ErrBadSpec, seedStr, err)
		}
		seed = s
	}
	w, err := model.Preset(name, seed)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBadSpec, err)
	}
	m.Weights = w
	m.Tokenizer, err = BuiltinTokenizer(w.Config)
	return err
}

// BuiltinTokenizer is the tokenizer a preset of config c uses: byte-level for a 259-token
// vocabulary, otherwise the deterministic synthetic vocabulary of that size.
func BuiltinTokenizer(c model.Config) (tokenizer.Tokenizer, error) {
	if c.VocabSize == model.TinyVocab {
		return tokenizer.NewByte(), nil
	}
	return tokenizer.Synthetic(c.VocabSize)
}

func (m *Model) openPath(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBadSpec, err)
	}
	if st.IsDir() {
		if m.Weights, err = weights.LoadHF(path); err != nil {
			return err
		}
		var cc ChatConfig
		if cc, err = ReadChatConfig(path); err != nil {
			return err
		}
		m.ChatTemplate, m.BOSToken, m.EOSToken = cc.Template, cc.BOSToken, cc.EOSToken
		return m.tokenizerBeside(path, "tokenizer.json", "tokenizer.bin")
	}
	if strings.HasSuffix(path, ".bin") {
		if m.Weights, err = weights.LoadLlama2C(path); err != nil {
			return err
		}
		return m.tokenizerBeside(filepath.Dir(path), "tokenizer.bin", "tokenizer.json")
	}
	return fmt.Errorf("%w: %s is neither a checkpoint directory nor a llama2.c .bin file", ErrBadSpec, path)
}

// tokenizerBeside loads the first of names found in dir; with none, a byte-level vocabulary
// fits only a byte-level model.
func (m *Model) tokenizerBeside(dir string, names ...string) error {
	for _, n := range names {
		p := filepath.Join(dir, n)
		if _, err := os.Stat(p); err == nil {
			t, err := tokenizer.Load(p, m.Weights.Config.VocabSize)
			if err != nil {
				return fmt.Errorf("load: tokenizer %s: %w", p, err)
			}
			m.Tokenizer = t
			return nil
		}
	}
	if m.Weights.Config.VocabSize == model.TinyVocab {
		m.Tokenizer = tokenizer.NewByte()
		return nil
	}
	return fmt.Errorf("load: no tokenizer (%s) in %s: pass --tokenizer", strings.Join(names, ", "), dir)
}
