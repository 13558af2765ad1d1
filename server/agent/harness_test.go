package agent_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/sample"
	"github.com/rolloutkit/rollout/internal/enginetest"
	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/protocol"
	"github.com/rolloutkit/rollout/server"
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	goleak.VerifyTestMain(m)
}

const (
	fleetName = "t"
	serverID  = "s1"
)

var testSecret = []byte("0123456789abcdef0123456789abcdef-agent-test")

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// waitFor polls cond until it holds (it must become true: the deadline only bounds a hang).
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// fleet is the test's side of the control plane: what the SDK does, by hand.
type fleet struct {
	t      *testing.T
	b      bus.Bus
	names  protocol.Names
	secret []byte
}

func newFleet(t *testing.T, b bus.Bus) *fleet {
	return &fleet{t: t, b: b, names: protocol.Names{Fleet: fleetName}, secret: testSecret}
}

// envelope builds a signed envelope for cmd, issued now with a 30s deadline.
func (f *fleet) envelope(cmd any, targets ...string) *protocol.Envelope {
	f.t.Helper()
	e, err := protocol.NewEnvelope(fleetName, targets, cmd, time.Now(), 30*time.Second)
	require.NoError(f.t, err)
	e.Sign(f.secret)
	return e
}

func (f *fleet) publish(e *protocol.Envelope) {
	f.t.Helper()
	raw, err := e.Encode()
	require.NoError(f.t, err)
	f.publishRaw(raw)
}

func (f *fleet) publishRaw(raw []byte) {
	f.t.Helper()
	n, err := f.b.Publish(f.t.Context(), f.names.Control(), raw)
	require.NoError(f.t, err)
	require.Positive(f.t, n, "nobody subscribed")
}

// ack waits for the next ack of command id.
func (f *fleet) ack(id string) protocol.Ack {
	f.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		vals, err := f.b.Pop(f.t.Context(), f.names.Acks(id), 1, time.Second)
		require.NoError(f.t, err)
		if len(vals) == 1 {
			a, err := protocol.DecodeAck(vals[0])
			require.NoError(f.t, err)
			require.Equal(f.t, id, a.CommandID)
			return *a
		}
	}
	f.t.Fatalf("no ack for %s", id)
	return protocol.Ack{}
}

// noAck asserts that command id has no ack (call after a barrier).
func (f *fleet) noAck(id string) {
	f.t.Helper()
	vals, err := f.b.Pop(f.t.Context(), f.names.Acks(id), 1, 0)
	require.NoError(f.t, err)
	require.Empty(f.t, vals, "unexpected ack for %s", id)
}

// do publishes cmd and returns its ack.
func (f *fleet) do(cmd any, targets ...string) protocol.Ack {
	f.t.Helper()
	e := f.envelope(cmd, targets...)
	f.publish(e)
	return f.ack(e.ID)
}

// barrier runs a no-op command: every message published before it has been handled once its
// ack is back (the agent handles the channel in order, one command at a time).
// barrier returns once both of the agent's lanes ran what was queued before it: a stage of
// a version every test server serves (the fetch lane; acked at once) and then an abort of
// nothing (the control lane, which a convergence commit after a stage occupies by then).
func (f *fleet) barrier() {
	f.t.Helper()
	a := f.do(protocol.Stage{Weights: protocol.WeightsRef{Version: 1, URI: "file:///barrier", SHA256: strings.Repeat("0", 64)}})
	require.Equal(f.t, protocol.ResultOK, a.Result, "%+v", a)
	a = f.do(protocol.Abort{RequestIDs: []string{"no-such-request"}})
	require.Equal(f.t, protocol.ResultOK, a.Result, "%+v", a)
}

func (f *fleet) setDesired(d protocol.DesiredState, sign bool) {
	f.t.Helper()
	d.V, d.Fleet = protocol.Version, fleetName
	if sign {
		d.Sign(f.secret)
	}
	raw, err := d.Encode()
	require.NoError(f.t, err)
	require.NoError(f.t, f.b.Set(f.t.Context(), f.names.Desired(), raw, 0))
}

func (f *fleet) heartbeat(id string) (*protocol.Heartbeat, bool) {
	raw, err := f.b.Get(f.t.Context(), f.names.Heartbeat(id))
	if err != nil {
		return nil, false
	}
	hb, err := protocol.DecodeHeartbeat(raw)
	require.NoError(f.t, err)
	return hb, true
}

// node is a running server in the fleet.
type node struct {
	*server.Server
	t      testing.TB
	client *http.Client
	cancel context.CancelFunc
	done   chan error
}

// startNode runs a server (builtin:tiny, weight version 1) in the fleet over b. The
// heartbeat interval is an hour unless mut changes it, so only the test's actions drive the
// agent.
func startNode(t testing.TB, b bus.Bus, mut func(*server.Config)) *node {
	t.Helper()
	cfg := server.Config{Addr: "127.0.0.1:0", KVBlocks: 512, WeightVersion: 1, Logger: quietLogger(), ShutdownGrace: 5 * time.Second,
		Bus: b, Fleet: fleetName, ServerID: serverID, FleetSecret: string(testSecret), FleetHeartbeat: time.Hour}
	if mut != nil {
		mut(&cfg)
	}
	s, err := server.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	n := &node{Server: s, t: t, client: &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}, cancel: cancel, done: make(chan error, 1)}
	go func() { n.done <- s.Run(ctx) }()
	t.Cleanup(func() {
		n.stop()
		n.client.CloseIdleConnections()
	})
	return n
}

// stop shuts the server down and returns Run's error (once; later calls return nil).
func (n *node) stop() error {
	n.cancel()
	if n.done == nil {
		return nil
	}
	err := <-n.done
	n.done = nil
	return err
}

// joined waits for the agent's first heartbeat: it is subscribed and has read the desired
// state.
func (n *node) joined(f *fleet) {
	n.t.Helper()
	waitFor(n.t, "the first heartbeat", func() bool { _, ok := f.heartbeat(n.Agent().ServerID()); return ok })
}

func (n *node) get(path string) (int, string) {
	n.t.Helper()
	resp, err := n.client.Get(n.URL() + path)
	require.NoError(n.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(n.t, err)
	return resp.StatusCode, string(b)
}

func (n *node) metric(name string) float64 {
	n.t.Helper()
	code, text := n.get("/metrics")
	require.Equal(n.t, http.StatusOK, code)
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			var v float64
			_, err := fmt.Sscan(rest, &v)
			require.NoError(n.t, err, line)
			return v
		}
	}
	n.t.Fatalf("metric %s not exported", name)
	return 0
}

func (n *node) stats() engine.Stats {
	n.t.Helper()
	st, err := n.Engine().Stats(n.t.Context())
	require.NoError(n.t, err)
	return st
}

// add queues a greedy request of max tokens that ignores EOS.
func (n *node) add(id string, maxTokens int) *engine.Stream {
	n.t.Helper()
	s, err := n.Engine().Add(n.t.Context(), engine.Request{ID: id, PromptTokenIDs: []int{256, 1, 2, 3},
		Sampling: sample.Params{MaxTokens: maxTokens, IgnoreEOS: true}})
	require.NoError(n.t, err)
	return s
}

func (n *node) ready() (bool, string) {
	code, body := n.get("/ready")
	return code == http.StatusOK, body
}

// checkpoint writes builtin tiny weights of seed as an HF directory and returns its ref.
func checkpoint(t *testing.T, version int64, seed uint64) protocol.WeightsRef {
	t.Helper()
	uri, d, _ := enginetest.Checkpoint(t, seed)
	return protocol.WeightsRef{Version: version, URI: uri, SHA256: d}
}

func phaseNames(a protocol.Ack) []string {
	var out []string
	for _, p := range a.Phases {
		out = append(out, p.Name)
	}
	return out
}
