// Package server wires one rollout server: the engine, the KV offloading connector, the HTTP
// API (package api) and, with Config.Fleet set, the fleet agent (package agent), which plugs
// in as a long-lived part started beside the engine and stopped after HTTP has drained.
//
// Usage:
//
//	s, err := server.New(server.Config{Model: "builtin:tiny", Addr: "127.0.0.1:0"})
//	go s.Run(ctx)          // serves s.URL() until ctx is cancelled
//	// or: server.Run(ctx, cfg)
//
//	// In a fleet: over Redis, or over a bus the caller owns (an embedded fleet's).
//	cfg := server.Config{Fleet: "demo", Redis: redisconf.Config{URL: "redis://127.0.0.1:6379"}, FleetSecret: secret}
//	cfg = server.Config{Fleet: "demo", Bus: bus.NewMem(bus.MemOptions{}), ServerID: "s1"}
//
// In a fleet, /ready also requires the fleet's desired weight version (and no fleet pause),
// and a part that stops on its own (the agent refusing to join a signed fleet without a
// secret) ends Run with its error.
//
// Shutdown order (on ctx cancellation, e.g. SIGINT/SIGTERM): stop intake (new requests get
// 503 and /ready fails; the agent's next heartbeat, written at once, says out of rotation),
// give in-flight requests Config.ShutdownGrace to finish, abort the rest, stop the other
// parts (the agent finishes the command in progress, acks it and heartbeats "stopping"),
// stop the engine. A clean shutdown returns nil, so the process exits 0.
package server
