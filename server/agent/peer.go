package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rolloutkit/rollout/sdk/protocol"
)

// ErrPeerNotMember is why a stage refuses the peer its command assigned: the server id has no
// live, verified heartbeat in this fleet advertising a peer route. The stage then fetches from
// the origin only; nothing is fetched from the refused source.
var ErrPeerNotMember = errors.New("agent: the assigned weight source is not a member of this fleet")

// Peer is a fleet member to fetch a version from: its id and its /weights/ base URL, as its
// verified heartbeat advertises them.
type Peer struct {
	ID, URL string
	// Holds says the peer already holds the version (else it relays while it fetches).
	Holds bool
}

// StageRequest is one stage for Config.StagePeers.
type StageRequest struct {
	Ref protocol.WeightsRef
	// Grant is the bearer token that opens Ref's version on a peer's /weights/ route: the
	// trainer's, from the stage command (protocol.PeerToken; "" in an unsigned fleet).
	Grant string
	// Peer is where to fetch first (nil: the origin, Ref.URI, only); PeerRefused says why the
	// assigned peer was refused (ErrPeerNotMember), for the server to count.
	Peer        *Peer
	PeerRefused error
}

// StageReport is where a stage's bytes came from.
type StageReport struct {
	OriginBytes, PeerBytes int64
	// SourceFailures counts sources that died or served bad bytes and were replaced.
	SourceFailures int64
}

// lookupPeer checks that id is a member of the fleet: its heartbeat key exists, decodes,
// names id and advertises a peer URL, and, when this server holds the fleet secret,
// verifies. A server with an issued key cannot check another server's signature; it relies
// on the stage command, which the trainer signed, for the assignment, and on the digest
// check for the bytes (a heartbeat rewritten in Redis can only send it to a source that
// fails the check, after which it fetches from the origin).
func (a *Agent) lookupPeer(ctx context.Context, id string, version int64) (*Peer, error) {
	box := a.bus.Load()
	if box == nil {
		return nil, fmt.Errorf("%w: %q (no bus to read its heartbeat)", ErrPeerNotMember, id)
	}
	gctx, cancel := context.WithTimeout(ctx, a.cfg.HeartbeatInterval+time.Second)
	defer cancel()
	raw, err := box.b.Get(gctx, a.names.Heartbeat(id))
	if err != nil {
		return nil, fmt.Errorf("%w: %q has no heartbeat: %w", ErrPeerNotMember, id, err)
	}
	hb, err := protocol.DecodeHeartbeat(raw)
	if err == nil && hb.ServerID != id {
		err = fmt.Errorf("%w: heartbeat of %q names %q", protocol.ErrMalformed, id, hb.ServerID)
	}
	if err == nil && a.cfg.Auth.CanSignCommands() {
		err = hb.VerifyWith(a.cfg.Auth, a.cfg.Fleet)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %w", ErrPeerNotMember, id, err)
	}
	if hb.PeerURL == "" {
		return nil, fmt.Errorf("%w: %q advertises no peer route", ErrPeerNotMember, id)
	}
	return &Peer{ID: id, URL: hb.PeerURL, Holds: hb.HoldsVersion(version)}, nil
}
