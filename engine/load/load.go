package load

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/rolloutkit/rollout/engine/kernels"
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
	Spec string
	// Config is the model's configuration, with the tokenizer's special tokens.
	Config model.Config
	// Weights holds the weights, or, for a checkpoint directory opened by OpenAs below F32,
	// Builder does (the engine's engine.Config.Builder) and Weights is nil.
	Weights   *model.Weights
	Builder   *model.Builder
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
	return OpenAs(spec, tokenizerPath, kernels.F32)
}

// OpenAs is Open for a model served at precision prec: below F32 a checkpoint directory is
// loaded into a model.Builder one tensor at a time (Model.Builder), so that no float32 set of
// it exists; builtin presets and llama2.c files, which are float32, load whole.
func OpenAs(spec, tokenizerPath string, prec kernels.Precision) (*Model, error) {
	m := &Model{Spec: spec}
	var err error
	switch {
	case strings.HasPrefix(spec, "builtin:"):
		err = m.openBuiltin(strings.TrimPrefix(spec, "builtin:"))
	case spec == "":
		return nil, fmt.Errorf("%w: empty", ErrBadSpec)
	default:
		err = m.openPath(spec, prec)
	}
	if err != nil {
		return nil, err
	}
	if m.Weights != nil {
		m.Config = m.Weights.Config
	}
	if tokenizerPath != "" {
		if m.Tokenizer, err = tokenizer.Load(tokenizerPath, m.Config.VocabSize); err != nil {
			return nil, fmt.Errorf("load: tokenizer %s: %w", tokenizerPath, err)
		}
	}
	if m.Tokenizer.VocabSize() > m.Config.VocabSize {
		return nil, fmt.Errorf("load: tokenizer has %d tokens but the model only %d", m.Tokenizer.VocabSize(), m.Config.VocabSize)
	}
	// A llama2.c .bin has no special-token fields (it implies 1 and 2): the tokenizer knows.
	if b := m.Tokenizer.BOS(); b >= 0 {
		m.Config.BOSTokenID = b
	}
	if e := m.Tokenizer.EOS(); e >= 0 {
		m.Config.EOSTokenID = e
	}
	if m.Weights != nil {
		m.Weights.Config = m.Config
	} else if err := m.Builder.SetConfig(m.Config); err != nil {
		return nil, err
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

func (m *Model) openPath(path string, prec kernels.Precision) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBadSpec, err)
	}
	if st.IsDir() {
		if llama2c := filepath.Join(path, "model.bin"); !exists(filepath.Join(path, "config.json")) && exists(llama2c) {
			// What `rollout model init --format llama2c --out dir` writes: dir names it.
			path = llama2c
		}
	}
	if st.IsDir() && !strings.HasSuffix(path, ".bin") {
		if err := m.openHF(path, prec); err != nil {
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
		m.Config = m.Weights.Config
		return m.tokenizerBeside(filepath.Dir(path), "tokenizer.bin", "tokenizer.json")
	}
	return fmt.Errorf("%w: %s is neither a checkpoint directory (HF, or llama2.c with model.bin) nor a llama2.c .bin file", ErrBadSpec, path)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// openHF loads the checkpoint directory path: whole at F32, into a Builder below.
func (m *Model) openHF(path string, prec kernels.Precision) error {
	if prec == kernels.F32 {
		w, err := weights.LoadHF(path)
		if err != nil {
			return err
		}
		m.Weights, m.Config = w, w.Config
		return nil
	}
	c, err := weights.ReadHFConfig(path)
	if err != nil {
		return err
	}
	b, err := model.NewBuilder(c, prec, nil)
	if err != nil {
		return fmt.Errorf("load: %s: %w", path, err)
	}
	if err := weights.LoadHFInto(path, b); err != nil {
		return err
	}
	m.Builder, m.Config = b, b.Config()
	return nil
}

// tokenizerBeside loads the first of names found in dir; with none, a byte-level vocabulary
// fits only a byte-level model.
func (m *Model) tokenizerBeside(dir string, names ...string) error {
	for _, n := range names {
		p := filepath.Join(dir, n)
		if _, err := os.Stat(p); err == nil {
			t, err := tokenizer.Load(p, m.Config.VocabSize)
			if err != nil {
				return fmt.Errorf("load: tokenizer %s: %w", p, err)
			}
			m.Tokenizer = t
			return nil
		}
	}
	if m.Config.VocabSize == model.TinyVocab {
		m.Tokenizer = tokenizer.NewByte()
		return nil
	}
	return fmt.Errorf("load: no tokenizer (%s) in %s: pass --tokenizer", strings.Join(names, ", "), dir)
}
