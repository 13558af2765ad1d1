package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"

	"github.com/rolloutkit/rollout/sdk"
)

// evalItem is one held-out prompt of an evaluation, as eval.jsonl holds it.
type evalItem struct {
	Prompt             string `json:"prompt"`
	PromptTokenIDs     []int  `json:"prompt_token_ids"`
	Expected           string `json:"expected"`
	ExpectedTokenIDs   []int  `json:"expected_token_ids"`
	CompletionTokenIDs []int  `json:"completion_token_ids"`
	Completion         string `json:"completion"`
	FinishReason       string `json:"finish_reason"`
	Correct            bool   `json:"correct"`
	// Sampling of the completion: greedy, with this token budget.
	Greedy    bool  `json:"greedy"`
	MaxTokens int   `json:"max_tokens"`
	Version   int64 `json:"weight_version"`
	// PassCorrect is how many of the K samples at the training sampling were correct.
	PassCorrect int `json:"pass_correct"`
}

// evalResult is one held-out evaluation.
type evalResult struct {
	Greedy   float64 // greedy accuracy
	PassK    float64 // fraction of prompts with a correct answer among K samples
	K        int
	Distinct int // distinct greedy completions over the held-out prompts
	Items    []evalItem
}

// evaluate scores the policy the fleet serves (at least version v) on the held-out prompts:
// greedy accuracy, and pass@k with k samples at the training sampling (seeded).
func evaluate(ctx context.Context, c *sdk.Client, tk *task, samp sdk.SamplingParams, k int, v int64) (*evalResult, error) {
	res := &evalResult{K: k, Items: make([]evalItem, len(tk.HeldOut))}
	maxTokens := tk.maxTokens()
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if firstErr == nil {
			firstErr = err
		}
	}
	for i, p := range tk.HeldOut {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			g, err := c.Generate(ctx, sdk.GenerateRequest{PromptTokenIDs: p.Prompt, MinVersion: v,
				Sampling: sdk.SamplingParams{MaxTokens: maxTokens, Greedy: true}})
			if err != nil {
				fail(err)
				return
			}
			s := g.Samples[0]
			ids := s.TokenIDs()
			it := evalItem{Prompt: p.Text, PromptTokenIDs: p.Prompt, Expected: text(p.Answer), ExpectedTokenIDs: p.Answer,
				CompletionTokenIDs: ids, Completion: tk.render(ids), FinishReason: string(s.FinishReason), Correct: tk.correct(p, ids),
				Greedy: true, MaxTokens: maxTokens}
			if len(ids) > 0 {
				it.Version = s.WeightVersions()[0]
			}
			if k > 0 {
				sp := samp
				sp.MaxTokens = maxTokens
				seed := int64(1_000_000 + i)
				sp.Seed = &seed
				g, err := c.Generate(ctx, sdk.GenerateRequest{PromptTokenIDs: p.Prompt, N: k, MinVersion: v, Sampling: sp})
				if err != nil {
					fail(err)
					return
				}
				for _, s := range g.Samples {
					if tk.correct(p, s.TokenIDs()) {
						it.PassCorrect++
					}
				}
			}
			res.Items[i] = it
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return nil, fmt.Errorf("evaluation: %w", firstErr)
	}
	distinct := map[string]bool{}
	for _, it := range res.Items {
		if it.Correct {
			res.Greedy++
		}
		if it.PassCorrect > 0 {
			res.PassK++
		}
		distinct[fmt.Sprint(it.CompletionTokenIDs)] = true
	}
	n := float64(len(res.Items))
	res.Greedy /= n
	res.PassK /= n
	res.Distinct = len(distinct)
	return res, nil
}

// writeEval writes one JSON object per held-out prompt.
func writeEval(path string, r *evalResult) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	for _, it := range r.Items {
		if err := enc.Encode(it); err != nil {
			_ = f.Close()
			return err
		}
	}
	return f.Close()
}
