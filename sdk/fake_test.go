package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/protocol"
)

// fakeAgent is a hand-written stand-in for a server's agent in this package's unit tests:
// it answers commands with acks the test shapes (failures, silence) and heartbeats its
// state, so the client's fan-out, ack collection and transaction driver run without an
// engine. The real agent is exercised through server/embedded.
type fakeAgent struct {
	t      *testing.T
	id     string
	fleet  string
	secret []byte
	b      bus.Bus
	sub    bus.Subscription
	done   chan struct{}

	mu       sync.Mutex
	version  int64
	staged   int64
	paused   bool
	url      string
	peerURL  string                   // advertised peer route (empty: none)
	holds    []int64                  // versions it advertises for peers
	sha      string                   // digest of the version it serves
	fail     map[protocol.Kind]string // kind → failure code
	silent   map[protocol.Kind]bool   // kinds never acked
	onCommit func()                   // runs as a commit arrives, before it is executed
	received []protocol.Envelope
	bubble   [2]time.Duration // LastTokenBefore, FirstTokenAfter reported on commit, relative to its receipt (zero: none)
}

func startFake(t *testing.T, b bus.Bus, fleet string, secret []byte, id string, version int64) *fakeAgent {
	t.Helper()
	sub, err := b.Subscribe(t.Context(), protocol.Names{Fleet: fleet}.Control())
	require.NoError(t, err)
	a := &fakeAgent{t: t, id: id, fleet: fleet, secret: secret, b: b, sub: sub, done: make(chan struct{}), version: version,
		url: "http://127.0.0.1:1", fail: map[protocol.Kind]string{}, silent: map[protocol.Kind]bool{}}
	a.heartbeat()
	go a.loop()
	t.Cleanup(a.stop)
	return a
}

func (a *fakeAgent) stop() {
	_ = a.sub.Close()
	<-a.done
}

func (a *fakeAgent) set(f func(a *fakeAgent)) {
	a.mu.Lock()
	f(a)
	a.mu.Unlock()
	a.heartbeat()
}

func (a *fakeAgent) heartbeat() {
	a.mu.Lock()
	hb := protocol.Heartbeat{V: protocol.Version, Fleet: a.fleet, ServerID: a.id, State: protocol.StateRunning,
		WeightVersion: a.version, StagedVersion: a.staged, InRotation: !a.paused, AdvertiseURL: a.url, At: time.Now().UnixMilli(),
		PeerURL: a.peerURL, Holds: a.holds, WeightSHA256: a.sha}
	if a.paused {
		hb.State = protocol.StatePaused
	}
	a.mu.Unlock()
	if len(a.secret) > 0 {
		hb.Sign(a.secret)
	}
	raw, err := hb.Encode()
	if err == nil {
		err = a.b.Set(context.Background(), protocol.Names{Fleet: a.fleet}.Heartbeat(a.id), raw, time.Minute)
	}
	if err != nil && !errors.Is(err, bus.ErrClosed) {
		a.t.Errorf("fake %s heartbeat: %v", a.id, err)
	}
}

func (a *fakeAgent) loop() {
	defer close(a.done)
	for ev := range a.sub.Events() {
		if ev.Kind != bus.EventMessage {
			continue
		}
		env, err := protocol.DecodeEnvelope(ev.Payload)
		if err != nil {
			continue
		}
		ack := protocol.Ack{V: protocol.Version, CommandID: env.ID, ServerID: a.id, Kind: env.Kind, At: time.Now().UnixMilli()}
		if err := env.Verify(a.secret, a.fleet, time.Now()); err != nil {
			ack.Result, ack.Code, ack.Error = protocol.ResultRejected, "bad_signature", err.Error()
		} else if !env.ForServer(a.id) {
			continue
		} else {
			a.execute(env, &ack)
		}
		a.mu.Lock()
		a.received = append(a.received, *env)
		silent := a.silent[env.Kind]
		a.mu.Unlock()
		a.heartbeat()
		if silent {
			continue
		}
		ack.Sign(a.secret, a.fleet)
		raw, _ := ack.Encode()
		_ = a.b.Push(context.Background(), protocol.Names{Fleet: a.fleet}.Acks(env.ID), raw, time.Minute)
	}
}

func (a *fakeAgent) execute(env *protocol.Envelope, ack *protocol.Ack) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if code, ok := a.fail[env.Kind]; ok {
		ack.Result, ack.Code, ack.Error = protocol.ResultFailed, code, "injected failure"
		ack.WeightVersion, ack.StagedVersion = a.version, a.staged
		return
	}
	cmd, err := env.Command()
	if err != nil {
		ack.Result, ack.Code, ack.Error = protocol.ResultRejected, "malformed", err.Error()
		return
	}
	ack.Result = protocol.ResultOK
	switch c := cmd.(type) {
	case protocol.Pause:
		a.paused = true
		ack.Phases = []protocol.Phase{{Name: "pause", OK: true, Seconds: 0.001}}
	case protocol.Resume:
		a.paused = false
	case protocol.Stage:
		a.staged = c.Weights.Version
		ack.Phases = []protocol.Phase{{Name: "fetch", OK: true, Seconds: 0.01}, {Name: "verify", OK: true, Seconds: 0.002}}
	case protocol.Commit:
		if a.onCommit != nil {
			a.onCommit()
		}
		if a.staged != c.Version {
			ack.Result, ack.Code, ack.Error = protocol.ResultFailed, "not_staged", "nothing staged"
			break
		}
		a.version, a.staged = c.Version, 0
		a.sha, ack.WeightSHA256 = c.SHA256, c.SHA256
		for _, n := range []string{"pause", "sleep", "swap", "wake", "resume"} {
			ack.Phases = append(ack.Phases, protocol.Phase{Name: n, OK: true, Seconds: 0.001})
		}
		// Relative to the receipt, which comes after the publish: a fixed time could land
		// before the publish on a slow machine and make the bubble negative.
		if a.bubble != [2]time.Duration{} {
			recv := time.Now()
			ack.LastTokenBefore, ack.FirstTokenAfter = recv.Add(a.bubble[0]).UnixNano(), recv.Add(a.bubble[1]).UnixNano()
		}
	}
	ack.WeightVersion, ack.StagedVersion = a.version, a.staged
}

func (a *fakeAgent) got() []protocol.Envelope {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]protocol.Envelope(nil), a.received...)
}

func (a *fakeAgent) kinds() []protocol.Kind {
	var out []protocol.Kind
	for _, e := range a.got() {
		out = append(out, e.Kind)
	}
	return out
}

// spy records every message on the control channel, so a test can assert that a refused
// call published nothing: it publishes a marker after the call and checks it arrives first.
type spy struct {
	t   *testing.T
	b   bus.Bus
	sub bus.Subscription
	ch  string
}

func newSpy(t *testing.T, b bus.Bus, fleet string) *spy {
	ch := protocol.Names{Fleet: fleet}.Control()
	sub, err := b.Subscribe(t.Context(), ch)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	return &spy{t: t, b: b, sub: sub, ch: ch}
}

// nothingPublished fails the test when anything but the marker was published since the
// spy started (or since the last call).
func (s *spy) nothingPublished() {
	s.t.Helper()
	marker, _ := json.Marshal(map[string]string{"marker": protocol.NewID()})
	_, err := s.b.Publish(s.t.Context(), s.ch, marker)
	require.NoError(s.t, err)
	for ev := range s.sub.Events() {
		if ev.Kind != bus.EventMessage {
			continue
		}
		require.JSONEq(s.t, string(marker), string(ev.Payload), "a refused call published a command")
		return
	}
}

func newMemFleet(t *testing.T, secret []byte, n int, version int64) (*bus.Mem, []*fakeAgent, *Client) {
	t.Helper()
	b := bus.NewMem(bus.MemOptions{})
	t.Cleanup(func() { _ = b.Close() })
	var agents []*fakeAgent
	for i := range n {
		agents = append(agents, startFake(t, b, "f", secret, string(rune('a'+i)), version))
	}
	// HeartbeatTTL 1ns: a deleted heartbeat key means a gone server at once.
	c, err := Dial(t.Context(), Options{Bus: b, Fleet: "f", Secret: secret, CommandTimeout: 10 * time.Second, HeartbeatTTL: time.Nanosecond,
		InsecureUnsigned: secret == nil})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return b, agents, c
}
