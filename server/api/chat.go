package api

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/sample"
	"github.com/rolloutkit/rollout/sdk/protocol"
)

// chatRequest is POST /v1/chat/completions; the sampling fields are sample.Params' JSON names.
type chatRequest struct {
	sample.Params
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	N                   int             `json:"n"`
	Stop                json.RawMessage `json:"stop"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	CacheSalt           string          `json:"cache_salt"`
	ReturnTokenIDs      bool            `json:"return_token_ids"`
	RequestID           string          `json:"request_id"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	// Logprobs shadows Params.Logprobs: in chat it is a bool, and top_logprobs the count.
	Logprobs    *bool `json:"logprobs"`
	TopLogprobs *int  `json:"top_logprobs"`
	// Tools and ToolChoice are OpenAI's function calling (see parseTools);
	// ParallelToolCalls is accepted and not enforced.
	Tools             json.RawMessage `json:"tools"`
	ToolChoice        json.RawMessage `json:"tool_choice"`
	ParallelToolCalls *bool           `json:"parallel_tool_calls"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	// ToolCalls are an assistant message's calls; ToolCallID and Name say which call a tool
	// message answers.
	ToolCalls  []chatToolCallIn `json:"tool_calls,omitempty"`
	ToolCallID string           `json:"tool_call_id,omitempty"`
	Name       string           `json:"name,omitempty"`
}

// chatMsgOut is a stream delta.
type chatMsgOut struct {
	Role      string        `json:"role,omitempty"`
	Content   *string       `json:"content,omitempty"`
	ToolCalls []toolCallOut `json:"tool_calls,omitempty"`
}

// chatMessageOut is a whole response message: content is null when the model only called
// tools, as OpenAI answers.
type chatMessageOut struct {
	Role      string        `json:"role"`
	Content   *string       `json:"content"`
	ToolCalls []toolCallOut `json:"tool_calls,omitempty"`
}

type chatTop struct {
	Token   string           `json:"token"`
	Logprob protocol.Logprob `json:"logprob"`
	Bytes   []int            `json:"bytes"`
}

type chatTokenLogprob struct {
	Token       string           `json:"token"`
	Logprob     protocol.Logprob `json:"logprob"`
	Bytes       []int            `json:"bytes"`
	TopLogprobs []chatTop        `json:"top_logprobs"`
}

type chatLogprobs struct {
	Content []chatTokenLogprob `json:"content"`
}

type chatChoice struct {
	Index          int             `json:"index"`
	Message        *chatMessageOut `json:"message,omitempty"`
	Delta          *chatMsgOut     `json:"delta,omitempty"`
	Logprobs       *chatLogprobs   `json:"logprobs"`
	FinishReason   *string         `json:"finish_reason"`
	TokenIDs       []int           `json:"token_ids,omitempty"`
	WeightVersions []int64         `json:"weight_versions"`
}

type chatResponse struct {
	ID             string       `json:"id"`
	Object         string       `json:"object"`
	Created        int64        `json:"created"`
	Model          string       `json:"model"`
	Choices        []chatChoice `json:"choices"`
	Usage          *usage       `json:"usage,omitempty"`
	PromptTokenIDs []int        `json:"prompt_token_ids,omitempty"`
	WeightVersion  int64        `json:"weight_version"`
}

// messageText extracts a message's text: a string, or a list of {"type":"text","text":...}
// parts. null is an empty message.
func messageText(raw json.RawMessage, i int) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return "", badRequest("invalid_type", "messages", "messages[%d].content must be a string or a list of text parts", i)
	}
	var sb strings.Builder
	for _, p := range parts {
		if p.Type != "text" {
			return "", badRequest("invalid_value", "messages", "messages[%d]: content part type %q is not supported (text only)", i, p.Type)
		}
		sb.WriteString(p.Text)
	}
	return sb.String(), nil
}

func (a *API) handleChat(c *gin.Context) {
	req := chatRequest{Params: sample.Defaults(), N: 1}
	if err := readJSON(c, &req); err != nil {
		writeError(c, err)
		return
	}
	if err := a.checkModel(req.Model); err != nil {
		writeError(c, err)
		return
	}
	text, content, tools, prefill, err := a.renderChat(req.Messages, req.Tools, req.ToolChoice)
	if err != nil {
		writeError(c, err)
		return
	}
	prompt, err := a.encodeChat(text, content, true)
	if err != nil {
		writeError(c, err)
		return
	}
	stops, err := parseStop(req.Stop)
	if err != nil {
		writeError(c, err)
		return
	}
	if req.MaxCompletionTokens != nil {
		req.Params.MaxTokens = *req.MaxCompletionTokens
	}
	withLogprobs := req.Logprobs != nil && *req.Logprobs
	req.Params.Logprobs = 0
	if req.TopLogprobs != nil {
		req.Params.Logprobs = *req.TopLogprobs
	}
	id := req.RequestID
	if id == "" {
		id = a.newID("chatcmpl")
	}
	spec := genSpec{clientID: id, prompts: [][]int{prompt}, n: req.N, params: req.Params, cacheSalt: req.CacheSalt, stops: stops, text: true}
	ctx := c.Request.Context()
	run, ok := a.start(c, spec)
	if !ok {
		return
	}
	defer run.end()
	base := chatResponse{ID: id, Object: "chat.completion", Created: time.Now().Unix(), Model: a.cfg.ModelName}
	if req.ReturnTokenIDs {
		base.PromptTokenIDs = prompt
	}
	if req.Stream {
		a.streamChat(c, run, base, req, withLogprobs, tools, prefill)
		return
	}
	if err := run.collect(ctx); err != nil {
		writeError(c, err)
		return
	}
	resp := base
	resp.Choices = make([]chatChoice, len(run.choices))
	for i, ch := range run.choices {
		content := ch.text.String()
		fr := string(ch.finish)
		msg := &chatMessageOut{Role: "assistant", Content: &content}
		if tools.mode != toolsOff {
			msg.Content, msg.ToolCalls, fr = a.toolMessage(prefill+content, fr)
		}
		cc := chatChoice{Index: ch.index, Message: msg, FinishReason: &fr, WeightVersions: versionsOf(ch.tokens)}
		if req.ReturnTokenIDs {
			cc.TokenIDs = idsOf(ch.tokens)
		}
		if withLogprobs {
			cc.Logprobs = a.chatLogprobs(ch.tokens)
		}
		resp.Choices[i] = cc
	}
	resp.Usage = usageOf(run.choices, run.prompts)
	resp.WeightVersion = a.responseVersion(run.choices)
	c.PureJSON(http.StatusOK, resp)
}

// toolMessage splits a finished choice's text (with the prefill a forced tool_choice put in
// the prompt) into content and tool calls: content is nil when there are calls and no text,
// and a choice that stopped on its own after calls finishes with "tool_calls".
func (a *API) toolMessage(text, finish string) (*string, []toolCallOut, string) {
	content, calls := a.splitToolCalls(text)
	if len(calls) == 0 {
		return &content, nil, finish
	}
	if finish == "stop" {
		finish = "tool_calls"
	}
	if content == "" {
		return nil, calls, finish
	}
	return &content, calls, finish
}

func (a *API) chatLogprobs(toks []engine.Token) *chatLogprobs {
	lp := &chatLogprobs{Content: make([]chatTokenLogprob, len(toks))}
	for i, t := range toks {
		e := chatTokenLogprob{Token: tokenText(a.tok, t.ID), Logprob: protocol.Logprob(t.Logprob), Bytes: tokenBytes(a, t.ID), TopLogprobs: []chatTop{}}
		for _, tl := range t.Top {
			e.TopLogprobs = append(e.TopLogprobs, chatTop{Token: tokenText(a.tok, tl.Token), Logprob: protocol.Logprob(tl.Logprob), Bytes: tokenBytes(a, tl.Token)})
		}
		lp.Content[i] = e
	}
	return lp
}

func tokenBytes(a *API, id int) []int {
	b, err := a.tok.TokenBytes(id)
	if err != nil {
		return []int{}
	}
	out := make([]int, len(b))
	for i, x := range b {
		out[i] = int(x)
	}
	return out
}

// streamChat streams the choices. With tools on, a choice's text is held back until it
// finishes (a call cannot be told from text before it is whole) and then sent as one delta:
// the content, or the tool calls with their index, id and whole arguments.
func (a *API) streamChat(c *gin.Context, run *genRun, base chatResponse, req chatRequest, withLogprobs bool, tools toolSetup, prefill string) {
	ctx := c.Request.Context()
	base.Object = "chat.completion.chunk"
	sseHeaders(c)
	// The first chunk of every choice announces the role, as OpenAI does.
	for _, ch := range run.choices {
		empty := ""
		chunk := base
		chunk.Choices = []chatChoice{{Index: ch.index, Delta: &chatMsgOut{Role: "assistant", Content: &empty}, WeightVersions: []int64{}}}
		if sse(c, chunk) != nil {
			return
		}
	}
	base.PromptTokenIDs = nil
	sent := make([]int, len(run.choices))
	held := make([]strings.Builder, len(run.choices))
	var writeErr error
	err := run.fanIn(ctx, func(ev event) bool {
		ch := ev.ch
		if ch.done {
			return true
		}
		text, done := ch.apply(ev.out)
		if done && !ev.out.Finished {
			a.eng.Abort(ch.engineID)
		}
		pos := ch.index
		newToks := ch.tokens[sent[pos]:]
		sent[pos] = len(ch.tokens)
		cc := chatChoice{Index: ch.index, Delta: &chatMsgOut{Content: &text}, WeightVersions: versionsOf(newToks)}
		if req.ReturnTokenIDs {
			cc.TokenIDs = idsOf(newToks)
		}
		if withLogprobs {
			cc.Logprobs = a.chatLogprobs(newToks)
		}
		fr := string(ch.finish)
		if tools.mode != toolsOff {
			held[pos].WriteString(text)
			empty := ""
			cc.Delta.Content = &empty
			if done {
				var calls []toolCallOut
				cc.Delta.Content, calls, fr = a.toolMessage(prefill+held[pos].String(), fr)
				for k := range calls {
					calls[k].Index = &k
				}
				cc.Delta.ToolCalls = calls
			}
		}
		if done {
			cc.FinishReason = &fr
		}
		chunk := base
		chunk.Choices = []chatChoice{cc}
		chunk.WeightVersion = a.responseVersion(run.choices)
		writeErr = sse(c, chunk)
		return writeErr == nil
	})
	if writeErr != nil || ctx.Err() != nil {
		return
	}
	if err != nil {
		streamError(c, err)
		return
	}
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		chunk := base
		chunk.Choices = []chatChoice{}
		chunk.Usage = usageOf(run.choices, run.prompts)
		chunk.WeightVersion = a.responseVersion(run.choices)
		_ = sse(c, chunk)
	}
	sseDone(c)
}
