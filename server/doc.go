// Package server wires one rollout server: the engine, the KV offloading connector and the
// HTTP API (package api), and, later, the fleet agent, which plugs in as a long-lived part
// started beside the engine and stopped after HTTP has drained.
//
// Usage:
//
//	s, err := server.New(server.Config{Model: "builtin:tiny", Addr: "127.0.0.1:0"})
//	go s.Run(ctx)          // serves s.URL() until ctx is cancelled
//	// or: server.Run(ctx, cfg)
//
// Shutdown order (on ctx cancellation, e.g. SIGINT/SIGTERM): stop intake (new requests get
// 503 and /ready fails), give in-flight requests Config.ShutdownGrace to finish, abort the
// rest, stop the other parts, stop the engine. A clean shutdown returns nil, so the process
// exits 0.
package server
