package load

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/weights"
)

// hfDir writes a tiny HF checkpoint (as `rollout model init --format hf` does; the byte-level
// vocabulary needs no tokenizer.json) with the given tokenizer_config.json, none when empty.
func hfDir(t *testing.T, tokenizerConfig string) string {
	t.Helper()
	w, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, weights.SaveHF(dir, w, weights.F32))
	if tokenizerConfig != "" {
		require.NoError(t, os.WriteFile(filepath.Join(dir, TokenizerConfigFile), []byte(tokenizerConfig), 0o644))
	}
	return dir
}

func TestChatConfigListFormAndAddedTokens(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "tokenizer_config_list.json"))
	require.NoError(t, err)
	m, err := Open(hfDir(t, string(b)), "")
	require.NoError(t, err)
	assert.Equal(t, "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}", m.ChatTemplate)
	assert.Equal(t, "<s>", m.BOSToken)
	assert.Equal(t, "</s>", m.EOSToken)
}

func TestChatConfigStringForms(t *testing.T) {
	m, err := Open(hfDir(t, `{"chat_template":"{{ messages }}","bos_token":"<|begin_of_text|>","eos_token":{"content":"<|eot_id|>","special":true}}`), "")
	require.NoError(t, err)
	assert.Equal(t, "{{ messages }}", m.ChatTemplate)
	assert.Equal(t, "<|begin_of_text|>", m.BOSToken)
	assert.Equal(t, "<|eot_id|>", m.EOSToken)

	// No file, or a file without the fields: no template, no error.
	for _, cfg := range []string{"", `{}`, `{"chat_template":null,"bos_token":null}`} {
		m, err := Open(hfDir(t, cfg), "")
		require.NoError(t, err, cfg)
		assert.Empty(t, m.ChatTemplate, cfg)
		assert.Empty(t, m.BOSToken, cfg)
	}
}

// TestChatTemplateFile: chat_template.jinja beside the config wins, as in transformers.
func TestChatTemplateFile(t *testing.T) {
	dir := hfDir(t, `{"chat_template":"old","eos_token":"</s>"}`)
	require.NoError(t, os.WriteFile(filepath.Join(dir, ChatTemplateFile), []byte("{{ messages[0].content }}\n"), 0o644))
	m, err := Open(dir, "")
	require.NoError(t, err)
	assert.Equal(t, "{{ messages[0].content }}\n", m.ChatTemplate)
	assert.Equal(t, "</s>", m.EOSToken)
}

func TestChatConfigMalformed(t *testing.T) {
	for _, tc := range []struct{ cfg, want string }{
		{`{"chat_template": "x"`, "not a JSON object"},
		{`[1, 2]`, "not a JSON object"},
		{`{"chat_template": 5}`, "chat_template must be a string or a list"},
		{`{"chat_template": [{"name":"tool_use","template":"x"}]}`, `none is named "default"`},
		{`{"bos_token": 1}`, "bos_token must be a string or an object"},
		{`{"eos_token": {"lstrip": false}}`, "eos_token must be a string or an object"},
	} {
		_, err := Open(hfDir(t, tc.cfg), "")
		require.ErrorIs(t, err, ErrBadTokenizerConfig, tc.cfg)
		assert.Contains(t, err.Error(), TokenizerConfigFile, tc.cfg)
		assert.Contains(t, err.Error(), tc.want, tc.cfg)
	}
}
