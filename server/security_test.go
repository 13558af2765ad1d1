package server_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/weights"
	"github.com/rolloutkit/rollout/server"
)

// TestNoTokenlessTCPAdmin: a server given no admin token generates one, on any listener, and
// no TCP client reaches an admin route without it, loopback or not; with AdminTokenPath it
// writes the token 0600 in a 0700 directory and removes it when it stops. Only an admin unix
// socket stays tokenless (its file mode decides).
func TestNoTokenlessTCPAdmin(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	path := server.AdminTokenFile(dir, "x")
	wide := startWide(t, func(c *server.Config) { c.AdminToken, c.AdminTokenPath = "", path })
	tok := wide.AdminToken()
	require.Len(t, tok, 64, "a generated token")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, tok+"\n", string(b))
	st, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	st, err = os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), st.Mode().Perm())
	for _, p := range []string{"/pause", "/update_weights", "/sleep"} {
		code, out := wide.do(t, http.MethodPost, p, "-", nil)
		assert.Equal(t, http.StatusUnauthorized, code, "%s", out)
		assert.Contains(t, string(out), "admin_token_required")
	}
	code, out := wide.do(t, http.MethodGet, "/state", tok, nil)
	assert.Equal(t, http.StatusOK, code, "%s", out)

	sock := filepath.Join(t.TempDir(), "admin.sock")
	local := start(t, func(c *server.Config) { c.AdminAddr = "unix:" + sock })
	assert.Empty(t, local.AdminToken(), "the unix socket's permissions are its authentication")

	// A token directory others can write is refused: they could swap the file.
	loose := filepath.Join(t.TempDir(), "loose")
	require.NoError(t, os.Mkdir(loose, 0o777))
	require.NoError(t, os.Chmod(loose, 0o777))
	_, err = server.New(server.Config{Addr: "127.0.0.1:0", KVBlocks: 64, Logger: quietLogger(), AdminTokenPath: filepath.Join(loose, "t")})
	require.ErrorIs(t, err, server.ErrUnsafeTokenDir)
}

// TestAdminTokenFileRemovedAtStop: the generated token's file goes when the server stops.
func TestAdminTokenFileRemovedAtStop(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", "admin-token")
	s, err := server.New(server.Config{Addr: "127.0.0.1:0", KVBlocks: 64, Logger: quietLogger(), AdminTokenPath: path, NoSpareWeights: true})
	require.NoError(t, err)
	_, err = os.Stat(path)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	cancel()
	require.NoError(t, <-done)
	_, err = os.Stat(path)
	assert.ErrorIs(t, err, os.ErrNotExist)
}

// TestAdminBehindReverseProxy: a local reverse proxy makes every remote client a loopback
// peer; an admin route refuses what comes through it without the token, while generation
// works, and the token works through it as directly.
func TestAdminBehindReverseProxy(t *testing.T) {
	ts := start(t, nil)
	target, err := url.Parse(ts.url)
	require.NoError(t, err)
	proxy := httptest.NewServer(httputil.NewSingleHostReverseProxy(target))
	defer proxy.Close()
	viaProxy := &testServer{Server: ts.Server, url: proxy.URL, client: proxy.Client()}

	code, out := viaProxy.do(t, http.MethodPost, "/pause", "-", nil)
	assert.Equal(t, http.StatusUnauthorized, code, "%s", out)
	assert.Contains(t, string(out), "admin_token_required")
	code, out = viaProxy.do(t, http.MethodPost, "/update_weights", "-", map[string]any{"version": 2, "source": "file:///x"})
	assert.Equal(t, http.StatusUnauthorized, code, "%s", out)
	code, out = viaProxy.do(t, http.MethodPost, "/generate", "-", greedyGen([]int{256, 1}, 2))
	assert.Equal(t, http.StatusOK, code, "%s", out)
	code, out = viaProxy.do(t, http.MethodGet, "/is_paused", ts.AdminToken(), nil)
	assert.Equal(t, http.StatusOK, code, "%s", out)
	assert.EqualValues(t, "running", ts.state(t).State)
}

func port(t *testing.T, u string) string {
	t.Helper()
	p, err := url.Parse(u)
	require.NoError(t, err)
	return p.Port()
}

// TestSeparateAdminListener: with --admin-addr the admin routes leave the main listener
// (404 there) and answer on their own, TCP or a unix socket.
func TestSeparateAdminListener(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "admin.sock")
	for name, addr := range map[string]string{"tcp": "127.0.0.1:0", "unix": "unix:" + sock} {
		t.Run(name, func(t *testing.T) {
			ts := start(t, func(c *server.Config) { c.AdminAddr = addr })
			code, out := ts.do(t, http.MethodPost, "/pause", "", nil)
			assert.Equal(t, http.StatusNotFound, code, "%s", out)
			code, _ = ts.do(t, http.MethodGet, "/state", "", nil)
			assert.Equal(t, http.StatusNotFound, code)
			code, out = ts.do(t, http.MethodPost, "/generate", "", greedyGen([]int{256, 1}, 2))
			assert.Equal(t, http.StatusOK, code, "%s", out)

			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			adm := &testServer{Server: ts.Server, client: &http.Client{Transport: &adminAuth{base: tr, token: ts.AdminToken()}}}
			if name == "unix" {
				tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
					return (&net.Dialer{}).DialContext(ctx, "unix", sock)
				}
				adm.url = "http://admin"
			} else {
				adm.url = "http://" + ts.AdminAddr()
			}
			code, out = adm.do(t, http.MethodPost, "/pause?mode=abort", "", nil)
			require.Equal(t, http.StatusOK, code, "%s", out)
			code, out = adm.do(t, http.MethodGet, "/is_paused", "", nil)
			require.Equal(t, http.StatusOK, code, "%s", out)
			assert.JSONEq(t, `{"is_paused":true}`, string(out))
			code, out = adm.do(t, http.MethodPost, "/resume", "", nil)
			require.Equal(t, http.StatusOK, code, "%s", out)
			code, _ = adm.do(t, http.MethodGet, "/health", "", nil)
			assert.Equal(t, http.StatusOK, code)
			code, _ = adm.do(t, http.MethodPost, "/generate", "", greedyGen([]int{256, 1}, 2))
			assert.Equal(t, http.StatusNotFound, code, "generation stays off the admin listener")
		})
	}
}

// slowConn opens a connection and sends the headers of a POST whose body never completes.
func slowConn(t *testing.T, addr, path string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	_, err = fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"prompt", path, addr)
	require.NoError(t, err)
	return c
}

// TestSlowlorisDoesNotStarveSlots: connections that send their body a byte at a time (here:
// never finish it) outnumber the concurrency slots, and good requests are still served.
func TestSlowlorisDoesNotStarveSlots(t *testing.T) {
	const slots = 2
	ts := start(t, func(c *server.Config) { c.MaxConcurrent, c.MaxQueue = slots, -1 })
	addr := strings.TrimPrefix(ts.url, "http://")
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for i := range 2 * slots {
		conns = append(conns, slowConn(t, addr, []string{"/v1/completions", "/generate", "/tokenize"}[i%3]))
	}
	// Wait until the server holds every slow request (reading its body, or, were the slot
	// taken first, admitted).
	st := ts.waitState(t, "slow requests held", func(s stateResp) bool { return s.HTTPReading+s.HTTPInflight == 2*slots })
	assert.Zero(t, st.HTTPInflight, "a slow body holds no slot")
	for i := range 3 * slots {
		code, out := ts.do(t, http.MethodPost, "/generate", "", greedyGen([]int{256, i}, 2))
		require.Equal(t, http.StatusOK, code, "good request %d during the slowloris: %s", i, out)
		code, out = ts.do(t, http.MethodPost, "/tokenize", "", map[string]any{"prompt": "hi"})
		require.Equal(t, http.StatusOK, code, "%s", out)
	}
}

// TestBodyReadDeadline: a body that does not arrive within the read timeout is answered 408
// and releases what it held.
func TestBodyReadDeadline(t *testing.T) {
	ts := start(t, func(c *server.Config) { c.BodyReadTimeout = 50 * time.Millisecond })
	c := slowConn(t, strings.TrimPrefix(ts.url, "http://"), "/generate")
	defer c.Close()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusRequestTimeout, resp.StatusCode, "%s", out)
	assert.Contains(t, string(out), "request_timeout")
	assert.Zero(t, ts.state(t).HTTPReading)
}

// TestOversizedBodyAnswers413: a client that writes its whole oversized body before reading
// (as Python's http.client does) reads the 413, not a reset connection.
func TestOversizedBodyAnswers413(t *testing.T) {
	ts := start(t, func(c *server.Config) { c.MaxBodyBytes = 64 << 10 })
	for _, chunked := range []bool{false, true} {
		c, err := net.Dial("tcp", strings.TrimPrefix(ts.url, "http://"))
		require.NoError(t, err)
		body := `{"prompt":"` + strings.Repeat("a", 600<<10) + `"}`
		head := fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
		payload := head + body
		if chunked {
			payload = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
				fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(body), body)
		}
		_, err = io.WriteString(c, payload)
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err, "chunked=%v: the 413 arrives", chunked)
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "%s", out)
		assert.Contains(t, string(out), "request_too_large")
		_ = c.Close()
	}
}

// TestTokenizeUnderLimiter: /tokenize and /detokenize take a concurrency slot like
// generation, so they cannot be used to bypass the limit.
func TestTokenizeUnderLimiter(t *testing.T) {
	ts := start(t, func(c *server.Config) { c.MaxConcurrent, c.MaxQueue = 1, -1 })
	ts.doJSON(t, http.MethodPost, "/pause?mode=keep", nil, http.StatusOK, nil)
	held := ts.generateAsync(t, greedyGen([]int{256, 1}, 2))
	ts.waitState(t, "slot held", func(s stateResp) bool { return s.HTTPInflight == 1 })
	code, out := ts.do(t, http.MethodPost, "/tokenize", "", map[string]any{"prompt": "hi"})
	assert.Equal(t, http.StatusTooManyRequests, code, "%s", out)
	code, out = ts.do(t, http.MethodPost, "/detokenize", "", map[string]any{"tokens": []int{65}})
	assert.Equal(t, http.StatusTooManyRequests, code, "%s", out)
	ts.doJSON(t, http.MethodPost, "/resume", nil, http.StatusOK, nil)
	held.wait(t)
	code, out = ts.do(t, http.MethodPost, "/tokenize", "", map[string]any{"prompt": "hi"})
	assert.Equal(t, http.StatusOK, code, "%s", out)
}

// TestRequestIDsDoNotCollide: two clients choosing the same request_id both run; each gets
// its id back, and aborting that id reaches both.
func TestRequestIDsDoNotCollide(t *testing.T) {
	ts := start(t, nil)
	ts.doJSON(t, http.MethodPost, "/pause?mode=keep", nil, http.StatusOK, nil)
	body := func(p int) map[string]any {
		b := greedyGen([]int{256, p}, 3)
		b["request_id"] = "same"
		return b
	}
	a := ts.generateAsync(t, body(1))
	ts.waitState(t, "first held", func(s stateResp) bool { return s.HTTPInflight == 1 && s.RequestsWaiting == 1 })
	b := ts.generateAsync(t, body(2))
	ts.waitState(t, "second held", func(s stateResp) bool { return s.HTTPInflight == 2 && s.RequestsWaiting == 2 })
	ts.doJSON(t, http.MethodPost, "/resume", nil, http.StatusOK, nil)
	for _, r := range []asyncGen{a, b} {
		res := r.wait(t)
		assert.Equal(t, "same", res.RequestID)
		require.Len(t, res.Outputs, 1)
		assert.Equal(t, "length", res.Outputs[0].FinishReason)
	}
}

// checkpointServer serves dir over HTTP and counts the requests it gets.
func checkpointServer(t *testing.T, dir string) (*httptest.Server, *int64) {
	t.Helper()
	var hits int64
	fs := http.FileServer(http.Dir(dir))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits++
		fs.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, &hits
}

// TestUpdateWeightsOverHTTP: an http(s) source needs its sha256 (unless the server allows
// unverified weights), loads when it has one, and leaves the old weights serving otherwise.
func TestUpdateWeightsOverHTTP(t *testing.T) {
	uri, digest := writeCheckpoint(t, 2)
	src, _ := checkpointServer(t, strings.TrimPrefix(uri, "file://"))
	ts := start(t, nil)
	code, out := ts.do(t, http.MethodPost, "/update_weights", "", map[string]any{"version": 2, "source": src.URL})
	require.Equal(t, http.StatusBadRequest, code, "%s", out)
	assert.Contains(t, string(out), "digest_required")
	code, out = ts.do(t, http.MethodPost, "/update_weights", "", map[string]any{"version": 2, "source": src.URL, "sha256": digest})
	require.Equal(t, http.StatusOK, code, "%s", out)
	assert.EqualValues(t, 2, ts.state(t).WeightVersion)

	lax := start(t, func(c *server.Config) { c.AllowUnverifiedWeights = true })
	code, out = lax.do(t, http.MethodPost, "/update_weights", "", map[string]any{"version": 2, "source": src.URL})
	require.Equal(t, http.StatusOK, code, "%s", out)
}

// TestWeightFetchRefusesInternalAddresses: a server reachable from other hosts does not fetch
// weights from loopback (or private) addresses unless told to, and says so without detail.
func TestWeightFetchRefusesInternalAddresses(t *testing.T) {
	uri, digest := writeCheckpoint(t, 2)
	src, hits := checkpointServer(t, strings.TrimPrefix(uri, "file://"))
	ts := startWide(t, nil)
	code, out := ts.do(t, http.MethodPost, "/update_weights", "adm", map[string]any{"version": 2, "source": src.URL, "sha256": digest})
	require.Equal(t, http.StatusUnprocessableEntity, code, "%s", out)
	assert.Contains(t, string(out), "not allowed")
	assert.Zero(t, *hits, "the internal address was never contacted")
	code, out = ts.do(t, http.MethodGet, "/state", "adm", nil)
	require.Equal(t, http.StatusOK, code, "%s", out)
	assert.Contains(t, string(out), `"weight_version":1`)

	allowed := startWide(t, func(c *server.Config) { c.WeightsAllowPrivate = true })
	code, out = allowed.do(t, http.MethodPost, "/update_weights", "adm", map[string]any{"version": 2, "source": src.URL, "sha256": digest})
	require.Equal(t, http.StatusOK, code, "%s", out)
}

// startWide starts a server on every interface, with admin token "adm", whose client talks
// to it over loopback.
func startWide(t *testing.T, mut func(*server.Config)) *testServer {
	t.Helper()
	ts := start(t, func(c *server.Config) {
		c.Addr, c.AdminToken = "0.0.0.0:0", "adm"
		if mut != nil {
			mut(c)
		}
	})
	ts.url = "http://127.0.0.1:" + port(t, ts.url)
	return ts
}

// TestWeightFetchErrorsAreGeneric: what an internal server answers (a status, its body, the
// bytes of a page) and the credentials in the URL never reach the caller.
func TestWeightFetchErrorsAreGeneric(t *testing.T) {
	internal := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "config.json") && strings.Contains(r.URL.Path, "page") {
			_, _ = io.WriteString(w, "<html>INTERNAL-ADMIN-CONSOLE</html>")
			return
		}
		w.WriteHeader(http.StatusTeapot)
		_, _ = io.WriteString(w, "INTERNAL-SECRET-BODY")
	}))
	defer internal.Close()
	ts := start(t, nil)
	host := strings.TrimPrefix(internal.URL, "http://")
	for _, src := range []string{
		"http://user:hunter2@" + host + "/ckpt?X-Amz-Signature=sig123",
		"http://" + host + "/page",
		"http://127.0.0.1:1/closed?token=sig123",
	} {
		code, out := ts.do(t, http.MethodPost, "/update_weights", "", map[string]any{"version": 2, "source": src, "sha256": strings.Repeat("ab", 32)})
		assert.Equal(t, http.StatusUnprocessableEntity, code, "%s", out)
		// The answer names the source, and the internal server's random port may contain "418".
		said := strings.ToLower(strings.ReplaceAll(string(out), host, "host"))
		for _, leak := range []string{"hunter2", "sig123", "INTERNAL", "418", "teapot", "refused", "dial"} {
			assert.NotContains(t, said, strings.ToLower(leak), "%s", out)
		}
	}
}

// TestSlowWeightSourceKeepsServing: a weights source that stops sending neither makes /ready
// fail (the old weights serve) nor traps other updaters on the lock: one whose context ends
// gives up.
func TestSlowWeightSourceKeepsServing(t *testing.T) {
	got := make(chan struct{}, 1)
	release := make(chan struct{})
	drip := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "1000")
		_, _ = io.WriteString(w, "{")
		w.(http.Flusher).Flush()
		select {
		case got <- struct{}{}:
		default:
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer drip.Close()
	defer close(release)
	ts := start(t, nil)
	first := make(chan int, 1)
	go func() {
		code, _, _ := ts.tryDo(http.MethodPost, "/update_weights", map[string]any{"version": 2, "source": drip.URL, "sha256": strings.Repeat("ab", 32)})
		first <- code
	}()
	<-got
	code, out := ts.do(t, http.MethodGet, "/ready", "", nil)
	assert.Equal(t, http.StatusOK, code, "the old weights serve while the new ones download: %s", out)
	code, out = ts.do(t, http.MethodPost, "/generate", "", greedyGen([]int{256, 1}, 2))
	assert.Equal(t, http.StatusOK, code, "%s", out)

	ctx, cancel := context.WithCancel(context.Background())
	staged := make(chan error, 1)
	go func() {
		_, err := ts.API().StageWeights(ctx, weights.Ref{Version: 3, URI: drip.URL, SHA256: strings.Repeat("ab", 32)})
		staged <- err
	}()
	cancel()
	select {
	case err := <-staged:
		require.Error(t, err)
		assert.False(t, errors.Is(err, weights.ErrDigestMismatch))
	case <-time.After(20 * time.Second):
		t.Fatal("a stager whose context ended is still waiting for the update lock")
	}
	release <- struct{}{}
	assert.Equal(t, http.StatusUnprocessableEntity, <-first)
	assert.EqualValues(t, 1, ts.state(t).WeightVersion)
}
