package agent_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/protocol"
	"github.com/rolloutkit/rollout/server"
	"github.com/rolloutkit/rollout/server/agent"
)

func newMem(t *testing.T) *bus.Mem {
	m := bus.NewMem(bus.MemOptions{})
	t.Cleanup(func() { _ = m.Close() }) // registered first: runs after the servers stopped
	return m
}

// TestEveryCommandExecutesAndAcks: each command kind runs on the engine and is acked with
// its phases; the counters follow.
func TestEveryCommandExecutesAndAcks(t *testing.T) {
	mem := newMem(t)
	f := newFleet(t, mem)
	n := startNode(t, mem, nil)
	n.joined(f)
	ok, _ := n.ready()
	require.True(t, ok, "no desired state: in rotation once joined")

	a := f.do(protocol.Pause{Mode: protocol.ModeAbort, ClearCache: true})
	require.Equal(t, protocol.ResultOK, a.Result, "%+v", a)
	assert.Equal(t, []string{"pause"}, phaseNames(a))
	assert.Contains(t, a.Phases[0].Detail, "blocks_cleared")
	assert.Equal(t, serverID, a.ServerID)
	assert.EqualValues(t, 1, a.WeightVersion)
	assert.EqualValues(t, "paused", n.stats().State)
	ok, body := n.ready()
	assert.False(t, ok, body)
	// The heartbeat follows at once (its interval here is an hour).
	waitFor(t, "a paused heartbeat", func() bool {
		hb, ok := f.heartbeat(serverID)
		return ok && hb.State == protocol.StatePaused && !hb.InRotation
	})

	a = f.do(protocol.Resume{})
	require.Equal(t, protocol.ResultOK, a.Result, "%+v", a)
	assert.EqualValues(t, "running", n.stats().State)

	a = f.do(protocol.Sleep{Level: 1})
	require.Equal(t, protocol.ResultOK, a.Result, "%+v", a)
	st := n.stats()
	assert.EqualValues(t, "sleeping", st.State)
	assert.True(t, st.KVReleased)

	a = f.do(protocol.Wake{Tags: []string{protocol.TagKVCache}})
	require.Equal(t, protocol.ResultOK, a.Result, "%+v", a)
	assert.EqualValues(t, "running", n.stats().State)

	a = f.do(protocol.Reset{ResetExternal: true})
	require.Equal(t, protocol.ResultOK, a.Result, "%+v", a)
	assert.Equal(t, []string{"reset"}, phaseNames(a))

	// Abort: a long request is finished with reason abort.
	s := n.add("long", 100000)
	_, err := s.Recv(t.Context())
	require.NoError(t, err)
	a = f.do(protocol.Abort{RequestIDs: []string{"long"}})
	require.Equal(t, protocol.ResultOK, a.Result, "%+v", a)
	assert.EqualValues(t, 1, a.Phases[0].Detail["aborted"])
	res, err := s.Collect(t.Context())
	require.NoError(t, err)
	assert.Equal(t, engine.FinishAbort, res.FinishReason)

	// A wake of a server that is awake is fine; a resume of an asleep one fails, and says why.
	require.Equal(t, protocol.ResultOK, f.do(protocol.Sleep{Level: 1}).Result)
	a = f.do(protocol.Resume{})
	assert.Equal(t, protocol.ResultFailed, a.Result)
	assert.NotEmpty(t, a.Code)
	assert.Contains(t, a.Error, "asleep")
	require.Equal(t, protocol.ResultOK, f.do(protocol.Wake{}).Result)

	// Stage, then commit: the cut's phases, the new version.
	ref := checkpoint(t, 2, 2)
	a = f.do(protocol.Stage{Weights: ref})
	require.Equal(t, protocol.ResultOK, a.Result, "%+v", a)
	assert.Positive(t, a.Phases[0].Detail["bytes"])
	assert.EqualValues(t, 2, a.StagedVersion)
	assert.EqualValues(t, 1, a.WeightVersion)
	// Staging it again (a retried transaction) has nothing to do; another checkpoint under
	// the same version replaces the staged set, and a commit then names which one it means.
	a = f.do(protocol.Stage{Weights: ref})
	require.Equal(t, protocol.ResultOK, a.Result, "%+v", a)
	assert.EqualValues(t, 1, a.Phases[0].Detail["already_staged"])
	other := checkpoint(t, 2, 5)
	a = f.do(protocol.Stage{Weights: other})
	require.Equal(t, protocol.ResultOK, a.Result, "%+v", a)
	assert.EqualValues(t, 1, a.Phases[0].Detail["replaced"])
	a = f.do(protocol.Commit{Version: 2, Mode: protocol.ModeAbort, SHA256: ref.SHA256})
	assert.Equal(t, protocol.ResultFailed, a.Result, "the staged set is the other checkpoint")
	assert.Equal(t, "conflict", a.Code)
	assert.EqualValues(t, "running", n.stats().State, "refused before the pause")
	a = f.do(protocol.Stage{Weights: ref})
	require.Equal(t, protocol.ResultOK, a.Result, "%+v", a)
	assert.EqualValues(t, 1, a.Phases[0].Detail["replaced"])
	a = f.do(protocol.Commit{Version: 2, Mode: protocol.ModeAbort, ClearCache: true, SleepLevel: 1, SHA256: ref.SHA256})
	require.Equal(t, protocol.ResultOK, a.Result, "%+v", a)
	assert.Equal(t, []string{"pause", "sleep", "commit", "wake", "resume"}, phaseNames(a))
	for _, p := range a.Phases {
		assert.True(t, p.OK, p.Name)
		assert.GreaterOrEqual(t, p.Seconds, 0.0)
	}
	assert.EqualValues(t, 2, a.WeightVersion)
	assert.EqualValues(t, "running", n.stats().State)
	assert.EqualValues(t, 2, n.stats().WeightVersion)

	// A commit of the version already served acks ok at once.
	a = f.do(protocol.Commit{Version: 2, Mode: protocol.ModeAbort, SHA256: ref.SHA256})
	require.Equal(t, protocol.ResultOK, a.Result, "%+v", a)
	assert.Equal(t, []string{"commit"}, phaseNames(a))
	assert.Equal(t, ref.SHA256, a.WeightSHA256)
	assert.EqualValues(t, 1, a.Phases[0].Detail["already_serving"])
	// The same version from another checkpoint is a conflict: the version is taken.
	a = f.do(protocol.Commit{Version: 2, Mode: protocol.ModeAbort, SHA256: other.SHA256})
	assert.Equal(t, protocol.ResultFailed, a.Result)
	assert.Equal(t, "conflict", a.Code)

	// A commit of a version never staged fails without touching the engine.
	a = f.do(protocol.Commit{Version: 9, Mode: protocol.ModeAbort, SHA256: ref.SHA256})
	assert.Equal(t, protocol.ResultFailed, a.Result)
	assert.Equal(t, "not_staged", a.Code)
	assert.EqualValues(t, "running", n.stats().State)

	// A stage that fails its digest check leaves the serving version alone.
	bad := checkpoint(t, 3, 3)
	bad.SHA256 = "00" + bad.SHA256[2:]
	a = f.do(protocol.Stage{Weights: bad})
	assert.Equal(t, protocol.ResultFailed, a.Result)
	assert.Equal(t, "digest_mismatch", a.Code)
	assert.EqualValues(t, 2, a.WeightVersion)

	// A commit through a level-2 sleep (the weights are released, then the new set wakes).
	ref4 := checkpoint(t, 4, 4)
	require.Equal(t, protocol.ResultOK, f.do(protocol.Stage{Weights: ref4}).Result)
	a = f.do(protocol.Commit{Version: 4, Mode: protocol.ModeWait, SleepLevel: 2, SHA256: ref4.SHA256})
	require.Equal(t, protocol.ResultOK, a.Result, "%+v", a)
	assert.Equal(t, []string{"pause", "sleep", "commit", "wake", "resume"}, phaseNames(a))
	res, err = n.add("after-level-2", 3).Collect(t.Context())
	require.NoError(t, err)
	require.Len(t, res.Tokens, 3)
	assert.EqualValues(t, 4, res.Tokens[0].WeightVersion)

	assert.EqualValues(t, 2, n.metric(`rollout_update_weights_seconds_count{phase="commit"}`), "two swaps")
	assert.EqualValues(t, 1, n.metric(`rollout_control_commands_total{kind="pause",result="ok"}`))
	assert.EqualValues(t, 2, n.metric(`rollout_control_commands_total{kind="sleep",result="ok"}`))
	assert.EqualValues(t, 3, n.metric(`rollout_control_commands_total{kind="commit",result="ok"}`))
	assert.EqualValues(t, 3, n.metric(`rollout_control_commands_total{kind="commit",result="failed"}`), "two conflicts, one not staged")
	assert.EqualValues(t, 1, n.metric(`rollout_control_commands_total{kind="resume",result="failed"}`))
	assert.EqualValues(t, 1, n.metric(`rollout_control_commands_total{kind="stage",result="failed"}`), "the bad digest")
	assert.Zero(t, n.metric(`rollout_control_rejected_total{reason="bad_signature"}`))
}

// TestCommitReportsItsBubble: the ack of a commit bounds the generation bubble: the last
// token before its pause and the first after its resume, and what waited through the cut
// generates with the new version.
func TestCommitReportsItsBubble(t *testing.T) {
	mem := newMem(t)
	f := newFleet(t, mem)
	n := startNode(t, mem, nil)
	n.joined(f)

	_, err := n.add("warm", 4).Collect(t.Context())
	require.NoError(t, err)
	ref := checkpoint(t, 2, 2)
	require.Equal(t, protocol.ResultOK, f.do(protocol.Stage{Weights: ref}).Result)
	// Requests queue behind a pause, so they are certainly waiting when the commit resumes.
	require.Equal(t, protocol.ResultOK, f.do(protocol.Pause{Mode: protocol.ModeKeep}).Result)
	streams := []*engine.Stream{n.add("a", 6), n.add("b", 6)}
	waitFor(t, "two waiting requests", func() bool { return n.stats().Waiting == 2 })

	before := time.Now()
	a := f.do(protocol.Commit{Version: 2, Mode: protocol.ModeKeep, ClearCache: true, SHA256: ref.SHA256})
	require.Equal(t, protocol.ResultOK, a.Result, "%+v", a)
	assert.Equal(t, []string{"pause", "commit", "resume"}, phaseNames(a))
	require.Positive(t, a.LastTokenBefore)
	assert.Less(t, a.LastTokenBefore, before.UnixNano(), "the last token came from the warm-up")
	require.Positive(t, a.FirstTokenAfter)
	assert.Greater(t, a.FirstTokenAfter, before.UnixNano())
	for _, s := range streams {
		res, err := s.Collect(t.Context())
		require.NoError(t, err)
		require.Len(t, res.Tokens, 6)
		for _, tok := range res.Tokens {
			assert.EqualValues(t, 2, tok.WeightVersion)
		}
	}
}

// TestDuplicateIsReacked: a command seen twice runs once; the second copy gets the stored
// result marked duplicate.
func TestDuplicateIsReacked(t *testing.T) {
	mem := newMem(t)
	f := newFleet(t, mem)
	n := startNode(t, mem, nil)
	n.joined(f)

	e := f.envelope(protocol.Pause{Mode: protocol.ModeAbort})
	f.publish(e)
	first := f.ack(e.ID)
	require.Equal(t, protocol.ResultOK, first.Result)
	require.Equal(t, protocol.ResultOK, f.do(protocol.Resume{}).Result)
	f.publish(e)
	dup := f.ack(e.ID)
	assert.True(t, dup.Duplicate)
	assert.False(t, first.Duplicate)
	assert.Equal(t, first.Result, dup.Result)
	assert.Equal(t, first.Phases, dup.Phases)
	assert.EqualValues(t, "running", n.stats().State, "the duplicate did not pause again")
	assert.EqualValues(t, 1, n.metric(`rollout_control_commands_total{kind="pause",result="ok"}`))
}

// TestRejectionsAreCountedAndChangeNothing: unsigned, mis-signed, expired, replayed,
// wrong-fleet and malformed commands never reach the engine; each is counted by reason, and
// those of this fleet are acked as rejected.
func TestRejectionsAreCountedAndChangeNothing(t *testing.T) {
	mem := newMem(t)
	f := newFleet(t, mem)
	n := startNode(t, mem, nil)
	n.joined(f)
	pause := protocol.Pause{Mode: protocol.ModeAbort, ClearCache: true}
	envAt := func(fleet string, issued time.Time, timeout time.Duration) *protocol.Envelope {
		e, err := protocol.NewEnvelope(fleet, nil, pause, issued, timeout)
		require.NoError(t, err)
		return e
	}
	for _, tc := range []struct {
		name, reason string
		acked        bool
		msg          func() (id string, raw []byte)
	}{
		{"unsigned", agent.ReasonUnsigned, true, func() (string, []byte) {
			e := envAt(fleetName, time.Now(), time.Minute)
			return e.ID, encode(t, e)
		}},
		{"wrong secret", agent.ReasonBadSignature, true, func() (string, []byte) {
			e := envAt(fleetName, time.Now(), time.Minute)
			e.Sign([]byte("another-secret-another-secret-another-secret"))
			return e.ID, encode(t, e)
		}},
		{"tampered after signing", agent.ReasonBadSignature, true, func() (string, []byte) {
			e := envAt(fleetName, time.Now(), time.Minute)
			e.Sign(testSecret)
			e.Body = []byte(`{"mode":"keep","clear_cache":true}`)
			return e.ID, encode(t, e)
		}},
		{"expired", agent.ReasonExpired, true, func() (string, []byte) {
			e := envAt(fleetName, time.Now().Add(-50*time.Second), 5*time.Second) // past the 30 s skew allowance
			e.Sign(testSecret)
			return e.ID, encode(t, e)
		}},
		{"issued before the server started", agent.ReasonReplayed, true, func() (string, []byte) {
			e := envAt(fleetName, time.Now().Add(-2*time.Minute), 3*time.Minute)
			e.Sign(testSecret)
			return e.ID, encode(t, e)
		}},
		{"lifetime above the maximum", agent.ReasonReplayed, true, func() (string, []byte) {
			e := envAt(fleetName, time.Now(), 2*time.Hour)
			e.Sign(testSecret)
			return e.ID, encode(t, e)
		}},
		{"wrong fleet", agent.ReasonWrongFleet, false, func() (string, []byte) {
			e := envAt("other", time.Now(), time.Minute)
			e.Sign(testSecret)
			return e.ID, encode(t, e)
		}},
		{"not json", agent.ReasonMalformed, false, func() (string, []byte) { return "", []byte("{not json") }},
		{"unknown field", agent.ReasonMalformed, false, func() (string, []byte) {
			return "", []byte(`{"v":1,"id":"x","fleet":"t","kind":"pause","body":{},"issued_at":1,"deadline":2,"extra":1}`)
		}},
		{"invalid body", agent.ReasonMalformed, true, func() (string, []byte) {
			e := envAt(fleetName, time.Now(), time.Minute)
			e.Body = []byte(`{"mode":"bogus","clear_cache":true}`)
			e.Sign(testSecret)
			return e.ID, encode(t, e)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			metric := `rollout_control_rejected_total{reason="` + tc.reason + `"}`
			before := n.metric(metric)
			id, raw := tc.msg()
			f.publishRaw(raw)
			f.barrier()
			assert.Equal(t, before+1, n.metric(metric))
			if tc.acked {
				a := f.ack(id)
				assert.Equal(t, protocol.ResultRejected, a.Result)
				assert.Equal(t, tc.reason, a.Code)
				assert.NotEmpty(t, a.Error)
			} else if id != "" {
				f.noAck(id)
			}
			assert.EqualValues(t, "running", n.stats().State, "a refused pause changed nothing")
		})
	}
	assert.Zero(t, n.metric(`rollout_control_commands_total{kind="pause",result="ok"}`))
}

func encode(t *testing.T, e *protocol.Envelope) []byte {
	t.Helper()
	raw, err := e.Encode()
	require.NoError(t, err)
	return raw
}

// TestTargetsSelectServers: a command for other servers is ignored (not even counted).
func TestTargetsSelectServers(t *testing.T) {
	mem := newMem(t)
	f := newFleet(t, mem)
	n := startNode(t, mem, nil)
	n.joined(f)
	e := f.envelope(protocol.Pause{Mode: protocol.ModeAbort}, "s2", "s3")
	f.publish(e)
	f.barrier()
	f.noAck(e.ID)
	assert.EqualValues(t, "running", n.stats().State)
	a := f.do(protocol.Pause{Mode: protocol.ModeAbort}, "s2", serverID)
	assert.Equal(t, protocol.ResultOK, a.Result)
}

// TestConvergesFromTheDesiredState: a server that missed a commit converges after a
// resubscription; until then /ready is 503. A desired state it cannot fetch keeps it on the
// old version, serving but out of rotation; a tampered desired state changes nothing.
func TestConvergesFromTheDesiredState(t *testing.T) {
	mem := newMem(t)
	f := newFleet(t, mem)
	n := startNode(t, mem, nil)
	n.joined(f)
	plan := &protocol.Commit{Mode: protocol.ModeAbort, ClearCache: true, SleepLevel: 1}

	// Tampered: a signed record whose version was raised afterwards.
	ref := checkpoint(t, 2, 2)
	d := protocol.DesiredState{V: protocol.Version, Fleet: fleetName, Epoch: 1, Weights: &protocol.WeightsRef{Version: 1, URI: ref.URI}, Plan: plan, Signed: true}
	d.Sign(testSecret)
	d.Weights = &ref
	f.setDesired(d, false)
	before := n.metric(`rollout_control_rejected_total{reason="bad_signature"}`)
	mem.Resubscribed(f.names.Control())
	f.barrier()
	assert.Equal(t, before+1, n.metric(`rollout_control_rejected_total{reason="bad_signature"}`))
	assert.EqualValues(t, 1, n.stats().WeightVersion, "a tampered desired state changes nothing")
	ok, _ := n.ready()
	assert.True(t, ok)

	// A desired version whose digest does not match: the fetch fails, the server keeps
	// serving version 1, out of rotation.
	bad := ref
	bad.SHA256 = "00" + bad.SHA256[2:]
	f.setDesired(protocol.DesiredState{Epoch: 2, Weights: &bad, Plan: plan, Signed: true}, true)
	mem.Resubscribed(f.names.Control())
	f.barrier() // runs after the convergence attempt
	st := n.stats()
	assert.EqualValues(t, 1, st.WeightVersion)
	assert.EqualValues(t, "running", st.State)
	ok, body := n.ready()
	assert.False(t, ok)
	assert.Contains(t, body, "desired version is 2")

	// The good record: the server stages and commits by itself.
	f.setDesired(protocol.DesiredState{Epoch: 3, Weights: &ref, Plan: plan, Signed: true}, true)
	mem.Resubscribed(f.names.Control())
	f.barrier()
	st = n.stats()
	assert.EqualValues(t, 2, st.WeightVersion)
	assert.EqualValues(t, "running", st.State)
	ok, body = n.ready()
	assert.True(t, ok, body)
	// The commit command that the server missed arrives late: harmless, and it reports
	// the cut the server made by itself.
	a := f.do(protocol.Commit{Version: 2, Mode: protocol.ModeAbort, ClearCache: true, SleepLevel: 1, SHA256: ref.SHA256})
	require.Equal(t, protocol.ResultOK, a.Result)
	assert.Equal(t, []string{"pause", "sleep", "commit", "wake", "resume"}, phaseNames(a))
}

// TestHeartbeatConvergesAndReports: with a short interval the heartbeat alone brings a
// server to the desired version; its (signed) heartbeat then says in rotation at the epoch.
func TestHeartbeatConvergesAndReports(t *testing.T) {
	mem := newMem(t)
	f := newFleet(t, mem)
	ref := checkpoint(t, 2, 2)
	f.setDesired(protocol.DesiredState{Epoch: 4, Weights: &ref, Signed: true}, true)
	n := startNode(t, mem, func(c *server.Config) { c.FleetHeartbeat, c.FleetHeartbeatTTL = 20*time.Millisecond, time.Minute })
	waitFor(t, "convergence", func() bool {
		hb, ok := f.heartbeat(serverID)
		return ok && hb.InRotation && hb.WeightVersion == 2
	})
	hb, _ := f.heartbeat(serverID)
	require.NoError(t, hb.Verify(testSecret, fleetName))
	assert.EqualValues(t, 4, hb.Epoch)
	assert.Equal(t, protocol.StateRunning, hb.State)
	assert.Equal(t, n.URL(), hb.AdvertiseURL)
	assert.Empty(t, hb.Error)
	assert.EqualValues(t, 2, n.stats().WeightVersion)

	// Shutdown: the last heartbeat says stopping, out of rotation.
	require.NoError(t, n.stop())
	hb, ok := f.heartbeat(serverID)
	require.True(t, ok)
	assert.Equal(t, protocol.StateStopping, hb.State)
	assert.False(t, hb.InRotation)
}

// TestFleetPauseHoldsTheServer: a desired state that says paused pauses a server that joins.
func TestFleetPauseHoldsTheServer(t *testing.T) {
	mem := newMem(t)
	f := newFleet(t, mem)
	f.setDesired(protocol.DesiredState{Epoch: 1, Paused: true, Signed: true}, true)
	n := startNode(t, mem, nil)
	n.joined(f)
	f.barrier()
	assert.EqualValues(t, "paused", n.stats().State)
	ok, _ := n.ready()
	assert.False(t, ok)
	assert.ErrorContains(t, n.Agent().Ready(), "fleet is paused")
}

// TestRefusesASignedFleetWithoutSecret: the server's Run ends with ErrRefuseJoin.
func TestRefusesASignedFleetWithoutSecret(t *testing.T) {
	mem := newMem(t)
	f := newFleet(t, mem)
	f.setDesired(protocol.DesiredState{Epoch: 1, Signed: true}, true)
	n := startNode(t, mem, func(c *server.Config) { c.FleetSecret, c.InsecureUnsignedFleet = "", true })
	select {
	case err := <-n.done:
		n.done = nil
		require.ErrorIs(t, err, agent.ErrRefuseJoin)
	case <-time.After(60 * time.Second):
		t.Fatal("the server did not refuse to join")
	}
}

// TestRunRetriesWhileTheBusIsDown: Run keeps dialling while the bus cannot be reached and
// joins once it can; the server serves meanwhile.
func TestRunRetriesWhileTheBusIsDown(t *testing.T) {
	mem := newMem(t)
	f := newFleet(t, mem)
	n := startNode(t, mem, nil) // only for its engine and API
	n.joined(f)
	attempts := make(chan struct{}, 100)
	up := make(chan struct{})
	a, err := agent.New(agent.Config{Fleet: fleetName, ServerID: "s9", Secret: testSecret, HeartbeatInterval: time.Millisecond, HeartbeatTTL: time.Hour,
		Engine: &agent.EngineAdapter{Engine: n.Engine(), Clock: agent.NewStepClock(nil)},
		Stage:  func(context.Context, protocol.WeightsRef) (int64, error) { return 0, nil },
		Dial: func(ctx context.Context) (bus.Bus, error) {
			attempts <- struct{}{}
			select {
			case <-up:
				return nopCloser{mem}, nil
			default:
				return nil, bus.ErrUnavailable
			}
		}, Logger: quietLogger()})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	<-attempts
	<-attempts
	assert.False(t, a.InRotation())
	close(up)
	waitFor(t, "s9 joined", func() bool { _, ok := f.heartbeat("s9"); return ok })
	assert.True(t, a.InRotation())
	cancel()
	require.NoError(t, <-done)
	assert.ErrorIs(t, a.Run(t.Context()), agent.ErrAlreadyRunning)
}

// nopCloser keeps the agent from closing the shared test bus.
type nopCloser struct{ bus.Bus }

func (nopCloser) Close() error { return nil }

// TestCommandSpanJoinsTheSendersTrace: the span of a command is a child of the span whose
// W3C trace context the envelope carries, and links to it.
func TestCommandSpanJoinsTheSendersTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(t.Context()) }()
	mem := newMem(t)
	f := newFleet(t, mem)
	n := startNode(t, mem, func(c *server.Config) { c.Tracer = tp.Tracer("test") })
	n.joined(f)

	ctx, sender := tp.Tracer("sdk").Start(t.Context(), "sdk.pause")
	e, err := protocol.NewEnvelope(fleetName, nil, protocol.Pause{Mode: protocol.ModeAbort}, time.Now(), 30*time.Second)
	require.NoError(t, err)
	e.Trace = map[string]string{}
	propagation.TraceContext{}.Inject(ctx, propagation.MapCarrier(e.Trace))
	e.Sign(testSecret)
	f.publish(e)
	require.Equal(t, protocol.ResultOK, f.ack(e.ID).Result)
	sender.End()

	var got sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == agent.SpanProcess {
			got = s
		}
	}
	require.NotNil(t, got, "no control.process span")
	sc := sender.SpanContext()
	assert.Equal(t, sc.TraceID(), got.SpanContext().TraceID())
	assert.Equal(t, sc.SpanID(), got.Parent().SpanID())
	require.Len(t, got.Links(), 1)
	assert.Equal(t, sc.SpanID(), got.Links()[0].SpanContext.SpanID())
}

// TestTwoServersAckOnOneList: a fleet-wide command is acked by every server on the
// command's one list; each heartbeats under its own key.
func TestTwoServersAckOnOneList(t *testing.T) {
	mem := newMem(t)
	f := newFleet(t, mem)
	n1 := startNode(t, mem, nil)
	n2 := startNode(t, mem, func(c *server.Config) { c.ServerID = "s2" })
	n1.joined(f)
	n2.joined(f)
	e := f.envelope(protocol.Reset{})
	f.publish(e)
	got := map[string]protocol.Result{}
	for range 2 {
		a := f.ack(e.ID)
		got[a.ServerID] = a.Result
	}
	assert.Equal(t, map[string]protocol.Result{serverID: protocol.ResultOK, "s2": protocol.ResultOK}, got)
	hb, ok := f.heartbeat("s2")
	require.True(t, ok)
	assert.Equal(t, n2.URL(), hb.AdvertiseURL)
}

// flakyPush fails every Push while down is set, and says so on tried.
type flakyPush struct {
	bus.Bus
	mu    sync.Mutex
	down  bool
	tried chan struct{}
}

func (f *flakyPush) Push(ctx context.Context, list string, val []byte, ttl time.Duration) error {
	f.mu.Lock()
	down := f.down
	f.mu.Unlock()
	if down {
		select {
		case f.tried <- struct{}{}:
		default:
		}
		return fmt.Errorf("%w: test outage", bus.ErrUnavailable)
	}
	return f.Bus.Push(ctx, list, val, ttl)
}

func (f *flakyPush) setDown(v bool) {
	f.mu.Lock()
	f.down = v
	f.mu.Unlock()
}

func (*flakyPush) Close() error { return nil }

// TestAckSurvivesABusOutage: an ack that cannot be pushed is kept and pushed once the bus
// works again.
func TestAckSurvivesABusOutage(t *testing.T) {
	mem := newMem(t)
	f := newFleet(t, mem)
	n := startNode(t, mem, func(c *server.Config) { c.ServerID = "host" }) // for its engine
	n.joined(f)
	fb := &flakyPush{Bus: mem, tried: make(chan struct{}, 1)}
	a, err := agent.New(agent.Config{Bus: fb, Fleet: fleetName, ServerID: serverID, Secret: testSecret,
		HeartbeatInterval: 10 * time.Millisecond, HeartbeatTTL: time.Hour,
		Engine: &agent.EngineAdapter{Engine: n.Engine(), Clock: agent.NewStepClock(nil)},
		Stage:  func(context.Context, protocol.WeightsRef) (int64, error) { return 0, nil }, Logger: quietLogger()})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()
	n.joined(f) // the host's heartbeat exists already; wait for ours
	waitFor(t, "s1 joined", func() bool { _, ok := f.heartbeat(serverID); return ok })

	fb.setDown(true)
	e := f.envelope(protocol.Reset{}, serverID)
	f.publish(e)
	<-fb.tried
	f.noAck(e.ID)
	fb.setDown(false)
	ack := f.ack(e.ID)
	assert.Equal(t, protocol.ResultOK, ack.Result)
	assert.False(t, ack.Duplicate)
}

// TestConvergenceDropsANewerStagedVersion: a server whose staged set is newer than the
// fleet's desired version (staged by an update that aborted after another trainer's commit
// point) drops it and converges to the desired version; the engine stages only upwards, so
// it used to stay out of rotation until a still newer version came (found by the fault
// harness, seed 8).
func TestConvergenceDropsANewerStagedVersion(t *testing.T) {
	mem := newMem(t)
	f := newFleet(t, mem)
	n := startNode(t, mem, nil)
	n.joined(f)
	newer := checkpoint(t, 3, 3)
	require.Equal(t, protocol.ResultOK, f.do(protocol.Stage{Weights: newer}).Result)
	require.EqualValues(t, 3, n.stats().StagedVersion)
	want := checkpoint(t, 2, 2)
	f.setDesired(protocol.DesiredState{Epoch: 1, Weights: &want, Signed: true}, true)
	mem.Resubscribed(f.names.Control())
	f.barrier()
	st := n.stats()
	assert.EqualValues(t, 2, st.WeightVersion)
	ok, body := n.ready()
	assert.True(t, ok, body)
}

// TestResumeOfAServingServerSkipsItsEngineLoop: a resume that finds the server serving, with
// no control call pending on its engine, is answered by the agent's loop without the engine
// loop (engine.Engine.ResumeIfRunning): its ack is as before, and no engine.resume span is
// recorded for it. A resume of a paused server still goes through the engine loop.
func TestResumeOfAServingServerSkipsItsEngineLoop(t *testing.T) {
	mem := newMem(t)
	f := newFleet(t, mem)
	n, rec := tracedNode(t, mem)
	n.joined(f)
	// The spare weight set's prepare_spare call, pending, would send a resume through the
	// engine loop (under -race it can still be running when the resumes arrive).
	<-n.API().SpareReady()
	engineResumes := func() (k int) {
		for _, s := range rec.Ended() {
			if s.Name() == "engine.resume" {
				k++
			}
		}
		return k
	}

	require.Equal(t, protocol.ResultOK, f.do(protocol.Pause{Mode: protocol.ModeAbort}).Result)
	a := f.do(protocol.Resume{})
	require.Equal(t, protocol.ResultOK, a.Result, "%+v", a)
	assert.Equal(t, 1, engineResumes(), "the paused server's resume ran on the engine loop")
	assert.EqualValues(t, "running", n.stats().State)

	for range 3 {
		a = f.do(protocol.Resume{})
		require.Equal(t, protocol.ResultOK, a.Result, "%+v", a)
		assert.Equal(t, []string{"resume"}, phaseNames(a))
		assert.True(t, a.Phases[0].OK)
		assert.EqualValues(t, 1, a.WeightVersion)
	}
	assert.Equal(t, 1, engineResumes(), "a serving server's resumes did not reach the engine loop")
	assert.EqualValues(t, "running", n.stats().State)
	assert.EqualValues(t, 4, n.metric(`rollout_control_commands_total{kind="resume",result="ok"}`))
}
