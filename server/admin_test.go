package server_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine"
)

func greedyGen(prompt []int, maxTokens int) map[string]any {
	return map[string]any{"prompt_token_ids": prompt, "sampling": map[string]any{
		"max_tokens": maxTokens, "temperature": 0, "ignore_eos": true}}
}

func TestNativeRoutes(t *testing.T) {
	ts := start(t, nil)
	prompt := []int{256}
	for i := range 40 {
		prompt = append(prompt, 10+i)
	}
	var g genResp
	ts.doJSON(t, http.MethodPost, "/generate", greedyGen(prompt, 20), http.StatusOK, &g)
	require.Len(t, g.Outputs, 1)
	o := g.Outputs[0]
	assert.Equal(t, inProcess(t, prompt, 20), o.TokenIDs)
	assert.Equal(t, "length", o.FinishReason)
	require.Len(t, o.Logprobs, 20)
	for _, lp := range o.Logprobs {
		require.NotNil(t, lp)
		assert.LessOrEqual(t, *lp, 0.0)
	}
	assert.Equal(t, []int64{1}, uniq(o.WeightVersions))
	assert.EqualValues(t, 1, g.WeightVersion)

	// The same prompt again hits the prefix cache.
	ts.doJSON(t, http.MethodPost, "/generate", greedyGen(prompt, 2), http.StatusOK, &g)
	assert.Positive(t, g.Outputs[0].NumCachedTokens)

	// n=2, seeded: deterministic, and the two samples use different seeds.
	body := map[string]any{"prompt_token_ids": prompt, "n": 2, "request_id": "mine", "sampling": map[string]any{
		"max_tokens": 16, "seed": 11, "logprobs": 3, "ignore_eos": true}}
	var a, b struct {
		genResp
		Outputs []struct {
			genOut
			Top [][]struct {
				Token   int     `json:"token"`
				Logprob float64 `json:"logprob"`
			} `json:"top_logprobs"`
		} `json:"outputs"`
	}
	ts.doJSON(t, http.MethodPost, "/generate", body, http.StatusOK, &a)
	ts.doJSON(t, http.MethodPost, "/generate", body, http.StatusOK, &b)
	assert.Equal(t, "mine", a.RequestID)
	require.Len(t, a.Outputs, 2)
	assert.Equal(t, a.Outputs[0].TokenIDs, b.Outputs[0].TokenIDs)
	assert.Equal(t, a.Outputs[1].TokenIDs, b.Outputs[1].TokenIDs)
	assert.NotEqual(t, a.Outputs[0].TokenIDs, a.Outputs[1].TokenIDs)
	require.Len(t, a.Outputs[0].Top, 16)
	assert.Len(t, a.Outputs[0].Top[0], 3)

	// min_version beyond the serving one.
	code, out := ts.do(t, http.MethodPost, "/generate", "", map[string]any{"prompt_token_ids": prompt, "min_version": 9})
	assert.Equal(t, http.StatusConflict, code, "%s", out)

	var tok struct {
		Tokens []int `json:"tokens"`
		Count  int   `json:"count"`
	}
	ts.doJSON(t, http.MethodPost, "/tokenize", map[string]any{"prompt": "abc"}, http.StatusOK, &tok)
	assert.Equal(t, []int{256, 97, 98, 99}, tok.Tokens)
	ts.doJSON(t, http.MethodPost, "/tokenize", map[string]any{"prompt": "abc", "add_special_tokens": false}, http.StatusOK, &tok)
	assert.Equal(t, []int{97, 98, 99}, tok.Tokens)
	var det struct {
		Prompt string `json:"prompt"`
	}
	ts.doJSON(t, http.MethodPost, "/detokenize", map[string]any{"tokens": []int{256, 104, 105}}, http.StatusOK, &det)
	assert.Equal(t, "hi", det.Prompt)

	ts.doJSON(t, http.MethodGet, "/health", nil, http.StatusOK, nil)
	ts.doJSON(t, http.MethodGet, "/ready", nil, http.StatusOK, nil)
	var v map[string]any
	ts.doJSON(t, http.MethodGet, "/version", nil, http.StatusOK, &v)
	assert.EqualValues(t, 1, v["weight_version"])
	st := ts.state(t)
	assert.Zero(t, st.KVBlocksUsed)
	assert.EqualValues(t, "running", st.State)
}

// sseStream is a streaming completion read event by event.
type sseStream struct {
	resp *http.Response
	sc   *bufio.Scanner
}

func (ts *testServer) stream(t *testing.T, body map[string]any) *sseStream {
	t.Helper()
	body["stream"] = true
	buf, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, ts.url+"/v1/completions", bytes.NewReader(buf))
	require.NoError(t, err)
	resp, err := ts.client.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	return &sseStream{resp: resp, sc: sc}
}

type chunk struct {
	Choices []struct {
		TokenIDs       []int   `json:"token_ids"`
		WeightVersions []int64 `json:"weight_versions"`
		FinishReason   *string `json:"finish_reason"`
	} `json:"choices"`
}

// next returns the next chunk, or ok=false at [DONE] or the end of the body.
func (s *sseStream) next(t *testing.T) (chunk, bool) {
	for s.sc.Scan() {
		line := s.sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		d := strings.TrimPrefix(line, "data: ")
		if d == "[DONE]" {
			return chunk{}, false
		}
		var c chunk
		require.NoError(t, json.Unmarshal([]byte(d), &c), d)
		return c, true
	}
	return chunk{}, false
}

// rest reads the stream to its end and returns all token ids, versions and the finish reason.
func (s *sseStream) rest(t *testing.T, first chunk) (ids []int, versions []int64, finish string) {
	defer s.resp.Body.Close()
	for c, ok := first, true; ok; c, ok = s.next(t) {
		for _, ch := range c.Choices {
			ids = append(ids, ch.TokenIDs...)
			versions = append(versions, ch.WeightVersions...)
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
	}
	return ids, versions, finish
}

type asyncGen struct {
	done chan genResp
}

func (ts *testServer) generateAsync(t *testing.T, body map[string]any) asyncGen {
	g := asyncGen{done: make(chan genResp, 1)}
	go func() {
		var r genResp
		code, out, err := ts.tryDo(http.MethodPost, "/generate", body)
		if assert.NoError(t, err) && assert.Equal(t, http.StatusOK, code, "%s", out) {
			assert.NoError(t, json.Unmarshal(out, &r))
		}
		g.done <- r
	}()
	return g
}

func (g asyncGen) wait(t *testing.T) genResp {
	t.Helper()
	select {
	case r := <-g.done:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("request did not finish")
		return genResp{}
	}
}

func TestAdminFlowWithRequestsInFlight(t *testing.T) {
	ts, g := startGated(t, nil)
	uri2, digest2 := writeCheckpoint(t, 2)
	prompt := []int{256, 1, 2, 3}

	// A streams; once its first token arrived, pause(keep, clear_cache) freezes it.
	g.HoldAfterTokens(g.Tokens())
	a := ts.stream(t, map[string]any{"prompt": prompt, "max_tokens": longTokens, "temperature": 0, "ignore_eos": true, "return_token_ids": true})
	first, ok := a.next(t)
	require.True(t, ok)
	var pause map[string]any
	ts.callHeld(t, g, http.MethodPost, "/pause?mode=keep&clear_cache=true", nil, http.StatusOK, &pause)
	assert.Equal(t, "paused", pause["status"])
	st := ts.state(t)
	assert.EqualValues(t, "paused", st.State)
	assert.Equal(t, "keep", st.PauseMode)
	assert.Equal(t, 1, st.RequestsRunning+st.RequestsWaiting, "A is frozen, not lost")
	var isPaused map[string]bool
	ts.doJSON(t, http.MethodGet, "/is_paused", nil, http.StatusOK, &isPaused)
	assert.True(t, isPaused["is_paused"])
	ts.doJSON(t, http.MethodGet, "/ready", nil, http.StatusServiceUnavailable, nil)

	// D arrives while paused: it is queued, not refused.
	d := ts.generateAsync(t, greedyGen([]int{256, 9, 9}, 4))
	ts.waitState(t, "D queued", func(s stateResp) bool { return s.RequestsWaiting+s.RequestsRunning == 2 })

	ts.doJSON(t, http.MethodPost, "/sleep?level=1", nil, http.StatusOK, nil)
	st = ts.state(t)
	assert.EqualValues(t, "sleeping", st.State)
	assert.True(t, st.KVReleased)
	var isSleeping map[string]bool
	ts.doJSON(t, http.MethodGet, "/is_sleeping", nil, http.StatusOK, &isSleeping)
	assert.True(t, isSleeping["is_sleeping"])

	var up struct {
		WeightVersion int64   `json:"weight_version"`
		Staged        bool    `json:"staged"`
		Bytes         int64   `json:"bytes"`
		Seconds       float64 `json:"seconds"`
	}
	ts.doJSON(t, http.MethodPost, "/update_weights", map[string]any{"version": 2, "source": uri2, "sha256": digest2}, http.StatusOK, &up)
	assert.EqualValues(t, 2, up.WeightVersion)
	assert.False(t, up.Staged)
	assert.Positive(t, up.Bytes)
	st = ts.state(t)
	assert.EqualValues(t, 2, st.WeightVersion)
	assert.EqualValues(t, "sleeping", st.State)

	ts.doJSON(t, http.MethodPost, "/wake_up?tags=weights&tags=kv_cache", nil, http.StatusOK, nil)
	st = ts.state(t)
	assert.EqualValues(t, "paused", st.State, "the pause from before the sleep stands")
	assert.False(t, st.KVReleased)

	ts.doJSON(t, http.MethodPost, "/resume", nil, http.StatusOK, nil)
	assert.EqualValues(t, "running", ts.state(t).State)
	ids, versions, finish := a.rest(t, first)
	assert.Equal(t, "length", finish)
	assert.Len(t, ids, longTokens)
	require.Len(t, versions, longTokens)
	assert.Equal(t, []int64{1, 2}, uniq(versions), "A's tokens: version 1 before the swap, 2 after")
	dr := d.wait(t)
	require.Len(t, dr.Outputs, 1)
	assert.Equal(t, []int64{2}, uniq(dr.Outputs[0].WeightVersions))
	assert.EqualValues(t, 2, dr.WeightVersion)

	// pause(abort) ends B with finish_reason abort and frees its blocks.
	g.HoldAfterTokens(g.Tokens())
	b := ts.generateAsync(t, greedyGen([]int{256, 5}, longTokens))
	ts.callHeld(t, g, http.MethodPost, "/pause?mode=abort", nil, http.StatusOK, nil)
	br := b.wait(t)
	assert.Equal(t, "abort", br.Outputs[0].FinishReason)
	st = ts.state(t)
	assert.Zero(t, st.RequestsRunning+st.RequestsWaiting)
	assert.Zero(t, st.KVBlocksUsed)
	ts.doJSON(t, http.MethodPost, "/resume", nil, http.StatusOK, nil)

	// pause(wait) answers once C has finished normally.
	g.HoldAfterTokens(g.Tokens())
	c := ts.generateAsync(t, greedyGen([]int{256, 6}, longTokens))
	ts.callHeld(t, g, http.MethodPost, "/pause?mode=wait&clear_cache=false", nil, http.StatusOK, nil)
	st = ts.state(t)
	assert.Zero(t, st.RequestsRunning, "pause(wait) answers only once the running request finished")
	cr := c.wait(t)
	assert.Equal(t, "length", cr.Outputs[0].FinishReason)
	assert.Len(t, cr.Outputs[0].TokenIDs, longTokens)
	ts.doJSON(t, http.MethodPost, "/resume", nil, http.StatusOK, nil)

	// Failed updates leave version 2 serving.
	code, out := ts.do(t, http.MethodPost, "/update_weights", "", map[string]any{"version": 3, "source": uri2, "sha256": strings.Repeat("0", 64)})
	assert.Equal(t, http.StatusUnprocessableEntity, code, "%s", out)
	code, out = ts.do(t, http.MethodPost, "/update_weights", "", map[string]any{"version": 3, "source": "file:///nonexistent/ckpt"})
	assert.Equal(t, http.StatusNotFound, code, "%s", out)
	assert.EqualValues(t, 2, ts.state(t).WeightVersion)

	// Stage, then commit with an empty source.
	uri3, digest3 := writeCheckpoint(t, 3)
	ts.doJSON(t, http.MethodPost, "/update_weights", map[string]any{"version": 3, "source": uri3, "sha256": digest3, "stage_only": true}, http.StatusOK, &up)
	assert.True(t, up.Staged)
	assert.EqualValues(t, 2, up.WeightVersion)
	assert.EqualValues(t, 3, ts.state(t).StagedVersion)
	ts.doJSON(t, http.MethodPost, "/update_weights", map[string]any{"version": 3}, http.StatusOK, &up)
	assert.EqualValues(t, 3, up.WeightVersion)

	// Level-2 sleep drops the weights: waking needs new ones first.
	ts.doJSON(t, http.MethodPost, "/sleep?level=2", nil, http.StatusOK, nil)
	code, out = ts.do(t, http.MethodPost, "/wake_up", "", nil)
	assert.Equal(t, http.StatusConflict, code, "%s", out)
	uri4, digest4 := writeCheckpoint(t, 4)
	ts.doJSON(t, http.MethodPost, "/update_weights", map[string]any{"version": 4, "source": uri4, "sha256": digest4}, http.StatusOK, nil)
	ts.doJSON(t, http.MethodPost, "/wake_up", nil, http.StatusOK, nil)
	assert.EqualValues(t, "running", ts.state(t).State, "the sleep paused the engine itself, so waking resumes it")
	var gr genResp
	ts.doJSON(t, http.MethodPost, "/generate", greedyGen(prompt, 3), http.StatusOK, &gr)
	assert.Equal(t, []int64{4}, uniq(gr.Outputs[0].WeightVersions))

	// /abort_requests by the client's request id.
	// The server adds E1's two samples one after the other: hold the first at its second token
	// until the second's Add is taken or queued, then hold again once both run.
	prompted := ts.Engine().Metrics().PromptTokens
	g.HoldAfterTokens(g.Tokens())
	e := ts.generateAsync(t, map[string]any{"prompt_token_ids": []int{256, 7}, "request_id": "E1", "n": 2,
		"sampling": map[string]any{"max_tokens": longTokens, "ignore_eos": true}})
	g.WaitUntil(t, "E1's second sample", func(m engine.MetricsSnapshot) bool { return m.PromptTokens == prompted+4 || m.InputQueued > 0 })
	g.HoldWhen(func(m engine.MetricsSnapshot) bool { return m.Running == 2 })
	var ab map[string]any
	ts.callHeld(t, g, http.MethodPost, "/abort_requests", map[string]any{"request_ids": []string{"E1"}}, http.StatusOK, &ab)
	assert.EqualValues(t, 2, ab["aborted"])
	er := e.wait(t)
	for _, o := range er.Outputs {
		assert.Equal(t, "abort", o.FinishReason)
	}

	var reset map[string]any
	ts.doJSON(t, http.MethodPost, "/reset_prefix_cache", nil, http.StatusOK, &reset)
	assert.Equal(t, true, reset["success"])
	st = ts.state(t)
	assert.Zero(t, st.KVBlocksUsed)
	assert.Zero(t, st.RequestsRunning+st.RequestsWaiting)
}

// TestAdminCyclePerPauseMode runs the RL weight-update cycle pause(mode, clear_cache) → sleep →
// update_weights → wake_up → resume with a request in flight, for the abort and wait modes
// (keep is TestAdminFlowWithRequestsInFlight).
func TestAdminCyclePerPauseMode(t *testing.T) {
	for _, mode := range []string{"abort", "wait"} {
		t.Run(mode, func(t *testing.T) {
			ts, g := startGated(t, nil)
			uri, digest := writeCheckpoint(t, 5)
			prompt := []int{256}
			for i := range 40 {
				prompt = append(prompt, 100+i)
			}
			g.HoldAfterTokens(g.Tokens())
			r := ts.generateAsync(t, greedyGen(prompt, longTokens))
			ts.callHeld(t, g, http.MethodPost, "/pause?clear_cache=true&mode="+mode, nil, http.StatusOK, nil)
			st := ts.state(t)
			assert.EqualValues(t, "paused", st.State)
			assert.Equal(t, mode, st.PauseMode)
			assert.Zero(t, st.RequestsRunning+st.RequestsWaiting, "abort ended it, wait let it finish")
			res := r.wait(t)
			require.Len(t, res.Outputs, 1)
			want := map[string]string{"abort": "abort", "wait": "length"}[mode]
			assert.Equal(t, want, res.Outputs[0].FinishReason)
			assert.Equal(t, []int64{1}, uniq(res.Outputs[0].WeightVersions))
			if mode == "wait" {
				assert.Len(t, res.Outputs[0].TokenIDs, longTokens)
			}

			ts.doJSON(t, http.MethodPost, "/sleep?level=1", nil, http.StatusOK, nil)
			st = ts.state(t)
			assert.EqualValues(t, "sleeping", st.State)
			assert.True(t, st.KVReleased)
			assert.Zero(t, st.KVBlocksUsed)
			ts.doJSON(t, http.MethodPost, "/update_weights", map[string]any{"version": 2, "source": uri, "sha256": digest}, http.StatusOK, nil)
			assert.EqualValues(t, 2, ts.state(t).WeightVersion)
			ts.doJSON(t, http.MethodPost, "/wake_up?tags=weights&tags=kv_cache", nil, http.StatusOK, nil)
			assert.EqualValues(t, "paused", ts.state(t).State)
			ts.doJSON(t, http.MethodPost, "/resume", nil, http.StatusOK, nil)
			assert.EqualValues(t, "running", ts.state(t).State)
			ts.doJSON(t, http.MethodGet, "/ready", nil, http.StatusOK, nil)
			var gr genResp
			ts.doJSON(t, http.MethodPost, "/generate", greedyGen(prompt, 5), http.StatusOK, &gr)
			assert.Equal(t, []int64{2}, uniq(gr.Outputs[0].WeightVersions))
			assert.Zero(t, gr.Outputs[0].NumCachedTokens, "no KV from version 1 is reused")
		})
	}
}
