// Package protocol defines the fleet control plane's wire format: the signed command envelope,
// the commands, acks, heartbeats and the desired-state record, and the Redis key and channel
// names they travel under.
//
// Every message is JSON with a version field V. Decoding is strict: unknown fields, a
// different V, trailing data and messages over MaxMessageBytes are rejected, so a server never
// acts on a message it only half understood.
//
// Commands, heartbeats and the desired state are signed with HMAC-SHA256 over their canonical
// bytes (see Canonical) with the fleet secret. Canonical bytes are not the JSON: they are a
// length-prefixed concatenation of every field in a fixed order, so two encoders that order
// JSON keys differently still agree on what was signed, and no field can be moved into
// another without changing the signature.
//
// Pub/sub only notifies: the truth is the desired-state key (what every server should serve),
// the heartbeat keys (what each server does serve) and the durable ack lists. A server that
// missed a command converges from the desired state; the SDK reads acks from lists, so it
// cannot miss one.
package protocol
