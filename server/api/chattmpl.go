package api

import (
	"fmt"
	"strings"

	"github.com/ardanlabs/jinja"
)

// chatMLTemplate is the template used when the checkpoint ships none: ChatML, with the
// OpenAI "developer" role rendered as "system", and the assistant turn opened.
const chatMLTemplate = `{%- for message in messages -%}
{{- '<|im_start|>' + ('system' if message.role == 'developer' else message.role) + '\n' + message.content + '<|im_end|>\n' -}}
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
	return ct, nil
}

// isChatML reports whether a checkpoint's template is ChatML-shaped (it is logged at startup).
func isChatML(t string) bool { return strings.Contains(t, "<|im_start|>") }

// render validates msgs (non-empty, known roles, text content) and renders them as
// apply_chat_template(messages, add_generation_prompt=True) does: messages as
// {"role","content"} with string content (text parts joined), add_generation_prompt true,
// bos_token and eos_token, and tools and documents none. A template error, such as a
// raise_exception on roles that do not alternate, is a 400 on "messages".
func (ct *chatTemplate) render(msgs []chatMessage) (out string, err error) {
	if len(msgs) == 0 {
		return "", badRequest("missing_field", "messages", "messages must not be empty")
	}
	list := make([]any, len(msgs))
	for i, m := range msgs {
		switch m.Role {
		case "system", "developer", "user", "assistant", "tool":
		default:
			return "", badRequest("invalid_value", "messages", "messages[%d].role %q: want system, developer, user, assistant or tool", i, m.Role)
		}
		text, err := messageText(m.Content, i)
		if err != nil {
			return "", err
		}
		list[i] = map[string]any{"role": m.Role, "content": text}
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
		"tools":                 nil,
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
func (a *API) encodeChat(text string, addSpecial bool) ([]int, error) {
	if bos := a.chat.bos; bos != "" && a.tok.BOS() >= 0 && strings.HasPrefix(text, bos) {
		return a.encodeText(text[len(bos):], true)
	}
	return a.encodeText(text, addSpecial)
}
