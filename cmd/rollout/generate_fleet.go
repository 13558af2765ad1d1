package main

import (
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

// runGenerateFleet is runGenerate on a fleet: the prompt is tokenized by one of the fleet's
// servers (/tokenize, so the ids are exactly what /v1/completions would use), generated through
// sdk.Generate (routed by load and affinity, continued across pauses), and the tokens are
// detokenized by a server again.
func runGenerateFleet(ctx context.Context, cmd *cobra.Command, o generateOpts, prompt string) error {
	c, err := o.conn.dial(ctx, cmd)
	if err != nil {
		return err
	}
	defer c.Close()
	var tok struct {
		Tokens []int `json:"tokens"`
	}
	base, err := tokenizeOnFleet(ctx, c, o.apiKey, prompt, &tok)
	if err != nil {
		return fmt.Errorf("fleet %q: %w", o.conn.fleet, err)
	}
	seed := o.seed
	start := time.Now()
	out, err := c.Generate(ctx, sdk.GenerateRequest{PromptTokenIDs: tok.Tokens, N: 1, Sampling: sdk.SamplingParams{
		MaxTokens: o.maxTokens, Temperature: o.temperature, Greedy: o.temperature == 0, TopP: o.topP, TopK: o.topK, Seed: &seed,
		LogprobMode: sdk.LogprobRaw}}) // as the local and HTTP paths report them
	if err != nil {
		return fmt.Errorf("generate on fleet %q: %w", o.conn.fleet, err)
	}
	elapsed := time.Since(start).Seconds()
	s := out.Samples[0]
	res := generateResult{Model: "fleet:" + o.conn.fleet, PromptTokenIDs: tok.Tokens, TokenIDs: s.TokenIDs(),
		WeightVersions: s.WeightVersions(), FinishReason: string(s.FinishReason)}
	for _, lp := range s.Logprobs() {
		v := float32(lp)
		if math.IsInf(lp, -1) || lp < -math.MaxFloat32 {
			v = -math.MaxFloat32 // JSON has no -Inf; as runGenerateHTTP reports a null logprob
		}
		res.Logprobs = append(res.Logprobs, v)
	}
	var detok struct {
		Prompt string `json:"prompt"`
	}
	if err := postJSON(ctx, base+"/detokenize", o.apiKey, map[string]any{"tokens": textTokens(res.TokenIDs, s.FinishReason)}, &detok); err != nil {
		return fmt.Errorf("detokenizing the output: %w", err)
	}
	res.Text = detok.Prompt
	if n := len(res.TokenIDs); n > 0 && elapsed > 0 {
		res.TokensPerSec = float64(n) / elapsed
	}
	w := cmd.OutOrStdout()
	if o.json {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	fmt.Fprintf(w, "%s%s\n\n[%d tokens, %.1f tokens/s, on %s, weight version %s, finish: %s]\n", prompt, res.Text,
		len(res.TokenIDs), res.TokensPerSec, strings.Join(out.Servers, ", "), versionSpan(res.WeightVersions), res.FinishReason)
	return nil
}

// tokenizeWait bounds how long generate waits for a server to tokenize on (every server
// mid-cut, or just restarted).
const tokenizeWait = 30 * time.Second

// tokenizeOnFleet tokenizes prompt on a server in rotation, trying each in turn and, when
// none is in rotation or every one fails, looking again until tokenizeWait, and returns the
// server's URL.
func tokenizeOnFleet(ctx context.Context, c *sdk.Client, apiKey, prompt string, out any) (string, error) {
	deadline := time.Now().Add(tokenizeWait)
	var last error
	for {
		st, err := c.Status(ctx)
		if err != nil {
			return "", err
		}
		for _, s := range st {
			if !s.InRotation || s.AdvertiseURL == "" {
				continue
			}
			if last = postJSON(ctx, s.AdvertiseURL+"/tokenize", apiKey, map[string]any{"prompt": prompt}, out); last == nil {
				return s.AdvertiseURL, nil
			}
		}
		if time.Now().After(deadline) {
			if last != nil {
				return "", fmt.Errorf("tokenizing the prompt: %w", last)
			}
			return "", fmt.Errorf("%w: no server in rotation to tokenize the prompt within %s", sdk.ErrNoServers, tokenizeWait)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// textTokens drops the final stop token from the ids to detokenize, as the text of
// /v1/completions does not contain it.
func textTokens(ids []int, finish sdk.FinishReason) []int {
	if finish == sdk.FinishStop && len(ids) > 0 {
		return ids[:len(ids)-1]
	}
	return ids
}

func versionSpan(v []int64) string {
	if len(v) == 0 {
		return "-"
	}
	if v[0] == v[len(v)-1] {
		return fmt.Sprint(v[0])
	}
	return fmt.Sprintf("%d..%d", v[0], v[len(v)-1])
}

// postJSON posts body to url and decodes a 200 answer into out.
func postJSON(ctx context.Context, url, apiKey string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<12))
		return fmt.Errorf("%s answered %d: %s", url, resp.StatusCode, strings.TrimSpace(string(msg)))
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(out); err != nil {
		return fmt.Errorf("reading %s: %w", url, err)
	}
	return nil
}
