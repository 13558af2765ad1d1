package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestOneTracePerStep: each step is one trace whose root is rl.step, with the loop's phases
// under it and the SDK's generate spans under rl.generate; the log's trace_id names it.
func TestOneTracePerStep(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	cfg := testConfig(t)
	cfg.Steps, cfg.TracerProvider = 2, tp
	sum, err := run(t.Context(), cfg, devNull(t))
	require.NoError(t, err)
	require.NoError(t, tp.ForceFlush(t.Context()))

	byTrace := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		byTrace[s.SpanContext().TraceID().String()] = append(byTrace[s.SpanContext().TraceID().String()], s)
	}
	for _, r := range sum.Records {
		require.NotEmpty(t, r.TraceID, "step %d", r.Step)
		spans := byTrace[r.TraceID]
		ids := map[string]sdktrace.ReadOnlySpan{}
		names := map[string]int{}
		for _, s := range spans {
			ids[s.SpanContext().SpanID().String()] = s
			names[s.Name()]++
		}
		require.Equal(t, 1, names["rl.step"], "step %d: one root", r.Step)
		for _, n := range []string{"rl.generate", "rl.score", "rl.train", "rl.publish", "sdk.update_weights"} {
			require.Positive(t, names[n], "step %d: span %s", r.Step, n)
		}
		groups := 0
		for _, s := range spans {
			if s.Name() == "sdk.generate" {
				parent, ok := ids[s.Parent().SpanID().String()]
				require.True(t, ok)
				require.Contains(t, []string{"rl.generate", "rl.eval"}, parent.Name())
				if parent.Name() == "rl.generate" {
					groups++
				}
			}
		}
		require.Equal(t, cfg.Prompts, groups, "step %d: one SDK generate per group under rl.generate", r.Step)
	}
	require.NotEqual(t, sum.Records[0].TraceID, sum.Records[1].TraceID)
	last := map[string]bool{}
	for _, s := range byTrace[sum.Records[1].TraceID] {
		last[s.Name()] = true
	}
	require.True(t, last["rl.update_wait"] && last["rl.eval"], "the last step waits for its update and evaluates")
}
