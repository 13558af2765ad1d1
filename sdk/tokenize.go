package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"go.opentelemetry.io/otel/trace"
)

// ChatMessage is one message of a conversation for Tokenize: OpenAI's chat message shape.
type ChatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
	// ToolCalls are an assistant message's calls; ToolCallID and Name say which call a tool
	// message answers.
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
	Name       string     `json:"name,omitempty"`
}

// ToolCall is a call in an assistant message.
type ToolCall struct {
	ID       string           `json:"id,omitempty"`
	Type     string           `json:"type"` // "function"
	Function ToolCallFunction `json:"function"`
}

// ToolCallFunction is a call's function and its arguments (a JSON object, as a string).
type ToolCallFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// Tool is a function the model may call, as OpenAI's tools list has it.
type Tool struct {
	Type     string       `json:"type"` // "function"
	Function ToolFunction `json:"function"`
}

// ToolFunction describes a callable function: its name, what it does and its parameters' JSON
// Schema.
type ToolFunction struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// TokenizeRequest is text, or a conversation rendered with the servers' chat template (and
// its tools), to turn into token ids.
type TokenizeRequest struct {
	// Text is tokenized as is (give Text or Messages).
	Text string
	// Messages are rendered with the chat template, the assistant turn opened, exactly as
	// /v1/chat/completions renders them; Tools are rendered with them.
	Messages []ChatMessage
	Tools    []Tool
	// NoSpecialTokens leaves out the BOS the servers add by default: for environment text
	// appended to a session after its first prompt.
	NoSpecialTokens bool
}

type wireTokenize struct {
	Prompt           *string       `json:"prompt,omitempty"`
	Messages         []ChatMessage `json:"messages,omitempty"`
	Tools            []Tool        `json:"tools,omitempty"`
	AddSpecialTokens bool          `json:"add_special_tokens"`
}

// Tokenize turns text or a conversation into the served model's token ids on one of the
// fleet's servers (they share one tokenizer): the way to build a session's first prompt from
// messages and tools, and its environment tokens from text, without a tokenizer in the
// training process. Bad input (an unknown role, a malformed tool) is ErrRejected with the
// server's message.
func (c *Client) Tokenize(ctx context.Context, req TokenizeRequest) (ids []int, err error) {
	ctx, span := c.tracer.Start(ctx, "sdk.tokenize", trace.WithSpanKind(trace.SpanKindClient))
	defer func() { endSpan(span, err) }()
	switch {
	case req.Text == "" && len(req.Messages) == 0:
		return nil, invalid("tokenize: give Text or Messages")
	case req.Text != "" && len(req.Messages) > 0:
		return nil, invalid("tokenize: give Text or Messages, not both")
	case len(req.Tools) > 0 && len(req.Messages) == 0:
		return nil, invalid("tokenize: Tools need Messages")
	}
	w := wireTokenize{Messages: req.Messages, Tools: req.Tools, AddSpecialTokens: !req.NoSpecialTokens}
	if len(req.Messages) == 0 {
		w.Prompt = &req.Text
	}
	body, err := json.Marshal(w)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	var out struct {
		Tokens []int `json:"tokens"`
	}
	if err := c.callAny(ctx, "/tokenize", body, &out); err != nil {
		return nil, err
	}
	return out.Tokens, nil
}

// Detokenize returns the text of ids in the served model's tokenizer (on one of the fleet's
// servers). Its signature is SessionOptions.Decode's: Decode: c.Detokenize parses a session's
// tool calls with the servers' tokenizer.
func (c *Client) Detokenize(ctx context.Context, ids []int) (text string, err error) {
	ctx, span := c.tracer.Start(ctx, "sdk.detokenize", trace.WithSpanKind(trace.SpanKindClient))
	defer func() { endSpan(span, err) }()
	if ids == nil {
		ids = []int{}
	}
	if err := checkIDs("detokenize", ids); err != nil {
		return "", err
	}
	body, err := json.Marshal(map[string]any{"tokens": ids})
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	var out struct {
		Prompt string `json:"prompt"`
	}
	if err := c.callAny(ctx, "/detokenize", body, &out); err != nil {
		return "", err
	}
	return out.Prompt, nil
}

// callAny posts body to path on a routable server, moving to another one when a server is
// unavailable, and decodes the answer into out. A 4xx other than 409/429 is the input's
// fault: ErrRejected.
func (c *Client) callAny(ctx context.Context, path string, body []byte, out any) error {
	if err := c.checkOpen(ctx); err != nil {
		return err
	}
	exclude := map[string]bool{}
	var lastErr error
	for attempt := 0; ; attempt++ {
		cand, err := c.pick(ctx, 0, "", 0, 0, exclude)
		if err != nil {
			if lastErr != nil {
				return fmt.Errorf("%w (last failure: %w)", err, lastErr)
			}
			return err
		}
		data, err := c.postJSON(ctx, cand.url, path, body)
		c.release(cand.id, 0)
		if err == nil {
			if err := json.Unmarshal(data, out); err != nil {
				return fmt.Errorf("sdk: decoding %s response of %s: %w", path, cand.id, err)
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctxError(ctx)
		}
		var he *httpError
		if errors.As(err, &he) && !he.retryable() {
			return fmt.Errorf("%w: server %s: %w", ErrRejected, cand.id, err)
		}
		lastErr = fmt.Errorf("server %s: %w", cand.id, err)
		if !errors.As(err, &he) || he.status != http.StatusConflict {
			c.suspect(cand.id)
		}
		exclude[cand.id] = true
		if attempt >= maxRetries {
			return fmt.Errorf("sdk: %s gave up after %d attempts: %w", path, attempt+1, lastErr)
		}
	}
}

// AppendText tokenizes text on the fleet (without a BOS) and appends it as environment
// tokens: a tool result, or the template's glue before the next turn. The text is tokenized on
// its own, never together with earlier turns.
func (s *Session) AppendText(ctx context.Context, text string) error {
	if text == "" {
		return nil
	}
	ids, err := s.c.Tokenize(ctx, TokenizeRequest{Text: text, NoSpecialTokens: true})
	if err != nil {
		return fmt.Errorf("session %s: %w", s.opts.ID, err)
	}
	return s.Append(ids...)
}
