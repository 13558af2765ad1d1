package api

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rawPost opens a connection to addr and sends the head of a POST to path declaring length
// (chunked when negative) and the first part of its body; the body never completes.
func rawPost(t *testing.T, addr, path string, length int, part []byte) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n", path, addr)
	if length < 0 {
		head += "Transfer-Encoding: chunked\r\n\r\n"
		part = fmt.Appendf(nil, "%x\r\n%s\r\n", len(part), part)
	} else {
		head += fmt.Sprintf("Content-Length: %d\r\n\r\n", length)
	}
	_, err = c.Write(append([]byte(head), part...))
	require.NoError(t, err)
	return c
}

// readAnswer reads one response from c.
func readAnswer(t *testing.T, c net.Conn) (*http.Response, errorBody) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(30*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	var e errorBody
	b, _ := io.ReadAll(resp.Body)
	require.NoError(t, json.Unmarshal(b, &e), "%s", b)
	return resp, e
}

// waitFor polls cond (a state of the server, not a time) until it holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestBodyBudgetAdmitsBeforeReading: bodies are admitted into the memory budget before a
// byte is read. Held large bodies fill the three quarters of the budget they may use; a
// further large one, declared or chunked, is answered 503 body_budget_exhausted with
// Retry-After at once, unread, while small bodies still pass; held small ones fill the rest,
// and then small ones are refused too. Once the held ones go, bodies are admitted again.
func TestBodyBudgetAdmitsBeforeReading(t *testing.T) {
	const limit = 256 << 10
	a := testAPI(t, Config{MaxBodyBytes: limit, MaxBodyBytesInFlight: 4 * limit, NoSpareWeights: true})
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	require.EqualValues(t, bodyStep, a.budget.smallBody())
	refused := func(length int, part, what string) {
		t.Helper()
		c := rawPost(t, addr, "/v1/completions", length, []byte(part))
		resp, e := readAnswer(t, c)
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, what)
		assert.Equal(t, "1", resp.Header.Get("Retry-After"), what)
		assert.Equal(t, "body_budget_exhausted", e.Error.Code, what)
		assert.Equal(t, typeUnavailable, e.Error.Type, what)
	}
	served := func(what string) {
		t.Helper()
		resp, err := http.Post(srv.URL+"/tokenize", "application/json", strings.NewReader(`{"prompt":"hi"}`))
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode, what)
	}

	var held []net.Conn
	for range 3 {
		held = append(held, rawPost(t, addr, "/v1/completions", limit, []byte(`{"prompt":"`)))
	}
	waitFor(t, "three large bodies admitted", func() bool { return a.budget.used.Load() == 3*limit && a.reading.Load() == 3 })
	refused(limit, `{"prompt":"hi"}`, "a fourth large body")
	refused(-1, `{"prompt":"`+strings.Repeat("a", bodyStep+10), "a chunked body growing past the small size")
	served("a small body beside the held large ones")

	for range 4 {
		held = append(held, rawPost(t, addr, "/tokenize", bodyStep, []byte(`{"prompt":"`)))
	}
	waitFor(t, "the budget full", func() bool { return a.budget.used.Load() == 4*limit && a.reading.Load() == 7 })
	refused(100, `{"prompt":"hi"}`, "a small body once the budget is full")
	// Bodyless routes need no budget.
	resp, err := http.Get(srv.URL + "/v1/models")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)

	for _, c := range held {
		_ = c.Close()
	}
	waitFor(t, "the held bodies' budget returned", func() bool { return a.budget.used.Load() == 0 })
	served("after the held bodies left")
	// A chunked body is read within the budget, step by step, and its size limit still holds.
	big := `{"prompt":"` + strings.Repeat("a", 3*limit) + `"}`
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/tokenize", io.MultiReader(strings.NewReader(big)))
	require.NoError(t, err)
	req.ContentLength = -1
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
	waitFor(t, "no budget left held", func() bool { return a.budget.used.Load() == 0 })
	http.DefaultClient.CloseIdleConnections()
}

// TestFleetMemberAdminRoutes: on a fleet member the routes that change weights or run state
// answer 403 fleet_managed; the read-only ones still answer.
func TestFleetMemberAdminRoutes(t *testing.T) {
	a := testAPI(t, Config{AdminToken: "adm", FleetManaged: true, NoSpareWeights: true})
	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{http.MethodPost, "/pause", 403}, {http.MethodPost, "/resume", 403}, {http.MethodPost, "/sleep", 403},
		{http.MethodPost, "/wake_up", 403}, {http.MethodPost, "/update_weights", 403},
		{http.MethodGet, "/state", 200}, {http.MethodGet, "/is_paused", 200}, {http.MethodGet, "/is_sleeping", 200},
	} {
		var body io.Reader
		if tc.path == "/update_weights" {
			body = strings.NewReader(`{"version":2,"source":"file:///x"}`)
		}
		req := httptest.NewRequest(tc.method, tc.path, body)
		req.Header.Set("Authorization", "Bearer adm")
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		a.Handler().ServeHTTP(w, req)
		assert.Equal(t, tc.want, w.Code, "%s %s: %s", tc.method, tc.path, w.Body)
		if tc.want == 403 {
			assert.Contains(t, w.Body.String(), `"code":"fleet_managed"`)
		}
	}
}

// TestRefusalLeavesTheBodyUnread: a request refused before its body is read (no admin token
// here) is answered at once and its connection closed, without the server waiting for the
// body the client declared: a refusal costs the same whatever the declared size.
func TestRefusalLeavesTheBodyUnread(t *testing.T) {
	a := testAPI(t, Config{AdminToken: "adm", NoSpareWeights: true})
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	for _, path := range []string{"/update_weights", "/no/such/route"} {
		c := rawPost(t, addr, path, 200<<10, []byte(`{"version":`)) // under the 256 KiB net/http drains
		resp, e := readAnswer(t, c)
		assert.Equal(t, map[string]int{"/update_weights": 401, "/no/such/route": 404}[path], resp.StatusCode)
		assert.NotEmpty(t, e.Error.Code)
		assert.True(t, resp.Close, "the connection closes after the refusal")
		// The server closes without waiting for the rest of the body: the read ends (EOF or
		// reset) well before the guard deadline.
		require.NoError(t, c.SetReadDeadline(time.Now().Add(20*time.Second)))
		_, err := c.Read(make([]byte, 1))
		var ne net.Error
		assert.False(t, errors.As(err, &ne) && ne.Timeout(), "%s: the server held the connection for the body: %v", path, err)
	}
}
