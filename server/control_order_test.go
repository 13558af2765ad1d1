package server_test

import (
	"fmt"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// heldInOrder sends the admin calls (POST paths) while the engine loop is held in a forward
// pass, each once the one before waits in the engine's input, then lets the loop go on: the
// engine receives them in this order with no step between. It returns their statuses and
// bodies.
func (ts *testServer) heldInOrder(t *testing.T, g *gate, paths ...string) ([]int, []string) {
	t.Helper()
	g.WaitHeld(t)
	codes, bodies := make([]int, len(paths)), make([]string, len(paths))
	errs := make([]error, len(paths))
	var wg sync.WaitGroup
	for i, p := range paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out []byte
			codes[i], out, errs[i] = ts.tryDo(http.MethodPost, p, nil)
			bodies[i] = string(out)
		}()
		deadline := time.Now().Add(30 * time.Second)
		for ts.Engine().Metrics().InputQueued < i+1 {
			if time.Now().After(deadline) {
				g.Open()
				t.Fatalf("%s never reached the engine", p)
			}
			runtime.Gosched()
		}
	}
	g.Open()
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "%s (did the server die?)", paths[i])
	}
	return codes, bodies
}

// TestSleepBehindPauseWaitAndResumeOverHTTP is issue 25's HTTP sequence: /pause?mode=wait
// while a /generate runs, /resume queued behind it, then /sleep. The sleep used to skip its own
// pause and release the KV pool (level 2: the weights) once the resume had restarted the
// engine: at level 2 the server died with a nil pointer in engine.execute, at level 1 every
// later request was aborted. Now the calls take effect in order: the engine sleeps at the end,
// and after the wake-up a request runs to its length.
func TestSleepBehindPauseWaitAndResumeOverHTTP(t *testing.T) {
	for _, level := range []int{1, 2} {
		t.Run(fmt.Sprintf("level%d", level), func(t *testing.T) {
			ts, g := startGated(t, nil)
			prompt := []int{256, 1, 2, 3}
			g.HoldAfterTokens(g.Tokens())
			a := ts.generateAsync(t, greedyGen(prompt, longTokens))
			codes, bodies := ts.heldInOrder(t, g, "/pause?mode=wait&clear_cache=false", "/resume", fmt.Sprintf("/sleep?level=%d&mode=wait", level))
			for i, c := range codes {
				require.Equal(t, http.StatusOK, c, bodies[i])
			}
			ra := a.wait(t)
			require.Len(t, ra.Outputs, 1)
			assert.Equal(t, "length", ra.Outputs[0].FinishReason, "the pause let the running request finish")
			st := ts.state(t)
			assert.EqualValues(t, "sleeping", st.State, "the sleep came last: %+v", st)
			assert.True(t, st.KVReleased)
			assert.Equal(t, level, st.SleepLevel)

			if level == 2 {
				uri2, digest2 := writeCheckpoint(t, 2)
				ts.doJSON(t, http.MethodPost, "/update_weights", map[string]any{"version": 2, "source": uri2, "sha256": digest2}, http.StatusOK, nil)
			}
			ts.doJSON(t, http.MethodPost, "/wake_up", nil, http.StatusOK, nil)
			var rb genResp
			ts.doJSON(t, http.MethodPost, "/generate", greedyGen(prompt, 5), http.StatusOK, &rb)
			require.Len(t, rb.Outputs, 1)
			assert.Equal(t, "length", rb.Outputs[0].FinishReason, "a request after the wake-up is not aborted")
			assert.Len(t, rb.Outputs[0].TokenIDs, 5)
			assert.Zero(t, ts.Engine().Metrics().InvariantViolations)
		})
	}
}

// TestPauseKeepBehindPauseWaitAndResumeOverHTTP: /pause?mode=keep sent behind the same
// /pause?mode=wait and /resume used to answer 200 "paused" while the resume, which ran after
// the drain, left the engine running. Now the keep pause comes last and holds: a request sent
// afterwards waits until /resume.
func TestPauseKeepBehindPauseWaitAndResumeOverHTTP(t *testing.T) {
	ts, g := startGated(t, nil)
	prompt := []int{256, 1, 2, 3}
	g.HoldAfterTokens(g.Tokens())
	a := ts.generateAsync(t, greedyGen(prompt, longTokens))
	codes, bodies := ts.heldInOrder(t, g, "/pause?mode=wait&clear_cache=false", "/resume", "/pause?mode=keep&clear_cache=false")
	for i, c := range codes {
		require.Equal(t, http.StatusOK, c, bodies[i])
	}
	a.wait(t)
	st := ts.state(t)
	assert.EqualValues(t, "paused", st.State, "a successful pause(keep) leaves the engine paused: %+v", st)
	assert.Equal(t, "keep", st.PauseMode)
	b := ts.generateAsync(t, greedyGen(prompt, 3))
	ts.waitState(t, "the request queued", func(s stateResp) bool { return s.RequestsWaiting == 1 })
	st = ts.state(t)
	assert.Zero(t, st.RequestsRunning, "nothing runs while paused")
	ts.doJSON(t, http.MethodPost, "/resume", nil, http.StatusOK, nil)
	rb := b.wait(t)
	require.Len(t, rb.Outputs, 1)
	assert.Equal(t, "length", rb.Outputs[0].FinishReason)
}
