// Package fleettest runs real fleets for tests: it builds the rollout binary once per test
// binary, starts `rollout serve` processes on free ports against a redis-server (from
// internal/redistest), waits until each one heartbeats in rotation, and stops them when the
// test ends. Each process's output is kept and written to the test log when the test fails,
// so a failure in a multi-process test shows what every server said.
package fleettest
