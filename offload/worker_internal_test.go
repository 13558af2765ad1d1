package offload

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFailedLoadReportedWithItsCompletion: a load that fails between GetFinished and
// TakeFailedRecving (the transfer goroutine finishes at that moment) used to be reported failed
// in this step, though the step did not report it finished, and then finished in the next: the
// scheduler turned its request back to recompute, and a step later took the stale completion
// as the end of the request's next load. Each step's failed loads must be among the loads it
// reports finished, and each completion reported once.
func TestFailedLoadReportedWithItsCompletion(t *testing.T) {
	c, err := New(Config{CPUBytes: 1 << 20, BlockSize: 16})
	require.NoError(t, err)
	w := c.worker
	w.payload = &Payload{} // what BindMetadata sets for a step

	load := &xfer{t: &Transfer{ID: 1, ReqID: "r"}, done: make(chan struct{})}
	w.mu.Lock()
	w.inflight[load.t.ID] = load
	w.c.stats.xfersInflight.Add(1)
	w.mu.Unlock()

	type step struct{ recv, failed []string }
	var steps []step
	_, recv := w.GetFinished(nil)
	w.mu.Lock()
	w.doneLocked(load, false) // the load fails right here, on its own goroutine
	w.mu.Unlock()
	steps = append(steps, step{recv, w.TakeFailedRecving()})
	_, recv = w.GetFinished(nil)
	steps = append(steps, step{recv, w.TakeFailedRecving()})

	finished, failed := 0, 0
	for i, s := range steps {
		for _, id := range s.failed {
			assert.Contains(t, s.recv, id, "step %d reports %s failed but not finished", i, id)
		}
		finished += len(s.recv)
		failed += len(s.failed)
	}
	assert.Equal(t, 1, finished, "the completion is reported once: %+v", steps)
	assert.Equal(t, 1, failed, "the failure is reported once: %+v", steps)
}
