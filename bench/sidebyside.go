package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/rolloutkit/rollout/engine/gguf"
	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/tokenizer"
)

// SideBySideConfig is what SideBySide measures on one preset's weights.
type SideBySideConfig struct {
	Preset string
	// Precs are rollout's precisions; the first one's greedy tokens from BOS are the
	// reference every row's GreedyMatch counts against.
	Precs []kernels.Precision
	// Types are the GGUF precisions llama.cpp runs.
	Types []gguf.Type
	// Tokens are the greedy tokens of each sequence; Seqs the sequences of the aggregate
	// figure (0: batch 1 only).
	Tokens, Seqs int
	// Threads are llama.cpp's threads, Workers rollout's engine workers (Concurrent).
	Threads, Workers int
	// Rounds is how many times each row is measured (at least once).
	Rounds int
	// Step, when set, is told of each measurement before it starts (progress).
	Step func(format string, args ...any)
}

// phases are a round's passes over the rows: batch 1, then with Seqs the aggregate.
func (c SideBySideConfig) phases() []bool {
	if c.Seqs > 0 {
		return []bool{false, true}
	}
	return []bool{false}
}

// Runs is the number of measurements SideBySide makes, one Step each.
func (c SideBySideConfig) Runs() int {
	return (len(c.Precs) + len(c.Types)) * max(c.Rounds, 1) * len(c.phases())
}

// SameBytes is the GGUF type that stores a weight in about as many bytes as rollout's prec, the
// peer row a rollout row is held against: f32 and bf16 themselves, int8 and w8a8 q8_0.
func SameBytes(prec kernels.Precision) gguf.Type {
	switch prec {
	case kernels.BF16:
		return gguf.BF16
	case kernels.Int8, kernels.W8A8:
		return gguf.Q8_0
	}
	return gguf.F32
}

// SideBySide measures rollout at each of cfg.Precs and llama.cpp (peer) at each of cfg.Types on
// w, whose vocabulary is tok: batch-1 greedy decode from BOS and, with cfg.Seqs, the aggregate of
// that many sequences after 8-token prompts. It runs in rounds, each of which measures every
// row's batch 1 and then every row's aggregate, in sideBySideOrder, so that a shared host's
// drift (its memory bandwidth moves by half from one minute to the next on some VMs) moves the
// two runs of a ratio alike: a row's figures are medians over the rounds, and a rollout row's
// VsPeer is the median of each round's ratio to the llama.cpp run of SameBytes in that round.
// The GGUF files are written once, before the first round, into a temporary directory (a 1B
// model in f32 is 5 GB).
func SideBySide(ctx context.Context, pool *kernels.Pool, peer *LlamaCpp, w *model.Weights, tok tokenizer.Tokenizer, cfg SideBySideConfig) ([]PeerResult, error) {
	if len(cfg.Precs) == 0 || cfg.Tokens <= 0 || cfg.Seqs < 0 || cfg.Threads <= 0 {
		return nil, fmt.Errorf("bench: side by side: %d precisions, %d tokens, %d sequences, %d threads", len(cfg.Precs), cfg.Tokens, cfg.Seqs, cfg.Threads)
	}
	step := cfg.Step
	if step == nil {
		step = func(string, ...any) {}
	}
	dir, err := os.MkdirTemp("", "rollout-peer-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	paths := make([]string, len(cfg.Types))
	for i, typ := range cfg.Types {
		paths[i] = filepath.Join(dir, cfg.Preset+"-"+typ.String()+".gguf")
		if err := gguf.WriteFile(paths[i], w, tok, typ, cfg.Preset); err != nil {
			return nil, err
		}
	}
	c := w.Config
	prompts := make([][]int, cfg.Seqs)
	for i := range prompts {
		prompts[i] = benchPrompt(8, i, c.VocabSize)
	}
	out := make([]PeerResult, 0, len(cfg.Precs)+len(cfg.Types))
	for _, prec := range cfg.Precs {
		out = append(out, PeerResult{Preset: cfg.Preset, Engine: "rollout", Precision: prec.String(), Sequences: cfg.Seqs})
	}
	for _, typ := range cfg.Types {
		out = append(out, PeerResult{Preset: cfg.Preset, Engine: "llama.cpp", Precision: typ.String(), Sequences: cfg.Seqs})
	}
	order := sideBySideOrder(cfg.Precs, cfg.Types)
	rounds := max(cfg.Rounds, 1)
	greedies := make([][]int, len(out))
	for round := range rounds {
		for _, many := range cfg.phases() {
			what := "batch 1"
			if many {
				what = fmt.Sprintf("%d sequences", cfg.Seqs)
			}
			for _, i := range order {
				r := &out[i]
				step("side by side, %s: %s %s, %s, round %d of %d", cfg.Preset, r.Engine, r.Precision, what, round+1, rounds)
				var v float64
				var greedy []int
				switch {
				case i < len(cfg.Precs) && !many:
					d, err := DecodeWeights(ctx, pool, w, cfg.Preset, cfg.Precs[i], cfg.Tokens, 8, 0)
					if err != nil {
						return nil, err
					}
					v, greedy = d.DecodeTokensPerSec, d.Greedy
				case i < len(cfg.Precs):
					m, err := Concurrent(ctx, w, cfg.Preset, cfg.Precs[i], cfg.Seqs, cfg.Tokens, cfg.Workers)
					if err != nil {
						return nil, err
					}
					v = m.TokensPerSec
				case !many:
					one, err := peer.Run(ctx, paths[i-len(cfg.Precs)], [][]int{{c.BOSTokenID}}, cfg.Tokens, cfg.Threads)
					if err != nil {
						return nil, err
					}
					v, greedy = one.DecodeTokensPerSec, one.Tokens[0]
				default:
					m, err := peer.Run(ctx, paths[i-len(cfg.Precs)], prompts, cfg.Tokens, cfg.Threads)
					if err != nil {
						return nil, err
					}
					v = m.AggregateTokensPerSec
				}
				if many {
					r.AggregateRuns = append(r.AggregateRuns, v)
				} else {
					r.Batch1Runs = append(r.Batch1Runs, v)
				}
				if round == 0 && !many {
					greedies[i] = greedy
				}
			}
		}
	}
	for i := range out {
		r := &out[i]
		r.Batch1TokensPerSec, r.AggregateTokensPerSec = Median(r.Batch1Runs), Median(r.AggregateRuns)
		r.GreedyTokens = len(greedies[0])
		for r.GreedyMatch < min(len(greedies[0]), len(greedies[i])) && greedies[i][r.GreedyMatch] == greedies[0][r.GreedyMatch] {
			r.GreedyMatch++
		}
	}
	for i, prec := range cfg.Precs {
		j := slices.Index(cfg.Types, SameBytes(prec))
		if j < 0 {
			continue
		}
		r, p := &out[i], out[len(cfg.Precs)+j]
		r.VsPeerType = p.Precision
		r.VsPeer = MedianRatio(r.Batch1Runs, p.Batch1Runs)
		r.VsPeerAggregate = MedianRatio(r.AggregateRuns, p.AggregateRuns)
	}
	return out, nil
}

// sideBySideOrder is the order of a round's runs over the rows (rollout's precs, then the peer's
// types, as indexes of both lists concatenated): each peer type runs right after the first
// rollout precision of about its bytes a weight (SameBytes), so that the two runs of a ratio
// are seconds apart, not minutes; types no precision maps to run last.
func sideBySideOrder(precs []kernels.Precision, types []gguf.Type) []int {
	var order []int
	ran := make([]bool, len(types))
	for i, prec := range precs {
		order = append(order, i)
		if j := slices.Index(types, SameBytes(prec)); j >= 0 && !ran[j] {
			order, ran[j] = append(order, len(precs)+j), true
		}
	}
	for j := range types {
		if !ran[j] {
			order = append(order, len(precs)+j)
		}
	}
	return order
}
