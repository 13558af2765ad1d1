package telemetry

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStdoutExporterWritesSpans(t *testing.T) {
	var buf bytes.Buffer
	tp, shutdown, err := Setup(context.Background(), Options{Exporter: Stdout, Stdout: &buf, ServiceName: "test"})
	require.NoError(t, err)
	_, span := tp.Tracer("t").Start(context.Background(), "engine.pause")
	span.End()
	require.NoError(t, shutdown(context.Background()))
	assert.Contains(t, buf.String(), `"Name":"engine.pause"`)
}

// TestOTLPExporterSendsToCollector exports to a real HTTP listener standing in for the
// collector's OTLP/HTTP endpoint and checks that a protobuf trace export arrives.
func TestOTLPExporterSendsToCollector(t *testing.T) {
	var got atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/v1/traces" && len(body) > 0 {
			got.Add(1)
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	tp, shutdown, err := Setup(context.Background(), Options{Exporter: OTLP})
	require.NoError(t, err)
	_, span := tp.Tracer("t").Start(context.Background(), "offload.reset_cache")
	span.End()
	require.NoError(t, shutdown(context.Background()))
	assert.Positive(t, got.Load())
}

func TestNoneAndUnknown(t *testing.T) {
	_, shutdown, err := Setup(context.Background(), Options{})
	require.NoError(t, err)
	require.NoError(t, shutdown(context.Background()))
	_, _, err = Setup(context.Background(), Options{Exporter: "jaeger"})
	require.ErrorIs(t, err, ErrUnknownExporter)
}
