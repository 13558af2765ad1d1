package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/rolloutkit/rollout/offload"
	"github.com/rolloutkit/rollout/server"
)

func recorded(rec *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func post(t *testing.T, ts *testServer, path, traceparent string, body string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, ts.url+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if traceparent != "" {
		req.Header.Set("traceparent", traceparent)
	}
	resp, err := ts.client.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	return resp.StatusCode
}

// The admin routes get the same tree as fleet commands: the HTTP server span (a child of the
// caller's traceparent) over the engine call over the connector's reset, delivery and wait.
// A malformed traceparent is ignored: the request succeeds under a root span. Generation
// requests record the engine's timeline as events of their HTTP span.
func TestTraceHTTPRoutes(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ts := start(t, func(c *server.Config) { c.TracerProvider = tp; c.OffloadCPUBytes = 8 << 20 })

	const caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	require.Equal(t, http.StatusOK, post(t, ts, "/pause?mode=keep&clear_cache=true", caller, ""))
	require.Eventually(t, func() bool { return len(recorded(rec, offload.SpanFlushWait)) == 1 }, 10*time.Second, time.Millisecond)
	httpSpans := recorded(rec, "POST /pause")
	require.Len(t, httpSpans, 1)
	h := httpSpans[0]
	assert.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", h.SpanContext().TraceID().String())
	assert.Equal(t, "00f067aa0ba902b7", h.Parent().SpanID().String())
	assert.Equal(t, trace.SpanKindServer, h.SpanKind())
	pause := recorded(rec, "engine.pause")
	require.Len(t, pause, 1)
	assert.Equal(t, h.SpanContext().SpanID(), pause[0].Parent().SpanID())
	reset := recorded(rec, offload.SpanResetCache)
	require.Len(t, reset, 1)
	assert.Equal(t, pause[0].SpanContext().SpanID(), reset[0].Parent().SpanID())
	del := recorded(rec, offload.SpanFlushDelivered)
	require.Len(t, del, 1)
	assert.Equal(t, reset[0].SpanContext().SpanID(), del[0].Parent().SpanID())
	assert.Equal(t, del[0].SpanContext().SpanID(), recorded(rec, offload.SpanFlushWait)[0].Parent().SpanID())

	for _, bad := range []string{"garbage", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"} {
		require.Equal(t, http.StatusOK, post(t, ts, "/resume", bad, ""), bad)
	}
	resumes := recorded(rec, "POST /resume")
	require.Len(t, resumes, 3)
	for _, s := range resumes {
		assert.False(t, s.Parent().IsValid(), "a malformed traceparent gives a root, not an error")
	}

	require.Equal(t, http.StatusOK, post(t, ts, "/generate", caller, `{"prompt_token_ids":[1,2,3],"sampling":{"max_tokens":4,"ignore_eos":true}}`))
	gen := recorded(rec, "POST /generate")
	require.Len(t, gen, 1)
	var events []string
	for _, e := range gen[0].Events() {
		events = append(events, e.Name)
	}
	assert.Equal(t, []string{"engine.queued", "engine.first_token", "engine.finished"}, events, "the engine's request timeline")
	assert.Empty(t, recorded(rec, "GET /metrics"), "scrapes are not traced")
}
