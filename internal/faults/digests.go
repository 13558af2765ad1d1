package faults

import (
	"sync"

	"github.com/rolloutkit/rollout/sdk/protocol"
)

// InitialDigest stands for the weights every server loads at start (version 0): they are the
// same on every server, so they count as one digest.
const InitialDigest = "initial"

// Digests knows which checkpoint (digest) each version names, from what the harness itself
// did: what each trainer published, which server acked which trainer's commit, and what the
// desired state named. ServingDigest reads it.
type Digests struct {
	mu        sync.Mutex
	published map[string]map[int64]string // trainer → version → digest
	acked     map[string]ack              // server → its last commit ack since it started
	staged    map[string]ack              // server → its last stage ack since it started
	desired   map[int64]string            // version → digest of the last desired state naming it
}

type ack struct {
	version         int64
	digest, trainer string
}

// NewDigests returns an empty log.
func NewDigests() *Digests {
	return &Digests{published: map[string]map[int64]string{}, acked: map[string]ack{}, staged: map[string]ack{},
		desired: map[int64]string{}}
}

// Published records that trainer published version under digest.
func (d *Digests) Published(trainer string, version int64, digest string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.published[trainer] == nil {
		d.published[trainer] = map[int64]string{}
	}
	d.published[trainer][version] = digest
}

// CommitAcked records that server acked trainer's commit of version (whose digest is the one
// trainer published).
func (d *Digests) CommitAcked(server, trainer string, version int64, digest string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.acked[server] = ack{version: version, digest: digest, trainer: trainer}
}

// Staged records that server acked trainer's stage of version: it holds that checkpoint
// staged, and commits it when it converges to a desired state naming the version (the agent
// does not stage a version again that it has staged).
func (d *Digests) Staged(server, trainer string, version int64, digest string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.staged[server] = ack{version: version, digest: digest, trainer: trainer}
}

// Restarted forgets what server acked: a restarted server loads what it converges to.
func (d *Digests) Restarted(server string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.acked, server)
	delete(d.staged, server)
}

// Desired records a desired state read from Redis.
func (d *Digests) Desired(ds *protocol.DesiredState) {
	if ds == nil || ds.Weights == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.desired[ds.Weights.Version] = ds.Weights.SHA256
}

// ServingDigest is the digest of the weights server serves, according to its heartbeat hb,
// and why the harness thinks so ("" when it cannot tell).
//
// Heartbeats carry no digest today, so it is derived from what the harness did, in order:
//   - version 0 is InitialDigest;
//   - the server acked a trainer's commit of this version since it started: that trainer's
//     checkpoint;
//   - the server acked a trainer's stage of this version since it started: it committed
//     that staged checkpoint when it converged (whatever digest the desired state named);
//   - a desired state named this version: the server converged to it by itself;
//   - exactly one trainer published this version: that checkpoint.
//
// When heartbeats carry the serving digest, this function returns it (and says so in why);
// nothing else in the harness or the checker changes.
func (d *Digests) ServingDigest(server string, hb *protocol.Heartbeat) (digest, why string) {
	v := hb.WeightVersion
	if v == 0 {
		return InitialDigest, "version 0"
	}
	if hb.WeightSHA256 != "" {
		return hb.WeightSHA256, "its heartbeat says so" // the server's signed word
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if a, ok := d.acked[server]; ok && a.version == v {
		return a.digest, "acked " + a.trainer + "'s commit"
	}
	if a, ok := d.staged[server]; ok && a.version == v {
		return a.digest, "staged " + a.trainer + "'s checkpoint"
	}
	if dg, ok := d.desired[v]; ok {
		return dg, "converged to the desired state"
	}
	var only, by string
	n := 0
	for trainer, vs := range d.published {
		if dg, ok := vs[v]; ok && dg != only {
			only, by = dg, trainer
			n++
		}
	}
	if n == 1 {
		return only, "only " + by + " published it"
	}
	return "", ""
}
