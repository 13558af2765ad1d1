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
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type chatMsgOut struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
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
	Index          int           `json:"index"`
	Message        *chatMsgOut   `json:"message,omitempty"`
	Delta          *chatMsgOut   `json:"delta,omitempty"`
	Logprobs       *chatLogprobs `json:"logprobs"`
	FinishReason   *string       `json:"finish_reason"`
	TokenIDs       []int         `json:"token_ids,omitempty"`
	WeightVersions []int64       `json:"weight_versions"`
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
	text, content, err := a.chat.renderPrompt(req.Messages)
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
		a.streamChat(c, run, base, req, withLogprobs)
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
		cc := chatChoice{Index: ch.index, Message: &chatMsgOut{Role: "assistant", Content: &content}, FinishReason: &fr,
			WeightVersions: versionsOf(ch.tokens)}
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

func (a *API) streamChat(c *gin.Context, run *genRun, base chatResponse, req chatRequest, withLogprobs bool) {
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
		if done {
			fr := string(ch.finish)
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
