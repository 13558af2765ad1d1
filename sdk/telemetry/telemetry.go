package telemetry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Errors callers branch on.
var (
	// ErrUnknownExporter is returned for an exporter name that is not none, stdout or otlp.
	ErrUnknownExporter = errors.New("telemetry: unknown exporter")
	// ErrInvalidEnv is returned for an OTEL_* variable whose value cannot be used.
	ErrInvalidEnv = errors.New("telemetry: invalid OTEL_* setting")
)

// Exporters Setup accepts.
const (
	None   = "none"
	Stdout = "stdout"
	OTLP   = "otlp"
)

// OTLP protocols (OTEL_EXPORTER_OTLP_PROTOCOL, OTEL_EXPORTER_OTLP_TRACES_PROTOCOL).
const (
	ProtocolHTTP = "http/protobuf"
	ProtocolGRPC = "grpc"
)

// Options configure Setup.
type Options struct {
	// Exporter is none, stdout or otlp; empty takes OTEL_TRACES_EXPORTER (otlp, console or
	// none), and none when that is unset too.
	Exporter string
	// ServiceName is the service.name resource attribute (default "rollout");
	// OTEL_SERVICE_NAME overrides it, and OTEL_RESOURCE_ATTRIBUTES adds to the resource.
	ServiceName string
	// Attributes are added to the resource (e.g. server id, fleet).
	Attributes []attribute.KeyValue
	// Stdout is where the stdout exporter writes (default os.Stdout).
	Stdout io.Writer
	// Getenv reads the environment (default os.Getenv); tests replace it. The OTLP
	// exporters read their own OTEL_EXPORTER_OTLP_* variables (endpoint, headers, timeout,
	// TLS, compression) from the process environment.
	Getenv func(string) string
}

// Setup builds the tracer provider for the exporter the options and the standard OTEL_*
// variables select, installs it and the W3C trace-context propagator as the process globals,
// and returns the provider and a shutdown that flushes and stops it. Only main packages call
// it. The variables honoured: OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL
// (http/protobuf, the default, or grpc), OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, _HEADERS,
// _TIMEOUT, _INSECURE, _COMPRESSION and the TLS files, OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG, and the batch
// processor's OTEL_BSP_* settings. A value Setup cannot use is an error, not a silent default.
func Setup(ctx context.Context, o Options) (trace.TracerProvider, func(context.Context) error, error) {
	getenv := o.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	name, err := exporterName(o.Exporter, getenv)
	if err != nil {
		return nil, nil, err
	}
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	if name == None {
		tp := noop.NewTracerProvider()
		otel.SetTracerProvider(tp)
		return tp, func(context.Context) error { return nil }, nil
	}
	sampler, err := samplerFromEnv(getenv)
	if err != nil {
		return nil, nil, err
	}
	var exp sdktrace.SpanExporter
	switch name {
	case Stdout:
		w := o.Stdout
		if w == nil {
			w = os.Stdout
		}
		exp, err = stdouttrace.New(stdouttrace.WithWriter(w))
	case OTLP:
		var proto string
		if proto, err = otlpProtocol(getenv); err != nil {
			return nil, nil, err
		}
		if proto == ProtocolGRPC {
			exp, err = otlptracegrpc.New(ctx)
		} else {
			exp, err = otlptracehttp.New(ctx)
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("telemetry: %s exporter: %w", name, err)
	}
	res, err := newResource(o, getenv)
	if err != nil {
		_ = exp.Shutdown(ctx)
		return nil, nil, err
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithBatcher(exp), sdktrace.WithResource(res)}
	if sampler != nil {
		opts = append(opts, sdktrace.WithSampler(sampler))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	otel.SetTracerProvider(tp)
	return tp, tp.Shutdown, nil
}

// exporterName resolves the exporter from the option, else OTEL_TRACES_EXPORTER.
func exporterName(opt string, getenv func(string) string) (string, error) {
	if opt != "" {
		switch opt {
		case None, Stdout, OTLP:
			return opt, nil
		}
		return "", fmt.Errorf("%w %q: want none, stdout or otlp", ErrUnknownExporter, opt)
	}
	switch v := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); v {
	case "", None:
		return None, nil
	case OTLP:
		return OTLP, nil
	case "console", Stdout:
		return Stdout, nil
	default:
		return "", fmt.Errorf("%w: OTEL_TRACES_EXPORTER=%q: want otlp, console or none", ErrUnknownExporter, v)
	}
}

// otlpProtocol is the OTLP transport, the traces-specific variable first.
func otlpProtocol(getenv func(string) string) (string, error) {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		switch v := strings.TrimSpace(getenv(k)); v {
		case "":
			continue
		case ProtocolHTTP, ProtocolGRPC:
			return v, nil
		default:
			return "", fmt.Errorf("%w: %s=%q: want %s or %s", ErrInvalidEnv, k, v, ProtocolHTTP, ProtocolGRPC)
		}
	}
	return ProtocolHTTP, nil
}

// samplerFromEnv parses OTEL_TRACES_SAMPLER and its argument; nil means the SDK's default
// (parent-based, always on).
func samplerFromEnv(getenv func(string) string) (sdktrace.Sampler, error) {
	name := strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER"))
	if name == "" {
		return nil, nil
	}
	ratio := func() (float64, error) {
		a := strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER_ARG"))
		if a == "" {
			return 1, nil
		}
		r, err := strconv.ParseFloat(a, 64)
		if err != nil || r < 0 || r > 1 {
			return 0, fmt.Errorf("%w: OTEL_TRACES_SAMPLER_ARG=%q: want a ratio in [0, 1]", ErrInvalidEnv, a)
		}
		return r, nil
	}
	switch name {
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "traceidratio", "parentbased_traceidratio":
		r, err := ratio()
		if err != nil {
			return nil, err
		}
		if name == "traceidratio" {
			return sdktrace.TraceIDRatioBased(r), nil
		}
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(r)), nil
	}
	return nil, fmt.Errorf("%w: OTEL_TRACES_SAMPLER=%q: want always_on, always_off, traceidratio or their parentbased_ forms", ErrInvalidEnv, name)
}

// newResource is the SDK's default resource, the options' service name and attributes, then
// OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME, which win.
func newResource(o Options, getenv func(string) string) (*resource.Resource, error) {
	name := o.ServiceName
	if name == "" {
		name = "rollout"
	}
	base := resource.NewSchemaless(append([]attribute.KeyValue{attribute.String("service.name", name)}, o.Attributes...)...)
	var env []attribute.KeyValue
	if v := strings.TrimSpace(getenv("OTEL_RESOURCE_ATTRIBUTES")); v != "" {
		for _, kv := range strings.Split(v, ",") {
			k, val, ok := strings.Cut(kv, "=")
			if !ok || strings.TrimSpace(k) == "" {
				return nil, fmt.Errorf("%w: OTEL_RESOURCE_ATTRIBUTES entry %q: want key=value", ErrInvalidEnv, kv)
			}
			if u, err := url.PathUnescape(strings.TrimSpace(val)); err == nil {
				val = u // values are percent-encoded
			}
			env = append(env, attribute.String(strings.TrimSpace(k), strings.TrimSpace(val)))
		}
	}
	if v := strings.TrimSpace(getenv("OTEL_SERVICE_NAME")); v != "" {
		env = append(env, attribute.String("service.name", v))
	}
	res, err := resource.Merge(resource.Default(), base)
	if err == nil {
		res, err = resource.Merge(res, resource.NewSchemaless(env...))
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	return res, nil
}
