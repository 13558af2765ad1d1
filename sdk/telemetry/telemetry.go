package telemetry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ErrUnknownExporter is returned for an exporter name that is not none, stdout or otlp.
var ErrUnknownExporter = errors.New("telemetry: unknown exporter")

// Exporters Setup accepts.
const (
	None   = "none"
	Stdout = "stdout"
	OTLP   = "otlp"
)

// Options configure Setup.
type Options struct {
	// Exporter is none (the default), stdout or otlp.
	Exporter string
	// ServiceName is the service.name resource attribute (default "rollout").
	ServiceName string
	// Attributes are added to the resource (e.g. server id, fleet).
	Attributes []attribute.KeyValue
	// Stdout is where the stdout exporter writes (default os.Stdout).
	Stdout io.Writer
}

// Setup installs the global tracer provider and propagator and returns the provider and a
// shutdown that flushes and stops it.
func Setup(ctx context.Context, o Options) (trace.TracerProvider, func(context.Context) error, error) {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	var exp sdktrace.SpanExporter
	var err error
	switch o.Exporter {
	case "", None:
		tp := noop.NewTracerProvider()
		otel.SetTracerProvider(tp)
		return tp, func(context.Context) error { return nil }, nil
	case Stdout:
		w := o.Stdout
		if w == nil {
			w = os.Stdout
		}
		exp, err = stdouttrace.New(stdouttrace.WithWriter(w))
	case OTLP:
		exp, err = otlptracehttp.New(ctx) // endpoint, headers, TLS from OTEL_EXPORTER_OTLP_*
	default:
		return nil, nil, fmt.Errorf("%w %q: want none, stdout or otlp", ErrUnknownExporter, o.Exporter)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("telemetry: %s exporter: %w", o.Exporter, err)
	}
	name := o.ServiceName
	if name == "" {
		name = "rollout"
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(append([]attribute.KeyValue{
		attribute.String("service.name", name)}, o.Attributes...)...))
	if err != nil {
		return nil, nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	return tp, tp.Shutdown, nil
}
