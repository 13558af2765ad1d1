// Package pipeline is an asynchronous rollout pipeline for RL training on a Rollout fleet:
// it generates groups continuously into a buffer while the trainer trains, bounds how stale a
// trained-on sample may be, and hands out batches oldest-first.
//
//	p, err := pipeline.Start(ctx, pipeline.Config{GroupSize: 8, BatchGroups: 16, MaxStaleness: 1,
//		Generator: pipeline.Fleet{Call: client.Generate, Sampling: samp},
//		Verifier: verifier, Source: prompts, Version: tr.Version()})
//	defer p.Close()
//	for {
//		b, err := p.Next(ctx, tr.Version()) // every group's tokens are >= tr.Version()-K
//		... train on b.Groups, publish, client.UpdateWeights ...
//		p.SetVersion(newVersion) // once the update committed
//	}
//
// Staleness: a group whose oldest model token was generated at weight version v is trained on
// only by a trainer at version <= v+K (MaxStaleness). The pipeline keeps to this by admission
// control rather than by discarding work (as AReaL does): it starts a group only while every
// group in flight or buffered fits into the batches up to version+K, generates it at the
// fleet's current version (sdk.GenerateRequest.MinVersion), and Next withholds a batch while
// a group in flight would otherwise miss its last batch. Groups that still cannot be taken in
// time (over-sampled ones) are dropped and counted as stale, never trained on.
//
// Dynamic sampling (DAPO): with FilterZeroVariance, a group whose rewards are all equal is
// dropped and another generated in its place; OverSample starts that many groups ahead to
// hide the refill.
//
// Results stream as they finish: OnSample for each scored sample, OnGroup for each group. A
// Verifier scores samples concurrently, each call under VerifyTimeout; a verifier error or
// timeout fails its group, which is counted, reported to OnGroup and listed in the next
// Batch's Errors, and never trained on. A generation error stops the pipeline: Next returns
// it. Close cancels the work in flight and waits for every goroutine.
//
// The scheduling logic (core.go) is a deterministic state machine without goroutines or
// clocks; pipeline.go is the thin loop around it. The package imports the SDK, never the
// trainer: Trajectory carries what a trainer sample needs (tokens, logprobs, per-token
// versions and the loss mask of multi-turn rollouts).
package pipeline
