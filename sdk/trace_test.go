package sdk

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/rolloutkit/rollout/sdk/bus"
)

func TestSpansAndTraceContext(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(t.Context())
	b := bus.NewMem(bus.MemOptions{})
	defer b.Close()
	agents := []*fakeAgent{startFake(t, b, "f", secret, "a", 0), startFake(t, b, "f", secret, "b", 0)}
	c, err := Dial(t.Context(), Options{Bus: b, Fleet: "f", Secret: secret, TracerProvider: tp})
	require.NoError(t, err)
	defer c.Close()

	_, err = c.UpdateWeights(t.Context(), ref(1), Plan{})
	require.NoError(t, err)

	spans := rec.Ended()
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byName[s.Name()] = s
	}
	root, ok := byName["sdk.update_weights"]
	require.True(t, ok)
	for _, name := range []string{"sdk.update_weights.stage", "sdk.update_weights.commit_point", "sdk.update_weights.commit",
		"sdk.update_weights.pause", "sdk.update_weights.swap", "sdk.update_weights.resume", "sdk.publish"} {
		s, ok := byName[name]
		require.True(t, ok, name)
		assert.Equal(t, root.SpanContext().TraceID(), s.SpanContext().TraceID(), name)
	}
	// Every command carried the trace context of its publish span.
	for _, a := range agents {
		for _, e := range a.got() {
			tp := e.Trace["traceparent"]
			require.NotEmpty(t, tp)
			assert.Contains(t, tp, root.SpanContext().TraceID().String())
		}
	}
}
