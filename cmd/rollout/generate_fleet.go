package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rolloutkit/rollout/sdk"
)

// runGenerateFleet is runGenerate on a fleet: the prompt is tokenized by one of the fleet's
// servers (sdk.Client.Tokenize, so the ids are exactly what /v1/completions would use),
// generated through sdk.Generate (routed by load and affinity, continued across pauses), and
// the tokens are detokenized by a server again (sdk.Client.Detokenize). Each waits up to the
// client's RouteTimeout for a server in rotation.
func runGenerateFleet(ctx context.Context, cmd *cobra.Command, o generateOpts, prompt string) error {
	o.conn.apiKey = o.apiKey
	c, err := o.conn.dial(ctx, cmd)
	if err != nil {
		return err
	}
	defer c.Close()
	ids, err := c.Tokenize(ctx, sdk.TokenizeRequest{Text: prompt})
	if err != nil {
		return fmt.Errorf("fleet %q: tokenizing the prompt: %w", o.conn.fleet, err)
	}
	seed := o.seed
	start := time.Now()
	out, err := c.Generate(ctx, sdk.GenerateRequest{PromptTokenIDs: ids, N: 1, Sampling: sdk.SamplingParams{
		MaxTokens: o.maxTokens, Temperature: o.temperature, Greedy: o.temperature == 0, TopP: o.topP, TopK: o.topK, Seed: &seed,
		LogprobMode: sdk.LogprobRaw}}) // as the local and HTTP paths report them
	if err != nil {
		return fmt.Errorf("generate on fleet %q: %w", o.conn.fleet, err)
	}
	elapsed := time.Since(start).Seconds()
	res := generateResult{GenerateResult: *out, Model: "fleet:" + o.conn.fleet, PromptTokenIDs: ids}
	s := res.sample()
	if res.Text, err = c.Detokenize(ctx, textTokens(s.TokenIDs(), s.FinishReason)); err != nil {
		return fmt.Errorf("fleet %q: detokenizing the output: %w", o.conn.fleet, err)
	}
	if n := len(s.Tokens); n > 0 && elapsed > 0 {
		res.TokensPerSec = float64(n) / elapsed
	}
	w := cmd.OutOrStdout()
	if o.json {
		return res.printJSON(w)
	}
	fmt.Fprintf(w, "%s%s\n\n[%d tokens, %.1f tokens/s, on %s, weight version %s, finish: %s]\n", prompt, res.Text,
		len(s.Tokens), res.TokensPerSec, strings.Join(out.Servers, ", "), versionSpan(s.WeightVersions()), s.FinishReason)
	return nil
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
