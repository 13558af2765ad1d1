package server_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/weights"
	"github.com/rolloutkit/rollout/server"
)

// templateCheckpoint writes builtin tiny weights as an HF checkpoint (what `rollout model init
// --format hf` writes; the byte-level vocabulary needs no tokenizer.json) with a
// tokenizer_config.json carrying the template in server/api/testdata/chat/file (or src when
// file is empty) and the given bos/eos strings.
func templateCheckpoint(t *testing.T, file, src, bos, eos string) string {
	t.Helper()
	if file != "" {
		b, err := os.ReadFile(filepath.Join("api", "testdata", "chat", file))
		require.NoError(t, err)
		src = string(b)
	}
	w, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, weights.SaveHF(dir, w, weights.F32))
	cfg, err := json.Marshal(map[string]any{"chat_template": src, "tokenizer_class": "PreTrainedTokenizerFast",
		"bos_token": bos, "eos_token": map[string]any{"content": eos, "special": true}})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), cfg, 0o644))
	return dir
}

type chatOut struct {
	PromptTokenIDs []int `json:"prompt_token_ids"`
	Choices        []struct {
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
		TokenIDs     []int  `json:"token_ids"`
	} `json:"choices"`
}

type errOut struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
	} `json:"error"`
}

// TestChatTemplateLlama3 serves a checkpoint with the Llama-3-Instruct template: /tokenize
// and chat prompts are its rendering, with the template's leading <|begin_of_text|> as the
// single BOS.
func TestChatTemplateLlama3(t *testing.T) {
	dir := templateCheckpoint(t, "llama3-instruct.jinja", "", "<|begin_of_text|>", "<|eot_id|>")
	ts := start(t, func(c *server.Config) { c.Model = dir })
	msgs := []map[string]any{{"role": "system", "content": "Be brief."}, {"role": "user", "content": " hi "}}
	rendered := "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>" +
		"<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
	want := textPrompt(rendered) // BOS id, then the bytes after <|begin_of_text|>

	var tok struct {
		Tokens []int `json:"tokens"`
		Count  int   `json:"count"`
	}
	ts.doJSON(t, http.MethodPost, "/tokenize", map[string]any{"messages": msgs}, http.StatusOK, &tok)
	assert.Equal(t, want, tok.Tokens)
	assert.Equal(t, len(want), tok.Count)
	// add_special_tokens=false changes nothing: the BOS is the template's.
	ts.doJSON(t, http.MethodPost, "/tokenize", map[string]any{"messages": msgs, "add_special_tokens": false}, http.StatusOK, &tok)
	assert.Equal(t, want, tok.Tokens)

	var out chatOut
	ts.doJSON(t, http.MethodPost, "/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 6,
		"temperature": 0, "ignore_eos": true, "return_token_ids": true}, http.StatusOK, &out)
	assert.Equal(t, want, out.PromptTokenIDs)
	require.Len(t, out.Choices, 1)
	assert.Equal(t, "assistant", out.Choices[0].Message.Role)
	assert.Equal(t, inProcess(t, want, 6), out.Choices[0].TokenIDs)
}

// TestChatTemplateRejects: a conversation the template raises on (Llama-2-chat: roles must
// alternate) is a 400 on "messages", and the server goes on serving good ones.
func TestChatTemplateRejects(t *testing.T) {
	dir := templateCheckpoint(t, "llama2-chat.jinja", "", "<s>", "</s>")
	ts := start(t, func(c *server.Config) { c.Model = dir })
	bad := []map[string]any{{"role": "user", "content": "a"}, {"role": "user", "content": "b"}}
	for _, path := range []string{"/v1/chat/completions", "/tokenize"} {
		code, body := ts.do(t, http.MethodPost, path, "", map[string]any{"messages": bad, "max_tokens": 2})
		require.Equal(t, http.StatusBadRequest, code, "%s: %s", path, body)
		var e errOut
		require.NoError(t, json.Unmarshal(body, &e), "%s", body)
		assert.Equal(t, "invalid_request_error", e.Error.Type)
		require.NotNil(t, e.Error.Param, "%s", body)
		assert.Equal(t, "messages", *e.Error.Param)
		assert.Contains(t, e.Error.Message, "Conversation roles must alternate")
	}

	good := []map[string]any{{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}}
	var out chatOut
	ts.doJSON(t, http.MethodPost, "/v1/chat/completions", map[string]any{"messages": good, "max_tokens": 3,
		"ignore_eos": true, "return_token_ids": true}, http.StatusOK, &out)
	assert.Equal(t, textPrompt("[INST] <<SYS>>\nS\n<</SYS>>\n\nQ [/INST]"), out.PromptTokenIDs)
	require.Len(t, out.Choices, 1)
	assert.Len(t, out.Choices[0].TokenIDs, 3)
}

// TestChatTemplateBrokenRefusesStart: a template that does not compile stops server.New with
// an error that names it.
func TestChatTemplateBrokenRefusesStart(t *testing.T) {
	dir := templateCheckpoint(t, "", "{% for m in messages %}{{ m.content }}", "<s>", "</s>")
	_, err := server.New(server.Config{Model: dir, Addr: "127.0.0.1:0", KVBlocks: 64, Logger: quietLogger(), ShutdownGrace: time.Second})
	require.Error(t, err)
	assert.True(t, strings.Contains(err.Error(), "chat template") && strings.Contains(err.Error(), "does not compile"), err.Error())
}
