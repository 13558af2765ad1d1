package api

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/ardanlabs/jinja"

	"github.com/rolloutkit/rollout/engine/tokenizer"
)

// chatMLTemplate is the template used when the checkpoint ships none: ChatML, with the
// OpenAI "developer" role rendered as "system", and the assistant turn opened. With tools it
// renders them, the assistant's tool calls and the tool results as Qwen 2.5 does (Hermes
// style: a system turn listing the functions in <tools>, calls in <tool_call>, results in
// <tool_response> inside a user turn), so the model's calls parse as toolcall.Hermes.
const chatMLTemplate = `{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if messages[0].role == 'system' or messages[0].role == 'developer' -%}{{- messages[0].content + '\n\n' -}}{%- endif -%}
{{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
{%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
{%- if tools and loop.first and (message.role == 'system' or message.role == 'developer') -%}
{%- elif message.role == 'assistant' and message.tool_calls -%}
{{- '<|im_start|>assistant' -}}
{%- if message.content -%}{{- '\n' + message.content -}}{%- endif -%}
{%- for call in message.tool_calls -%}
{{- '\n<tool_call>\n{"name": "' + call.function.name + '", "arguments": ' + (call.function.arguments | tojson) + '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- elif message.role == 'tool' and tools -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
{%- else -%}
{{- '<|im_start|>' + ('system' if message.role == 'developer' else message.role) + '\n' + message.content + '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- endif -%}`

// chatTemplate is a chat template compiled once at startup and rendered concurrently by the
// chat routes, with the variables transformers' apply_chat_template passes.
type chatTemplate struct {
	tmpl *jinja.Template
	// builtin is true for the ChatML fallback.
	builtin bool
	// bos and eos are the checkpoint's bos_token and eos_token strings.
	bos, eos string
	// hermesTools: the template teaches <tool_call> calls (the built-in one does), so a
	// forced tool_choice can prefill a call's opening.
	hermesTools bool
}

// newChatTemplate compiles src, or the built-in ChatML template when src is empty. bos and eos
// are the strings templates see as bos_token and eos_token.
func newChatTemplate(src, bos, eos string) (*chatTemplate, error) {
	ct := &chatTemplate{bos: bos, eos: eos}
	if src == "" {
		src, ct.builtin = chatMLTemplate, true
	}
	t, err := jinja.Compile(src)
	if err != nil {
		return nil, fmt.Errorf("api: the checkpoint's chat template (tokenizer_config.json chat_template) does not compile: %w", err)
	}
	ct.tmpl = t
	ct.hermesTools = strings.Contains(src, "<tool_call>")
	return ct, nil
}

// isChatML reports whether a checkpoint's template is ChatML-shaped (it is logged at startup).
func isChatML(t string) bool { return strings.Contains(t, "<|im_start|>") }

// render validates msgs (non-empty, known roles, text content) and renders them as
// apply_chat_template(messages, add_generation_prompt=True) does: messages as
// {"role","content"} with string content (text parts joined), add_generation_prompt true,
// bos_token and eos_token, and tools and documents none. A template error, such as a
// raise_exception on roles that do not alternate, is a 400 on "messages".
func (ct *chatTemplate) render(msgs []chatMessage) (string, error) {
	out, _, err := ct.renderContents(msgs, nil)
	return out, err
}

// renderContents is render with tools (nil: none; else a []jinja.Value of the request's
// tool definitions) that also returns the message contents it passed the template.
func (ct *chatTemplate) renderContents(msgs []chatMessage, tools any) (string, []string, error) {
	if len(msgs) == 0 {
		return "", nil, badRequest("missing_field", "messages", "messages must not be empty")
	}
	contents := make([]string, len(msgs))
	for i, m := range msgs {
		switch m.Role {
		case "system", "developer", "user", "assistant", "tool":
		default:
			return "", nil, badRequest("invalid_value", "messages", "messages[%d].role %q: want system, developer, user, assistant or tool", i, m.Role)
		}
		text, err := messageText(m.Content, i)
		if err != nil {
			return "", nil, err
		}
		if len(m.ToolCalls) > 0 && m.Role != "assistant" {
			return "", nil, badRequest("invalid_value", "messages", "messages[%d]: only assistant messages carry tool_calls", i)
		}
		contents[i] = text
	}
	out, err := ct.renderWith(msgs, contents, tools)
	return out, contents, err
}

// placeholder stands for message i's content in a probe rendering; private-use characters
// that templates do not strip or case-fold.
func placeholder(i int) string { return "\uE000" + strconv.Itoa(i) + "\uE001" }

// renderPrompt renders msgs and finds where the message contents lie in the result, so that
// encoding can keep their special-token text from becoming special ids (role injection).
// It renders a second time with a placeholder for each content; when putting the contents
// (as given, or trimmed, as templates that apply "| trim" do) in place of the placeholders
// gives the real rendering, the placeholders' positions are the contents'. Otherwise (a
// template that transforms content some other way) every occurrence of a content in the
// rendering is protected, which errs towards plain text.
func (ct *chatTemplate) renderPrompt(msgs []chatMessage, tools any) (string, [][2]int, error) {
	text, contents, err := ct.renderContents(msgs, tools)
	if err != nil {
		return "", nil, err
	}
	ph := make([]string, len(contents))
	for i := range ph {
		ph[i] = placeholder(i)
	}
	probe, err := ct.renderWith(msgs, ph, tools)
	if err == nil {
		for _, trim := range []bool{false, true} {
			if spans, ok := substitute(probe, contents, trim, text); ok {
				return text, spans, nil
			}
		}
	}
	var spans [][2]int
	for _, c := range contents {
		for _, v := range []string{c, strings.TrimSpace(c)} {
			for from := 0; v != "" && from < len(text); {
				i := strings.Index(text[from:], v)
				if i < 0 {
					break
				}
				spans = append(spans, [2]int{from + i, from + i + len(v)})
				from += i + 1
			}
		}
	}
	return text, spans, nil
}

// substitute replaces the placeholders of probe by the contents (trimmed if trim) and reports
// the contents' byte ranges when the result is want.
func substitute(probe string, contents []string, trim bool, want string) ([][2]int, bool) {
	var sb strings.Builder
	var spans [][2]int
	for rest := probe; ; {
		i := strings.Index(rest, "\uE000")
		if i < 0 {
			sb.WriteString(rest)
			break
		}
		j := strings.Index(rest[i:], "\uE001")
		if j < 0 {
			return nil, false
		}
		k, err := strconv.Atoi(rest[i+len("\uE000") : i+j])
		if err != nil || k < 0 || k >= len(contents) {
			return nil, false
		}
		sb.WriteString(rest[:i])
		c := contents[k]
		if trim {
			c = strings.TrimSpace(c)
		}
		spans = append(spans, [2]int{sb.Len(), sb.Len() + len(c)})
		sb.WriteString(c)
		rest = rest[i+j+len("\uE001"):]
	}
	return spans, sb.String() == want
}

// renderWith renders msgs with the given contents and tools.
func (ct *chatTemplate) renderWith(msgs []chatMessage, contents []string, tools any) (out string, err error) {
	list := make([]jinja.Value, len(msgs))
	for i, m := range msgs {
		v := jinja.NewDict()
		d := v.AsDict()
		d.Set("role", jinja.NewString(m.Role))
		d.Set("content", jinja.NewString(contents[i]))
		if len(m.ToolCalls) > 0 {
			calls, err := messageToolCalls(m.ToolCalls, i)
			if err != nil {
				return "", err
			}
			d.Set("tool_calls", calls)
		}
		if m.ToolCallID != "" {
			d.Set("tool_call_id", jinja.NewString(m.ToolCallID))
		}
		if m.Name != "" {
			d.Set("name", jinja.NewString(m.Name))
		}
		list[i] = v
	}
	// The template comes from the checkpoint: a failure inside the evaluator is the
	// conversation's 400, never a crashed handler.
	defer func() {
		if r := recover(); r != nil {
			out, err = "", badRequest("chat_template_error", "messages", "the chat template failed on these messages: %v", r)
		}
	}()
	s, err := ct.tmpl.Render(map[string]any{
		"messages":              list,
		"add_generation_prompt": true,
		"bos_token":             ct.bos,
		"eos_token":             ct.eos,
		"tools":                 tools,
		"documents":             nil,
	})
	if err != nil {
		return "", badRequest("chat_template_error", "messages", "the chat template rejected the messages: %v", err)
	}
	return s, nil
}

// encodeChat tokenizes a rendered conversation.
//
// BOS rule: when the rendered text already starts with bos_token, the template has put the
// BOS there itself, and HF and vLLM then tokenize it without adding special tokens again so
// the prompt does not start with two BOS. Here Encode never turns text into a control id (a
// prompt cannot spell BOS or EOS), so that leading bos_token text is replaced by the
// vocabulary's BOS id: the prompt holds exactly one BOS, as with HF, whatever addSpecial says.
// Otherwise the text is encoded like any text prompt, with BOS first when addSpecial is set.
//
// The byte ranges in content hold message content: no special token is matched there
// (tokenizer.ProtectedEncoder), so a message cannot spell "<|im_end|>" into a real turn end.
func (a *API) encodeChat(text string, content [][2]int, addSpecial bool) ([]int, error) {
	if err := a.checkPromptBytes(len(text), "messages"); err != nil {
		return nil, err
	}
	if bos := a.chat.bos; bos != "" && a.tok.BOS() >= 0 && strings.HasPrefix(text, bos) {
		shifted := make([][2]int, 0, len(content))
		for _, c := range content {
			shifted = append(shifted, [2]int{max(0, c[0]-len(bos)), max(0, c[1]-len(bos))})
		}
		text, content, addSpecial = text[len(bos):], shifted, true
	}
	pe, ok := a.tok.(tokenizer.ProtectedEncoder)
	if !ok || len(content) == 0 {
		return a.encodeText(text, addSpecial)
	}
	ids, err := pe.EncodeProtected(text, content)
	if err != nil {
		return nil, badRequest("unencodable", "messages", "tokenizing the conversation: %v", err)
	}
	if bos := a.tok.BOS(); addSpecial && bos >= 0 {
		ids = append([]int{bos}, ids...)
	}
	return ids, nil
}
