package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/load"
	"github.com/rolloutkit/rollout/engine/sample"
	"github.com/rolloutkit/rollout/engine/tokenizer"
	"github.com/rolloutkit/rollout/sdk"
)

type generateOpts struct {
	model, tokenizer string
	server, apiKey   string
	conn             fleetConn
	maxTokens        int
	temperature      float64
	topP             float64
	topK             int
	seed             int64
	json             bool
}

func newGenerateCmd() *cobra.Command {
	var o generateOpts
	cmd := &cobra.Command{
		Use:   "generate [flags] PROMPT",
		Short: "Generate text from a prompt (in-process engine with --model, a server with --server, or a fleet with --redis and --fleet)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.conn.redis.conf.URL != "" || o.conn.fleet != "" {
				if o.server != "" || cmd.Flags().Changed("model") || cmd.Flags().Changed("tokenizer") {
					return fmt.Errorf("--redis/--fleet and --server/--model/--tokenizer are exclusive: the fleet's servers have their own model")
				}
				return runGenerateFleet(cmd.Context(), cmd, o, args[0])
			}
			if o.server != "" {
				if cmd.Flags().Changed("model") || cmd.Flags().Changed("tokenizer") {
					return fmt.Errorf("--server and --model/--tokenizer are exclusive: the server has its own model")
				}
				return runGenerateHTTP(cmd.Context(), cmd, o, args[0])
			}
			return runGenerate(cmd.Context(), cmd, o, args[0])
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.model, "model", load.DefaultSpec, "model: builtin:NAME[@SEED], an HF checkpoint directory, or a llama2.c .bin file (or its directory)")
	f.StringVar(&o.tokenizer, "tokenizer", "", "tokenizer file overriding the one beside the checkpoint")
	f.StringVar(&o.server, "server", "", "generate on a running server (its base URL, e.g. http://127.0.0.1:8000) instead of in-process")
	f.StringVar(&o.apiKey, "api-key", "", "API key of the --server or the fleet's servers (sent as a bearer token)")
	o.conn.register(cmd, false)
	f.IntVar(&o.maxTokens, "max-tokens", 64, "tokens to generate at most")
	f.Float64Var(&o.temperature, "temperature", 0, "sampling temperature (0: greedy)")
	f.Float64Var(&o.topP, "top-p", 1, "nucleus sampling mass in (0,1]")
	f.IntVar(&o.topK, "top-k", 0, "sample among the k most likely tokens (0: off)")
	f.Int64Var(&o.seed, "seed", 0, "sampling seed (same seed, same tokens)")
	f.BoolVar(&o.json, "json", false, "print one JSON object instead of text")
	return cmd
}

// generateResult is what `generate --json` prints in every mode (in-process, one server, a
// fleet): the SDK's GenerateResult, whose one sample holds every token with its logprob and
// weight version, and beside it what only the CLI knows. One shape, so that a script reads the
// CLI's output as a training loop reads Generate's.
type generateResult struct {
	sdk.GenerateResult
	// Model is the model spec, the server's model name, or fleet:NAME.
	Model string `json:"model"`
	// Text is the sample decoded, without a final stop token (as /v1/completions has it).
	Text           string  `json:"text"`
	PromptTokenIDs []int   `json:"prompt_token_ids"`
	TokensPerSec   float64 `json:"tokens_per_s"`
	TTFTSeconds    float64 `json:"ttft_s"`
}

// newGenerateResult is a result with one empty sample, which the in-process and HTTP paths
// fill as tokens arrive. They know no fleet, so its server lists are empty (not null).
func newGenerateResult(model string, prompt []int) generateResult {
	s := sdk.Sample{Servers: []string{}, Segments: []sdk.Segment{}}
	return generateResult{GenerateResult: sdk.GenerateResult{Samples: []sdk.Sample{s}, Servers: []string{}}, Model: model,
		PromptTokenIDs: prompt}
}

// sample is the result's one sample.
func (r *generateResult) sample() *sdk.Sample { return &r.Samples[0] }

// printJSON writes the result as indented JSON.
func (r *generateResult) printJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func runGenerate(ctx context.Context, cmd *cobra.Command, o generateOpts, prompt string) error {
	m, err := load.Open(o.model, o.tokenizer)
	if err != nil {
		return err
	}
	ids, err := m.Tokenizer.Encode(prompt)
	if err != nil {
		return fmt.Errorf("tokenizing the prompt: %w", err)
	}
	if bos := m.Tokenizer.BOS(); bos >= 0 {
		ids = append([]int{bos}, ids...)
	}
	p := sample.Defaults()
	p.MaxTokens = o.maxTokens
	p.Temperature = o.temperature
	p.TopP = o.topP
	p.TopK = o.topK
	seed := o.seed
	p.Seed = &seed

	e, err := engine.New(engine.Config{Weights: m.Weights, MaxNumSeqs: 1})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			loggerFrom(cmd).Warn("engine stopped with an error", "err", err)
		}
	}()

	start := time.Now()
	s, err := e.Add(ctx, engine.Request{ID: "generate", PromptTokenIDs: ids, Sampling: p})
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	dec := tokenizer.NewStreamDecoder(m.Tokenizer)
	res := newGenerateResult(o.model, ids)
	smp := res.sample()
	var first time.Time
	if !o.json {
		fmt.Fprint(out, prompt)
	}
	for {
		o2, err := s.Recv(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		for _, t := range o2.Tokens {
			if first.IsZero() {
				first = time.Now()
			}
			smp.Tokens = append(smp.Tokens, sdk.Token{ID: t.ID, Logprob: float64(t.Logprob), WeightVersion: t.WeightVersion})
			if t.ID == m.Weights.Config.EOSTokenID {
				continue
			}
			text, err := dec.Push(t.ID)
			if err != nil {
				return err
			}
			res.Text += text
			if !o.json {
				fmt.Fprint(out, text)
			}
		}
		if o2.Finished {
			smp.FinishReason = sdk.FinishReason(o2.FinishReason)
		}
	}
	tail := dec.Flush()
	res.Text += tail
	elapsed := time.Since(start).Seconds()
	if n := len(smp.Tokens); n > 0 && elapsed > 0 {
		res.TokensPerSec = float64(n) / elapsed
		res.TTFTSeconds = first.Sub(start).Seconds()
	}
	if o.json {
		return res.printJSON(out)
	}
	fmt.Fprintf(out, "%s\n\n[%d tokens, %.1f tokens/s, first token after %.1f ms, finish: %s]\n",
		tail, len(smp.Tokens), res.TokensPerSec, res.TTFTSeconds*1e3, smp.FinishReason)
	return nil
}
