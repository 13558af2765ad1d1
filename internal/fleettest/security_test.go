package fleettest_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/internal/fleettest"
	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/protocol"
)

// serverState is the part of GET /state these tests read.
type serverState struct {
	State         string `json:"state"`
	WeightVersion int64  `json:"weight_version"`
}

func stateOf(t *testing.T, p *fleettest.Proc) serverState {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, p.URL()+"/state", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+p.AdminToken())
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var s serverState
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&s))
	return s
}

// waitMetric waits until the metric reaches want on p; a counter that must get there.
func waitMetric(t *testing.T, p *fleettest.Proc, want float64, name string, labels ...string) {
	t.Helper()
	var got float64
	require.Eventually(t, func() bool {
		v, err := p.Metric(name, labels...)
		got = v
		return err == nil && v >= want
	}, 30*time.Second, 20*time.Millisecond, "%s %s%v: got %v, want %v", p.ID, name, labels, got, want)
	v, err := p.Metric(name, labels...)
	require.NoError(t, err)
	assert.Equal(t, want, v, "%s %s%v counted more than once", p.ID, name, labels)
}

func dialBus(t *testing.T, f *fleettest.Fleet) bus.Bus {
	t.Helper()
	b, err := bus.DialRedis(t.Context(), f.Redis.URL(), bus.RedisOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// waitKeyVersion waits until the desired-state key itself (not a client's newer cache) holds
// a record naming weights version v.
func waitKeyVersion(t *testing.T, b bus.Bus, f *fleettest.Fleet, v int64, what string) {
	t.Helper()
	key := protocol.Names{Fleet: f.Name}.Desired()
	require.Eventually(t, func() bool {
		raw, err := b.Get(t.Context(), key)
		if err != nil {
			return false
		}
		d, err := protocol.DecodeDesiredState(raw)
		return err == nil && d.Weights != nil && d.Weights.Version == v
	}, 20*time.Second, 20*time.Millisecond, what)
}

func publish(t *testing.T, b bus.Bus, f *fleettest.Fleet, e *protocol.Envelope) []byte {
	t.Helper()
	raw, err := e.Encode()
	require.NoError(t, err)
	n, err := b.Publish(t.Context(), protocol.Names{Fleet: f.Name}.Control(), raw)
	require.NoError(t, err)
	require.Equal(t, len(f.Procs), n, "every server subscribes to the control channel")
	return raw
}

func pauseEnvelope(t *testing.T, fleet string, now time.Time) *protocol.Envelope {
	t.Helper()
	e, err := protocol.NewEnvelope(fleet, nil, protocol.Pause{Mode: protocol.ModeAbort}, now, time.Minute)
	require.NoError(t, err)
	return e
}

// acks pops the acks of command id until it has want of them.
func acks(t *testing.T, b bus.Bus, f *fleettest.Fleet, id string, want int) []*protocol.Ack {
	t.Helper()
	var out []*protocol.Ack
	deadline := time.Now().Add(30 * time.Second)
	for len(out) < want {
		require.False(t, time.Now().After(deadline), "%d of %d acks of %s", len(out), want, id)
		vals, err := b.Pop(t.Context(), protocol.Names{Fleet: f.Name}.Acks(id), want-len(out), time.Second)
		require.NoError(t, err)
		for _, v := range vals {
			a, err := protocol.DecodeAck(v)
			require.NoError(t, err)
			out = append(out, a)
		}
	}
	return out
}

func assertServing(t *testing.T, f *fleettest.Fleet, version int64) {
	t.Helper()
	for _, p := range f.Procs {
		s := stateOf(t, p)
		assert.EqualValues(t, "running", s.State, p.ID)
		assert.Equal(t, version, s.WeightVersion, p.ID)
		assert.Equal(t, http.StatusOK, p.Status("/ready"), p.ID)
	}
}

// TestSecurityRejectsForgedCommands sends, straight onto the control channel, the commands an
// attacker without the secret (or with an old capture) could send, and a tampered desired
// state; every server refuses each one, counts it by reason, and keeps serving untouched.
func TestSecurityRejectsForgedCommands(t *testing.T) {
	skipShort(t)
	f := fleettest.Start(t, fleettest.Options{Servers: 2, Fleet: "sec"})
	b := dialBus(t, f)
	secret := []byte(f.Secret)
	const rejected = "rollout_control_rejected_total"

	cases := []struct {
		reason string
		make   func(now time.Time) *protocol.Envelope
	}{
		{"unsigned", func(now time.Time) *protocol.Envelope { return pauseEnvelope(t, f.Name, now) }},
		{"bad_signature", func(now time.Time) *protocol.Envelope {
			e := pauseEnvelope(t, f.Name, now)
			e.Sign([]byte("another-secret-of-at-least-32-bytes-long!"))
			return e
		}},
		{"bad_signature", func(now time.Time) *protocol.Envelope { // signed, then altered
			e := pauseEnvelope(t, f.Name, now)
			e.Sign(secret)
			e.Body = json.RawMessage(`{"mode":"abort","clear_cache":true}`)
			return e
		}},
		{"expired", func(now time.Time) *protocol.Envelope {
			e := pauseEnvelope(t, f.Name, now.Add(-50*time.Second))
			e.Deadline = now.Add(-40 * time.Second).UnixMilli() // past the 30 s clock-skew allowance
			e.Sign(secret)
			return e
		}},
		{"replayed", func(now time.Time) *protocol.Envelope { // captured before the servers started
			e := pauseEnvelope(t, f.Name, now.Add(-time.Hour))
			e.Deadline = now.Add(time.Minute).UnixMilli()
			e.Sign(secret)
			return e
		}},
		{"wrong_fleet", func(now time.Time) *protocol.Envelope {
			e := pauseEnvelope(t, "another-fleet", now)
			e.Sign(secret)
			return e
		}},
	}
	want := map[string]float64{}
	for _, c := range cases {
		publish(t, b, f, c.make(time.Now()))
		want[c.reason]++
		for _, p := range f.Procs {
			waitMetric(t, p, want[c.reason], rejected, "reason", c.reason)
		}
		assertServing(t, f, 0)
	}
	for _, p := range f.Procs {
		v, err := p.Metric("rollout_control_commands_total")
		require.NoError(t, err)
		assert.Zero(t, v, "%s executed a forged command", p.ID)
	}

	// A genuine pause, then resume; replaying the captured pause is re-acked as a duplicate
	// and does nothing. (A capture replayed after a restart, when the server has forgotten the
	// id, is the "replayed" case above: refused when issued before the server started.)
	pause := pauseEnvelope(t, f.Name, time.Now())
	pause.Sign(secret)
	pauseRaw := publish(t, b, f, pause)
	for _, a := range acks(t, b, f, pause.ID, 2) {
		assert.Equal(t, protocol.ResultOK, a.Result, a.ServerID)
	}
	resume, err := protocol.NewEnvelope(f.Name, nil, protocol.Resume{}, time.Now(), time.Minute)
	require.NoError(t, err)
	resume.Sign(secret)
	publish(t, b, f, resume)
	acks(t, b, f, resume.ID, 2)
	assertServing(t, f, 0)

	_, err = b.Publish(t.Context(), protocol.Names{Fleet: f.Name}.Control(), pauseRaw)
	require.NoError(t, err)
	for _, a := range acks(t, b, f, pause.ID, 2) {
		assert.True(t, a.Duplicate, "%s re-acks the replayed command as a duplicate", a.ServerID)
	}
	assertServing(t, f, 0)

	// The desired state: a signed one, then the same with a field changed and the signature
	// kept, and one with no signature at all. Servers ignore both (counting bad_signature and
	// unsigned) and never pause.
	names := protocol.Names{Fleet: f.Name}
	d := &protocol.DesiredState{V: protocol.Version, Fleet: f.Name, Epoch: 1, Signed: true, UpdatedAt: time.Now().UnixMilli()}
	d.Sign(secret)
	raw, err := d.Encode()
	require.NoError(t, err)
	require.NoError(t, b.Set(t.Context(), names.Desired(), raw, 0))
	for _, bad := range []struct {
		reason string
		sig    string
	}{{"bad_signature", d.Sig}, {"unsigned", ""}} {
		before := map[string]float64{}
		for _, p := range f.Procs {
			before[p.ID], err = p.Metric(rejected, "reason", bad.reason)
			require.NoError(t, err)
		}
		tampered := *d
		tampered.Epoch, tampered.Paused, tampered.Sig = 2, true, bad.sig
		raw, err = tampered.Encode()
		require.NoError(t, err)
		require.NoError(t, b.Set(t.Context(), names.Desired(), raw, 0))
		for _, p := range f.Procs {
			waitMetric(t, p, before[p.ID]+1, rejected, "reason", bad.reason)
		}
		assertServing(t, f, 0)
	}
	for _, p := range f.Procs {
		hb := f.Heartbeat(p.ID)
		require.NotNil(t, hb)
		assert.True(t, hb.InRotation, p.ID)
		assert.NotEqual(t, protocol.StatePaused, hb.State, p.ID)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	require.NoError(t, b.Delete(ctx, names.Desired()))
}

// TestFloodOfForgedCommandsCostsLittle (issue 26, finding 6, from Redis): thousands of
// forged commands on the control channel cost each server no log line per message and no
// Redis write per message (rejection acks come from a small token bucket, refusals are
// logged at most once per 10 s), and a genuine pause sent after the flood is carried out.
func TestFloodOfForgedCommandsCostsLittle(t *testing.T) {
	skipShort(t)
	f := fleettest.Start(t, fleettest.Options{Servers: 2, Fleet: "flood"})
	b := dialBus(t, f)
	opt, err := redis.ParseURL(f.Redis.URL())
	require.NoError(t, err)
	rc := redis.NewClient(opt)
	t.Cleanup(func() { _ = rc.Close() })
	ackKeys := func() int {
		keys, err := rc.Keys(t.Context(), protocol.Names{Fleet: f.Name}.Acks("*")).Result()
		require.NoError(t, err)
		return len(keys)
	}
	refusedLines := func(p *fleettest.Proc) int { return strings.Count(p.Logs(), "refused control messages") }
	before := ackKeys()
	linesBefore := map[string]int{}
	for _, p := range f.Procs {
		linesBefore[p.ID] = strings.Count(p.Logs(), "\n")
	}

	const flood = 4000
	start := time.Now()
	wrong := []byte("attacker-secret-of-at-least-32-bytes-long")
	control := protocol.Names{Fleet: f.Name}.Control()
	for i := range flood {
		e := pauseEnvelope(t, f.Name, time.Now())
		if i%2 == 0 {
			e.Sign(wrong)
		}
		raw, err := e.Encode()
		require.NoError(t, err)
		_, err = b.Publish(t.Context(), control, raw)
		require.NoError(t, err)
	}
	for _, p := range f.Procs {
		waitMetric(t, p, flood, "rollout_control_rejected_total")
	}
	elapsed := time.Since(start)

	// The bounds follow from the rates, over the time the flood took to be refused: a full
	// bucket of 16 rejection acks, then 16 a second; on d3a29f0 every forged command cost an
	// ack key and a log line on every server.
	secs := int(elapsed/time.Second) + 1
	assert.LessOrEqual(t, ackKeys()-before, len(f.Procs)*16*(1+secs), "rejection acks per forged command (elapsed %s)", elapsed)
	for _, p := range f.Procs {
		assert.LessOrEqual(t, strings.Count(p.Logs(), "\n")-linesBefore[p.ID], 2+secs/10, "%s: log lines during the flood", p.ID)
		assert.GreaterOrEqual(t, refusedLines(p), 1, "%s says it refused messages", p.ID)
	}
	c := dial(t, f)
	require.NoError(t, errOf(c.Pause(t.Context(), sdk.PauseOptions{})))
	for _, p := range f.Procs {
		f.WaitFor(p, 30*time.Second, "paused", func(hb *protocol.Heartbeat) bool { return hb.State == protocol.StatePaused })
	}
	require.NoError(t, errOf(c.Resume(t.Context(), sdk.ResumeOptions{})))
	assertServing(t, f, 0)
}
