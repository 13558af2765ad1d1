// Package e2e holds the real-backend trace test (build tag e2e; `make e2e` runs it): a real
// Jaeger (built from this tools module, so its dependencies stay out of the main module), a
// real redis-server and two `rollout serve --otel otlp` processes; `rollout fleet update`
// drives one weight update, and the test reads the trace back through Jaeger's HTTP API and
// checks that it holds the SDK's span, both servers' control.process spans, their cache
// resets, the steps that delivered the flushes and the workers' waits, in that order.
package e2e
