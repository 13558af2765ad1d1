// Package telemetry sets up OpenTelemetry tracing for a main package: it builds the tracer
// provider for the chosen exporter (none, stdout, or OTLP over HTTP or gRPC) from its options
// and the standard OTEL_* variables (exporter, protocol, endpoint, headers, service name,
// resource attributes, sampler), installs it and the W3C trace-context propagator as the
// process globals, and returns the shutdown that flushes pending spans. Libraries never call
// it: they take a trace.TracerProvider or trace.Tracer (an arch test enforces this).
package telemetry
