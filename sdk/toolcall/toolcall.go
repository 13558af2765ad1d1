package toolcall

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// ErrMalformed is wrapped by the error Parse returns when the text starts a tool call but
// does not hold a valid one (bad JSON, no name, arguments that are not an object).
var ErrMalformed = errors.New("toolcall: malformed tool call")

// ErrUnknownFormat is returned for a Format Parse does not know.
var ErrUnknownFormat = errors.New("toolcall: unknown format")

// Format names a tool-call syntax.
type Format string

const (
	// Auto detects the format: Hermes when the text holds "<tool_call>", Llama-3 JSON when it
	// starts with "<|python_tag|>" or a JSON object with a "name" key, else plain content.
	Auto Format = "auto"
	// Hermes is <tool_call>{"name": ..., "arguments": {...}}</tool_call>, as Qwen and Hermes
	// chat templates teach.
	Hermes Format = "hermes"
	// Llama3JSON is {"name": ..., "parameters": {...}} as the whole output, as Llama 3.1+
	// emits for JSON-based tool calling.
	Llama3JSON Format = "llama3_json"
)

// Hermes markers.
const (
	hermesOpen  = "<tool_call>"
	hermesClose = "</tool_call>"
	pythonTag   = "<|python_tag|>"
)

// Call is one parsed tool call.
type Call struct {
	// Name is the function's name (non-empty).
	Name string `json:"name"`
	// Arguments is the call's arguments: a JSON object, compacted.
	Arguments json.RawMessage `json:"arguments"`
}

// Result is a model output split into its text and its tool calls.
type Result struct {
	// Content is the text that is not a tool call (for Hermes, the text before the first
	// call, trimmed of surrounding whitespace); the whole text when there are no calls.
	Content string
	// Calls are the tool calls in order; empty when the output is not a call.
	Calls []Call
}

// Parse splits text into content and tool calls in format f (the empty Format is Auto).
// Text without a call gives Result{Content: text}. Text that starts a call but holds no valid
// one gives Result{Content: text} and an error wrapping ErrMalformed that says what is wrong.
func Parse(text string, f Format) (Result, error) {
	switch f {
	case "", Auto:
		switch {
		case strings.Contains(text, hermesOpen):
			return parseHermes(text)
		case looksLlama3(text):
			return parseLlama3(text)
		}
		return Result{Content: text}, nil
	case Hermes:
		return parseHermes(text)
	case Llama3JSON:
		return parseLlama3(text)
	}
	return Result{}, fmt.Errorf("%w %q: want %q, %q or %q", ErrUnknownFormat, f, Auto, Hermes, Llama3JSON)
}

// Valid reports whether f is a Format Parse knows (the empty Format is Auto).
func Valid(f Format) bool {
	switch f {
	case "", Auto, Hermes, Llama3JSON:
		return true
	}
	return false
}

func malformed(text string, format string, args ...any) (Result, error) {
	return Result{Content: text}, fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// parseHermes reads every <tool_call> block; the last may lack its closing tag (generation
// stopped on </tool_call> as a stop string, or on EOS right after the JSON).
func parseHermes(text string) (Result, error) {
	first := strings.Index(text, hermesOpen)
	if first < 0 {
		return Result{Content: text}, nil
	}
	res := Result{Content: strings.TrimSpace(text[:first])}
	rest := text[first:]
	for k := 0; ; k++ {
		rest = strings.TrimLeft(rest, " \t\r\n")
		if rest == "" {
			break
		}
		if !strings.HasPrefix(rest, hermesOpen) {
			return malformed(text, "text %q after tool call %d", clip(rest), k-1)
		}
		rest = rest[len(hermesOpen):]
		body := rest
		if end := strings.Index(rest, hermesClose); end >= 0 {
			body, rest = rest[:end], rest[end+len(hermesClose):]
		} else {
			rest = ""
		}
		c, err := decodeCall([]byte(body), "arguments", "parameters")
		if err != nil {
			return malformed(text, "tool call %d: %v", k, err)
		}
		res.Calls = append(res.Calls, c)
	}
	return res, nil
}

// looksLlama3 reports whether text is meant as a Llama-3 JSON call: the python tag, or a
// leading JSON object whose first key is "name".
func looksLlama3(text string) bool {
	t := strings.TrimSpace(text)
	if strings.HasPrefix(t, pythonTag) {
		return true
	}
	if !strings.HasPrefix(t, "{") {
		return false
	}
	t = strings.TrimSpace(t[1:])
	return strings.HasPrefix(t, `"name"`)
}

// parseLlama3 reads one or more JSON objects separated by ";" as the whole output. Output
// that does not start with "{" (after the python tag) is content.
func parseLlama3(text string) (Result, error) {
	t := strings.TrimSpace(text)
	tagged := strings.HasPrefix(t, pythonTag)
	t = strings.TrimSpace(strings.TrimPrefix(t, pythonTag))
	if !strings.HasPrefix(t, "{") {
		if tagged {
			return malformed(text, "%s is not followed by a JSON object", pythonTag)
		}
		return Result{Content: text}, nil
	}
	dec := json.NewDecoder(strings.NewReader(t))
	var res Result
	for k := 0; ; k++ {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return malformed(text, "tool call %d: %v", k, err)
		}
		c, err := decodeCall(raw, "parameters", "arguments")
		if err != nil {
			return malformed(text, "tool call %d: %v", k, err)
		}
		res.Calls = append(res.Calls, c)
		rest := strings.TrimSpace(t[dec.InputOffset():])
		if rest == "" {
			return res, nil
		}
		if !strings.HasPrefix(rest, ";") {
			return malformed(text, "text %q after tool call %d", clip(rest), k)
		}
		rest = strings.TrimSpace(rest[1:])
		if rest == "" {
			return res, nil
		}
		t = rest
		dec = json.NewDecoder(strings.NewReader(t))
	}
}

// decodeCall reads {"name": string, <argument key>: object}; argKeys are the accepted names
// of the arguments field, preferred first. Missing arguments are {}. Arguments given as a
// JSON string holding an object (as OpenAI's wire format does) are accepted too.
func decodeCall(body []byte, argKeys ...string) (Call, error) {
	body = bytes.TrimSpace(body)
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil {
		return Call{}, fmt.Errorf("not a JSON object: %w", err)
	}
	var name string
	if err := json.Unmarshal(obj["name"], &name); err != nil || strings.TrimSpace(name) == "" {
		return Call{}, errors.New(`"name" must be a non-empty string`)
	}
	args := json.RawMessage(`{}`)
	for _, k := range argKeys {
		if a, ok := obj[k]; ok {
			args = a
			break
		}
	}
	args = bytes.TrimSpace(args)
	if len(args) > 0 && args[0] == '"' {
		var s string
		if err := json.Unmarshal(args, &s); err != nil {
			return Call{}, fmt.Errorf("arguments: %w", err)
		}
		args = json.RawMessage(strings.TrimSpace(s))
	}
	if string(args) == "null" {
		args = json.RawMessage(`{}`)
	}
	var m map[string]json.RawMessage
	if len(args) == 0 || args[0] != '{' || json.Unmarshal(args, &m) != nil {
		return Call{}, fmt.Errorf("call %q: arguments must be a JSON object", name)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, args); err != nil {
		return Call{}, fmt.Errorf("call %q: arguments: %w", name, err)
	}
	return Call{Name: name, Arguments: buf.Bytes()}, nil
}

// clip shortens s for an error message.
func clip(s string) string {
	const n = 40
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
