package offload_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/offload"
)

// attr returns the value of key on span s (an invalid Value when absent).
func attr(s sdktrace.ReadOnlySpan, key string) attribute.Value {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

func spansNamed(spans []sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// Two resets handled back to back while the last request's store is in flight: each reset
// span is a child of its engine call (and so of its caller), the second links to the first,
// and the one step that delivers the merged flush set records offload.flush.delivered (a
// child of the first reset, linked to the second, carrying the job ids) with the workers'
// offload.flush.wait under it; the metric callback sees the delivery's trace.
func TestTraceDoubleResetOneDeliveredFlush(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	var (
		cbMu     sync.Mutex
		cbTraces []trace.TraceID
		cbJobs   [][]int64
	)
	conn, err := offload.New(offload.Config{CPUBytes: 8 << 20, BlockSize: 16, Test: &offload.TestHooks{Delay: 150 * time.Millisecond}, TracerProvider: tp,
		OnFlushDelivered: func(ctx context.Context, ids []int64, _ time.Duration) {
			cbMu.Lock()
			defer cbMu.Unlock()
			cbTraces = append(cbTraces, trace.SpanContextFromContext(ctx).TraceID())
			cbJobs = append(cbJobs, ids)
		}})
	require.NoError(t, err)
	g := newGate()
	var finished atomic.Bool
	w, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	e, err := engine.New(engine.Config{Weights: w, WeightVersion: 1, NumBlocks: 160, Workers: 2,
		Connector: conn.Scheduler(), ConnectorWorker: conn.Worker(), Tracer: tp.Tracer("engine"),
		Hooks: engine.Hooks{OnStep: g.onStep, OnFinish: func(string, engine.FinishReason, int, int, engine.Timings) { finished.Store(true) }}})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(runCtx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	g.arm(finished.Load)
	ctx := testCtx(t)
	st, err := e.Add(ctx, engine.Request{ID: "r", PromptTokenIDs: tinyPrompt(40, 1), Sampling: greedy(3)})
	require.NoError(t, err)
	_, err = st.Collect(ctx)
	require.NoError(t, err)
	<-g.parked // parked right after the step that finished the request; its store is tracked
	require.Positive(t, conn.Stats()["offload_jobs_inflight"])

	caller := tp.Tracer("test")
	callers := make([]trace.SpanContext, 2)
	results := make(chan engine.ResetResult, 2)
	for i := range 2 {
		cctx, span := caller.Start(ctx, "caller")
		callers[i] = span.SpanContext()
		go func() {
			defer span.End()
			r, err := e.ResetPrefixCache(cctx, true, true)
			assert.NoError(t, err)
			results <- r
		}()
		waitQueuedCalls(t, e, i+1)
	}
	close(g.release)
	<-results
	<-results
	waitIdle(t, conn)
	// The worker ends the delivery span after its wait; waitIdle saw the flush delivered, and
	// the wait ended before the step returned, so both are recorded by now.
	require.Eventually(t, func() bool { return len(spansNamed(rec.Ended(), offload.SpanFlushDelivered)) == 1 }, 10*time.Second, time.Millisecond)

	spans := rec.Ended()
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byID[s.SpanContext().SpanID()] = s
	}
	resets := spansNamed(spans, offload.SpanResetCache)
	require.Len(t, resets, 2)
	// Order the resets as they ran (the engine handled the calls in queue order).
	if resets[0].StartTime().After(resets[1].StartTime()) {
		resets[0], resets[1] = resets[1], resets[0]
	}
	for i, r := range resets {
		eng := byID[r.Parent().SpanID()]
		require.NotNil(t, eng, "reset %d has its engine call as parent", i)
		assert.Equal(t, "engine.reset_prefix_cache", eng.Name())
		assert.Contains(t, []trace.TraceID{callers[0].TraceID(), callers[1].TraceID()}, r.SpanContext().TraceID(), "in its caller's trace")
		assert.Contains(t, []trace.SpanID{callers[0].SpanID(), callers[1].SpanID()}, eng.Parent().SpanID(), "the engine span is the caller's child")
	}
	first, second := resets[0], resets[1]
	assert.EqualValues(t, 1, attr(first, offload.AttrJobsFlushed).AsInt64(), "the finished request's store")
	assert.EqualValues(t, 0, attr(first, offload.AttrResetsMerged).AsInt64())
	assert.EqualValues(t, 0, attr(second, offload.AttrJobsFlushed).AsInt64(), "nothing new to flush")
	assert.EqualValues(t, 1, attr(second, offload.AttrResetsMerged).AsInt64(), "joins the first reset's flush")
	assert.EqualValues(t, 1, attr(second, offload.AttrFlushPending).AsInt64())
	require.Len(t, second.Links(), 1)
	assert.Equal(t, first.SpanContext(), second.Links()[0].SpanContext, "the merged reset links to the first")
	assert.Empty(t, first.Links())

	del := spansNamed(spans, offload.SpanFlushDelivered)[0]
	assert.Equal(t, first.SpanContext().SpanID(), del.Parent().SpanID(), "delivered under the first reset")
	assert.Equal(t, first.SpanContext().TraceID(), del.SpanContext().TraceID())
	require.Len(t, del.Links(), 1)
	assert.Equal(t, second.SpanContext(), del.Links()[0].SpanContext, "and linked to the merged one")
	ids := attr(del, offload.AttrJobIDs).AsInt64Slice()
	require.Len(t, ids, 1, "the union of both resets' job ids, delivered once")
	assert.EqualValues(t, 2, attr(del, offload.AttrResetsMerged).AsInt64())
	assert.Positive(t, attr(del, offload.AttrStep).AsInt64())
	assert.GreaterOrEqual(t, attr(del, offload.AttrResetToFlush).AsFloat64(), attr(del, offload.AttrResetToDelivery).AsFloat64())
	assert.False(t, del.StartTime().Before(second.EndTime()), "delivered after both resets")

	waits := spansNamed(spans, offload.SpanFlushWait)
	require.Len(t, waits, 1)
	wait := waits[0]
	assert.Equal(t, del.SpanContext().SpanID(), wait.Parent().SpanID())
	assert.EqualValues(t, 1, attr(wait, offload.AttrJobs).AsInt64())
	assert.False(t, wait.EndTime().After(del.EndTime()), "the delivery ends once the wait is over")

	cbMu.Lock()
	defer cbMu.Unlock()
	require.Len(t, cbTraces, 1)
	assert.Equal(t, del.SpanContext().TraceID(), cbTraces[0], "the metric's exemplar names the delivery's trace")
	assert.Equal(t, ids, cbJobs[0])
	assert.Zero(t, conn.Stats()["safety_violations_total"])
}

// A reset with nothing in flight still has its (empty) flush delivered by the very next step,
// so its delivery span and reset-to-flush latency belong to the reset, not to whatever step
// comes after a resume.
func TestTraceEmptyResetDeliveredNextStep(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	delivered := make(chan time.Duration, 4)
	conn, err := offload.New(offload.Config{CPUBytes: 8 << 20, BlockSize: 16, TracerProvider: tp,
		OnFlushDelivered: func(_ context.Context, _ []int64, d time.Duration) { delivered <- d }})
	require.NoError(t, err)
	w, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	e, err := engine.New(engine.Config{Weights: w, WeightVersion: 1, NumBlocks: 160, Workers: 2,
		Connector: conn.Scheduler(), ConnectorWorker: conn.Worker(), Tracer: tp.Tracer("engine")})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(runCtx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	ctx := testCtx(t)
	_, err = e.Pause(ctx, engine.PauseKeep, true)
	require.NoError(t, err)
	select {
	case <-delivered: // while still paused: no request, no resume needed
	case <-ctx.Done():
		t.Fatal("the paused, idle engine never delivered the reset's flush")
	}
	waitIdle(t, conn)
	require.Eventually(t, func() bool { return len(spansNamed(rec.Ended(), offload.SpanFlushWait)) == 1 }, 10*time.Second, time.Millisecond)
	spans := rec.Ended()
	reset := spansNamed(spans, offload.SpanResetCache)
	require.Len(t, reset, 1)
	del := spansNamed(spans, offload.SpanFlushDelivered)
	require.Len(t, del, 1)
	assert.Equal(t, reset[0].SpanContext().SpanID(), del[0].Parent().SpanID())
	assert.Empty(t, attr(del[0], offload.AttrJobIDs).AsInt64Slice())
	paused, err := e.IsPaused(ctx)
	require.NoError(t, err)
	assert.True(t, paused)
}
