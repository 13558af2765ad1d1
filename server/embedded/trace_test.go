package embedded_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/rolloutkit/rollout/offload"
	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/server"
	"github.com/rolloutkit/rollout/server/agent"
	"github.com/rolloutkit/rollout/server/embedded"
)

// spanTree indexes the ended spans of one trace.
type spanTree struct {
	t     *testing.T
	spans []sdktrace.ReadOnlySpan
	byID  map[trace.SpanID]sdktrace.ReadOnlySpan
}

func newSpanTree(t *testing.T, all []sdktrace.ReadOnlySpan, id trace.TraceID) *spanTree {
	st := &spanTree{t: t, byID: map[trace.SpanID]sdktrace.ReadOnlySpan{}}
	for _, s := range all {
		if s.SpanContext().TraceID() == id {
			st.spans = append(st.spans, s)
			st.byID[s.SpanContext().SpanID()] = s
		}
	}
	return st
}

func (st *spanTree) parent(s sdktrace.ReadOnlySpan) sdktrace.ReadOnlySpan {
	return st.byID[s.Parent().SpanID()]
}

// children are s's children named name, in start order.
func (st *spanTree) children(s sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, c := range st.spans {
		if c.Name() == name && c.Parent().SpanID() == s.SpanContext().SpanID() {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) })
	return out
}

// child is s's only child named name.
func (st *spanTree) child(s sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
	st.t.Helper()
	c := st.children(s, name)
	require.Len(st.t, c, 1, "%s under %s", name, s.Name())
	return c[0]
}

func (st *spanTree) named(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range st.spans {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func spanAttr(s sdktrace.ReadOnlySpan, key string) attribute.Value {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// One UpdateWeights (stage, then pause with cache clearing → sleep → swap → wake → resume)
// across a two-server fleet under generation load with slow KV copies is one trace: the SDK's
// span, each server's control.process spans under the SDK's publish spans (with a link), the
// engine utility spans under them in order, both resets of each server, the step that
// delivered each reset's flush and the workers' wait on it, and every ack.
func TestTraceUpdateWeightsOneTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	f, err := embedded.Start(t.Context(), embedded.Options{Servers: 2, Secret: secret, Logger: quiet, Server: func(_ int, c *server.Config) {
		c.FleetHeartbeat = 100 * time.Millisecond
		c.FleetHeartbeatTTL = time.Second
		c.TracerProvider = tp
		c.OffloadCPUBytes = 16 << 20
		c.OffloadDelay = 20 * time.Millisecond // copies stay in flight across steps
	}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, f.Close()) })
	o := f.DialOptions()
	o.Logger, o.TracerProvider = quiet, tp
	c, err := sdk.Dial(t.Context(), o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })

	ref := fileRef(t, 1, 42)
	l := startLoad(t, c, 4, 40)
	// Stores are in flight on every server before the update starts.
	require.Eventually(t, func() bool {
		for _, s := range f.Servers() {
			st, err := s.Engine().Stats(t.Context())
			if err != nil || st.Connector["offload_stored_bytes_total"] == 0 {
				return false
			}
		}
		return true
	}, 30*time.Second, time.Millisecond, "stores on every server")
	res, err := c.UpdateWeights(t.Context(), ref, sdk.Plan{Policy: sdk.AllOrNothing})
	l.finish()
	require.NoError(t, err)
	require.Equal(t, sdk.OutcomeCommitted, res.Outcome)

	var root sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		for _, s := range rec.Ended() {
			if s.Name() == "sdk.update_weights" {
				root = s
			}
		}
		// Acks are pushed (and their spans end) just before the SDK reads them.
		return root != nil && len(newSpanTree(t, rec.Ended(), root.SpanContext().TraceID()).named(agent.SpanAck)) == 4
	}, 10*time.Second, time.Millisecond)
	tr := newSpanTree(t, rec.Ended(), root.SpanContext().TraceID())
	assert.False(t, root.Parent().IsValid(), "the SDK call is the root")

	procs := tr.named(agent.SpanProcess)
	require.Len(t, procs, 4, "stage and commit on each of the two servers")
	perServer := map[string]map[string]sdktrace.ReadOnlySpan{}
	for _, p := range procs {
		pub := tr.parent(p)
		require.NotNil(t, pub, "control.process has its sender in the trace")
		assert.Equal(t, "sdk.publish", pub.Name())
		require.Len(t, p.Links(), 1)
		assert.Equal(t, pub.SpanContext().SpanID(), p.Links()[0].SpanContext.SpanID(), "and links to it")
		id, kind := spanAttr(p, "rollout.server_id").AsString(), spanAttr(p, "rollout.command").AsString()
		if perServer[id] == nil {
			perServer[id] = map[string]sdktrace.ReadOnlySpan{}
		}
		perServer[id][kind] = p
		// Its ack is pushed under it.
		ack := tr.child(p, agent.SpanAck)
		assert.False(t, ack.StartTime().Before(p.EndTime()))
	}
	require.ElementsMatch(t, f.IDs(), slices.Collect(func(yield func(string) bool) {
		for id := range perServer {
			if !yield(id) {
				return
			}
		}
	}))
	for id, kinds := range perServer {
		stage, commit := kinds["stage"], kinds["commit"]
		require.NotNil(t, stage, id)
		require.NotNil(t, commit, id)
		assert.True(t, stage.EndTime().Before(commit.StartTime()), "%s: stage before commit", id)
		// A server may converge to the new desired state by itself before a command reaches
		// it (the SDK writes the state first); its control.converge span is then in this
		// trace too, and the command finds the work done.
		doer := func(cmd sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
			if len(tr.children(cmd, name)) > 0 {
				return cmd
			}
			for _, cv := range tr.named(agent.SpanConverge) {
				if spanAttr(cv, "rollout.server_id").AsString() == id && len(tr.children(cv, name)) > 0 {
					return cv
				}
			}
			return cmd
		}
		tr.child(doer(stage, "weights.fetch"), "weights.fetch")
		tr.child(doer(stage, "engine.update_weights.stage"), "engine.update_weights.stage")

		// The cut, in order.
		cut := doer(commit, "engine.pause")
		var steps []sdktrace.ReadOnlySpan
		for _, name := range []string{"engine.pause", "engine.sleep", "engine.update_weights.commit", "engine.wake_up", "engine.resume"} {
			steps = append(steps, tr.child(cut, name))
		}
		for i := 1; i < len(steps); i++ {
			assert.False(t, steps[i].StartTime().Before(steps[i-1].EndTime()), "%s: %s after %s", id, steps[i].Name(), steps[i-1].Name())
		}
		pause, sleep := steps[0], steps[1]
		assert.True(t, spanAttr(pause, "engine.clear_cache").AsBool())
		assert.EqualValues(t, 1, spanAttr(sleep, "engine.sleep_level").AsInt64())
		// Both resets, each delivered to the workers by a step and waited on: the pause's by
		// the step right after it (before the sleep's reset, which waits for an idle engine),
		// the sleep's before the sleep returns.
		var waits []sdktrace.ReadOnlySpan
		for _, call := range []sdktrace.ReadOnlySpan{pause, sleep} {
			reset := tr.child(call, offload.SpanResetCache)
			if len(waits) > 0 {
				assert.False(t, reset.StartTime().Before(waits[0].EndTime()), "%s: the sleep's reset after the pause's flush", id)
			}
			assert.Equal(t, attribute.INT64, spanAttr(reset, offload.AttrJobsFlushed).Type(), "%s %s", id, call.Name())
			del := tr.child(reset, offload.SpanFlushDelivered)
			assert.EqualValues(t, 1, spanAttr(del, offload.AttrResetsMerged).AsInt64())
			assert.Positive(t, spanAttr(del, offload.AttrStep).AsInt64())
			assert.Len(t, spanAttr(del, offload.AttrJobIDs).AsInt64Slice(), int(spanAttr(reset, offload.AttrFlushPending).AsInt64()))
			wait := tr.child(del, offload.SpanFlushWait)
			waits = append(waits, wait)
			t.Logf("%s %s: reset flushed %d jobs; step %d delivered %v after %.2f ms, waited %.2f ms", id, call.Name(),
				spanAttr(reset, offload.AttrJobsFlushed).AsInt64(), spanAttr(del, offload.AttrStep).AsInt64(), spanAttr(del, offload.AttrJobIDs).AsInt64Slice(),
				1e3*spanAttr(del, offload.AttrResetToDelivery).AsFloat64(), float64(wait.EndTime().Sub(wait.StartTime()).Microseconds())/1e3)
			assert.False(t, del.StartTime().Before(reset.EndTime()))
		}
		assert.False(t, waits[1].EndTime().After(sleep.EndTime()), "%s: the sleep returns after its flush was waited on", id)
	}
	// Every span of the transaction is in this one trace: the servers' spans of the cut have
	// no other root.
	for _, s := range tr.spans {
		if s != root {
			assert.True(t, s.Parent().IsValid(), "%s has a parent", s.Name())
		}
	}
}
