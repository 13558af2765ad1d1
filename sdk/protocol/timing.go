package protocol

import "time"

// Timings both sides of the control bus must agree on. A server's agent and the SDK each
// take their defaults from here, so that a client never judges a server by a TTL or a clock
// allowance the server does not use. docs/fleet.md names each.
const (
	// HeartbeatInterval is how often a server's agent writes its heartbeat by default: a
	// fifth of HeartbeatTTL, so that a server misses four beats in a row (a long GC pause, a
	// slow Redis) before its key expires and clients stop routing to it.
	HeartbeatInterval = time.Second

	// HeartbeatTTL is the default lifetime of a heartbeat key, and how long after its last
	// heartbeat a client keeps routing to a server whose key is missing (lost early, as when
	// Redis restarts empty). The two are the same value so that a server is live to a client
	// exactly as long as its own key would have lived: five seconds is how long a dead server
	// keeps receiving requests, traded against false deaths on a stalled machine.
	HeartbeatTTL = 5 * time.Second

	// AckTTL is how long an ack list lives. A client reads a command's acks within its
	// command timeout and deletes the list in the background; the TTL removes the lists of a
	// client that died or whose delete failed. Ten minutes outlasts any command a client
	// waits for (MaxCommandLifetime aside) while keeping Redis from collecting lists.
	AckTTL = 10 * time.Minute

	// ClockSkew is how far a trainer's and a server's clocks may disagree. A server accepts
	// a command until ClockSkew past its deadline and refuses one issued more than ClockSkew
	// before its agent started; a client counts a heartbeat stale once its signed time is
	// more than its TTL plus ClockSkew old. Thirty seconds covers machines without time
	// synchronisation drifting for a day, and is short enough that a replayed command or
	// heartbeat from an earlier run is refused.
	ClockSkew = 30 * time.Second

	// MaxCommandLifetime is the longest deadline minus issued-at a server accepts; a longer
	// command is refused as replayed, because a server remembers the ids it executed only
	// until their deadlines pass. A client's command timeout must stay below it.
	MaxCommandLifetime = 15 * time.Minute
)
