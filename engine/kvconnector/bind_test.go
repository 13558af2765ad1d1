package kvconnector

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// typedSched is a connector's scheduler side with a string payload and an int report.
type typedSched struct {
	Noop
	got []int
}

func (s *typedSched) BuildConnectorMeta(step StepInfo) TypedMetadata[string] {
	return TypedMetadata[string]{Step: step.Step, Payload: fmt.Sprintf("p%d", step.Step)}
}

func (s *typedSched) UpdateConnectorOutput(out TypedOutput[int]) {
	s.got = append(s.got, out.WorkerMeta)
}

// typedWorker is its worker side.
type typedWorker struct {
	Noop
	got  []string
	step uint64
}

func (w *typedWorker) BindMetadata(m TypedMetadata[string]) {
	w.got, w.step = append(w.got, m.Payload), m.Step
}
func (w *typedWorker) BuildWorkerMeta() int { return int(w.step) * 10 }

// TestBind: the payload a bound scheduler side builds reaches its worker side with its type
// and the report comes back the same way; metadata another connector's scheduler side sealed
// fails the step instead of arriving as a zero payload; Open reads a payload only with a side
// of the connector that sealed it.
func TestBind(t *testing.T) {
	ts, tw := &typedSched{}, &typedWorker{}
	s, w := Bind[string, int](ts, tw)
	meta := s.BuildConnectorMeta(StepInfo{Step: 5})
	out, err := RunStep(t.Context(), w, meta, nil, nil)
	require.NoError(t, err)
	s.UpdateConnectorOutput(out)
	assert.Equal(t, []string{"p5"}, tw.got)
	assert.Equal(t, []int{50}, ts.got)

	p, ok := Open[string](meta.Payload, s)
	assert.True(t, ok)
	assert.Equal(t, "p5", p)
	_, ok = Open[int](meta.Payload, w)
	assert.False(t, ok, "the payload is a string")

	// A step with no payload (Noop's, or a hand-made Metadata) is an empty one.
	_, err = RunStep(t.Context(), w, Metadata{Step: 6}, nil, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"p5", ""}, tw.got)

	s2, w2 := Bind[string, int](&typedSched{}, &typedWorker{})
	_, err = RunStep(t.Context(), w2, meta, nil, nil)
	require.ErrorIs(t, err, ErrForeignMetadata)
	_, ok = Open[string](meta.Payload, s2)
	assert.False(t, ok)
	_, err = RunStep(t.Context(), w2, s2.BuildConnectorMeta(StepInfo{Step: 7}), nil, nil)
	require.NoError(t, err, "the step after a foreign one is the worker's own again")

	// The optional interfaces are forwarded (Noop implements none: they are no-ops).
	require.NoError(t, w.(StorageBinder).BindKVStorage(nil))
	w.(StepFailer).FailStep()
	assert.Nil(t, w.(LoadErrorReporter).TakeFailedRecving())
	s.(PoolBinder).BindBlockPool(nil)
	require.NoError(t, w.WaitIdle(context.Background()))
}
