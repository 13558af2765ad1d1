// Package embedded runs a whole Rollout fleet inside the calling process: N real servers
// (engine, HTTP API on 127.0.0.1, fleet agent) sharing one in-process bus. It returns what
// sdk.Dial needs, so the trainer code that drives a fleet of `rollout serve` processes over
// Redis runs unchanged on a laptop or in a test:
//
//	f, err := embedded.Start(ctx, embedded.Options{Servers: 2})
//	...
//	defer f.Close()
//	c, err := sdk.Dial(ctx, f.DialOptions())
package embedded
