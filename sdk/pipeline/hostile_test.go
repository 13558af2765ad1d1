package pipeline_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/sdk/pipeline"
)

// The tests in this file feed the pipeline user code that misbehaves: a verifier, a generator
// or a prompt source that panics must not take the trainer's process down with it, and what
// it was working on must be accounted for, not lost.

// TestVerifierPanicFailsItsSample: a verifier that panics on one sample fails that sample
// (ErrVerifier, ErrPanic) and so its group; the pipeline goes on and the next batch is whole.
func TestVerifierPanicFailsItsSample(t *testing.T) {
	g := gated{release: make(chan int, 8)}
	for i := range 4 {
		g.release <- i % 2
	}
	calls := 0
	v := pipeline.VerifierFunc(func(_ context.Context, _ pipeline.Prompt, tr pipeline.Trajectory) (float64, error) {
		calls++ // calls run one at a time: VerifyConcurrency is 1
		if calls == 1 {
			panic("index out of range in the reward model")
		}
		return float64(tr.Completion[0]), nil
	})
	var sampleErrs []error
	p, err := pipeline.Start(t.Context(), pipeline.Config{GroupSize: 2, BatchGroups: 1, MaxInFlight: 1, Generator: g,
		Verifier: v, VerifyConcurrency: 1, Source: constSource, Logger: quiet,
		OnSample: func(s pipeline.Sample) {
			if s.Err != nil {
				sampleErrs = append(sampleErrs, s.Err) // MaxInFlight 1, concurrency 1: one at a time
			}
		}})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	b, err := p.Next(t.Context(), 0)
	require.NoError(t, err)
	require.Len(t, b.Groups, 1)
	assert.Equal(t, uint64(2), b.Groups[0].ID, "the first group failed, the second is trained on")
	assert.Equal(t, 1, b.Failed)
	require.Len(t, b.Errors, 1)
	assert.ErrorIs(t, b.Errors[0], pipeline.ErrVerifier)
	assert.ErrorIs(t, b.Errors[0], pipeline.ErrPanic)
	assert.Contains(t, b.Errors[0].Error(), "index out of range in the reward model")
	require.Len(t, sampleErrs, 1)
	assert.ErrorIs(t, sampleErrs[0], pipeline.ErrPanic)
	st := p.Stats()
	assert.Equal(t, 1, st.VerifyErrors)
	assert.Equal(t, 1, st.Failed)
	assert.Equal(t, 1, st.Consumed)
}

// panicking is a generator that panics after emitting its first sample.
type panicking struct{}

func (panicking) Generate(_ context.Context, _ pipeline.Request, emit func(int, pipeline.Trajectory)) error {
	emit(0, pipeline.Trajectory{Completion: []int{0}, Logprobs: []float64{-1}, Versions: []int64{0}})
	panic(errors.New("nil tokenizer"))
}

// TestGeneratorPanicStopsThePipelineWithAnError: a generator's panic is a generation error:
// Next returns it (ErrGenerate, ErrPanic) instead of the process crashing, and Close
// still ends every goroutine (TestMain's goleak checks).
func TestGeneratorPanicStopsThePipelineWithAnError(t *testing.T) {
	p, err := pipeline.Start(t.Context(), pipeline.Config{GroupSize: 2, BatchGroups: 1, MaxInFlight: 1, Generator: panicking{},
		Verifier: byIndex, Source: constSource, Logger: quiet})
	require.NoError(t, err)
	_, err = p.Next(t.Context(), 0)
	require.ErrorIs(t, err, pipeline.ErrGenerate)
	require.ErrorIs(t, err, pipeline.ErrPanic)
	assert.Contains(t, err.Error(), "nil tokenizer")
	require.NoError(t, p.Close())
	_, err = p.Next(t.Context(), 0)
	assert.ErrorIs(t, err, pipeline.ErrClosed)
}

// TestSourcePanicStopsThePipelineWithAnError: a prompt source's panic ends admission with an
// error Next returns.
func TestSourcePanicStopsThePipelineWithAnError(t *testing.T) {
	src := func(context.Context) (pipeline.Prompt, error) { panic("dataset shard missing") }
	p, err := pipeline.Start(t.Context(), pipeline.Config{GroupSize: 2, BatchGroups: 1, Generator: gated{release: make(chan int)},
		Verifier: byIndex, Source: src, Logger: quiet})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	_, err = p.Next(t.Context(), 0)
	require.ErrorIs(t, err, pipeline.ErrPanic)
	assert.Contains(t, err.Error(), "dataset shard missing")
}

// TestObserverPanicsLoseNothing: OnSample and OnGroup panicking on every call are logged and
// recovered; every group still reaches the batch with its samples scored.
func TestObserverPanicsLoseNothing(t *testing.T) {
	g := gated{release: make(chan int, 4)}
	for i := range 4 {
		g.release <- i % 2
	}
	p, err := pipeline.Start(t.Context(), pipeline.Config{GroupSize: 2, BatchGroups: 2, MaxInFlight: 1, Generator: g,
		Verifier: byIndex, Source: constSource, Logger: quiet,
		OnSample: func(pipeline.Sample) { panic("dashboard down") }, OnGroup: func(*pipeline.Group) { panic("dashboard down") }})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	b, err := p.Next(t.Context(), 0)
	require.NoError(t, err)
	require.Len(t, b.Groups, 2)
	for _, gr := range b.Groups {
		assert.Equal(t, []float64{0, 1}, gr.Rewards())
		assert.NoError(t, gr.Err)
	}
	assert.Zero(t, b.Failed)
}
