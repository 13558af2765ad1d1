// Package faults is a Jepsen-style fault harness for the fleet control plane (issue 25).
//
// TestFaults (run only with ROLLOUT_FAULTS=n set; `make faults-ci`, `make faults`) starts a
// real redis-server, a TCP proxy per server between it and Redis, three `rollout serve`
// processes (internal/fleettest) and two trainers (sdk clients, each publishing its own
// checkpoints from a weightstore over HTTP), keeps a generation load running (single
// requests, and multi-turn sdk.Session episodes whose transcripts are checked too), and
// plays a schedule drawn up front from a seed (ROLLOUT_FAULTS_SEED replays one): weight
// updates under every policy, cancelled updates, two trainers updating at once, fleet and
// per-server pause/resume/sleep/wake, SIGKILL and restart of servers (also mid-stage and
// mid-commit), SIGSTOP past the heartbeat timeout and SIGCONT, Redis restarts (empty and from
// a snapshot), and a proxy that partitions, freezes, delays, drops and cuts connections.
// Then it heals everything, resumes and wakes the fleet, and polls the heartbeats until every
// server is in rotation on the final desired version or a bound passes.
//
// Everything that happened goes into a History (history.go): every operation with its
// invoke and complete times (monotonic, from the start of the run), process, kind,
// arguments and result; every generation request with its version floor and each token's
// weight version; every fault; what each server was observed serving, under which digest;
// the desired states read from Redis; the servers' violation counters; the convergence.
// Check (checker.go) is a pure function of a History: it judges what happened, never timing
// margins, and reports each violation kind with a count.
//
// The one place that depends on what a heartbeat carries is ServingDigest in the driver
// (faults_test.go): the digest a server serves is derived today from what the harness
// itself published per (trainer, version), since heartbeats do not carry it.
package faults
