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
// UpdateWeights, Stats, …) are queued and answered when done; Pause and Sleep complete once the
// engine has drained what they wait for. The control calls among them (Pause, Resume, Sleep,
// WakeUp, StageWeights, CommitWeights, UpdateWeights, PrepareSpare) are linearizable: the loop
// starts them one at a time, in the order it received them, each once the one before it
// returned, and each changes the control state at one point (see Resume). So a Resume sent
// while a Pause(wait) drains lets the drain finish (the running requests end normally, the
// Pause returns) and resumes right after, and no later call overtakes it. A control call whose
// caller gives up before it started never runs; once started it completes (ErrStillRunning).
// UpdateWeights stages and commits in one call, so concurrent updates never interleave;
// CommitWeights names the version.
//
// A step that fails (a forward error) aborts the requests it scheduled, rolled back so that
// nothing the step was to compute is cached or offloaded; the connector fails the step's
// stores. A connector load that fails its checks makes its request recompute. Before a sleep
// releases the KV pool every request gives its blocks up and later recomputes; releasing with
// a block owned is counted in Metrics().InvariantViolations. Requests wait to be scheduled (running, paused or asleep) up to
// Config.MaxQueued; beyond that Add refuses them with ErrQueueFull.
//
// Usage:
//
//	e, err := engine.New(engine.Config{Weights: w})
//	defer e.Close()
//	go e.Run(ctx)
//	s, err := e.Add(ctx, engine.Request{ID: "r1", PromptTokenIDs: ids, Sampling: p})
//	res, err := s.Collect(ctx)
package engine
