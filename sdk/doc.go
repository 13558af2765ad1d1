// Package sdk is the trainer-facing client of a Rollout fleet: a Go training loop dials the
// fleet, generates rollouts on it and moves every server to new weights each step.
//
//	c, err := sdk.Dial(ctx, sdk.Options{Redis: redisconf.Config{URL: "redis://127.0.0.1:6379"},
//		Fleet: "demo", Secret: secret})
//	...
//	for step := int64(1); ; step++ {
//		out, err := c.Generate(ctx, sdk.GenerateRequest{PromptTokenIDs: prompt, N: 8,
//			Sampling: sdk.SamplingParams{MaxTokens: 256, Temperature: 1}, MinVersion: step - 1})
//		... train on out.Samples (every token carries its weight version and logprob) ...
//		res, err := c.UpdateWeights(ctx, sdk.WeightsRef{Version: step, URI: uri, SHA256: digest},
//			sdk.Plan{Policy: sdk.Quorum(3)})
//	}
//
// The control plane is the one docs/fleet.md describes: commands are signed envelopes
// published on the fleet's channel, acks come back on durable per-command lists, each server
// heartbeats its state under a key with a TTL, and the desired-state key (written with
// compare-and-swap) is what every server converges to, so a server that missed a command
// catches up by itself.
//
// The control calls (Pause, Resume, Sleep, WakeUp, ResetCache, Abort) publish one command to
// every target (all live servers unless Targets is given) and wait for every ack; a failure
// on any target returns a *FleetError holding each server's result (errors.Is(err,
// ErrPartial)). Each takes one options struct (PauseOptions, ResumeOptions, ...) that embeds
// Call, whose Targets and Timeout tune that call:
//
//	c.Pause(ctx, sdk.PauseOptions{Mode: sdk.PauseKeep})                        // the whole fleet
//	c.Resume(ctx, sdk.ResumeOptions{Call: sdk.Call{Targets: []string{"s1"}}}) // one server
//
// Every option is passed one way, in one struct, and its zero value is its documented
// default: no pointer fields, no variadic options. Redis is configured in one place,
// Options.Redis.
//
// UpdateWeights is one transaction: stage on every target while it keeps serving, decide by
// the policy (AllOrNothing, Quorum(K), Rolling(K)), move the desired state (the commit point),
// then commit on the servers that staged (pause → sleep → swap → wake → resume, as one command
// per server). The result gives, per server and phase, what happened and how long it took,
// and each server's generation bubble.
//
// Generate routes to the servers' native /generate by load and prompt affinity (all N samples
// of a group go to one server), only to in-rotation servers at MinVersion or above; it moves
// to another server when one fails and continues a sample that a pause aborted, so the caller
// always gets whole samples.
//
// Sessions (NewSession) hold a multi-turn episode as token ids: model turns (Session.Generate,
// each token with its logprob and weight version) and environment tokens (Append, AppendText)
// are appended and nothing is re-tokenized. Every turn is routed by the session's affinity key
// (GenerateRequest.AffinityKey), so it runs where the previous turn's KV is cached, and
// Trajectory exports the episode with a loss mask for the trainer. With a Decode function
// (Client.Detokenize) turns carry the tool calls parsed from them (package toolcall).
// Tokenize renders messages and tools with the servers' chat template. See docs/agentic.md.
//
// Sampling defaults fit RL: a zero Temperature means 1.0 (vLLM's default), greedy decoding is
// asked for with SamplingParams.Greedy, and N > 1 greedy samples (N copies of one sample, with
// zero GRPO advantage) are refused unless AllowIdenticalSamples is set. Token logprobs are
// processed by default (LogprobProcessed: the distribution sampled from, after temperature
// and filters), which is what importance ratios divide by at any sampling settings; give the
// trainer the same settings (trainer.Config.Sampling). LogprobRaw is the model's own
// distribution at temperature 1 without filters: for scoring or evaluation.
//
// The package prints nothing: it logs through the Options.Logger slog.Logger (slog.Default()
// when nil).
//
// The same code runs against an in-process fleet (server/embedded), which hands Dial an open
// bus in Options.Bus. The package never imports the engine or the server.
package sdk
