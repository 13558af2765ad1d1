package server_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/tokenizer"
)

func (ts *testServer) openai(opts ...option.RequestOption) openai.Client {
	base := []option.RequestOption{option.WithBaseURL(ts.url + "/v1/"), option.WithHTTPClient(ts.client),
		option.WithMaxRetries(0), option.WithAPIKey("unused")}
	return openai.NewClient(append(base, opts...)...)
}

// extra decodes the fields of raw JSON the OpenAI types do not know.
type choiceExtras struct {
	Choices []struct {
		Index          int     `json:"index"`
		TokenIDs       []int   `json:"token_ids"`
		PromptTokenIDs []int   `json:"prompt_token_ids"`
		WeightVersions []int64 `json:"weight_versions"`
	} `json:"choices"`
	PromptTokenIDs []int `json:"prompt_token_ids"`
	WeightVersion  int64 `json:"weight_version"`
}

func TestOpenAICompletionsGreedyMatchesInProcess(t *testing.T) {
	ts := start(t, nil)
	ctx := t.Context()
	cl := ts.openai()
	const prompt = "The quick brown fox"
	want := inProcess(t, textPrompt(prompt), 24)

	params := openai.CompletionNewParams{
		Model:       "builtin:tiny",
		Prompt:      openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
		MaxTokens:   openai.Int(24),
		Temperature: openai.Float(0),
		Logprobs:    openai.Int(2),
	}
	resp, err := cl.Completions.New(ctx, params, option.WithJSONSet("return_token_ids", true), option.WithJSONSet("ignore_eos", true))
	require.NoError(t, err)
	require.Len(t, resp.Choices, 1)
	ch := resp.Choices[0]
	assert.Equal(t, "length", string(ch.FinishReason))
	var ex choiceExtras
	require.NoError(t, json.Unmarshal([]byte(resp.RawJSON()), &ex))
	assert.Equal(t, want, ex.Choices[0].TokenIDs, "greedy over HTTP equals the in-process engine")
	assert.Equal(t, textPrompt(prompt), ex.Choices[0].PromptTokenIDs)
	assert.Equal(t, []int64{1}, uniq(ex.Choices[0].WeightVersions))
	assert.Len(t, ex.Choices[0].WeightVersions, 24)
	assert.EqualValues(t, 1, ex.WeightVersion)
	assert.Equal(t, bytesText(want), ch.Text)
	require.Len(t, ch.Logprobs.TokenLogprobs, 24)
	require.Len(t, ch.Logprobs.TopLogprobs, 24)
	for i, lp := range ch.Logprobs.TokenLogprobs {
		assert.LessOrEqual(t, lp, 0.0)
		assert.Len(t, ch.Logprobs.TopLogprobs[i], 2)
	}
	assert.EqualValues(t, len(textPrompt(prompt)), resp.Usage.PromptTokens)
	assert.EqualValues(t, 24, resp.Usage.CompletionTokens)

	// Streaming: the chunks concatenate to the same text and token ids.
	stream := cl.Completions.NewStreaming(ctx, params, option.WithJSONSet("return_token_ids", true), option.WithJSONSet("ignore_eos", true))
	var text strings.Builder
	var ids []int
	var finish string
	for stream.Next() {
		c := stream.Current()
		for _, chc := range c.Choices {
			text.WriteString(chc.Text)
			if chc.FinishReason != "" {
				finish = string(chc.FinishReason)
			}
		}
		var cx choiceExtras
		require.NoError(t, json.Unmarshal([]byte(c.RawJSON()), &cx))
		for _, chc := range cx.Choices {
			ids = append(ids, chc.TokenIDs...)
		}
	}
	require.NoError(t, stream.Err())
	require.NoError(t, stream.Close())
	assert.Equal(t, ch.Text, text.String())
	assert.Equal(t, want, ids)
	assert.Equal(t, "length", finish)
}

func TestOpenAICompletionsPromptShapesNAndStop(t *testing.T) {
	ts := start(t, nil)
	ctx := t.Context()
	cl := ts.openai()
	// Two token-id prompts, n=3 each, seeded sampling.
	resp, err := cl.Completions.New(ctx, openai.CompletionNewParams{
		Model:     "builtin:tiny",
		Prompt:    openai.CompletionNewParamsPromptUnion{OfArrayOfTokenArrays: [][]int64{{256, 65, 66}, {256, 67}}},
		MaxTokens: openai.Int(6), N: openai.Int(3), Seed: openai.Int(7),
	})
	require.NoError(t, err)
	require.Len(t, resp.Choices, 6)
	for i, c := range resp.Choices {
		assert.EqualValues(t, i, c.Index)
	}
	assert.EqualValues(t, 5, resp.Usage.PromptTokens)

	// Stop string: take a seeded sample's text and stop inside it.
	const prompt = "Hello"
	base := openai.CompletionNewParams{
		Model: "builtin:tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
		MaxTokens: openai.Int(40), Temperature: openai.Float(1), Seed: openai.Int(3),
	}
	r1, err := cl.Completions.New(ctx, base, option.WithJSONSet("ignore_eos", true))
	require.NoError(t, err)
	full := r1.Choices[0].Text
	stop := ""
	runes := []rune(full)
	for k := 2; k+2 <= len(runes); k++ {
		cand := string(runes[k : k+2])
		if strings.Index(full, cand) == len(string(runes[:k])) {
			stop = cand
			break
		}
	}
	require.NotEmpty(t, stop, "no usable stop string in %q", full)
	cut := full[:strings.Index(full, stop)]
	withStop := base
	withStop.Stop = openai.CompletionNewParamsStopUnion{OfString: openai.String(stop)}
	r2, err := cl.Completions.New(ctx, withStop, option.WithJSONSet("ignore_eos", true))
	require.NoError(t, err)
	assert.Equal(t, cut, r2.Choices[0].Text)
	assert.Equal(t, "stop", string(r2.Choices[0].FinishReason))

	// The same over a stream: held-back text never leaks the stop string.
	withStop.Echo = openai.Bool(true)
	st := cl.Completions.NewStreaming(ctx, withStop, option.WithJSONSet("ignore_eos", true))
	var sb strings.Builder
	for st.Next() {
		for _, c := range st.Current().Choices {
			sb.WriteString(c.Text)
		}
	}
	require.NoError(t, st.Err())
	require.NoError(t, st.Close())
	assert.Equal(t, prompt+cut, sb.String(), "echo prepends the prompt")
}

func TestOpenAIChat(t *testing.T) {
	ts := start(t, nil)
	ctx := t.Context()
	cl := ts.openai()
	params := openai.ChatCompletionNewParams{
		Model:       "builtin:tiny",
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief"), openai.UserMessage("hi")},
		MaxTokens:   openai.Int(12),
		Temperature: openai.Float(0),
		Logprobs:    openai.Bool(true), TopLogprobs: openai.Int(3),
	}
	resp, err := cl.Chat.Completions.New(ctx, params, option.WithJSONSet("return_token_ids", true), option.WithJSONSet("ignore_eos", true))
	require.NoError(t, err)
	require.Len(t, resp.Choices, 1)
	var ex choiceExtras
	require.NoError(t, json.Unmarshal([]byte(resp.RawJSON()), &ex))
	chatML := "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
	assert.Equal(t, textPrompt(chatML), ex.PromptTokenIDs, "ChatML with BOS")
	want := inProcess(t, textPrompt(chatML), 12)
	assert.Equal(t, want, ex.Choices[0].TokenIDs)
	assert.Equal(t, bytesText(want), resp.Choices[0].Message.Content)
	assert.Equal(t, "assistant", string(resp.Choices[0].Message.Role))
	require.Len(t, resp.Choices[0].Logprobs.Content, 12)
	assert.Len(t, resp.Choices[0].Logprobs.Content[0].TopLogprobs, 3)

	stream := cl.Chat.Completions.NewStreaming(ctx, params, option.WithJSONSet("ignore_eos", true))
	acc := openai.ChatCompletionAccumulator{}
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	require.NoError(t, stream.Err())
	require.NoError(t, stream.Close())
	require.Len(t, acc.Choices, 1)
	assert.Equal(t, resp.Choices[0].Message.Content, acc.Choices[0].Message.Content)
	assert.Equal(t, "length", acc.Choices[0].FinishReason)

	models, err := cl.Models.List(ctx)
	require.NoError(t, err)
	require.Len(t, models.Data, 1)
	assert.Equal(t, "builtin:tiny", models.Data[0].ID)
	_ = http.StatusOK
}

func uniq(v []int64) []int64 {
	var out []int64
	for _, x := range v {
		if len(out) == 0 || out[len(out)-1] != x {
			out = append(out, x)
		}
	}
	return out
}

// bytesText is the text of byte-level tokens as the server renders it (control tokens empty,
// invalid UTF-8 as U+FFFD).
func bytesText(ids []int) string {
	var b []byte
	for _, id := range ids {
		if id < 256 {
			b = append(b, byte(id))
		}
	}
	return tokenizer.ValidUTF8(b)
}
