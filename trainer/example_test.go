package trainer_test

import (
	"context"
	"fmt"

	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/trainer"
	"github.com/rolloutkit/rollout/weightstore"
)

// Example shows one iteration of an RL loop around the trainer: train on scored samples,
// publish the new version, and hand the servers the ref to load.
func Example() {
	ctx := context.Background()
	w, err := model.Preset("tiny", 1)
	if err != nil {
		panic(err)
	}
	tr, err := trainer.New(w, trainer.Config{LR: 1e-3})
	if err != nil {
		panic(err)
	}
	defer tr.Close()
	store, err := weightstore.Open(ctx, "/tmp/rl-weights")
	if err != nil {
		panic(err)
	}
	srv, err := weightstore.Serve("127.0.0.1:0", store)
	if err != nil {
		panic(err)
	}
	defer srv.Close(ctx)

	// Samples come from the rollout servers: G completions per prompt (same Group), with the
	// per-token raw logprobs and weight versions the servers returned, and a reward each.
	var samples []trainer.Sample
	st, err := tr.Step(ctx, samples)
	if err != nil {
		panic(err) // ErrEmptyBatch here; ErrGroupTooSmall, ErrInvalidSample for bad batches
	}
	// The sdk.WeightsRef{Version, URI: http://.../vN/, SHA256} for sdk.Client.UpdateWeights.
	ref, err := srv.Publish(ctx, tr.Version(), tr.Weights())
	if err != nil {
		panic(err)
	}
	fmt.Println(st.RewardMean, st.MismatchMax, ref.URI)
}
