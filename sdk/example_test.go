package sdk_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"

	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/weights"
	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/server/embedded"
)

// saveCheckpoint stands in for the trainer's checkpoint writer: a new tiny checkpoint in dir
// and its digest.
func saveCheckpoint(ctx context.Context, dir string, seed uint64) (string, error) {
	w, err := model.Preset("tiny", seed)
	if err != nil {
		return "", err
	}
	if err := weights.SaveHF(dir, w, weights.F32); err != nil {
		return "", err
	}
	return weights.Digest(ctx, dir)
}

// A training loop: generate a GRPO group of rollouts on the fleet, train on them, publish
// the new weights to every server, and ask for rollouts on at least that version next step.
// The fleet here is embedded (two servers in this process); against `rollout serve`
// processes only Dial's options change (Redis, Fleet, Secret).
func Example() {
	ctx := context.Background()
	fleet, err := embedded.Start(ctx, embedded.Options{Servers: 2, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	defer fleet.Close()
	c, err := sdk.Dial(ctx, fleet.DialOptions())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	dir, err := os.MkdirTemp("", "rollout-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	prompt := []int{72, 101, 108, 108, 111} // "Hello" in the tiny model's byte vocabulary
	for step := int64(1); step <= 3; step++ {
		out, err := c.Generate(ctx, sdk.GenerateRequest{PromptTokenIDs: prompt, N: 4, MinVersion: step - 1,
			Sampling: sdk.SamplingParams{MaxTokens: 8, Temperature: 1, IgnoreEOS: true}})
		if err != nil {
			log.Fatal(err)
		}
		// ... compute advantages and a policy-gradient step from out.Samples: every token
		// carries its logprob and the weight version that produced it ...
		ckpt := filepath.Join(dir, strconv.FormatInt(step, 10))
		digest, err := saveCheckpoint(ctx, ckpt, uint64(step))
		if err != nil {
			log.Fatal(err)
		}
		res, err := c.UpdateWeights(ctx, sdk.WeightsRef{Version: step, URI: "file://" + ckpt, SHA256: digest},
			sdk.Plan{Policy: sdk.Rolling(1)})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("step %d: %d samples of %d tokens from version %d; update %s, fleet on version %d\n",
			step, len(out.Samples), len(out.Samples[0].Tokens), out.Samples[0].Tokens[0].WeightVersion, res.Outcome, res.Version)
	}
	// Output:
	// step 1: 4 samples of 8 tokens from version 0; update committed, fleet on version 1
	// step 2: 4 samples of 8 tokens from version 1; update committed, fleet on version 2
	// step 3: 4 samples of 8 tokens from version 2; update committed, fleet on version 3
}
