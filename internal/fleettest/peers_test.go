package fleettest_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/weights"
	"github.com/rolloutkit/rollout/internal/fleettest"
	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/protocol"
	"github.com/rolloutkit/rollout/weightstore"
)

// origin is the trainer's weight server of a peer test: a weight store served over HTTP,
// counting its egress, with an optional gate on the first model.safetensors download.
type origin struct {
	store *weightstore.Store
	url   string
	// gated: the first download of model.safetensors sends half the file, closes started,
	// and waits for release before it sends the rest.
	gated    atomic.Bool
	once     sync.Once
	started  chan struct{}
	release  chan struct{}
	requests atomic.Int64
}

func startOrigin(t *testing.T) *origin {
	t.Helper()
	st, err := weightstore.Open(t.Context(), t.TempDir())
	require.NoError(t, err)
	o := &origin{store: st, started: make(chan struct{}), release: make(chan struct{})}
	inner := st.Handler()
	o.url = httptestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.requests.Add(1)
		if o.gated.Load() && strings.HasSuffix(r.URL.Path, weights.SafetensorsFile) && r.Header.Get("Range") == "" {
			first := false
			o.once.Do(func() { first = true })
			if first {
				o.gate(w, r, inner)
				return
			}
		}
		inner.ServeHTTP(w, r)
	}))
	return o
}

// gate serves the first half of the file, flushes it, and waits for release.
func (o *origin) gate(w http.ResponseWriter, r *http.Request, inner http.Handler) {
	rec := &bufferWriter{header: http.Header{}}
	inner.ServeHTTP(rec, r)
	for k, v := range rec.header {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.status)
	body := rec.body
	_, _ = w.Write(body[:len(body)/2])
	w.(http.Flusher).Flush()
	close(o.started)
	select {
	case <-o.release:
	case <-r.Context().Done():
		return
	}
	_, _ = w.Write(body[len(body)/2:])
}

type bufferWriter struct {
	header http.Header
	status int
	body   []byte
}

func (b *bufferWriter) Header() http.Header { return b.header }
func (b *bufferWriter) WriteHeader(s int)   { b.status = s }
func (b *bufferWriter) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.status = http.StatusOK
	}
	b.body = append(b.body, p...)
	return len(p), nil
}

// publish writes the tiny preset with seed as version v and returns its ref on the origin.
func (o *origin) publish(t *testing.T, v int64, seed uint64) (sdk.WeightsRef, int64) {
	t.Helper()
	w, err := model.Preset("tiny", seed)
	require.NoError(t, err)
	e, err := o.store.Publish(t.Context(), v, w)
	require.NoError(t, err)
	return e.Ref(o.url), e.Bytes
}

// Four real servers, a binary tree under one origin child: the origin sends exactly one
// checkpoint per update, the other three copies travel between servers.
func TestPeerEgressOneCheckpointPerUpdate(t *testing.T) {
	skipShort(t)
	o := startOrigin(t)
	f := fleettest.Start(t, fleettest.Options{Servers: 4, Fleet: "peers"})
	c := dial(t, f)
	var served int64
	for v := int64(1); v <= 2; v++ {
		ref, size := o.publish(t, v, 60+uint64(v))
		res, err := c.UpdateWeights(t.Context(), ref, sdk.Plan{})
		require.NoError(t, err)
		assert.Equal(t, sdk.OutcomeCommitted, res.Outcome)
		assert.Len(t, res.Sources, 3, "three servers fetch from a peer")
		egress := o.store.BytesServed() - served
		served = o.store.BytesServed()
		t.Logf("update %d: checkpoint %d bytes, trainer egress %d bytes (%.2f checkpoints), peer bytes %d", v, size, egress,
			float64(egress)/float64(size), res.PeerBytes)
		assert.Equal(t, size, egress, "the origin sent one checkpoint")
		assert.Equal(t, size, res.OriginBytes)
		assert.Equal(t, 3*size, res.PeerBytes)
		waitVersion(t, f, v) // the heartbeat follows the ack
		for _, p := range f.Procs {
			assert.True(t, f.Heartbeat(p.ID).HoldsVersion(v), "%s holds v%d for its peers (verified on adoption)", p.ID, v)
		}
	}
	var fromPeers float64
	for _, p := range f.Procs {
		fromPeers += metric(t, p, "rollout_weights_fetched_bytes_total", "source", "peer")
	}
	assert.Positive(t, fromPeers)
}

// The origin's only child dies while its children relay from it: they resume elsewhere,
// the update commits on the rest, and the dead server converges once restarted; every copy
// is verified (a server holds a version only after its digest matched).
func TestPeerSourceKilledMidFetch(t *testing.T) {
	skipShort(t)
	o := startOrigin(t)
	f := fleettest.Start(t, fleettest.Options{Servers: 4, Fleet: "peerkill"})
	c := dial(t, f)
	ref, _ := o.publish(t, 1, 71)
	o.gated.Store(true)
	type outcome struct {
		res *sdk.UpdateResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := c.UpdateWeights(context.WithoutCancel(t.Context()), ref, sdk.Plan{Policy: sdk.Quorum(3), StageTimeout: time.Minute})
		done <- outcome{res, err}
	}()
	<-o.started // s1, the origin's child, has half the checkpoint
	s1 := f.Proc("s1")
	deadline := time.Now().Add(fleettest.StartTimeout)
	for metric(t, s1, "rollout_peer_served_bytes_total") == 0 {
		require.True(t, time.Now().Before(deadline), "s1 never relayed to its children")
		time.Sleep(20 * time.Millisecond)
	}
	s1.Kill()
	close(o.release)
	out := <-done
	require.NoError(t, out.err)
	assert.Equal(t, sdk.OutcomeDegraded, out.res.Outcome)
	assert.Equal(t, []string{"s1"}, out.res.Stale)
	var replaced float64
	waitVersion(t, f, 1, f.Proc("s2"), f.Proc("s3"), f.Proc("s4"))
	for _, id := range []string{"s2", "s3", "s4"} {
		replaced += metric(t, f.Proc(id), "rollout_weights_source_failures_total", "reason", "died")
		assert.True(t, f.Heartbeat(id).HoldsVersion(1), id)
	}
	assert.Positive(t, replaced, "a child of s1 replaced its source")
	s1.Start()
	f.WaitFor(s1, fleettest.StartTimeout, "on version 1", func(hb *protocol.Heartbeat) bool {
		return hb != nil && hb.WeightVersion == 1 && hb.InRotation && hb.HoldsVersion(1)
	})
}

// A checkpoint that does not hash to the ref's digest, from the origin and therefore from
// every peer relaying it: each server fails clearly and keeps serving its old weights.
func TestPeerBadDigestFromEverySource(t *testing.T) {
	skipShort(t)
	o := startOrigin(t)
	f := fleettest.Start(t, fleettest.Options{Servers: 4, Fleet: "peerdigest"})
	c := dial(t, f)
	ref, _ := o.publish(t, 1, 81)
	ref.SHA256 = strings.Repeat("0", 64)
	res, err := c.UpdateWeights(t.Context(), ref, sdk.Plan{})
	require.ErrorIs(t, err, sdk.ErrAborted)
	assert.Equal(t, sdk.OutcomeAborted, res.Outcome)
	var failed int
	for _, s := range res.Servers {
		if s.Err != nil && strings.Contains(s.Err.Error(), "digest") {
			failed++
		}
	}
	assert.Positive(t, failed)
	for _, p := range f.Procs {
		hb := f.Heartbeat(p.ID)
		assert.Equal(t, int64(0), hb.WeightVersion, p.ID)
		assert.False(t, hb.HoldsVersion(1), "%s kept nothing unverified", p.ID)
		assert.Equal(t, http.StatusOK, p.Status("/ready"), p.ID)
	}
}

// A stage command naming a source that is not a member (its heartbeat does not verify with
// the fleet secret): the server never contacts it, counts it, and fetches from the origin.
func TestPeerSourceNotInFleetRefused(t *testing.T) {
	skipShort(t)
	o := startOrigin(t)
	f := fleettest.Start(t, fleettest.Options{Servers: 1, Fleet: "peerghost"})
	var evilHits atomic.Int64
	evil := httptestServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		evilHits.Add(1)
		http.Error(w, "evil", http.StatusTeapot)
	}))
	ref, _ := o.publish(t, 1, 91)
	b, err := bus.DialRedis(t.Context(), f.Redis.URL(), bus.RedisOptions{})
	require.NoError(t, err)
	defer b.Close()
	names := protocol.Names{Fleet: f.Name}
	ghost := protocol.Heartbeat{V: protocol.Version, Fleet: f.Name, ServerID: "ghost", State: protocol.StateRunning,
		PeerURL: evil + "/weights", Holds: []int64{1}, At: time.Now().UnixMilli()}
	ghost.Sign([]byte("not-the-fleet-secret-0123456789abcdef"))
	raw, err := ghost.Encode()
	require.NoError(t, err)
	require.NoError(t, b.Set(t.Context(), names.Heartbeat("ghost"), raw, time.Minute))
	env, err := protocol.NewEnvelope(f.Name, []string{"s1"}, protocol.Stage{Weights: ref, Sources: map[string]string{"s1": "ghost"}},
		time.Now(), time.Minute)
	require.NoError(t, err)
	env.Sign([]byte(f.Secret))
	msg, err := env.Encode()
	require.NoError(t, err)
	_, err = b.Publish(t.Context(), names.Control(), msg)
	require.NoError(t, err)
	acks, err := b.Pop(t.Context(), names.Acks(env.ID), 1, time.Minute)
	require.NoError(t, err)
	require.Len(t, acks, 1)
	ack, err := protocol.DecodeAck(acks[0])
	require.NoError(t, err)
	assert.Equal(t, protocol.ResultOK, ack.Result, ack.Error)
	require.Len(t, ack.Phases, 1)
	assert.Equal(t, int64(1), ack.Phases[0].Detail["peer_refused"])
	assert.Positive(t, ack.Phases[0].Detail["origin_bytes"])
	assert.Zero(t, evilHits.Load(), "the refused source was never contacted")
	p := f.Proc("s1")
	assert.Equal(t, 1.0, metric(t, p, "rollout_weights_source_failures_total", "reason", "not_member"))
	assert.Contains(t, p.Logs(), "not a member of this fleet")
	assert.Equal(t, int64(1), ack.StagedVersion)
}
