package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"

	"github.com/rolloutkit/rollout/sdk"
)

// evalItem is one held-out episode of an evaluation, as eval.jsonl holds it.
type evalItem struct {
	Prompt         string `json:"prompt"`
	PromptTokenIDs []int  `json:"prompt_token_ids"`
	Key            int    `json:"key"`
	Expected       string `json:"expected"` // the value the tool holds under the key
	// Transcript is everything after the prompt (model and tool tokens), TranscriptTokenIDs
	// its ids and LossMask which of them are the model's (1) or the tool's (0).
	Transcript         string `json:"transcript"`
	TranscriptTokenIDs []int  `json:"transcript_token_ids"`
	LossMask           []int  `json:"loss_mask"` // ints, not []uint8, which JSON would encode as base64
	Called             bool   `json:"called_tool"`
	KeyDigits          int    `json:"key_digits_right"`
	Success            bool   `json:"success"`
	Greedy             bool   `json:"greedy"`
	Version            int64  `json:"weight_version"`
}

// evalResult is one held-out evaluation (greedy episodes).
type evalResult struct {
	Success  float64 // share of episodes whose answer is right
	ToolUse  float64 // share of episodes that called the tool
	KeyRight float64 // share of episodes whose call named the question's key
	Items    []evalItem
}

// evaluate runs one greedy episode per held-out question on the policy the fleet serves (at
// least version v).
func evaluate(ctx context.Context, ep episodes, v int64) (*evalResult, error) {
	tk := ep.tk
	res := &evalResult{Items: make([]evalItem, len(tk.HeldOut))}
	sem := make(chan struct{}, 16)
	errs := make([]error, len(tk.HeldOut))
	var wg sync.WaitGroup
	for i, p := range tk.HeldOut {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			tr, o, err := ep.episode(ctx, p, v, sdk.SamplingParams{Greedy: true}, nil)
			if err != nil {
				errs[i] = err
				return
			}
			it := evalItem{Prompt: p.Text, PromptTokenIDs: p.Prompt, Key: p.Key, Expected: fmt.Sprint(p.Value),
				Transcript: tk.render(tr.Completion), TranscriptTokenIDs: tr.Completion, LossMask: make([]int, len(tr.LossMask)),
				Called: o.Called, KeyDigits: o.KeyDigits, Success: o.Success, Greedy: true}
			for j, m := range tr.LossMask {
				it.LossMask[j] = int(m)
			}
			if lo, _, ok := tr.VersionRange(); ok {
				it.Version = lo
			}
			res.Items[i] = it
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("evaluation: %w", err)
		}
	}
	for _, it := range res.Items {
		if it.Success {
			res.Success++
		}
		if it.Called {
			res.ToolUse++
		}
		if it.KeyDigits == 2 {
			res.KeyRight++
		}
	}
	n := float64(len(res.Items))
	res.Success, res.ToolUse, res.KeyRight = res.Success/n, res.ToolUse/n, res.KeyRight/n
	return res, nil
}

// writeEval writes one JSON object per held-out episode.
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
