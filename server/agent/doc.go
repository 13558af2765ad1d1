// Package agent is a rollout server's member of a fleet: it joins the fleet's control
// channel, runs the commands addressed to it on the engine, acks them, heartbeats, and
// converges to the fleet's desired state by itself (docs/fleet.md is the contract).
//
// The logic is a pure, deterministic state machine, Core, in the style of raft's RawNode: it
// takes inputs (a control message, the desired-state key as read, an engine snapshot, the
// end of a piece of work, a clock reading) and answers with a Ready: acks to push, counts to
// add, and the next Work to run. Agent.Run is the thin I/O loop around it: one goroutine that
// selects over the subscription, a heartbeat ticker and the end of work, plus one worker
// goroutine that runs a Work on the engine at a time, so heartbeats continue while a stage
// fetches.
//
// Typical wiring (what the server does):
//
//	clock := agent.NewStepClock(nil)
//	hooks.OnStep = clock.Hook(hooks.OnStep) // before engine.New
//	a, err := agent.New(agent.Config{Bus: b, Fleet: "demo", ServerID: "s1", AdvertiseURL: url,
//		Secret: secret, Engine: &agent.EngineAdapter{Engine: eng, AbortRequests: api.Abort, Clock: clock},
//		Stage: stage, Metrics: metrics})
//	go a.Run(ctx)
//	// /ready consults a.Ready()
package agent
