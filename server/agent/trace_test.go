package agent_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/protocol"
	"github.com/rolloutkit/rollout/server"
	"github.com/rolloutkit/rollout/server/agent"
)

func tracedNode(t *testing.T, b bus.Bus) (*node, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	n := startNode(t, b, func(c *server.Config) { c.TracerProvider = tp })
	return n, rec
}

// senderSpan starts a span in the test's own provider and returns its W3C carrier.
func senderSpan(t *testing.T) (trace.SpanContext, map[string]string) {
	t.Helper()
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("sender").Start(context.Background(), "sdk.publish")
	span.End()
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	return span.SpanContext(), carrier
}

func ended(rec *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func boolAttr(s sdktrace.ReadOnlySpan, key string) bool {
	for _, kv := range s.Attributes() {
		if kv.Key == attribute.Key(key) {
			return kv.Value.AsBool()
		}
	}
	return false
}

// A command's span is a child of the sender's span (plus a link), its ack's span is a child
// of the process span, and a copy of the command delivered again is re-acked under the
// redelivery's sender span with a link to the original process span: never a new root.
func TestTraceProcessAndReackLink(t *testing.T) {
	b := bus.NewMem(bus.MemOptions{})
	defer b.Close()
	f := newFleet(t, b)
	n, rec := tracedNode(t, b)
	n.joined(f)

	sender, carrier := senderSpan(t)
	e := f.envelope(protocol.Pause{Mode: protocol.ModeKeep, ClearCache: true})
	e.Trace = carrier
	e.Sign(f.secret)
	f.publish(e)
	first := f.ack(e.ID)
	require.Equal(t, protocol.ResultOK, first.Result, "%+v", first)
	f.publish(e) // the same envelope again: deduped and re-acked
	dup := f.ack(e.ID)
	require.True(t, dup.Duplicate)
	waitFor(t, "two ack spans", func() bool { return len(ended(rec, agent.SpanAck)) == 2 })

	procs := ended(rec, agent.SpanProcess)
	require.Len(t, procs, 1, "the duplicate is not executed again")
	proc := procs[0]
	assert.Equal(t, sender.TraceID(), proc.SpanContext().TraceID())
	assert.Equal(t, sender.SpanID(), proc.Parent().SpanID())
	assert.True(t, proc.Parent().IsRemote())
	require.Len(t, proc.Links(), 1)
	assert.Equal(t, sender.SpanID(), proc.Links()[0].SpanContext.SpanID())
	var pause sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "engine.pause" {
			pause = s
		}
	}
	require.NotNil(t, pause)
	assert.Equal(t, proc.SpanContext().SpanID(), pause.Parent().SpanID(), "the engine call runs under the process span")

	acks := ended(rec, agent.SpanAck)
	orig, re := acks[0], acks[1]
	if boolAttr(orig, "rollout.duplicate") {
		orig, re = re, orig
	}
	assert.Equal(t, proc.SpanContext().SpanID(), orig.Parent().SpanID())
	assert.Empty(t, orig.Links())
	assert.True(t, boolAttr(re, "rollout.duplicate"))
	assert.Equal(t, sender.TraceID(), re.SpanContext().TraceID(), "the re-ack stays in the sender's trace")
	assert.Equal(t, sender.SpanID(), re.Parent().SpanID())
	require.Len(t, re.Links(), 1)
	assert.Equal(t, proc.SpanContext(), re.Links()[0].SpanContext, "the re-ack links to the original execution")
}

// A malformed traceparent is used for nothing: the command runs and acks as usual and its
// process span is a root of its own.
func TestTraceMalformedTraceparentIgnored(t *testing.T) {
	b := bus.NewMem(bus.MemOptions{})
	defer b.Close()
	f := newFleet(t, b)
	n, rec := tracedNode(t, b)
	n.joined(f)
	for _, tp := range []string{"garbage", "00-00000000000000000000000000000000-0000000000000000-01", "00-zz-yy-01", ""} {
		e := f.envelope(protocol.Resume{})
		e.Trace = map[string]string{"traceparent": tp, "tracestate": "=,="}
		e.Sign(f.secret)
		f.publish(e)
		a := f.ack(e.ID)
		assert.Equal(t, protocol.ResultOK, a.Result, "traceparent %q: %+v", tp, a)
	}
	waitFor(t, "four process spans", func() bool { return len(ended(rec, agent.SpanProcess)) == 4 })
	for _, s := range ended(rec, agent.SpanProcess) {
		assert.False(t, s.Parent().IsValid(), "a root")
		assert.Empty(t, s.Links())
	}
	assert.False(t, agent.SenderSpan(map[string]string{"traceparent": "garbage"}).IsValid())
}
