// Package toolcall finds the tool calls in a model's output text, in the formats open models
// are trained to emit:
//
//   - Hermes (Qwen 2.5/3, Hermes, many fine-tunes): one or more
//     <tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks, after optional text.
//   - Llama-3 JSON: the whole output is {"name": ..., "parameters": {...}} (or "arguments"),
//     optionally after <|python_tag|>, several calls separated by ";".
//
// Parse is a pure function of the text: it never panics, whatever the input (fuzz-tested).
// Output that is not a call is content; output that starts a call but does not finish a valid
// one is an error wrapping ErrMalformed, together with the whole text as content, so a caller
// can answer the model "your call was malformed" or treat the turn as plain text.
//
// The server's /v1/chat/completions and the SDK's sessions both parse with this package, so a
// trajectory trained through the SDK and a chat answer see the same calls.
package toolcall
