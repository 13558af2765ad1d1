package api

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// A reset-to-flush or update observation made inside a sampled span carries its trace id as
// an exemplar, served to a scraper that negotiates OpenMetrics; the classic text format is
// unchanged for everyone else.
func TestExemplarsCarryTraceIDs(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("t").Start(context.Background(), "offload.flush.delivered")
	span.End()
	m := NewMetrics()
	m.ObserveResetToFlush(ctx, []int64{1, 2}, 3*time.Millisecond)
	m.ObserveUpdate(ctx, "commit", 20*time.Millisecond)
	m.ObserveUpdate(context.Background(), "stage", time.Millisecond) // no span: no exemplar
	srv := httptest.NewServer(m.handler())
	defer srv.Close()
	get := func(accept string) (string, string) {
		req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
		require.NoError(t, err)
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.Header.Get("Content-Type"), string(b)
	}
	ct, body := get("application/openmetrics-text; version=1.0.0; charset=utf-8")
	assert.Contains(t, ct, "application/openmetrics-text")
	id := span.SpanContext().TraceID().String()
	assert.Regexp(t, `rollout_reset_to_flush_seconds_bucket\{le="[0-9.e-]+"\} 1 # \{[^}]*trace_id="`+id+`"[^}]*\} 0\.003 `, body)
	assert.Regexp(t, `rollout_update_weights_seconds_bucket\{phase="commit",le="[0-9.e-]+"\} 1 # \{[^}]*trace_id="`+id+`"[^}]*\} 0\.02 `, body)
	assert.NotRegexp(t, `phase="stage".*# \{`, body)
	ct, body = get("")
	assert.Contains(t, ct, "text/plain")
	assert.NotContains(t, body, "trace_id")
	assert.Contains(t, body, "rollout_reset_to_flush_seconds_count 1")
}
