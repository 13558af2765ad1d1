package load

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// TokenizerConfigFile and ChatTemplateFile are the files beside a Hugging Face checkpoint that
// carry its chat template and special-token strings.
const (
	TokenizerConfigFile = "tokenizer_config.json"
	ChatTemplateFile    = "chat_template.jinja"
)

// ErrBadTokenizerConfig is returned (wrapped) when tokenizer_config.json or chat_template.jinja
// cannot be read or does not have the shape transformers writes.
var ErrBadTokenizerConfig = errors.New("load: bad tokenizer config")

// ChatConfig is what a checkpoint says about rendering chat: its Jinja chat template and the
// strings of its BOS and EOS tokens, which templates reference as bos_token and eos_token.
// Empty fields mean the checkpoint does not set them.
type ChatConfig struct {
	Template string
	BOSToken string
	EOSToken string
}

// ReadChatConfig reads dir's tokenizer_config.json the way transformers does: chat_template is
// a string or a list of {"name","template"} entries (the "default" one is taken), and
// bos_token / eos_token are strings or AddedToken objects ({"content": ...}). A
// chat_template.jinja beside it takes precedence over chat_template, as in transformers.
// Missing files mean no template (a zero ChatConfig); a file that is present but unreadable or
// malformed is an error wrapping ErrBadTokenizerConfig.
func ReadChatConfig(dir string) (ChatConfig, error) {
	var cc ChatConfig
	path := filepath.Join(dir, TokenizerConfigFile)
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return cc, fmt.Errorf("%w: %w", ErrBadTokenizerConfig, err)
	default:
		if cc, err = parseTokenizerConfig(b); err != nil {
			return ChatConfig{}, fmt.Errorf("%w: %s: %w", ErrBadTokenizerConfig, path, err)
		}
	}
	jpath := filepath.Join(dir, ChatTemplateFile)
	t, err := os.ReadFile(jpath)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return ChatConfig{}, fmt.Errorf("%w: %w", ErrBadTokenizerConfig, err)
	default:
		cc.Template = string(t)
	}
	return cc, nil
}

// parseTokenizerConfig decodes the chat fields of a tokenizer_config.json.
func parseTokenizerConfig(b []byte) (ChatConfig, error) {
	var raw struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
		BOSToken     json.RawMessage `json:"bos_token"`
		EOSToken     json.RawMessage `json:"eos_token"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return ChatConfig{}, fmt.Errorf("not a JSON object: %w", err)
	}
	var cc ChatConfig
	var err error
	if cc.Template, err = parseTemplateField(raw.ChatTemplate); err != nil {
		return ChatConfig{}, err
	}
	if cc.BOSToken, err = parseTokenField("bos_token", raw.BOSToken); err != nil {
		return ChatConfig{}, err
	}
	if cc.EOSToken, err = parseTokenField("eos_token", raw.EOSToken); err != nil {
		return ChatConfig{}, err
	}
	return cc, nil
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// parseTemplateField decodes chat_template: a string, or HF's list of named templates, of
// which "default" is the one apply_chat_template uses without a name.
func parseTemplateField(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var list []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return "", fmt.Errorf("chat_template must be a string or a list of {\"name\", \"template\"} objects: %w", err)
	}
	names := make([]string, 0, len(list))
	for _, e := range list {
		if e.Name == "default" {
			return e.Template, nil
		}
		names = append(names, e.Name)
	}
	return "", fmt.Errorf("chat_template lists named templates %q but none is named \"default\"", names)
}

// parseTokenField decodes a special token: a string or an AddedToken object.
func parseTokenField(name string, raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var tok struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(raw, &tok); err != nil || tok.Content == nil {
		return "", fmt.Errorf("%s must be a string or an object with a string \"content\"", name)
	}
	return *tok.Content, nil
}
