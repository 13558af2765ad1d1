package pipeline_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/weights"
	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/sdk/pipeline"
	"github.com/rolloutkit/rollout/server/embedded"
)

// An asynchronous GRPO loop: the pipeline generates the next batch while the trainer trains
// and the fleet updates, and hands out batches whose tokens are at most K versions behind the
// trainer. A new tiny checkpoint stands in for each trainer step.
func Example() {
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)
	fleet, err := embedded.Start(ctx, embedded.Options{Servers: 2, Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	defer fleet.Close()
	o := fleet.DialOptions()
	o.Logger = quiet
	c, err := sdk.Dial(ctx, o)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	dir, err := os.MkdirTemp("", "pipeline-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	// The verifier: the share of even token ids (any function of the prompt and tokens).
	even := pipeline.VerifierFunc(func(_ context.Context, _ pipeline.Prompt, t pipeline.Trajectory) (float64, error) {
		n := 0
		for _, id := range t.Completion {
			n += 1 - id%2
		}
		return float64(n) / float64(len(t.Completion)), nil
	})
	i := 0
	prompts := func(context.Context) (pipeline.Prompt, error) {
		i++
		return pipeline.Prompt{TokenIDs: []int{72, 101 + i%20, 108}}, nil
	}
	const K = 1
	p, err := pipeline.Start(ctx, pipeline.Config{GroupSize: 4, BatchGroups: 2, MaxStaleness: K, Logger: quiet,
		Generator: pipeline.Fleet{Call: c.Generate, Sampling: sdk.SamplingParams{MaxTokens: 8, IgnoreEOS: true}},
		Verifier:  even, Source: prompts})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()

	var version int64 // the trainer's
	for range 3 {
		b, err := p.Next(ctx, version)
		if err != nil {
			log.Fatal(err)
		}
		oldest := version
		for _, g := range b.Groups {
			oldest = min(oldest, g.MinVersion)
		}
		fmt.Printf("trainer at version %d: %d groups, oldest token within %d versions: %v\n", version, len(b.Groups), K, oldest >= version-K)

		// "Train", publish the new version and update the fleet (here: wait for it).
		version++
		vdir := filepath.Join(dir, fmt.Sprint(version))
		w, err := model.Preset("tiny", uint64(version))
		if err != nil {
			log.Fatal(err)
		}
		if err := weights.SaveHF(vdir, w, weights.F32); err != nil {
			log.Fatal(err)
		}
		digest, err := weights.Digest(ctx, vdir)
		if err != nil {
			log.Fatal(err)
		}
		if _, err := c.UpdateWeights(ctx, sdk.WeightsRef{Version: version, URI: "file://" + vdir, SHA256: digest},
			sdk.Plan{Policy: sdk.AllOrNothing}); err != nil {
			log.Fatal(err)
		}
		p.SetVersion(version)
	}
	// Output:
	// trainer at version 0: 2 groups, oldest token within 1 versions: true
	// trainer at version 1: 2 groups, oldest token within 1 versions: true
	// trainer at version 2: 2 groups, oldest token within 1 versions: true
}
