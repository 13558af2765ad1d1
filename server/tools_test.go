package server_test

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/weights"
	"github.com/rolloutkit/rollout/trainer"
)

// byteIDs are the builtin tiny model's token ids of s (its vocabulary is bytes).
func byteIDs(s string) []int {
	ids := make([]int, len(s))
	for i := range len(s) {
		ids[i] = int(s[i])
	}
	return ids
}

// tinyEOS is the builtin tiny vocabulary's EOS id.
const tinyEOS = 257

// The conversation the tool tests teach the model: a question, its call, the tool's answer and
// the final answer.
const (
	toolQuestion = "What is 2+3?"
	toolCallText = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}\n</tool_call>"
	toolAnswer   = "The answer is 5."
)

// teachTools fine-tunes the server's model (builtin tiny, seed 1) so that greedy decoding
// answers the question's prompt with toolCallText and the follow-up's (after the tool's
// result) with toolAnswer, and moves the server to those weights: a real model emits the
// calls the tests parse. The prompts are what the server rendered for the client's own
// requests (a client's key order reaches the template, as with transformers).
func teachTools(t *testing.T, ts *testServer, question, followUp []int) {
	t.Helper()
	ex := []trainer.Example{
		{Prompt: question, Completion: append(byteIDs(toolCallText), tinyEOS)},
		{Prompt: followUp, Completion: append(byteIDs(toolAnswer), tinyEOS)},
	}
	w, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	tr, err := trainer.New(w, trainer.Config{LR: 3e-3, Workers: 2, MaxGradNorm: 1})
	require.NoError(t, err)
	defer tr.Close()
	for step := 0; ; step++ {
		st, err := tr.SupervisedStep(t.Context(), ex)
		require.NoError(t, err)
		// The summed NLL below 0.3 puts every target token above probability 0.74: greedy
		// decoding then emits exactly the targets.
		if st.Loss*float64(st.Tokens) < 0.3 {
			t.Logf("taught in %d steps", step+1)
			break
		}
		require.Less(t, step, 1500, "the tiny model did not learn the tool conversation (loss %.4f)", st.Loss)
	}
	dir := filepath.Join(t.TempDir(), "taught")
	require.NoError(t, weights.SaveHF(dir, tr.Weights(), weights.F32))
	d, err := weights.Digest(t.Context(), dir)
	require.NoError(t, err)
	ts.doJSON(t, http.MethodPost, "/update_weights", map[string]any{"version": 2, "source": "file://" + dir, "sha256": d}, http.StatusOK, nil)
}

// promptOf returns the prompt token ids the server renders for a chat request.
func promptOf(t *testing.T, cl openai.Client, params openai.ChatCompletionNewParams) []int {
	t.Helper()
	params.MaxTokens = openai.Int(1)
	resp, err := cl.Chat.Completions.New(t.Context(), params, option.WithJSONSet("return_token_ids", true))
	require.NoError(t, err)
	var ex choiceExtras
	require.NoError(t, json.Unmarshal([]byte(resp.RawJSON()), &ex))
	require.NotEmpty(t, ex.PromptTokenIDs)
	return ex.PromptTokenIDs
}

func addTool() openai.ChatCompletionToolUnionParam {
	return openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{Name: "add", Description: openai.String("Add two integers."),
		Parameters: openai.FunctionParameters{"type": "object", "properties": map[string]any{"a": map[string]any{"type": "integer"},
			"b": map[string]any{"type": "integer"}}, "required": []string{"a", "b"}}})
}

// TestChatToolCallsOpenAIGo drives a tool-calling conversation with the official Go client:
// the model's call comes back as tool_calls with finish_reason "tool_calls", the client sends
// the call and the tool's result back, and the model answers; streamed, the accumulated
// chunks give the same call; tool_choice "none" gives the raw text, and a named tool_choice
// prefills the call.
func TestChatToolCallsOpenAIGo(t *testing.T) {
	ts := start(t, nil)
	cl := ts.openai()
	ctx := t.Context()
	params := openai.ChatCompletionNewParams{
		Model:       "builtin:tiny",
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.UserMessage(toolQuestion)},
		Tools:       []openai.ChatCompletionToolUnionParam{addTool()},
		Temperature: openai.Float(0),
		MaxTokens:   openai.Int(120),
	}
	call := openai.ChatCompletionAssistantMessageParam{ToolCalls: []openai.ChatCompletionMessageToolCallUnionParam{{
		OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{ID: "call_0",
			Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: "add", Arguments: `{"a": 2, "b": 3}`}}}}}
	follow := params
	follow.Messages = append(follow.Messages[:1:1], openai.ChatCompletionMessageParamUnion{OfAssistant: &call}, openai.ToolMessage("5", "call_0"))
	teachTools(t, ts, promptOf(t, cl, params), promptOf(t, cl, follow))

	resp, err := cl.Chat.Completions.New(ctx, params)
	require.NoError(t, err)
	require.Len(t, resp.Choices, 1)
	ch := resp.Choices[0]
	assert.Equal(t, "tool_calls", ch.FinishReason)
	assert.Empty(t, ch.Message.Content)
	assert.Contains(t, resp.RawJSON(), `"content":null`, "a message with only calls has null content, as OpenAI's")
	require.Len(t, ch.Message.ToolCalls, 1)
	got := ch.Message.ToolCalls[0]
	assert.Equal(t, "function", got.Type)
	assert.NotEmpty(t, got.ID)
	assert.Equal(t, "add", got.Function.Name)
	assert.JSONEq(t, `{"a": 2, "b": 3}`, got.Function.Arguments)

	// The client sends the call and the tool's result back; the model answers.
	params.Messages = append(params.Messages, ch.Message.ToParam(), openai.ToolMessage("5", got.ID))
	resp2, err := cl.Chat.Completions.New(ctx, params)
	require.NoError(t, err)
	assert.Equal(t, "stop", resp2.Choices[0].FinishReason)
	assert.Equal(t, toolAnswer, resp2.Choices[0].Message.Content)
	assert.Empty(t, resp2.Choices[0].Message.ToolCalls)

	// Streamed: the accumulator rebuilds the same call.
	params.Messages = params.Messages[:1]
	stream := cl.Chat.Completions.NewStreaming(ctx, params)
	acc := openai.ChatCompletionAccumulator{}
	finished := false
	for stream.Next() {
		acc.AddChunk(stream.Current())
		if tc, ok := acc.JustFinishedToolCall(); ok {
			finished = true
			assert.Equal(t, "add", tc.Name)
			assert.JSONEq(t, `{"a": 2, "b": 3}`, tc.Arguments)
		}
	}
	require.NoError(t, stream.Err())
	require.Len(t, acc.Choices, 1)
	assert.Equal(t, "tool_calls", acc.Choices[0].FinishReason)
	require.Len(t, acc.Choices[0].Message.ToolCalls, 1)
	assert.Equal(t, "add", acc.Choices[0].Message.ToolCalls[0].Function.Name)
	assert.JSONEq(t, `{"a": 2, "b": 3}`, acc.Choices[0].Message.ToolCalls[0].Function.Arguments)
	assert.NotEmpty(t, acc.Choices[0].Message.ToolCalls[0].ID)
	_ = finished // JustFinishedToolCall reports a call once the next chunk starts; the last call ends the stream

	// tool_choice "none": the output is text, the call left unparsed.
	none := params
	none.ToolChoice = openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("none")}
	resp3, err := cl.Chat.Completions.New(ctx, none)
	require.NoError(t, err)
	assert.Equal(t, "stop", resp3.Choices[0].FinishReason)
	assert.Equal(t, toolCallText, resp3.Choices[0].Message.Content)
	assert.Empty(t, resp3.Choices[0].Message.ToolCalls)

	// A named tool_choice prefills the call's opening; "required" prefills <tool_call>.
	for _, choice := range []openai.ChatCompletionToolChoiceOptionUnionParam{
		openai.ToolChoiceOptionFunctionToolChoice(openai.ChatCompletionNamedToolChoiceFunctionParam{Name: "add"}),
		{OfAuto: openai.String("required")},
	} {
		forced := params
		forced.ToolChoice = choice
		resp4, err := cl.Chat.Completions.New(ctx, forced, option.WithJSONSet("return_token_ids", true))
		require.NoError(t, err)
		require.Len(t, resp4.Choices[0].Message.ToolCalls, 1)
		assert.Equal(t, "add", resp4.Choices[0].Message.ToolCalls[0].Function.Name)
		assert.JSONEq(t, `{"a": 2, "b": 3}`, resp4.Choices[0].Message.ToolCalls[0].Function.Arguments)
		assert.Equal(t, "tool_calls", resp4.Choices[0].FinishReason)
	}

	// Every choice with tools on was counted: two 1-token prompt probes and the answer were
	// text, the call four times (plain, streamed, named, required); "none" is not parsed.
	m := ts.metrics(t)
	assert.EqualValues(t, 4, metricValue(t, m, `rollout_chat_tool_outputs_total{outcome="calls"}`))
	assert.EqualValues(t, 3, metricValue(t, m, `rollout_chat_tool_outputs_total{outcome="text"}`))
	assert.EqualValues(t, 0, metricValue(t, m, `rollout_chat_tool_outputs_total{outcome="malformed"}`))
}

// TestChatToolsValidation: every malformed tools / tool_choice / tool-call message is a 400
// in the JSON error shape naming the field, and nothing is generated.
func TestChatToolsValidation(t *testing.T) {
	ts := start(t, nil)
	user := []any{map[string]any{"role": "user", "content": "hi"}}
	fn := func(name string, params any) map[string]any {
		f := map[string]any{"name": name}
		if params != nil {
			f["parameters"] = params
		}
		return map[string]any{"type": "function", "function": f}
	}
	for _, tc := range []struct {
		name  string
		body  map[string]any
		param string
		want  string
	}{
		{"tools not a list", map[string]any{"tools": "add"}, "tools", "list"},
		{"tool not an object", map[string]any{"tools": []any{3}}, "tools", "object"},
		{"tool type", map[string]any{"tools": []any{map[string]any{"type": "code", "function": map[string]any{"name": "f"}}}}, "tools", `"function"`},
		{"no function", map[string]any{"tools": []any{map[string]any{"type": "function"}}}, "tools", "name is required"},
		{"bad name", map[string]any{"tools": []any{fn("a b", nil)}}, "tools", "letters"},
		{"long name", map[string]any{"tools": []any{fn(strings.Repeat("x", 65), nil)}}, "tools", "letters"},
		{"parameters not an object", map[string]any{"tools": []any{fn("f", []int{1})}}, "tools", "JSON Schema object"},
		{"description not a string", map[string]any{"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "f", "description": 3}}}}, "tools", "string"},
		{"duplicate", map[string]any{"tools": []any{fn("f", nil), fn("f", nil)}}, "tools", "second function"},
		{"choice without tools", map[string]any{"tool_choice": "auto"}, "tool_choice", "only allowed when tools"},
		{"choice unknown", map[string]any{"tools": []any{fn("f", nil)}, "tool_choice": "always"}, "tool_choice", "none"},
		{"choice bad shape", map[string]any{"tools": []any{fn("f", nil)}, "tool_choice": map[string]any{"type": "function"}}, "tool_choice", "name"},
		{"choice names a stranger", map[string]any{"tools": []any{fn("f", nil)}, "tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "g"}}}, "tool_choice", "not among"},
		{"call arguments not an object", map[string]any{"tools": []any{fn("f", nil)}, "messages": []any{map[string]any{"role": "user", "content": "q"},
			map[string]any{"role": "assistant", "tool_calls": []any{map[string]any{"id": "c", "type": "function", "function": map[string]any{"name": "f", "arguments": "[1]"}}}}}}, "messages", "JSON object"},
		{"call arguments not JSON", map[string]any{"tools": []any{fn("f", nil)}, "messages": []any{map[string]any{"role": "user", "content": "q"},
			map[string]any{"role": "assistant", "tool_calls": []any{map[string]any{"id": "c", "type": "function", "function": map[string]any{"name": "f", "arguments": "{a"}}}}}}, "messages", "JSON object"},
		{"call on a user message", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "q",
			"tool_calls": []any{map[string]any{"id": "c", "type": "function", "function": map[string]any{"name": "f", "arguments": "{}"}}}}}}, "messages", "only assistant"},
		{"call with a bad name", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "q"},
			map[string]any{"role": "assistant", "tool_calls": []any{map[string]any{"id": "c", "type": "function", "function": map[string]any{"name": "", "arguments": "{}"}}}}}}, "messages", "function name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := map[string]any{"model": "builtin:tiny", "messages": user, "max_tokens": 2}
			for k, v := range tc.body {
				body[k] = v
			}
			code, out := ts.do(t, http.MethodPost, "/v1/chat/completions", "", body)
			require.Equal(t, http.StatusBadRequest, code, string(out))
			var e struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
					Param   string `json:"param"`
					Code    string `json:"code"`
				} `json:"error"`
			}
			require.NoError(t, json.Unmarshal(out, &e), string(out))
			assert.Equal(t, "invalid_request_error", e.Error.Type)
			assert.Equal(t, tc.param, e.Error.Param)
			assert.NotEmpty(t, e.Error.Code)
			assert.Contains(t, e.Error.Message, tc.want)
		})
	}
}

// nodeToolsJSON is the tools list the Node test sends, as text: the template sees the keys in
// this order whichever client sends it.
const nodeToolsJSON = `[{"type": "function", "function": {"name": "add", "description": "Add two integers.", ` +
	`"parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]`

// TestChatToolCallsOpenAINode runs the same conversation with the official OpenAI Node client
// (npm's openai, installed into a temporary directory): tool_calls and finish_reason
// "tool_calls", the follow-up answer, a streamed call rebuilt by the client's stream helper,
// and a bad tool_choice surfacing as the client's 400 error. Skipped without node and npm.
func TestChatToolCallsOpenAINode(t *testing.T) {
	if testing.Short() {
		t.Skip("installs an npm package")
	}
	node, errNode := exec.LookPath("node")
	npm, errNpm := exec.LookPath("npm")
	if errNode != nil || errNpm != nil {
		t.Skip("node and npm are needed for the OpenAI Node client test (apt-get install nodejs npm)")
	}
	dir := t.TempDir()
	install := exec.CommandContext(t.Context(), npm, "install", "--no-audit", "--no-fund", "--silent", "openai@^6")
	install.Dir = dir
	if out, err := install.CombinedOutput(); err != nil {
		t.Skipf("npm install openai failed (no registry access?): %v\n%s", err, out)
	}
	script, err := os.ReadFile(filepath.Join("testdata", "openai_tools.mjs"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "openai_tools.mjs"), script, 0o644))

	ts := start(t, nil)
	promptFor := func(msgs string) []int {
		body := `{"model": "builtin:tiny", "max_tokens": 1, "return_token_ids": true, "tools": ` + nodeToolsJSON + `, "messages": ` + msgs + `}`
		var out struct {
			PromptTokenIDs []int `json:"prompt_token_ids"`
		}
		ts.doJSON(t, http.MethodPost, "/v1/chat/completions", json.RawMessage(body), http.StatusOK, &out)
		return out.PromptTokenIDs
	}
	q := `[{"role": "user", "content": "` + toolQuestion + `"}]`
	follow := `[{"role": "user", "content": "` + toolQuestion + `"}, {"role": "assistant", "content": null, "tool_calls": ` +
		`[{"id": "c", "type": "function", "function": {"name": "add", "arguments": "{\"a\":2,\"b\":3}"}}]}, {"role": "tool", "tool_call_id": "c", "content": "5"}]`
	teachTools(t, ts, promptFor(q), promptFor(follow))

	run := exec.CommandContext(t.Context(), node, "openai_tools.mjs")
	run.Dir = dir
	run.Env = append(os.Environ(), "ROLLOUT_URL="+ts.url, "TOOLS_JSON="+nodeToolsJSON)
	var stderr strings.Builder
	run.Stderr = &stderr
	out, err := run.Output()
	require.NoError(t, err, "node: %s", stderr.String())
	type call struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	}
	var got struct {
		First struct {
			Finish    string  `json:"finish"`
			Content   *string `json:"content"`
			ToolCalls []call  `json:"tool_calls"`
		} `json:"first"`
		Second struct {
			Finish  string `json:"finish"`
			Content string `json:"content"`
		} `json:"second"`
		Streamed struct {
			Finish    string `json:"finish"`
			ToolCalls []call `json:"tool_calls"`
		} `json:"streamed"`
		BadRequest *struct {
			Status  int    `json:"status"`
			Type    string `json:"type"`
			Param   string `json:"param"`
			Message string `json:"message"`
		} `json:"badRequest"`
	}
	require.NoError(t, json.Unmarshal(out, &got), string(out))
	assert.Equal(t, "tool_calls", got.First.Finish)
	assert.Nil(t, got.First.Content)
	require.Len(t, got.First.ToolCalls, 1)
	assert.NotEmpty(t, got.First.ToolCalls[0].ID)
	assert.Equal(t, "function", got.First.ToolCalls[0].Type)
	assert.Equal(t, "add", got.First.ToolCalls[0].Function.Name)
	assert.JSONEq(t, `{"a": 2, "b": 3}`, got.First.ToolCalls[0].Function.Arguments)
	assert.Equal(t, "stop", got.Second.Finish)
	assert.Equal(t, toolAnswer, got.Second.Content)
	assert.Equal(t, "tool_calls", got.Streamed.Finish)
	require.Len(t, got.Streamed.ToolCalls, 1)
	assert.Equal(t, "add", got.Streamed.ToolCalls[0].Function.Name)
	assert.JSONEq(t, `{"a": 2, "b": 3}`, got.Streamed.ToolCalls[0].Function.Arguments)
	require.NotNil(t, got.BadRequest)
	assert.Equal(t, http.StatusBadRequest, got.BadRequest.Status)
	assert.Equal(t, "invalid_request_error", got.BadRequest.Type)
	assert.Equal(t, "tool_choice", got.BadRequest.Param)
}
