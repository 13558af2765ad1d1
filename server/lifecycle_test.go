package server_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/sdk/bus/redisconf"
	"github.com/rolloutkit/rollout/server"
)

func (ts *testServer) metrics(t *testing.T) string {
	t.Helper()
	code, out := ts.do(t, http.MethodGet, "/metrics", "", nil)
	require.Equal(t, http.StatusOK, code)
	return string(out)
}

// metricValue finds the sample line starting with name (labels included) and returns its value.
func metricValue(t *testing.T, text, name string) float64 {
	t.Helper()
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			var v float64
			_, err := fmt.Sscan(rest, &v)
			require.NoError(t, err, line)
			return v
		}
	}
	t.Fatalf("metric %s not exported", name)
	return 0
}

func TestClientDisconnectAbortsAndFreesBlocks(t *testing.T) {
	ts, g := startGated(t, nil)
	g.HoldAfterTokens(1) // the request stays mid-generation until its abort is queued
	ctx, cancel := context.WithCancel(t.Context())
	body := `{"prompt":[256,1,2],"max_tokens":2000,"ignore_eos":true,"stream":true}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.url+"/v1/completions", strings.NewReader(body))
	require.NoError(t, err)
	resp, err := ts.client.Do(req)
	require.NoError(t, err)
	rd := bufio.NewReader(resp.Body)
	line, err := rd.ReadString('\n')
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(line, "data: "))
	cancel()
	resp.Body.Close()
	g.WaitUntil(t, "the disconnect's abort queued", func(m engine.MetricsSnapshot) bool { return m.InputQueued > 0 })
	g.Open()
	st := ts.waitState(t, "the request aborted", func(s stateResp) bool {
		return s.RequestsRunning == 0 && s.RequestsWaiting == 0 && s.HTTPInflight == 0
	})
	assert.Zero(t, st.KVBlocksUsed)
	m := ts.metrics(t)
	assert.EqualValues(t, 1, metricValue(t, m, `rollout_requests_total{finish_reason="abort"}`))
	assert.Less(t, metricValue(t, m, "rollout_generation_tokens_total"), 2000.0)
}

func TestMetricsExported(t *testing.T) {
	ts := start(t, nil)
	uri, digest := writeCheckpoint(t, 2)
	for range 3 {
		ts.doJSON(t, http.MethodPost, "/generate", greedyGen([]int{256, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}, 5), http.StatusOK, nil)
	}
	ts.doJSON(t, http.MethodPost, "/update_weights", map[string]any{"version": 2, "source": uri, "sha256": digest}, http.StatusOK, nil)
	// The engine counts a request's end just after delivering its last tokens, so a scrape
	// right after the response may be a moment early.
	assert.EventuallyWithT(t, func(c *assert.CollectT) {
		m := ts.metrics(t)
		assert.EqualValues(c, 3, metricValue(t, m, `rollout_requests_total{finish_reason="length"}`))
		assert.EqualValues(c, 3, metricValue(t, m, "rollout_time_to_first_token_seconds_count"))
	}, 5*time.Second, 5*time.Millisecond)
	m := ts.metrics(t)
	assert.EqualValues(t, 0, metricValue(t, m, `rollout_requests_total{finish_reason="stop"}`))
	assert.EqualValues(t, 54, metricValue(t, m, "rollout_prompt_tokens_total"))
	assert.EqualValues(t, 15, metricValue(t, m, "rollout_generation_tokens_total"))
	assert.EqualValues(t, 0, metricValue(t, m, "rollout_requests_running"))
	assert.EqualValues(t, 0, metricValue(t, m, "rollout_requests_waiting"))
	assert.EqualValues(t, 0, metricValue(t, m, "rollout_kv_usage_ratio"))
	assert.Positive(t, metricValue(t, m, "rollout_prefix_cache_queries_total"))
	assert.Positive(t, metricValue(t, m, "rollout_prefix_cache_hits_total"), "the 2nd and 3rd requests reuse the 1st's block")
	assert.Positive(t, metricValue(t, m, "rollout_engine_steps_total"))
	assert.EqualValues(t, 2, metricValue(t, m, "rollout_weight_version"))
	assert.EqualValues(t, 1, metricValue(t, m, `rollout_engine_state{state="running"}`))
	assert.EqualValues(t, 0, metricValue(t, m, `rollout_engine_state{state="paused"}`))
	assert.EqualValues(t, 1, metricValue(t, m, `rollout_update_weights_seconds_count{phase="fetch"}`))
	assert.EqualValues(t, 1, metricValue(t, m, `rollout_update_weights_seconds_count{phase="commit"}`))
	ts.doJSON(t, http.MethodPost, "/pause", nil, http.StatusOK, nil)
	m = ts.metrics(t)
	assert.EqualValues(t, 1, metricValue(t, m, `rollout_engine_state{state="paused"}`), "state changes without a step are visible")
	ts.doJSON(t, http.MethodPost, "/sleep", nil, http.StatusOK, nil)
	assert.EqualValues(t, 1, metricValue(t, ts.metrics(t), `rollout_engine_state{state="sleeping"}`))
}

func TestConcurrencyLimitQueuesThen429(t *testing.T) {
	ts := start(t, func(c *server.Config) { c.MaxConcurrent, c.MaxQueue = 1, 1 })
	ts.doJSON(t, http.MethodPost, "/pause?mode=keep", nil, http.StatusOK, nil)
	first := ts.generateAsync(t, greedyGen([]int{256, 1}, 3))
	ts.waitState(t, "first admitted", func(s stateResp) bool { return s.HTTPInflight == 1 && s.RequestsWaiting == 1 })
	second := ts.generateAsync(t, greedyGen([]int{256, 2}, 3))
	ts.waitState(t, "second queued", func(s stateResp) bool { return s.HTTPQueued == 1 })
	code, out := ts.do(t, http.MethodPost, "/generate", "", greedyGen([]int{256, 3}, 3))
	assert.Equal(t, http.StatusTooManyRequests, code, "%s", out)
	assert.Contains(t, string(out), "rate_limit_error")
	ts.doJSON(t, http.MethodPost, "/resume", nil, http.StatusOK, nil)
	assert.Equal(t, "length", first.wait(t).Outputs[0].FinishReason)
	assert.Equal(t, "length", second.wait(t).Outputs[0].FinishReason)
}

// runServer starts a server whose shutdown the test controls.
func runServer(t *testing.T, grace time.Duration) (*testServer, context.CancelFunc, chan error) {
	t.Helper()
	s, err := server.New(server.Config{Addr: "127.0.0.1:0", KVBlocks: 256, Logger: quietLogger(), ShutdownGrace: grace})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &testServer{Server: s, url: s.URL(), client: &http.Client{Transport: &adminAuth{base: tr, token: s.AdminToken()}}}, cancel, done
}

func TestGracefulShutdownFinishesInFlight(t *testing.T) {
	ts, cancel, done := runServer(t, 10*time.Second)
	defer cancel()
	// Hold a request in flight with a keep-pause, start the shutdown, then let it finish.
	ts.doJSON(t, http.MethodPost, "/pause?mode=keep", nil, http.StatusOK, nil)
	r := ts.generateAsync(t, greedyGen([]int{256, 1}, 8))
	ts.waitState(t, "admitted", func(s stateResp) bool { return s.HTTPInflight == 1 })
	cancel()
	// The listener stays open while in-flight requests finish: a new client gets a 503
	// with Retry-After, not a refused connection.
	require.Eventually(t, func() bool {
		code, _, err := ts.tryDo(http.MethodGet, "/ready", nil)
		return err == nil && code == http.StatusServiceUnavailable
	}, 10*time.Second, 5*time.Millisecond)
	req, err := http.NewRequest(http.MethodPost, ts.url+"/generate", strings.NewReader(`{"prompt_token_ids":[256,2]}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := ts.client.Do(req)
	require.NoError(t, err)
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", out)
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))
	assert.Contains(t, string(out), "service_unavailable_error")
	// Resume in-process, and the held request completes normally within the grace.
	require.NoError(t, ts.Engine().Resume(t.Context()))
	res := r.wait(t)
	require.Len(t, res.Outputs, 1)
	assert.Equal(t, "length", res.Outputs[0].FinishReason)
	assert.Len(t, res.Outputs[0].TokenIDs, 8)
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
}

func TestGracefulShutdownAbortsAfterGrace(t *testing.T) {
	ts, cancel, done := runServer(t, 200*time.Millisecond)
	defer cancel()
	ts.doJSON(t, http.MethodPost, "/pause?mode=keep", nil, http.StatusOK, nil)
	r := ts.generateAsync(t, greedyGen([]int{256, 1}, 8))
	ts.waitState(t, "admitted", func(s stateResp) bool { return s.HTTPInflight == 1 })
	t0 := time.Now()
	cancel()
	res := r.wait(t)
	require.Len(t, res.Outputs, 1)
	assert.Equal(t, "abort", res.Outputs[0].FinishReason)
	assert.GreaterOrEqual(t, time.Since(t0), 150*time.Millisecond)
	select {
	case err := <-done:
		assert.NoError(t, err, "a shutdown that had to abort still exits cleanly")
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
}

func TestBackToBackResetsOverHTTP(t *testing.T) {
	ts := start(t, func(c *server.Config) { c.OffloadCPUBytes, c.OffloadDelay = 8<<20, 300*time.Millisecond })
	prompt := []int{256}
	for i := range 70 {
		prompt = append(prompt, (i*7)%256)
	}
	// The request finishes while its stores (slowed by the delay) are still in flight.
	ts.doJSON(t, http.MethodPost, "/generate", greedyGen(prompt, 4), http.StatusOK, nil)
	m0 := ts.metrics(t)
	before := metricValue(t, m0, "rollout_offload_flush_delivered_total")
	require.Positive(t, metricValue(t, m0, "rollout_offload_jobs_inflight"), "the stores are still in flight")

	codes := make(chan int, 3)
	resets := make(chan []byte, 2)
	for range 2 {
		go func() {
			code, out, err := ts.tryDo(http.MethodPost, "/reset_prefix_cache?reset_external=true", nil)
			assert.NoError(t, err)
			codes <- code
			resets <- out
		}()
	}
	go func() {
		time.Sleep(time.Millisecond)
		code, out, err := ts.tryDo(http.MethodPost, "/sleep?level=1", nil)
		assert.NoError(t, err)
		assert.Equal(t, http.StatusOK, code, "%s", out)
		codes <- code
	}()
	for range 3 {
		select {
		case c := <-codes:
			assert.Equal(t, http.StatusOK, c)
		case <-time.After(20 * time.Second):
			t.Fatal("an admin call did not answer")
		}
	}
	for range 2 {
		out := <-resets
		assert.Contains(t, string(out), `"success"`)
	}
	st := ts.waitState(t, "asleep", func(s stateResp) bool { return s.State == "sleeping" })
	assert.True(t, st.KVReleased)

	ts.doJSON(t, http.MethodPost, "/wake_up", nil, http.StatusOK, nil)
	ts.doJSON(t, http.MethodPost, "/resume", nil, http.StatusOK, nil)
	var g genResp
	ts.doJSON(t, http.MethodPost, "/generate", greedyGen(prompt, 4), http.StatusOK, &g)
	assert.Equal(t, "length", g.Outputs[0].FinishReason)
	m := ts.metrics(t)
	assert.Greater(t, metricValue(t, m, "rollout_offload_flush_delivered_total"), before)
	assert.Positive(t, metricValue(t, m, "rollout_offload_resets_total"))
	assert.Zero(t, metricValue(t, m, "rollout_safety_violations_total"))
	assert.Zero(t, ts.state(t).Violations)
	// Each reset's flush was timed from the reset to its delivery at the workers.
	assert.Positive(t, metricValue(t, m, "rollout_reset_to_flush_seconds_count"))
}

func TestNewErrorsLeakNothing(t *testing.T) {
	s, err := server.New(server.Config{Addr: "127.0.0.1:0", KVBlocks: 64, Logger: quietLogger()})
	require.NoError(t, err)
	// The port is taken: New fails cleanly.
	_, err = server.New(server.Config{Addr: s.Addr(), KVBlocks: 64, Logger: quietLogger()})
	assert.ErrorContains(t, err, "listen")
	require.NoError(t, s.Close(), "a server that never ran releases its listener and engine")

	_, err = server.New(server.Config{Addr: "127.0.0.1:0", Model: "builtin:nope", Logger: quietLogger()})
	assert.Error(t, err)
	_, err = server.New(server.Config{Addr: "127.0.0.1:0", Redis: redisconf.Config{URL: "redis://x"}, Logger: quietLogger()})
	assert.ErrorIs(t, err, server.ErrInvalidConfig, "--redis without --fleet")
	_, err = server.New(server.Config{Addr: "127.0.0.1:0", Fleet: "f", Logger: quietLogger()})
	assert.ErrorIs(t, err, server.ErrInvalidConfig, "--fleet without a bus")
	_, err = server.New(server.Config{Addr: "127.0.0.1:0", Fleet: "f", Redis: redisconf.Config{URL: "redis://x"}, FleetSecret: "short", Logger: quietLogger()})
	assert.ErrorIs(t, err, server.ErrInvalidConfig, "a secret under 32 bytes")
	_, err = server.New(server.Config{Addr: "127.0.0.1:0", OTel: "jaeger", Logger: quietLogger()})
	assert.ErrorIs(t, err, server.ErrInvalidConfig)
	_, err = server.New(server.Config{Addr: "127.0.0.1:0", OffloadDelay: time.Second, Logger: quietLogger()})
	assert.ErrorIs(t, err, server.ErrInvalidConfig)
}

// TestMetricsListedInAPIExist: a fresh server with offloading exports every metric docs/metrics.md
// lists (names copied from it), before any traffic, the control plane's at zero.
func TestMetricsListedInAPIExist(t *testing.T) {
	ts := start(t, func(c *server.Config) { c.OffloadCPUBytes = 64 << 20 })
	m := ts.metrics(t)
	for _, name := range []string{
		"rollout_engine_state", "rollout_engine_steps_total", "rollout_generation_tokens_total", "rollout_kv_usage_ratio",
		"rollout_offload_flush_delivered_total", "rollout_offload_flush_pending", "rollout_offload_hit_tokens_total",
		"rollout_offload_jobs_inflight", "rollout_offload_loaded_bytes_total", "rollout_offload_resets_total",
		"rollout_offload_stored_bytes_total", "rollout_prefix_cache_hits_total", "rollout_prefix_cache_queries_total",
		"rollout_prompt_tokens_total", "rollout_requests_running", "rollout_requests_total", "rollout_requests_waiting",
		"rollout_reset_to_flush_seconds", "rollout_safety_violations_total", "rollout_time_to_first_token_seconds",
		"rollout_update_weights_seconds", "rollout_weight_version",
		"rollout_control_commands_total", "rollout_control_rejected_total", "rollout_chat_tool_outputs_total",
	} {
		assert.True(t, strings.Contains(m, "\n"+name), "metric %s is not exported", name)
	}
	for _, phase := range []string{"fetch", "stage", "commit", "total"} {
		assert.Zero(t, metricValue(t, m, `rollout_update_weights_seconds_count{phase="`+phase+`"}`))
	}
	assert.Zero(t, metricValue(t, m, `rollout_control_commands_total{kind="commit",result="ok"}`))
	for _, reason := range []string{"unsigned", "bad_signature", "expired", "replayed", "wrong_fleet", "malformed"} {
		assert.Zero(t, metricValue(t, m, `rollout_control_rejected_total{reason="`+reason+`"}`))
	}
}

// TestReadyFromTheFirstRequest: a /ready that reaches the listener before Run starts is
// answered once the engine loop runs, with 200, never with "engine loop not running". The
// request is written to the socket before Run is called, so the server accepts it as early as
// it can.
func TestReadyFromTheFirstRequest(t *testing.T) {
	for range 20 {
		s, err := server.New(server.Config{Addr: "127.0.0.1:0", KVBlocks: 64, WeightVersion: 1, Logger: quietLogger(), ShutdownGrace: 5 * time.Second})
		require.NoError(t, err)
		conn, err := net.Dial("tcp", strings.TrimPrefix(s.URL(), "http://"))
		require.NoError(t, err)
		_, err = io.WriteString(conn, "GET /ready HTTP/1.1\r\nHost: rollout\r\nConnection: close\r\n\r\n")
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		conn.Close()
		cancel()
		require.NoError(t, <-done)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	}
}
