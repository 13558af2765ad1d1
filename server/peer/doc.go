// Package peer is a rollout server's side of peer weight distribution: the read-only
// /weights/vN/<file> route that serves the versions the server holds (a weightstore
// directory, so the same code as `rollout weights serve`, digest-checked when each version is
// adopted) and relays the version it is fetching to its children as the bytes arrive. Every
// request carries the version's token (protocol.PeerToken, an HMAC of the fleet secret).
// Every receiver verifies the whole checkpoint against the digest before it uses a byte, so a
// relay never needs to trust what it forwards.
package peer
