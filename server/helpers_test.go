package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/sample"
	"github.com/rolloutkit/rollout/internal/enginetest"
	"github.com/rolloutkit/rollout/server"
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	goleak.VerifyTestMain(m)
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// testServer is a running server on a free port plus an HTTP client whose connections are
// closed at cleanup.
type testServer struct {
	*server.Server
	url    string
	client *http.Client
}

func start(t testing.TB, mut func(*server.Config)) *testServer {
	t.Helper()
	cfg := server.Config{Addr: "127.0.0.1:0", KVBlocks: 1024, WeightVersion: 1, Logger: quietLogger(), ShutdownGrace: 5 * time.Second}
	if mut != nil {
		mut(&cfg)
	}
	s, err := server.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	tr := &http.Transport{MaxIdleConnsPerHost: 256}
	ts := &testServer{Server: s, url: s.URL(), client: &http.Client{Transport: &adminAuth{base: tr, token: s.AdminToken()}, Timeout: 60 * time.Second}}
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		tr.CloseIdleConnections()
	})
	return ts
}

// adminAuth sends the server's admin token (generated when the config had none) on every
// request without an Authorization header, as a trainer given the token would; a request
// whose Authorization is set to nil (send's token "-") goes without one.
type adminAuth struct {
	base  http.RoundTripper
	token string
}

// RoundTrip implements http.RoundTripper.
func (a *adminAuth) RoundTrip(req *http.Request) (*http.Response, error) {
	if _, set := req.Header["Authorization"]; !set && a.token != "" {
		req = req.Clone(req.Context())
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	return a.base.RoundTrip(req)
}

// do sends a request and returns the status and body. token "" sends the server's admin
// token, "-" no Authorization at all.
func (ts *testServer) do(t testing.TB, method, path, token string, body any) (int, []byte) {
	t.Helper()
	return ts.send(t, method, path, token, body, nil)
}

// send is do with extra headers: "Host" sets the Host header, "Content-Type" (empty: none)
// replaces application/json.
func (ts *testServer) send(t testing.TB, method, path, token string, body any, hdr map[string]string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		buf, err := json.Marshal(b)
		require.NoError(t, err)
		rd = bytes.NewReader(buf)
	}
	req, err := http.NewRequest(method, ts.url+path, rd)
	require.NoError(t, err)
	switch token {
	case "":
	case "-":
		req.Header["Authorization"] = nil
	default:
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		switch {
		case k == "Host":
			req.Host = v
		case v == "":
			req.Header.Del(k)
		default:
			req.Header.Set(k, v)
		}
	}
	resp, err := ts.client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, out
}

// tryDo is do for goroutines other than the test's: it returns errors instead of failing.
func (ts *testServer) tryDo(method, path string, body any) (int, []byte, error) {
	buf, err := json.Marshal(body)
	if err != nil {
		return 0, nil, err
	}
	if body == nil {
		buf = nil
	}
	req, err := http.NewRequest(method, ts.url+path, bytes.NewReader(buf))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := ts.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, err
}

// doJSON is do that requires want and decodes the body into v (when not nil).
func (ts *testServer) doJSON(t testing.TB, method, path string, body any, want int, v any) {
	t.Helper()
	code, out := ts.do(t, method, path, "", body)
	require.Equal(t, want, code, "%s %s: %s", method, path, out)
	if v != nil {
		require.NoError(t, json.Unmarshal(out, v), "%s", out)
	}
}

type stateResp struct {
	State           string  `json:"state"`
	WeightVersion   int64   `json:"weight_version"`
	StagedVersion   int64   `json:"staged_version"`
	PauseMode       string  `json:"pause_mode"`
	SleepLevel      int     `json:"sleep_level"`
	RequestsRunning int     `json:"requests_running"`
	RequestsWaiting int     `json:"requests_waiting"`
	HTTPInflight    int     `json:"http_inflight"`
	HTTPQueued      int     `json:"http_queued"`
	HTTPReading     int     `json:"http_reading_body"`
	KVBlocksUsed    int     `json:"kv_blocks_used"`
	KVReleased      bool    `json:"kv_released"`
	Violations      float64 `json:"safety_violations"`
}

func (ts *testServer) state(t testing.TB) stateResp {
	t.Helper()
	var s stateResp
	ts.doJSON(t, http.MethodGet, "/state", nil, http.StatusOK, &s)
	return s
}

// waitState polls /state until ok holds.
func (ts *testServer) waitState(t testing.TB, what string, ok func(stateResp) bool) stateResp {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		s := ts.state(t)
		if ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; last state %+v", what, s)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type genOut struct {
	TokenIDs        []int      `json:"token_ids"`
	Logprobs        []*float64 `json:"logprobs"`
	WeightVersions  []int64    `json:"weight_versions"`
	FinishReason    string     `json:"finish_reason"`
	NumCachedTokens int        `json:"num_cached_tokens"`
}

type genResp struct {
	RequestID     string   `json:"request_id"`
	WeightVersion int64    `json:"weight_version"`
	Outputs       []genOut `json:"outputs"`
}

// sseEvents reads an SSE body into its data payloads, up to and excluding [DONE]; done says
// whether [DONE] arrived.
func sseEvents(t testing.TB, r io.Reader) (events []string, done bool) {
	t.Helper()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		d := strings.TrimPrefix(line, "data: ")
		if d == "[DONE]" {
			return events, true
		}
		events = append(events, d)
	}
	return events, false
}

// inProcess returns the greedy continuation the engine computes in-process for prompt, with
// the same weights the server serves (builtin:tiny, seed 1).
func inProcess(t testing.TB, prompt []int, n int) []int {
	t.Helper()
	w, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	e, err := engine.New(engine.Config{Weights: w, NumBlocks: 256, Logger: quietLogger()})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() { cancel(); <-done }()
	p := sample.Defaults()
	p.Temperature, p.MaxTokens, p.IgnoreEOS = 0, n, true
	s, err := e.Add(ctx, engine.Request{ID: "ref", PromptTokenIDs: prompt, Sampling: p})
	require.NoError(t, err)
	res, err := s.Collect(ctx)
	require.NoError(t, err)
	return res.TokenIDs()
}

// textPrompt is how the server tokenizes a text prompt for the byte-level tiny model: BOS
// then the bytes.
func textPrompt(s string) []int {
	ids := []int{256}
	for i := 0; i < len(s); i++ {
		ids = append(ids, int(s[i]))
	}
	return ids
}

// writeCheckpoint writes builtin tiny weights of seed to a fresh HF directory and returns its
// file:// URI and digest.
func writeCheckpoint(t testing.TB, seed uint64) (string, string) {
	t.Helper()
	uri, d, _ := enginetest.Checkpoint(t, seed)
	return uri, d
}
