package bench

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// ErrNoLlamaCpp means the peer cannot run here: no node binary or no node-llama-cpp package.
var ErrNoLlamaCpp = errors.New("bench: llama.cpp peer not available")

// LlamaCppModuleEnv names the environment variable that points at an installed node-llama-cpp
// package directory (…/node_modules/node-llama-cpp).
const LlamaCppModuleEnv = "ROLLOUT_NODE_LLAMA_CPP"

// llamaCppScript is bench/peer/llamacpp.mjs, embedded so that the binary needs no checkout
// beside it. It is run from a file, not with --eval: node-llama-cpp tests its binding in a
// child process started with the parent's node flags, which --eval would make run the script.
//
//go:embed peer/llamacpp.mjs
var llamaCppScript string

// LlamaCpp is llama.cpp run through node-llama-cpp's prebuilt CPU build (installed from npm by
// the user, never by rollout): the peer engine of the GGUF benchmark.
type LlamaCpp struct {
	node, module string
}

// FindLlamaCpp locates node and the node-llama-cpp package: module when not empty, else
// $ROLLOUT_NODE_LLAMA_CPP, else bench/peer/node_modules/node-llama-cpp below the working
// directory (where `make peer-install` puts it). It returns ErrNoLlamaCpp, saying what is
// missing, when either is absent.
func FindLlamaCpp(module string) (*LlamaCpp, error) {
	if module == "" {
		module = os.Getenv(LlamaCppModuleEnv)
	}
	if module == "" {
		module = filepath.Join("bench", "peer", "node_modules", "node-llama-cpp")
	}
	abs, err := filepath.Abs(module)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoLlamaCpp, err)
	}
	if _, err := os.Stat(filepath.Join(abs, "dist", "index.js")); err != nil {
		return nil, fmt.Errorf("%w: no node-llama-cpp at %s (npm install --prefix bench/peer, or set %s): %w",
			ErrNoLlamaCpp, abs, LlamaCppModuleEnv, err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoLlamaCpp, err)
	}
	return &LlamaCpp{node: node, module: abs}, nil
}

// LlamaCppRun is what one run of the peer reports.
type LlamaCppRun struct {
	// Tokens are the greedy tokens of each prompt, in order.
	Tokens [][]int `json:"tokens"`
	// DecodeTokensPerSec is the first sequence's decode rate from its first token on.
	DecodeTokensPerSec float64 `json:"decode_tokens_per_s"`
	// AggregateTokensPerSec is all sequences' tokens over the time from the start to the last.
	AggregateTokensPerSec float64 `json:"aggregate_tokens_per_s"`
	Threads               int     `json:"threads"`
	Build                 string  `json:"build"`
}

// Run loads the GGUF file at path and decodes tokens greedy tokens after each prompt, all
// prompts concurrently, on threads threads.
func (l *LlamaCpp) Run(ctx context.Context, path string, prompts [][]int, tokens, threads int) (LlamaCppRun, error) {
	if len(prompts) == 0 || tokens <= 0 || threads <= 0 {
		return LlamaCppRun{}, fmt.Errorf("bench: llama.cpp run: %d prompts, %d tokens, %d threads", len(prompts), tokens, threads)
	}
	args, err := json.Marshal(map[string]any{"module": l.module, "model": path, "prompts": prompts, "tokens": tokens, "threads": threads})
	if err != nil {
		return LlamaCppRun{}, err
	}
	dir, err := os.MkdirTemp("", "rollout-llamacpp-")
	if err != nil {
		return LlamaCppRun{}, err
	}
	defer os.RemoveAll(dir)
	script := filepath.Join(dir, "llamacpp.mjs")
	if err := os.WriteFile(script, []byte(llamaCppScript), 0o644); err != nil {
		return LlamaCppRun{}, err
	}
	cmd := exec.CommandContext(ctx, l.node, script, string(args))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return LlamaCppRun{}, fmt.Errorf("bench: node-llama-cpp on %s: %w: %s", path, err, bytes.TrimSpace(stderr.Bytes()))
	}
	var r LlamaCppRun
	if err := json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &r); err != nil {
		return LlamaCppRun{}, fmt.Errorf("bench: node-llama-cpp output %q: %w", stdout.String(), err)
	}
	if len(r.Tokens) != len(prompts) {
		return LlamaCppRun{}, fmt.Errorf("bench: node-llama-cpp returned %d sequences for %d prompts", len(r.Tokens), len(prompts))
	}
	return r, nil
}

// PeerResult is one engine's figures at one precision on one preset's weights (seed 1, the
// weights Decode and Concurrent run).
type PeerResult struct {
	Preset    string `json:"preset"`
	Engine    string `json:"engine"`    // "rollout" or "llama.cpp"
	Precision string `json:"precision"` // "f32", "f16", "q8_0", …
	// Batch1TokensPerSec is greedy decode from BOS of one sequence (median of the runs).
	Batch1TokensPerSec float64   `json:"batch1_tokens_per_s"`
	Batch1Runs         []float64 `json:"batch1_runs,omitempty"`
	// Sequences greedy sequences after 8-token prompts (benchPrompt, as Concurrent) decode
	// together; AggregateTokensPerSec is all their tokens over the wall time (median).
	Sequences             int       `json:"sequences"`
	AggregateTokensPerSec float64   `json:"aggregate_tokens_per_s"`
	AggregateRuns         []float64 `json:"aggregate_runs,omitempty"`
	// GreedyMatch is how many leading batch-1 tokens equal rollout's greedy tokens at the
	// reference precision (f32 unless told otherwise), of GreedyTokens.
	GreedyMatch  int `json:"greedy_match"`
	GreedyTokens int `json:"greedy_tokens"`
	// VsPeer is, on a rollout row, the median over the rounds of its batch-1 rate over that of
	// the llama.cpp row VsPeerType (SameBytes) in the same round; VsPeerAggregate the same of
	// the aggregate. 0 where that type was not run.
	VsPeer          float64 `json:"vs_peer,omitempty"`
	VsPeerAggregate float64 `json:"vs_peer_aggregate,omitempty"`
	VsPeerType      string  `json:"vs_peer_type,omitempty"`
}
