// Package bus is the fleet control plane's transport: one Bus interface with a Redis
// implementation (go-redis/v9's universal client: one server, Sentinel or Cluster, plain or
// TLS, as package redisconf parses it) and an in-process one (for embedded fleets and tests),
// all held to the same contract by one test suite. On a Cluster pub/sub is sharded
// (SPUBLISH/SSUBSCRIBE); on Sentinel subscriptions follow the primary across failovers.
//
// The contract follows Redis's strengths and weaknesses rather than hiding them:
//   - Publish/Subscribe is at-most-once notification. Subscribe returns only once the
//     subscription is confirmed, and every later (re)subscription is reported as an
//     EventSubscribed, because messages published while a subscriber was disconnected are
//     lost: on that event the subscriber must resync from keys.
//   - Keys (Set with a TTL, Get, Scan, CompareAndSwap) hold the truth.
//   - Lists (Push, Pop) hold acks durably until read, so a reader that was briefly away
//     misses nothing.
//
// A subscription never drops a message because its reader is slow: events queue without
// bound between the transport and the Events channel. The Redis bus reads each subscription
// on its own connection and goroutine, pings an idle one so a silently dead connection is
// replaced (not waited on forever), and maps every transport failure to ErrUnavailable.
// internal/redistest starts the real redis-server (and a partitionable proxy) its tests use.
package bus
