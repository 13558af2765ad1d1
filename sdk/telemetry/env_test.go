package telemetry

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// exported is what a collector received: resource attributes and span names per request.
type exported struct {
	mu      sync.Mutex
	service []string
	spans   []string
	headers []string
}

func (e *exported) add(req *coltrace.ExportTraceServiceRequest, header string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.headers = append(e.headers, header)
	for _, rs := range req.GetResourceSpans() {
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				e.service = append(e.service, kv.GetValue().GetStringValue())
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				e.spans = append(e.spans, s.GetName())
			}
		}
	}
}

func emit(t *testing.T, o Options, name string) {
	t.Helper()
	tp, shutdown, err := Setup(context.Background(), o)
	require.NoError(t, err)
	_, span := tp.Tracer("t").Start(context.Background(), name)
	span.End()
	require.NoError(t, shutdown(context.Background()))
}

// OTLP over HTTP: endpoint, headers and service name come from the standard variables.
func TestOTLPHTTPFromEnv(t *testing.T) {
	var got exported
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req coltrace.ExportTraceServiceRequest
		if r.URL.Path == "/v1/traces" && proto.Unmarshal(body, &req) == nil {
			got.add(&req, r.Header.Get("X-Token"))
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-token=s3cret")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	env := map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SERVICE_NAME": "from-env", "OTEL_RESOURCE_ATTRIBUTES": "team=rl%20infra"}
	emit(t, Options{ServiceName: "from-code", Getenv: func(k string) string { return env[k] }}, "control.process")
	got.mu.Lock()
	defer got.mu.Unlock()
	assert.Equal(t, []string{"control.process"}, got.spans)
	assert.Equal(t, []string{"from-env"}, got.service, "OTEL_SERVICE_NAME wins over the code's default")
	assert.Equal(t, []string{"s3cret"}, got.headers)
}

type grpcCollector struct {
	coltrace.UnimplementedTraceServiceServer
	got *exported
}

func (c *grpcCollector) Export(ctx context.Context, req *coltrace.ExportTraceServiceRequest) (*coltrace.ExportTraceServiceResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	c.got.add(req, strings.Join(md.Get("x-token"), ","))
	return &coltrace.ExportTraceServiceResponse{}, nil
}

// OTLP over gRPC, selected by OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, to a real gRPC collector.
func TestOTLPGRPCFromEnv(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var got exported
	gs := grpc.NewServer()
	coltrace.RegisterTraceServiceServer(gs, &grpcCollector{got: &got})
	done := make(chan error, 1)
	go func() { done <- gs.Serve(ln) }()
	defer func() { gs.Stop(); <-done }()
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf") // the traces-specific one wins
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+ln.Addr().String())
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-token=g")
	emit(t, Options{Exporter: OTLP, ServiceName: "rollout-serve"}, "offload.flush.delivered")
	got.mu.Lock()
	defer got.mu.Unlock()
	assert.Equal(t, []string{"offload.flush.delivered"}, got.spans)
	assert.Equal(t, []string{"rollout-serve"}, got.service)
	assert.Equal(t, []string{"g"}, got.headers)
}

// OTEL_TRACES_SAMPLER is honoured: always_off exports nothing; console means stdout.
func TestSamplerAndConsoleFromEnv(t *testing.T) {
	var buf bytes.Buffer
	env := map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "always_off"}
	emit(t, Options{Stdout: &buf, Getenv: func(k string) string { return env[k] }}, "engine.pause")
	assert.Empty(t, buf.String())
	env["OTEL_TRACES_SAMPLER"], env["OTEL_TRACES_SAMPLER_ARG"] = "parentbased_traceidratio", "1"
	emit(t, Options{Stdout: &buf, Getenv: func(k string) string { return env[k] }}, "engine.pause")
	assert.Contains(t, buf.String(), `"Name":"engine.pause"`)
}

// Values Setup cannot use are errors naming the variable, never a silent default.
func TestBadEnvIsAnError(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want error
	}{
		{map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, ErrUnknownExporter},
		{map[string]string{"OTEL_TRACES_SAMPLER": "sometimes"}, ErrInvalidEnv},
		{map[string]string{"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, ErrInvalidEnv},
		{map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, ErrInvalidEnv},
		{map[string]string{"OTEL_RESOURCE_ATTRIBUTES": "novalue"}, ErrInvalidEnv},
	} {
		env := tc.env
		exp := ""
		if env["OTEL_TRACES_EXPORTER"] == "" {
			exp = OTLP
		}
		_, _, err := Setup(context.Background(), Options{Exporter: exp, Getenv: func(k string) string { return env[k] }})
		require.ErrorIs(t, err, tc.want, "%v", env)
		for k := range env {
			assert.Contains(t, err.Error(), k)
		}
	}
}
