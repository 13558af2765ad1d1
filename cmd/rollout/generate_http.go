package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rolloutkit/rollout/sdk"
)

// completionWire is the part of a /v1/completions response (or stream chunk) generate reads.
type completionWire struct {
	Model   string `json:"model"`
	Choices []struct {
		Text           string  `json:"text"`
		FinishReason   *string `json:"finish_reason"`
		PromptTokenIDs []int   `json:"prompt_token_ids"`
		TokenIDs       []int   `json:"token_ids"`
		WeightVersions []int64 `json:"weight_versions"`
		Logprobs       *struct {
			TokenLogprobs []*float64 `json:"token_logprobs"`
		} `json:"logprobs"`
	} `json:"choices"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// runGenerateHTTP is runGenerate over a server's /v1/completions: the same sampling, the same
// output (text streamed as it arrives, or one JSON object with --json). A logprob the server
// sends as null (-Inf in processed mode) is -Inf, printed as null again.
func runGenerateHTTP(ctx context.Context, cmd *cobra.Command, o generateOpts, prompt string) error {
	body := map[string]any{"prompt": prompt, "max_tokens": o.maxTokens, "temperature": o.temperature, "top_p": o.topP,
		"top_k": o.topK, "seed": o.seed, "logprobs": 0, "return_token_ids": true, "stream": !o.json}
	buf, err := json.Marshal(body)
	if err != nil {
		return err
	}
	url := strings.TrimRight(o.server, "/") + "/v1/completions"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(buf))
	if err != nil {
		return fmt.Errorf("--server %q: %w", o.server, err)
	}
	req.Header.Set("Content-Type", "application/json")
	if o.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+o.apiKey)
	}
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("generate on %s: %w", o.server, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		var w completionWire
		if json.Unmarshal(b, &w) == nil && w.Error != nil {
			return fmt.Errorf("server answered %d: %s", resp.StatusCode, w.Error.Message)
		}
		return fmt.Errorf("server answered %d: %s", resp.StatusCode, strings.TrimSpace(string(b)))
	}
	out := cmd.OutOrStdout()
	res := newGenerateResult(o.server, nil)
	smp := res.sample()
	var first time.Time
	add := func(w completionWire, stream bool) {
		if w.Model != "" {
			res.Model = w.Model
		}
		for _, c := range w.Choices {
			if len(c.TokenIDs) > 0 && first.IsZero() {
				first = time.Now()
			}
			if c.PromptTokenIDs != nil {
				res.PromptTokenIDs = c.PromptTokenIDs
			}
			for i, id := range c.TokenIDs {
				t := sdk.Token{ID: id, Logprob: math.Inf(-1)}
				if i < len(c.WeightVersions) {
					t.WeightVersion = c.WeightVersions[i]
				}
				if c.Logprobs != nil && i < len(c.Logprobs.TokenLogprobs) && c.Logprobs.TokenLogprobs[i] != nil {
					t.Logprob = float64(float32(*c.Logprobs.TokenLogprobs[i])) // the engine's float32, as in-process
				}
				smp.Tokens = append(smp.Tokens, t)
			}
			res.Text += c.Text
			if stream {
				fmt.Fprint(out, c.Text)
			}
			if c.FinishReason != nil {
				smp.FinishReason = sdk.FinishReason(*c.FinishReason)
			}
		}
	}
	if o.json {
		var w completionWire
		if err := json.NewDecoder(resp.Body).Decode(&w); err != nil {
			return fmt.Errorf("reading the server's answer: %w", err)
		}
		add(w, false)
	} else {
		fmt.Fprint(out, prompt)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		done := false
		for sc.Scan() {
			d, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			if d == "[DONE]" {
				done = true
				break
			}
			var w completionWire
			if err := json.Unmarshal([]byte(d), &w); err != nil {
				return fmt.Errorf("reading the server's stream: %w", err)
			}
			if w.Error != nil {
				return fmt.Errorf("server: %s", w.Error.Message)
			}
			add(w, true)
		}
		if err := sc.Err(); err != nil {
			return fmt.Errorf("reading the server's stream: %w", err)
		}
		if !done {
			return fmt.Errorf("the server's stream ended early")
		}
	}
	elapsed := time.Since(start).Seconds()
	if n := len(smp.Tokens); n > 0 && elapsed > 0 {
		res.TokensPerSec = float64(n) / elapsed
		if !first.IsZero() {
			res.TTFTSeconds = first.Sub(start).Seconds()
		}
	}
	if o.json {
		return res.printJSON(out)
	}
	fmt.Fprintf(out, "\n\n[%d tokens, %.1f tokens/s, first token after %.1f ms, finish: %s]\n",
		len(smp.Tokens), res.TokensPerSec, res.TTFTSeconds*1e3, smp.FinishReason)
	return nil
}
