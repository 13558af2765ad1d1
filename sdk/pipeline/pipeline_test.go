package pipeline_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/sdk/pipeline"
)

// The tests in this file drive the pipeline's loop with in-memory generators (the fleet
// tests use real servers): they check the loop's own logic, step by step through channels.

// gated is a generator whose samples are released one at a time by the test.
type gated struct {
	release chan int // sample index to emit next (per group, in order)
	err     error    // returned after the samples, when set
}

func (g gated) Generate(ctx context.Context, req pipeline.Request, emit func(int, pipeline.Trajectory)) error {
	for range req.N {
		select {
		case i := <-g.release:
			emit(i, pipeline.Trajectory{Completion: []int{i}, Logprobs: []float64{-1}, Versions: []int64{req.MinVersion}})
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return g.err
}

func constSource(ctx context.Context) (pipeline.Prompt, error) {
	return pipeline.Prompt{TokenIDs: []int{1}}, nil
}

// byIndex rewards a sample by its index: groups always have variance.
var byIndex = pipeline.VerifierFunc(func(_ context.Context, _ pipeline.Prompt, t pipeline.Trajectory) (float64, error) {
	return float64(t.Completion[0]), nil
})

// TestSamplesStreamBeforeTheirGroupEnds: a sample is scored and handed to OnSample while the
// rest of its group is still generating.
func TestSamplesStreamBeforeTheirGroupEnds(t *testing.T) {
	g := gated{release: make(chan int)}
	streamed := make(chan pipeline.Sample, 4)
	groups := make(chan *pipeline.Group, 1)
	p, err := pipeline.Start(t.Context(), pipeline.Config{GroupSize: 2, BatchGroups: 1, MaxInFlight: 1, Generator: g,
		Verifier: byIndex, Source: constSource, Logger: quiet,
		OnSample: func(s pipeline.Sample) { streamed <- s }, OnGroup: func(gr *pipeline.Group) { groups <- gr }})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	g.release <- 1
	s := <-streamed
	assert.Equal(t, 1, s.Index)
	assert.Equal(t, 1.0, s.Reward)
	select {
	case <-groups:
		t.Fatal("the group ended with one sample still generating")
	default:
	}
	g.release <- 0
	gr := <-groups
	assert.Equal(t, []float64{0, 1}, gr.Rewards())
	b, err := p.Next(t.Context(), 0)
	require.NoError(t, err)
	assert.Same(t, gr, b.Groups[0])
}

// TestGenerationErrorStopsThePipeline: a generator's error reaches Next, wrapped.
func TestGenerationErrorStopsThePipeline(t *testing.T) {
	boom := errors.New("fleet on fire")
	g := gated{release: make(chan int, 2), err: boom}
	g.release <- 0
	g.release <- 1
	p, err := pipeline.Start(t.Context(), pipeline.Config{GroupSize: 2, BatchGroups: 1, MaxInFlight: 1, Generator: g,
		Verifier: byIndex, Source: constSource, Logger: quiet})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	_, err = p.Next(t.Context(), 0)
	require.ErrorIs(t, err, pipeline.ErrGenerate)
	require.ErrorIs(t, err, boom)
}

// badEmits emits what a generator must not: a repeated index, an index out of range, or a
// trajectory whose arrays disagree.
type badEmits struct{ kind string }

func (b badEmits) Generate(_ context.Context, req pipeline.Request, emit func(int, pipeline.Trajectory)) error {
	ok := pipeline.Trajectory{Completion: []int{1}, Logprobs: []float64{-1}, Versions: []int64{0}}
	switch b.kind {
	case "repeat":
		emit(0, ok)
		emit(0, ok)
	case "range":
		emit(req.N, ok)
	case "shape":
		emit(0, pipeline.Trajectory{Completion: []int{1, 2}, Logprobs: []float64{-1}, Versions: []int64{0}})
	case "missing":
		emit(0, ok)
		return nil
	}
	for i := 1; i < req.N; i++ {
		emit(i, ok)
	}
	return nil
}

func TestGeneratorMisuseIsAnError(t *testing.T) {
	for _, kind := range []string{"repeat", "range", "shape", "missing"} {
		t.Run(kind, func(t *testing.T) {
			p, err := pipeline.Start(t.Context(), pipeline.Config{GroupSize: 3, BatchGroups: 1, MaxInFlight: 1,
				Generator: badEmits{kind}, Verifier: byIndex, Source: constSource, Logger: quiet})
			require.NoError(t, err)
			defer func() { require.NoError(t, p.Close()) }()
			_, err = p.Next(t.Context(), 0)
			require.ErrorIs(t, err, pipeline.ErrGenerate)
		})
	}
}

// TestVerifierIgnoringItsContextStillTimesOut: a verifier blocked on something else than its
// context fails its sample at the deadline; Close waits for the call to end.
func TestVerifierIgnoringItsContextStillTimesOut(t *testing.T) {
	unblock := make(chan struct{})
	stuck := pipeline.VerifierFunc(func(context.Context, pipeline.Prompt, pipeline.Trajectory) (float64, error) {
		<-unblock
		return 1, nil
	})
	failed := make(chan *pipeline.Group, 1)
	g := gated{release: make(chan int, 2)}
	g.release <- 0
	g.release <- 1
	p, err := pipeline.Start(t.Context(), pipeline.Config{GroupSize: 2, BatchGroups: 1, MaxInFlight: 1, Generator: g,
		Verifier: stuck, VerifyTimeout: time.Millisecond, Source: constSource, Logger: quiet,
		OnGroup: func(gr *pipeline.Group) {
			select {
			case failed <- gr:
			default:
			}
		}})
	require.NoError(t, err)
	gr := <-failed
	require.ErrorIs(t, gr.Err, pipeline.ErrVerifierTimeout)
	close(unblock)
	require.NoError(t, p.Close())
	assert.Equal(t, 2, p.Stats().VerifyTimeouts)
}

// TestCancelledContextClosesThePipeline: the caller's cancel makes Next return ErrClosed.
func TestCancelledContextClosesThePipeline(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	g := gated{release: make(chan int)}
	p, err := pipeline.Start(ctx, pipeline.Config{GroupSize: 2, BatchGroups: 1, Generator: g, Verifier: byIndex,
		Source: constSource, Logger: quiet})
	require.NoError(t, err)
	cancel()
	_, err = p.Next(t.Context(), 0)
	require.ErrorIs(t, err, pipeline.ErrClosed)
	require.NoError(t, p.Close())
}

func TestConfigIsValidated(t *testing.T) {
	good := pipeline.Config{GroupSize: 2, BatchGroups: 1, Generator: gated{}, Verifier: byIndex, Source: constSource}
	for name, mut := range map[string]func(*pipeline.Config){
		"group of one":       func(c *pipeline.Config) { c.GroupSize = 1 },
		"no batch":           func(c *pipeline.Config) { c.BatchGroups = 0 },
		"negative staleness": func(c *pipeline.Config) { c.MaxStaleness = -1 },
		"negative over":      func(c *pipeline.Config) { c.OverSample = -1 },
		"negative version":   func(c *pipeline.Config) { c.Version = -1 },
		"no verifier":        func(c *pipeline.Config) { c.Verifier = nil },
		"negative timeout":   func(c *pipeline.Config) { c.VerifyTimeout = -time.Second },
	} {
		t.Run(name, func(t *testing.T) {
			c := good
			mut(&c)
			_, err := pipeline.Start(t.Context(), c)
			require.ErrorIs(t, err, pipeline.ErrInvalid)
		})
	}
	p, err := pipeline.Start(t.Context(), good)
	require.NoError(t, err)
	_, err = p.Next(t.Context(), -1)
	require.ErrorIs(t, err, pipeline.ErrInvalid)
	require.NoError(t, p.Close())
}

// TestTooManyFilteredGroupsIsAnError: with every group's rewards equal, dynamic sampling
// would refill forever; past MaxFiltered, Next says so.
func TestTooManyFilteredGroupsIsAnError(t *testing.T) {
	flat := pipeline.VerifierFunc(func(context.Context, pipeline.Prompt, pipeline.Trajectory) (float64, error) { return 1, nil })
	g := gated{release: make(chan int, 64)}
	for range 32 {
		g.release <- 0
		g.release <- 1
	}
	p, err := pipeline.Start(t.Context(), pipeline.Config{GroupSize: 2, BatchGroups: 1, FilterZeroVariance: true, MaxFiltered: 3,
		Generator: g, Verifier: flat, Source: constSource, Logger: quiet})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	_, err = p.Next(t.Context(), 0)
	require.ErrorIs(t, err, pipeline.ErrNoSignal)
	assert.GreaterOrEqual(t, p.Stats().Filtered, 4)
}
