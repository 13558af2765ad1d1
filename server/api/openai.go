package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/sample"
	"github.com/rolloutkit/rollout/engine/tokenizer"
	"github.com/rolloutkit/rollout/sdk/protocol"
)

// completionRequest is POST /v1/completions. The sampling fields are sample.Params' own JSON
// names at the top level, decoded into sample.Defaults() so omitted fields get OpenAI's
// defaults.
type completionRequest struct {
	sample.Params
	Model          string          `json:"model"`
	Prompt         json.RawMessage `json:"prompt"`
	N              int             `json:"n"`
	Stop           json.RawMessage `json:"stop"`
	Echo           bool            `json:"echo"`
	Stream         bool            `json:"stream"`
	StreamOptions  *streamOptions  `json:"stream_options"`
	CacheSalt      string          `json:"cache_salt"`
	ReturnTokenIDs bool            `json:"return_token_ids"`
	RequestID      string          `json:"request_id"`
	// Logprobs shadows Params.Logprobs to tell "logprobs": 0 (the sampled token's logprob
	// only) from an omitted field (no logprobs).
	Logprobs *int `json:"logprobs"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type usage struct {
	PromptTokens        int            `json:"prompt_tokens"`
	CompletionTokens    int            `json:"completion_tokens"`
	TotalTokens         int            `json:"total_tokens"`
	PromptTokensDetails *promptDetails `json:"prompt_tokens_details,omitempty"`
}

type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type completionLogprobs struct {
	Tokens        []string                      `json:"tokens"`
	TokenLogprobs protocol.Logprobs             `json:"token_logprobs"`
	TopLogprobs   []map[string]protocol.Logprob `json:"top_logprobs"`
	TextOffset    []int                         `json:"text_offset"`
}

type completionChoice struct {
	Index          int                 `json:"index"`
	Text           string              `json:"text"`
	Logprobs       *completionLogprobs `json:"logprobs"`
	FinishReason   *string             `json:"finish_reason"`
	PromptTokenIDs []int               `json:"prompt_token_ids,omitempty"`
	TokenIDs       []int               `json:"token_ids,omitempty"`
	WeightVersions []int64             `json:"weight_versions"`
}

type completionResponse struct {
	ID            string             `json:"id"`
	Object        string             `json:"object"`
	Created       int64              `json:"created"`
	Model         string             `json:"model"`
	Choices       []completionChoice `json:"choices"`
	Usage         *usage             `json:"usage,omitempty"`
	WeightVersion int64              `json:"weight_version"`
}

// checkModel accepts the served model's name or an empty one.
func (a *API) checkModel(m string) error {
	if m != "" && m != a.cfg.ModelName {
		return &Error{Status: http.StatusNotFound, Type: typeNotFound, Code: "model_not_found", Param: "model",
			Message: fmt.Sprintf("model %q does not exist; this server serves %q", m, a.cfg.ModelName)}
	}
	return nil
}

// encodeText tokenizes a text prompt the way `rollout generate` does: BOS first when the
// vocabulary has one.
func (a *API) encodeText(s string, addSpecial bool) ([]int, error) {
	if err := a.checkPromptBytes(len(s), "prompt"); err != nil {
		return nil, err
	}
	ids, err := a.tok.Encode(s)
	if err != nil {
		return nil, badRequest("unencodable", "prompt", "tokenizing the prompt: %v", err)
	}
	if bos := a.tok.BOS(); addSpecial && bos >= 0 {
		ids = append([]int{bos}, ids...)
	}
	return ids, nil
}

// checkPromptBytes refuses text too long to fit the context whatever it encodes to, before
// paying for the encoding: no token is longer than maxTokenBytes, so text of more than
// maxPromptBytes bytes (which allows for normalization shrinking it) needs more tokens than
// the context holds.
func (a *API) checkPromptBytes(n int, param string) error {
	if n > a.maxPromptBytes {
		return badRequest("context_length_exceeded", param, "text of %d bytes cannot fit the context of %d tokens (limit %d bytes)",
			n, a.cfg.ModelConfig.MaxPositionEmbeddings, a.maxPromptBytes)
	}
	return nil
}

// promptByteLimit is maxPromptBytes for a tokenizer and context length: the longest token's
// bytes times the context, times 4 for normalizations that shrink text (composition, NFKC).
func promptByteLimit(tok tokenizer.Tokenizer, ctxLen int) int {
	longest := 1
	for id := range tok.VocabSize() {
		if b, err := tok.TokenBytes(id); err == nil {
			longest = max(longest, len(b))
		}
	}
	return 4*longest*ctxLen + 64
}

// parsePrompt accepts a string, a list of strings, a list of token ids or a list of lists;
// more than maxPrompts prompts are refused before any is tokenized.
func (a *API) parsePrompt(raw json.RawMessage, maxPrompts int) ([][]int, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("missing_field", "prompt", "prompt is required")
	}
	typeErr := badRequest("invalid_type", "prompt", "prompt must be a string, a list of strings, a list of token ids or a list of token-id lists")
	fromText := func(s string) ([]int, error) {
		if s == "" {
			return nil, badRequest("empty_prompt", "prompt", "empty prompt")
		}
		return a.encodeText(s, true)
	}
	switch raw[0] {
	case '"':
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return nil, typeErr
		}
		p, err := fromText(s)
		if err != nil {
			return nil, err
		}
		return [][]int{p}, nil
	case '[':
	default:
		return nil, typeErr
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil {
		return nil, typeErr
	}
	if len(items) == 0 {
		return nil, badRequest("empty_prompt", "prompt", "empty prompt list")
	}
	first := bytes.TrimSpace(items[0])
	if len(first) > 0 && (first[0] == '"' || first[0] == '[') && len(items) > maxPrompts {
		return nil, badRequest("invalid_value", "prompt", "%d prompts × n exceed the limit of %d sequences per request", len(items), a.cfg.MaxN)
	}
	switch {
	case len(first) > 0 && first[0] == '"':
		var ss []string
		if json.Unmarshal(raw, &ss) != nil {
			return nil, typeErr
		}
		out := make([][]int, len(ss))
		for i, s := range ss {
			p, err := fromText(s)
			if err != nil {
				return nil, err
			}
			out[i] = p
		}
		return out, nil
	case len(first) > 0 && first[0] == '[':
		var ll [][]int
		if json.Unmarshal(raw, &ll) != nil {
			return nil, typeErr
		}
		return ll, nil
	default:
		var l []int
		if json.Unmarshal(raw, &l) != nil {
			return nil, typeErr
		}
		return [][]int{l}, nil
	}
}

func parseStop(raw json.RawMessage) ([]string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return []string{one}, nil
	}
	var many []string
	if json.Unmarshal(raw, &many) != nil {
		return nil, badRequest("invalid_type", "stop", "stop must be a string or a list of strings")
	}
	if len(many) > 16 {
		return nil, badRequest("invalid_value", "stop", "at most 16 stop strings (got %d)", len(many))
	}
	return many, nil
}

func (a *API) handleCompletions(c *gin.Context) {
	req := completionRequest{Params: sample.Defaults(), N: 1}
	if err := readJSON(c, &req); err != nil {
		writeError(c, err)
		return
	}
	if err := a.checkModel(req.Model); err != nil {
		writeError(c, err)
		return
	}
	if err := a.checkN(req.N); err != nil {
		writeError(c, err)
		return
	}
	prompts, err := a.parsePrompt(req.Prompt, a.cfg.MaxN/req.N)
	if err != nil {
		writeError(c, err)
		return
	}
	stops, err := parseStop(req.Stop)
	if err != nil {
		writeError(c, err)
		return
	}
	id := req.RequestID
	if id == "" {
		id = a.newID("cmpl")
	}
	if req.Logprobs != nil {
		req.Params.Logprobs = *req.Logprobs
	}
	spec := genSpec{clientID: id, prompts: prompts, n: req.N, params: req.Params, cacheSalt: req.CacheSalt, stops: stops, text: true}
	ctx := c.Request.Context()
	run, ok := a.start(c, spec)
	if !ok {
		return
	}
	defer run.end()
	base := completionResponse{ID: id, Object: "text_completion", Created: time.Now().Unix(), Model: a.cfg.ModelName}
	withLogprobs := req.Logprobs != nil
	if req.Stream {
		a.streamCompletions(c, run, base, req, withLogprobs)
		return
	}
	if err := run.collect(ctx); err != nil {
		writeError(c, err)
		return
	}
	resp := base
	resp.Choices = make([]completionChoice, len(run.choices))
	for i, ch := range run.choices {
		text := ch.text.String()
		if req.Echo {
			text = a.decodeLossy(ch.prompt) + text
		}
		fr := string(ch.finish)
		cc := completionChoice{Index: ch.index, Text: text, FinishReason: &fr, WeightVersions: versionsOf(ch.tokens)}
		if req.ReturnTokenIDs {
			cc.PromptTokenIDs, cc.TokenIDs = ch.prompt, idsOf(ch.tokens)
		}
		if withLogprobs {
			cc.Logprobs = a.completionLogprobs(ch.tokens, ch.text.offsets, 0)
		}
		resp.Choices[i] = cc
	}
	resp.Usage = usageOf(run.choices, prompts)
	resp.WeightVersion = a.responseVersion(run.choices)
	c.PureJSON(http.StatusOK, resp)
}

func usageOf(chs []*choice, prompts [][]int) *usage {
	u := &usage{}
	for _, p := range prompts {
		u.PromptTokens += len(p)
	}
	cached := 0
	for _, ch := range chs {
		u.CompletionTokens += len(ch.tokens)
		cached += ch.cached
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	if cached > 0 {
		u.PromptTokensDetails = &promptDetails{CachedTokens: cached}
	}
	return u
}

func (a *API) decodeLossy(ids []int) string {
	var sb strings.Builder
	d := newTextProc(a.tok, nil)
	for _, id := range ids {
		s, _ := d.push(id)
		sb.WriteString(s)
	}
	sb.WriteString(d.flush())
	return sb.String()
}

func (a *API) completionLogprobs(toks []engine.Token, offsets []int, base int) *completionLogprobs {
	lp := &completionLogprobs{Tokens: make([]string, len(toks)), TokenLogprobs: make(protocol.Logprobs, len(toks)),
		TopLogprobs: make([]map[string]protocol.Logprob, len(toks)), TextOffset: make([]int, len(toks))}
	for i, t := range toks {
		lp.Tokens[i] = tokenText(a.tok, t.ID)
		lp.TokenLogprobs[i] = protocol.Logprob(t.Logprob)
		if len(t.Top) > 0 {
			m := make(map[string]protocol.Logprob, len(t.Top))
			for _, e := range t.Top {
				m[tokenText(a.tok, e.Token)] = protocol.Logprob(e.Logprob)
			}
			lp.TopLogprobs[i] = m
		}
		if base+i < len(offsets) {
			lp.TextOffset[i] = offsets[base+i]
		}
	}
	return lp
}

// sse writes one Server-Sent Event and flushes it.
func sse(c *gin.Context, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := c.Writer.Write(append(append([]byte("data: "), b...), '\n', '\n')); err != nil {
		return err
	}
	c.Writer.Flush()
	return nil
}

func sseDone(c *gin.Context) {
	_, _ = c.Writer.Write([]byte("data: [DONE]\n\n"))
	c.Writer.Flush()
}

func sseHeaders(c *gin.Context) {
	h := c.Writer.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	c.Status(http.StatusOK)
}

// streamError sends an error as the last event of a stream that already started.
func streamError(c *gin.Context, err error) {
	e := classify(err)
	_ = sse(c, errorBody{Error: errorDetail{Message: e.Message, Type: e.Type, Code: e.Code}})
}

func (a *API) streamCompletions(c *gin.Context, run *genRun, base completionResponse, req completionRequest, withLogprobs bool) {
	ctx := c.Request.Context()
	sseHeaders(c)
	started := make([]bool, len(run.choices))
	sent := make([]int, len(run.choices)) // tokens already sent per choice
	writeErr := error(nil)
	err := run.fanIn(ctx, func(ev event) bool {
		ch := ev.ch
		if ch.done {
			return true // a stop string ended it; the rest is the abort arriving
		}
		text, done := ch.apply(ev.out)
		if done && !ev.out.Finished {
			a.eng.Abort(ch.engineID)
		}
		pos := ch.index - run.choices[0].index
		cc := completionChoice{Index: ch.index, Text: text}
		if !started[pos] {
			started[pos] = true
			if req.Echo {
				cc.Text = a.decodeLossy(ch.prompt) + cc.Text
			}
			if req.ReturnTokenIDs {
				cc.PromptTokenIDs = ch.prompt
			}
		}
		newToks := ch.tokens[sent[pos]:]
		cc.WeightVersions = versionsOf(newToks)
		if req.ReturnTokenIDs {
			cc.TokenIDs = idsOf(newToks)
		}
		if withLogprobs {
			cc.Logprobs = a.completionLogprobs(newToks, ch.text.offsets, sent[pos])
		}
		sent[pos] = len(ch.tokens)
		if done {
			fr := string(ch.finish)
			cc.FinishReason = &fr
		}
		chunk := base
		chunk.Choices = []completionChoice{cc}
		chunk.WeightVersion = a.responseVersion(run.choices)
		if writeErr = sse(c, chunk); writeErr != nil {
			return false
		}
		return true
	})
	if writeErr != nil || ctx.Err() != nil {
		return // the client is gone; run.end aborts the rest
	}
	if err != nil {
		streamError(c, err)
		return
	}
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		chunk := base
		chunk.Choices = []completionChoice{}
		chunk.Usage = usageOf(run.choices, run.prompts)
		chunk.WeightVersion = a.responseVersion(run.choices)
		_ = sse(c, chunk)
	}
	sseDone(c)
}
