package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/ardanlabs/jinja"

	"github.com/rolloutkit/rollout/engine/tokenizer"
	"github.com/rolloutkit/rollout/sdk/toolcall"
)

// maxTools bounds the tools of one request (OpenAI's limit).
const maxTools = 128

// toolNameRE is OpenAI's rule for function names.
var toolNameRE = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// chatTool is one entry of a chat request's tools: {"type": "function", "function": {...}}.
// raw keeps the entry as sent, which the chat template renders (key order included, as
// transformers passes the request's dicts).
type chatTool struct {
	name string
	raw  json.RawMessage
}

// chatToolCallIn is a tool call in an assistant message of the conversation.
type chatToolCallIn struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

// toolCallOut is a tool call in a response: the message's tool_calls (Index only in stream
// deltas).
type toolCallOut struct {
	Index    *int         `json:"index,omitempty"`
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function toolFunction `json:"function"`
}

type toolFunction struct {
	Name string `json:"name"`
	// Arguments is the JSON object of the call's arguments, as a string (OpenAI's shape).
	Arguments string `json:"arguments"`
}

// toolMode is what tool_choice asks for.
type toolMode int

const (
	toolsOff      toolMode = iota // no tools, or tool_choice "none": the output is text
	toolsAuto                     // the model may call a tool
	toolsRequired                 // the model must call one (the call's opening is prefilled)
	toolsNamed                    // the model must call this one (its name is prefilled)
)

// toolSetup is a request's validated tools and tool_choice.
type toolSetup struct {
	tools []chatTool
	mode  toolMode
	named string
}

// parseTools validates tools and tool_choice as OpenAI does: tools are function definitions
// with unique, well-formed names and object parameters; tool_choice is "none", "auto",
// "required" or {"type": "function", "function": {"name": one of the tools}}, and needs
// tools unless it is "none".
func parseTools(rawTools, rawChoice json.RawMessage) (toolSetup, error) {
	var ts toolSetup
	if !isJSONNull(rawTools) {
		var list []json.RawMessage
		if err := json.Unmarshal(rawTools, &list); err != nil {
			return ts, badRequest("invalid_type", "tools", "tools must be a list of function definitions")
		}
		if len(list) > maxTools {
			return ts, badRequest("invalid_value", "tools", "at most %d tools (got %d)", maxTools, len(list))
		}
		for i, raw := range list {
			var t struct {
				Type     string `json:"type"`
				Function *struct {
					Name        *string         `json:"name"`
					Description json.RawMessage `json:"description"`
					Parameters  json.RawMessage `json:"parameters"`
				} `json:"function"`
			}
			if err := json.Unmarshal(raw, &t); err != nil {
				return ts, badRequest("invalid_type", "tools", "tools[%d] must be an object {\"type\": \"function\", \"function\": {...}}: %v", i, err)
			}
			switch {
			case t.Type != "function":
				return ts, badRequest("invalid_value", "tools", "tools[%d].type must be \"function\" (got %q)", i, t.Type)
			case t.Function == nil || t.Function.Name == nil:
				return ts, badRequest("missing_field", "tools", "tools[%d].function.name is required", i)
			case !toolNameRE.MatchString(*t.Function.Name):
				return ts, badRequest("invalid_value", "tools", "tools[%d].function.name %q must be 1-64 letters, digits, '_' or '-'", i, *t.Function.Name)
			case !isJSONNull(t.Function.Description) && !isJSONString(t.Function.Description):
				return ts, badRequest("invalid_type", "tools", "tools[%d].function.description must be a string", i)
			case !isJSONNull(t.Function.Parameters) && !isJSONObject(t.Function.Parameters):
				return ts, badRequest("invalid_type", "tools", "tools[%d].function.parameters must be a JSON Schema object", i)
			}
			if slices.ContainsFunc(ts.tools, func(o chatTool) bool { return o.name == *t.Function.Name }) {
				return ts, badRequest("invalid_value", "tools", "tools[%d]: a second function named %q", i, *t.Function.Name)
			}
			ts.tools = append(ts.tools, chatTool{name: *t.Function.Name, raw: raw})
		}
	}
	ts.mode = toolsAuto
	if !isJSONNull(rawChoice) {
		var s string
		if json.Unmarshal(rawChoice, &s) == nil {
			switch s {
			case "none":
				ts.mode = toolsOff
			case "auto":
			case "required":
				ts.mode = toolsRequired
			default:
				return ts, badRequest("invalid_value", "tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" or a named function (got %q)", s)
			}
		} else {
			var named struct {
				Type     string `json:"type"`
				Function struct {
					Name string `json:"name"`
				} `json:"function"`
			}
			if err := json.Unmarshal(rawChoice, &named); err != nil || named.Type != "function" || named.Function.Name == "" {
				return ts, badRequest("invalid_type", "tool_choice", "tool_choice must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}")
			}
			if !slices.ContainsFunc(ts.tools, func(o chatTool) bool { return o.name == named.Function.Name }) {
				return ts, badRequest("invalid_value", "tool_choice", "tool_choice names %q, which is not among the tools", named.Function.Name)
			}
			ts.mode, ts.named = toolsNamed, named.Function.Name
		}
		if len(ts.tools) == 0 && ts.mode != toolsOff {
			return ts, badRequest("invalid_value", "tool_choice", "tool_choice is only allowed when tools are given")
		}
	}
	if len(ts.tools) == 0 {
		ts.mode = toolsOff
	}
	return ts, nil
}

func isJSONNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

func isJSONObject(raw json.RawMessage) bool {
	var m map[string]json.RawMessage
	return json.Unmarshal(raw, &m) == nil && m != nil
}

func isJSONString(raw json.RawMessage) bool {
	var s string
	return json.Unmarshal(raw, &s) == nil
}

// prefill is the text appended after the generation prompt to force a call: the opening of a
// Hermes call, and the function's name for a named tool_choice. A template that does not
// teach <tool_call> cannot be forced this way (there is no guided decoding): that is a 400.
func (ts toolSetup) prefill(ct *chatTemplate) (string, error) {
	if ts.mode != toolsRequired && ts.mode != toolsNamed {
		return "", nil
	}
	if !ct.hermesTools {
		return "", badRequest("unsupported_value", "tool_choice",
			"tool_choice %q needs a chat template that uses <tool_call> (Hermes/Qwen): this model's does not; use \"auto\"", ts.choiceName())
	}
	if ts.mode == toolsNamed {
		name, _ := json.Marshal(ts.named)
		return "<tool_call>\n{\"name\": " + string(name) + ", \"arguments\": ", nil
	}
	return "<tool_call>\n", nil
}

func (ts toolSetup) choiceName() string {
	if ts.mode == toolsNamed {
		return "function " + ts.named
	}
	return "required"
}

// jsonValue converts JSON to a template value, keeping object key order (as Python's dicts
// do) and integers as integers.
func jsonValue(raw json.RawMessage) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := decodeValue(dec)
	if err != nil {
		return jinja.Value{}, err
	}
	return v, nil
}

func decodeValue(dec *json.Decoder) (jinja.Value, error) {
	tok, err := dec.Token()
	if err != nil {
		return jinja.Value{}, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			d := jinja.NewDict()
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return jinja.Value{}, err
				}
				k, _ := kt.(string)
				v, err := decodeValue(dec)
				if err != nil {
					return jinja.Value{}, err
				}
				d.AsDict().Set(k, v)
			}
			_, err := dec.Token() // '}'
			return d, err
		case '[':
			var items []jinja.Value
			for dec.More() {
				v, err := decodeValue(dec)
				if err != nil {
					return jinja.Value{}, err
				}
				items = append(items, v)
			}
			_, err := dec.Token() // ']'
			return jinja.NewList(items), err
		}
		return jinja.Value{}, fmt.Errorf("unexpected %v", t)
	default:
		return jinja.FromGoValue(t), nil
	}
}

// stringLeaves returns every string (keys and values) inside raw JSON.
func stringLeaves(raw json.RawMessage) []string {
	var out []string
	dec := json.NewDecoder(bytes.NewReader(raw))
	for {
		tok, err := dec.Token()
		if err != nil {
			return out
		}
		if s, ok := tok.(string); ok {
			out = append(out, s)
		}
	}
}

// checkNoSpecialText refuses tool definitions and tool-call arguments that spell a special
// token: templates render them outside the message contents, where the encoder matches
// special tokens, so "<|im_end|>" in a description would otherwise end a turn (role
// injection, as message contents are protected against in encodeChat).
func (a *API) checkNoSpecialText(param string, raw json.RawMessage) error {
	pe, ok := a.tok.(tokenizer.ProtectedEncoder)
	if !ok {
		return nil // the tokenizer has no special tokens to match
	}
	for _, s := range stringLeaves(raw) {
		if s == "" {
			continue
		}
		plain, err1 := a.tok.Encode(s)
		prot, err2 := pe.EncodeProtected(s, [][2]int{{0, len(s)}})
		if err1 != nil || err2 != nil || !slices.Equal(plain, prot) {
			return badRequest("invalid_value", param, "%s holds special-token text (%q): not allowed outside message contents", param, clipText(s))
		}
	}
	return nil
}

func clipText(s string) string {
	const n = 60
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// toolsValue is the tools list the template sees (nil: none). tool_choice "none" still
// shows the tools (as vLLM does by default): it only stops the output being parsed as calls.
func (ts toolSetup) toolsValue() (any, error) {
	if len(ts.tools) == 0 {
		return nil, nil
	}
	items := make([]jinja.Value, len(ts.tools))
	for i, t := range ts.tools {
		v, err := jsonValue(t.raw)
		if err != nil {
			return nil, badRequest("invalid_json", "tools", "tools[%d]: %v", i, err)
		}
		items[i] = v
	}
	return items, nil
}

// messageToolCalls converts an assistant message's tool_calls for the template: arguments
// sent as a JSON string become the object they hold, as vLLM passes them, so that templates'
// "arguments | tojson" renders the object.
func messageToolCalls(calls []chatToolCallIn, i int) (jinja.Value, error) {
	items := make([]jinja.Value, len(calls))
	for j, c := range calls {
		if c.Type != "" && c.Type != "function" {
			return jinja.Value{}, badRequest("invalid_value", "messages", "messages[%d].tool_calls[%d].type must be \"function\"", i, j)
		}
		if !toolNameRE.MatchString(c.Function.Name) {
			return jinja.Value{}, badRequest("invalid_value", "messages", "messages[%d].tool_calls[%d].function.name %q is not a valid function name", i, j, c.Function.Name)
		}
		args := bytes.TrimSpace(c.Function.Arguments)
		var s string
		if json.Unmarshal(args, &s) == nil {
			args = []byte(strings.TrimSpace(s))
		}
		if len(args) == 0 {
			args = []byte("{}")
		}
		if !isJSONObject(args) {
			return jinja.Value{}, badRequest("invalid_value", "messages", "messages[%d].tool_calls[%d].function.arguments must be a JSON object (or a string holding one)", i, j)
		}
		av, err := jsonValue(args)
		if err != nil {
			return jinja.Value{}, badRequest("invalid_value", "messages", "messages[%d].tool_calls[%d].function.arguments: %v", i, j, err)
		}
		fn := jinja.NewDict()
		fn.AsDict().Set("name", jinja.NewString(c.Function.Name))
		fn.AsDict().Set("arguments", av)
		call := jinja.NewDict()
		if c.ID != "" {
			call.AsDict().Set("id", jinja.NewString(c.ID))
		}
		call.AsDict().Set("type", jinja.NewString("function"))
		call.AsDict().Set("function", fn)
		items[j] = call
	}
	return jinja.NewList(items), nil
}

// splitToolCalls parses a choice's text for tool calls. Text without a valid call (or a
// malformed one) stays content: the client sees what the model wrote.
func (a *API) splitToolCalls(text string) (content string, calls []toolCallOut) {
	r, err := toolcall.Parse(text, toolcall.Auto)
	switch {
	case err != nil:
		a.metrics.ToolOutput(ToolOutcomeMalformed)
		return text, nil
	case len(r.Calls) == 0:
		a.metrics.ToolOutput(ToolOutcomeText)
		return text, nil
	}
	a.metrics.ToolOutput(ToolOutcomeCalls)
	calls = make([]toolCallOut, len(r.Calls))
	for i, c := range r.Calls {
		calls[i] = toolCallOut{ID: a.newID("call"), Type: "function", Function: toolFunction{Name: c.Name, Arguments: string(c.Arguments)}}
	}
	return r.Content, calls
}

// renderChat validates a conversation's tools and renders it: the prompt text (with a forced
// tool_choice's prefill at the end), the message contents' byte ranges and the tool setup.
func (a *API) renderChat(msgs []chatMessage, rawTools, rawChoice json.RawMessage) (string, [][2]int, toolSetup, string, error) {
	ts, err := parseTools(rawTools, rawChoice)
	if err != nil {
		return "", nil, ts, "", err
	}
	for i, t := range ts.tools {
		if err := a.checkNoSpecialText(fmt.Sprintf("tools[%d]", i), t.raw); err != nil {
			return "", nil, ts, "", err
		}
	}
	for i, m := range msgs {
		for j, c := range m.ToolCalls {
			if err := a.checkNoSpecialText(fmt.Sprintf("messages[%d].tool_calls[%d]", i, j), c.Function.Arguments); err != nil {
				return "", nil, ts, "", err
			}
		}
	}
	tools, err := ts.toolsValue()
	if err != nil {
		return "", nil, ts, "", err
	}
	text, content, err := a.chat.renderPrompt(msgs, tools)
	if err != nil {
		return "", nil, ts, "", err
	}
	prefill, err := ts.prefill(a.chat)
	if err != nil {
		return "", nil, ts, "", err
	}
	return text + prefill, content, ts, prefill, nil
}
