// Package engine is EngineCore: one goroutine that owns the scheduler, the KV pool and the
// model, and steps them, with vLLM v1's semantics and a few deliberate improvements.
//
// Before each step the loop handles every queued message (adds, aborts, utility calls), so two
// utility calls with no step between them are normal (a pause with cache clearing, then a sleep).
// The loop steps while there is work, HasWork = scheduler has requests || the connector has
// pending push work (an undelivered flush set counts), and otherwise blocks on its input: an idle
// engine uses no CPU. Connector metadata reaches the worker side only inside a step, and every
// step carries one, even a step with no tokens.
//
// Utility calls (Pause, Resume, Sleep, WakeUp, ResetPrefixCache, StageWeights, CommitWeights,
// Stats, …) are queued and answered when done; Pause and Sleep complete once the engine has
// drained what they wait for. Requests that arrive while the engine is paused or asleep are queued
// up to Config.MaxQueued, then refused with ErrQueueFull.
//
// Usage:
//
//	e, err := engine.New(engine.Config{Weights: w})
//	go e.Run(ctx)
//	s, err := e.Add(ctx, engine.Request{ID: "r1", PromptTokenIDs: ids, Sampling: p})
//	res, err := s.Collect(ctx)
package engine
