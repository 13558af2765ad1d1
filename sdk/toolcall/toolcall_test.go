package toolcall

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	cases := []struct {
		name    string
		text    string
		f       Format
		content string
		calls   []Call
	}{
		{"plain text", "The answer is 4.", Auto, "The answer is 4.", nil},
		{"hermes one call", "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>", Auto, "",
			[]Call{{"add", json.RawMessage(`{"a":1,"b":2}`)}}},
		{"hermes text then two calls", "Let me compute.\n<tool_call>{\"name\":\"add\",\"arguments\":{\"a\":1}}</tool_call>\n<tool_call>{\"name\":\"now\"}</tool_call>", Hermes,
			"Let me compute.", []Call{{"add", json.RawMessage(`{"a":1}`)}, {"now", json.RawMessage(`{}`)}}},
		{"hermes unclosed last call", "<tool_call>{\"name\":\"add\",\"arguments\":{\"a\":1}}", Auto, "",
			[]Call{{"add", json.RawMessage(`{"a":1}`)}}},
		{"hermes arguments as a JSON string", `<tool_call>{"name":"add","arguments":"{\"a\": 1}"}</tool_call>`, Auto, "",
			[]Call{{"add", json.RawMessage(`{"a":1}`)}}},
		{"llama3 parameters", `{"name": "get_weather", "parameters": {"city": "Paris"}}`, Auto, "",
			[]Call{{"get_weather", json.RawMessage(`{"city":"Paris"}`)}}},
		{"llama3 python tag and two calls", `<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "arguments": {"x": [1]}}`, Llama3JSON, "",
			[]Call{{"a", json.RawMessage(`{}`)}, {"b", json.RawMessage(`{"x":[1]}`)}}},
		{"llama3 format on prose", "no call here", Llama3JSON, "no call here", nil},
		{"json that is not a call is content in auto", `{"answer": 4}`, Auto, `{"answer": 4}`, nil},
		{"hermes format on prose", "just words", Hermes, "just words", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := Parse(c.text, c.f)
			require.NoError(t, err)
			require.Equal(t, c.content, r.Content)
			require.Equal(t, len(c.calls), len(r.Calls))
			for i := range c.calls {
				require.Equal(t, c.calls[i].Name, r.Calls[i].Name)
				require.JSONEq(t, string(c.calls[i].Arguments), string(r.Calls[i].Arguments))
			}
		})
	}
}

func TestParseMalformed(t *testing.T) {
	cases := []struct {
		name, text string
		f          Format
		why        string
	}{
		{"hermes bad json", "<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": }</tool_call>", Auto, "not a JSON object"},
		{"hermes no name", `<tool_call>{"arguments": {}}</tool_call>`, Auto, `"name"`},
		{"hermes empty name", `<tool_call>{"name": " ", "arguments": {}}</tool_call>`, Auto, `"name"`},
		{"hermes name not a string", `<tool_call>{"name": 3}</tool_call>`, Auto, `"name"`},
		{"hermes arguments an array", `<tool_call>{"name": "f", "arguments": [1]}</tool_call>`, Auto, "must be a JSON object"},
		{"hermes arguments a string of junk", `<tool_call>{"name": "f", "arguments": "1+"}</tool_call>`, Auto, "must be a JSON object"},
		{"hermes text after the calls", `<tool_call>{"name": "f"}</tool_call> and then`, Auto, "after tool call"},
		{"hermes empty block", `<tool_call></tool_call>`, Auto, "not a JSON object"},
		{"llama3 truncated", `{"name": "f", "parameters": {"a": 1`, Auto, "tool call 0"},
		{"llama3 trailing prose", `{"name": "f", "parameters": {}} thanks`, Auto, "after tool call 0"},
		{"python tag alone", `<|python_tag|>print(1)`, Auto, "not followed by a JSON object"},
		{"llama3 format, object without name", `{"parameters": {}}`, Llama3JSON, `"name"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := Parse(c.text, c.f)
			require.ErrorIs(t, err, ErrMalformed)
			require.Contains(t, err.Error(), c.why)
			require.Equal(t, c.text, r.Content, "a malformed call leaves the text as content")
			require.Empty(t, r.Calls)
		})
	}
	_, err := Parse("x", "xml")
	require.ErrorIs(t, err, ErrUnknownFormat)
	require.False(t, Valid("xml"))
	require.True(t, Valid(""))
}

// FuzzParse checks that Parse never panics, that a call always has a name and object
// arguments, that an error always wraps ErrMalformed and keeps the whole text, and that a
// rendering of the parsed calls parses back to the same calls.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"", "hello", "<tool_call>", "</tool_call>", "<tool_call>{}</tool_call>",
		`<tool_call>{"name":"f","arguments":{"a":1}}</tool_call>`,
		`<tool_call>{"name":"f","arguments":"{\"a\":1}"}`,
		`{"name":"f","parameters":{}};{"name":"g"}`, `<|python_tag|>{"name":"f"}`, `{"name":`,
		"<tool_call>\n{\"name\": \"f\", \"arguments\": {\"s\": \"</tool_call>\"}}\n</tool_call>",
	} {
		for _, fm := range []string{"", "hermes", "llama3_json"} {
			f.Add(s, fm)
		}
	}
	f.Fuzz(func(t *testing.T, text, fm string) {
		r, err := Parse(text, Format(fm))
		if !Valid(Format(fm)) {
			require.ErrorIs(t, err, ErrUnknownFormat)
			return
		}
		if err != nil {
			require.ErrorIs(t, err, ErrMalformed)
			require.Equal(t, text, r.Content)
			require.Empty(t, r.Calls)
			return
		}
		if len(r.Calls) == 0 {
			require.Equal(t, text, r.Content)
			return
		}
		var sb strings.Builder
		for _, c := range r.Calls {
			require.NotEmpty(t, strings.TrimSpace(c.Name))
			var m map[string]any
			require.NoError(t, json.Unmarshal(c.Arguments, &m))
			require.NotNil(t, m)
			b, err := json.Marshal(map[string]any{"name": c.Name, "arguments": c.Arguments})
			require.NoError(t, err)
			sb.WriteString(hermesOpen + string(b) + hermesClose + "\n")
		}
		if !utf8.ValidString(text) {
			return // names with invalid UTF-8 do not survive a JSON round trip
		}
		back, err := Parse(sb.String(), Hermes)
		require.NoError(t, err)
		require.Equal(t, len(r.Calls), len(back.Calls))
		for i := range r.Calls {
			require.Equal(t, r.Calls[i].Name, back.Calls[i].Name)
			require.JSONEq(t, string(r.Calls[i].Arguments), string(back.Calls[i].Arguments))
		}
	})
}
