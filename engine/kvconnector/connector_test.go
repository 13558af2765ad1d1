package kvconnector

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recWorker records the order of worker-side calls.
type recWorker struct {
	Noop
	calls   []string
	failAt  string
	meta    Metadata
	sending []string
}

func (w *recWorker) hit(name string) error {
	w.calls = append(w.calls, name)
	if w.failAt == name {
		return errors.New("boom")
	}
	return nil
}

func (w *recWorker) BindMetadata(m Metadata)                 { w.meta = m; _ = w.hit("bind") }
func (w *recWorker) HandlePreemptions(context.Context) error { return w.hit("preempt") }
func (w *recWorker) StartLoadKV(context.Context) error       { return w.hit("load") }
func (w *recWorker) WaitForSave(context.Context) error       { return w.hit("save") }
func (w *recWorker) GetFinished(ids []string) ([]string, []string) {
	_ = w.hit("finished")
	return w.sending, ids
}
func (w *recWorker) BuildWorkerMeta() Sealed { _ = w.hit("meta"); return Sealed{} }
func (w *recWorker) ClearMetadata()          { _ = w.hit("clear") }

func TestRunStepOrder(t *testing.T) {
	w := &recWorker{sending: []string{"s"}}
	meta := Metadata{Step: 3, FlushJobIDs: []int64{1, 2}}
	out, err := RunStep(t.Context(), w, meta, []string{"f"}, func(context.Context) error { return w.hit("forward") })
	require.NoError(t, err)
	assert.Equal(t, []string{"bind", "preempt", "load", "forward", "save", "finished", "meta", "clear"}, w.calls)
	assert.Equal(t, meta, w.meta)
	assert.Equal(t, Output{FinishedSending: []string{"s"}, FinishedRecving: []string{"f"}}, out)

	// A 0-token step has no forward but still runs every other hook.
	w = &recWorker{}
	_, err = RunStep(t.Context(), w, Metadata{}, nil, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"bind", "preempt", "load", "save", "finished", "meta", "clear"}, w.calls)
}

// failWorker is a recWorker that hears about failed steps and reports failed loads.
type failWorker struct {
	recWorker
	failed int
}

func (w *failWorker) FailStep()                   { w.failed++; _ = w.hit("fail") }
func (w *failWorker) TakeFailedRecving() []string { return []string{"bad"} }

// A failed phase skips the rest of the step but still reports finished transfers and the
// worker metadata (else their completions would be lost), and tells a StepFailer.
func TestRunStepErrors(t *testing.T) {
	want := map[string][]string{
		"preempt": {"bind", "preempt", "fail", "finished", "meta", "clear"},
		"load":    {"bind", "preempt", "load", "fail", "finished", "meta", "clear"},
		"forward": {"bind", "preempt", "load", "forward", "fail", "finished", "meta", "clear"},
		"save":    {"bind", "preempt", "load", "forward", "save", "fail", "finished", "meta", "clear"},
	}
	for phase, calls := range want {
		w := &failWorker{recWorker: recWorker{failAt: phase, sending: []string{"s"}}}
		out, err := RunStep(t.Context(), w, Metadata{}, []string{"f"}, func(context.Context) error { return w.hit("forward") })
		require.Error(t, err, phase)
		assert.Equal(t, calls, w.calls, phase)
		assert.Equal(t, 1, w.failed)
		assert.Equal(t, Output{FinishedSending: []string{"s"}, FinishedRecving: []string{"f"}, FailedRecving: []string{"bad"}}, out, phase)
	}
	w := &failWorker{}
	_, err := RunStep(t.Context(), w, Metadata{}, nil, nil)
	require.NoError(t, err)
	assert.Zero(t, w.failed, "a step that did not fail is not reported as failed")
}

func TestNoop(t *testing.T) {
	var n Noop
	got, async := n.GetNumNewMatchedTokens(nil, 0)
	assert.Zero(t, got)
	assert.False(t, async)
	assert.False(t, n.RequestFinished(nil, nil))
	assert.False(t, n.HasPendingPushWork())
	jobs, ok := n.ResetCache(context.Background())
	assert.Zero(t, jobs)
	assert.True(t, ok)
	assert.Equal(t, uint64(9), n.BuildConnectorMeta(StepInfo{Step: 9}).Step)
	out, err := RunStep(t.Context(), n, Metadata{}, []string{"x"}, nil)
	require.NoError(t, err)
	assert.Equal(t, Output{}, out)
}
