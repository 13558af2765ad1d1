package fleettest_test

// The trust boundaries of a rollout server seen from outside it (issue 26, items 7-10): real
// `rollout serve` processes, a real redis-server for the fleet, a real nginx for the reverse
// proxy. Each test names the finding it covers.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/internal/fleettest"
	"github.com/rolloutkit/rollout/sdk"
)

// errorCode is the code of a JSON error answer ("" when it is none).
func errorCode(t *testing.T, body string) string {
	t.Helper()
	var e struct {
		Error struct {
			Code    string `json:"code"`
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(body), &e) != nil || e.Error.Code == "" {
		return ""
	}
	assert.NotEmpty(t, e.Error.Type, "%s", body)
	assert.NotEmpty(t, e.Error.Message, "%s", body)
	return e.Error.Code
}

func updateBody(ref sdk.WeightsRef) string {
	return fmt.Sprintf(`{"version":%d,"source":%q,"sha256":%q}`, ref.Version, ref.URI, ref.SHA256)
}

// TestFleetMemberAdminPlaneDefersToFleet (finding 7): a local process on a fleet member's host
// loads nothing over the HTTP admin plane: without the token nothing answers, and with it
// (the same user can read the token file) the routes that change weights or run state are
// the fleet's. The trainer's update then commits and serves.
func TestFleetMemberAdminPlaneDefersToFleet(t *testing.T) {
	skipShort(t)
	f := fleettest.Start(t, fleettest.Options{Servers: 1, Fleet: "trust7"})
	p := f.Procs[0]
	foreign := fileRef(t, 1<<31, 66) // serving (0) + 2^31, the finding's version

	code, out, err := p.Do("", http.MethodPost, "/update_weights", "", updateBody(foreign))
	require.NoError(t, err)
	assert.Equal(t, http.StatusUnauthorized, code, "%s", out)
	assert.Equal(t, "admin_token_required", errorCode(t, out))

	tok := p.AdminToken()
	require.NotEmpty(t, tok, "the server wrote its generated token to its state dir")
	for _, path := range []string{"/update_weights", "/pause", "/sleep?level=1", "/resume", "/wake_up"} {
		body := ""
		if path == "/update_weights" {
			body = updateBody(foreign)
		}
		code, out, err := p.Do("", http.MethodPost, path, tok, body)
		require.NoError(t, err)
		assert.Equal(t, http.StatusForbidden, code, "%s: %s", path, out)
		assert.Equal(t, "fleet_managed", errorCode(t, out), path)
	}
	assert.Zero(t, stateOf(t, p).WeightVersion, "the foreign weights were never loaded")

	c := dial(t, f)
	res, err := c.UpdateWeights(t.Context(), fileRef(t, 1, 61), sdk.Plan{Policy: sdk.AllOrNothing})
	require.NoError(t, err)
	assert.Equal(t, sdk.OutcomeCommitted, res.Outcome)
	st := stateOf(t, p)
	assert.EqualValues(t, 1, st.WeightVersion, "the trainer's version serves")
	assert.EqualValues(t, "running", st.State)
}

// TestFleetAdminRoutesOptInBoundVersionStep (finding 7): with --fleet-admin-routes the admin
// plane may load weights on a fleet member, but not a version far enough ahead to make the
// trainer's next updates stale.
func TestFleetAdminRoutesOptInBoundVersionStep(t *testing.T) {
	skipShort(t)
	f := fleettest.Start(t, fleettest.Options{Servers: 1, Fleet: "trust7b", Env: []string{"ROLLOUT_FLEET_ADMIN_ROUTES=true"}})
	p := f.Procs[0]
	tok := p.AdminToken()
	code, out, err := p.Do("", http.MethodPost, "/update_weights", tok, updateBody(fileRef(t, 1<<31, 66)))
	require.NoError(t, err)
	assert.Equal(t, http.StatusBadRequest, code, "%s", out)
	assert.Equal(t, "invalid_value", errorCode(t, out))
	code, out, err = p.Do("", http.MethodPost, "/update_weights", tok, updateBody(fileRef(t, 1, 62)))
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code, "%s", out)
	assert.EqualValues(t, 1, stateOf(t, p).WeightVersion)
}

// nginxBinary finds nginx; without it the test skips, or fails under CI=true (.ci/run
// installs nginx-light).
func nginxBinary(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"nginx", "/usr/sbin/nginx"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("nginx is not installed: CI must run it (apt-get install nginx-light, as .ci/run does)")
	}
	t.Skip("nginx is not installed (apt-get install nginx-light)")
	return ""
}

// startNginx runs nginx in the foreground with a bare `proxy_pass` to backend (host:port) and
// returns its base URL once it answers.
func startNginx(t *testing.T, backend string) string {
	t.Helper()
	bin := nginxBinary(t)
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	conf := fmt.Sprintf(`daemon off;
master_process off;
worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 64; }
http {
	access_log off;
	client_body_temp_path %[1]s/body;
	proxy_temp_path %[1]s/proxy;
	fastcgi_temp_path %[1]s/fastcgi;
	uwsgi_temp_path %[1]s/uwsgi;
	scgi_temp_path %[1]s/scgi;
	server {
		listen %[2]s;
		location / {
			proxy_pass http://%[3]s;
		}
	}
}
`, dir, addr, backend)
	path := filepath.Join(dir, "nginx.conf")
	require.NoError(t, os.WriteFile(path, []byte(conf), 0o600))
	var logs bytes.Buffer
	cmd := exec.Command(bin, "-p", dir, "-c", path, "-e", filepath.Join(dir, "error.log"))
	cmd.Stdout, cmd.Stderr = &logs, &logs
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			el, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Logf("=== nginx\n%s%s", logs.String(), el)
		}
	})
	base := "http://" + addr
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(base + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base
			}
		}
		select {
		case <-done:
			t.Fatalf("nginx exited: %s", logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("nginx did not come up: %s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestNginxBareProxyPassGivesNoAdmin (finding 8): behind nginx with a bare proxy_pass (no
// forwarding headers, Host set to the upstream's address), every client of the proxy is a
// loopback peer with a clean request; none of them is an admin without the token, while
// generation passes through.
func TestNginxBareProxyPassGivesNoAdmin(t *testing.T) {
	p := fleettest.Serve(t, nil, "--kv-blocks", "64", "--no-spare-weights")
	proxy := startNginx(t, p.Addr)
	for _, c := range []struct{ method, path, body string }{
		{http.MethodPost, "/pause", ""}, {http.MethodGet, "/state", ""}, {http.MethodPost, "/sleep?level=1", ""},
		{http.MethodPost, "/update_weights", `{"version":2,"source":"file:///etc"}`},
	} {
		code, out, err := p.Do(proxy, c.method, c.path, "", c.body)
		require.NoError(t, err)
		assert.Equal(t, http.StatusUnauthorized, code, "%s via nginx: %s", c.path, out)
		assert.Equal(t, "admin_token_required", errorCode(t, out), c.path)
	}
	code, out, err := p.Do(proxy, http.MethodPost, "/generate", "", `{"prompt_token_ids":[256,65],"sampling":{"max_tokens":2}}`)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code, "%s", out)
	code, out, err = p.Do(proxy, http.MethodGet, "/state", p.AdminToken(), "")
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code, "the token works through the proxy: %s", out)
	assert.Contains(t, out, `"state":"running"`)
}

// rssBytes is the resident set of process pid (Linux /proc).
func rssBytes(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// TestHeldUploadsStayWithinBodyBudget (finding 9): 64 clients each send all but the last byte
// of an 8 MiB body and hold. Bodies are admitted before they are read, within a memory budget
// (64 MiB by default, three quarters of it for large bodies): the resident memory grows by
// about that, not by the 64
// bodies, and the refused clients get 503 body_budget_exhausted with Retry-After.
func TestHeldUploadsStayWithinBodyBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("sends 512 MiB")
	}
	p := fleettest.Serve(t, nil, "--kv-blocks", "64", "--no-spare-weights")
	code, out, err := p.Do("", http.MethodPost, "/generate", "", `{"prompt_token_ids":[256,65],"sampling":{"max_tokens":2}}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, "%s", out)
	before := rssBytes(t, p.Pid())

	const clients, size = 64, 8 << 20
	sent := make(chan error, clients)
	answers := make(chan *http.Response, clients)
	for range clients {
		c, err := net.Dial("tcp", p.Addr)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		go func() {
			head := fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{\"prompt\":\"", p.Addr, size)
			_, err := io.WriteString(c, head)
			chunk := bytes.Repeat([]byte("a"), 256<<10)
			for left := size - 1 - len(`{"prompt":"`); err == nil && left > 0; left -= len(chunk) {
				_, err = c.Write(chunk[:min(left, len(chunk))])
			}
			sent <- err // nil: all but the last byte sent; else refused and closed
		}()
		go func() {
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				answers <- nil
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			resp.Body = io.NopCloser(bytes.NewReader(b))
			answers <- resp
		}()
	}
	held := 0
	for range clients {
		if <-sent == nil {
			held++
		}
	}
	after := rssBytes(t, p.Pid())
	t.Logf("resident memory: %d MiB before, %d MiB with %d uploads of 8 MiB (%d sent in full but the last byte): +%d MiB",
		before>>20, after>>20, clients, held, (after-before)>>20)
	assert.Less(t, after-before, int64(128<<20), "held bodies are bounded by the budget")

	refused := 0
	for refused < clients-held {
		resp := <-answers
		if resp == nil {
			continue // a held connection closed at cleanup cannot happen yet; a reset one can
		}
		b, _ := io.ReadAll(resp.Body)
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", b)
		assert.Equal(t, "1", resp.Header.Get("Retry-After"))
		assert.Equal(t, "body_budget_exhausted", errorCode(t, string(b)))
		refused++
	}
	assert.Positive(t, refused)
	v, err := p.Metric("rollout_http_body_rejected_total", "reason", "budget")
	require.NoError(t, err)
	assert.GreaterOrEqual(t, v, float64(refused))
	code, out, err = p.Do("", http.MethodPost, "/generate", "", `{"prompt_token_ids":[256,66],"sampling":{"max_tokens":2}}`)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code, "bodyless and small requests still served: %s", out)
}

// TestDripSourceCutOffByMinimumRate (finding 10): a weight source that sends a byte every
// few milliseconds (never stalling) is cut off once a window passes below the minimum rate,
// and the update lock is free again: the next update loads at once.
func TestDripSourceCutOffByMinimumRate(t *testing.T) {
	// The settings through the environment, so that a binary without them (an older one)
	// starts too, and shows the finding.
	p := fleettest.Serve(t, []string{"ROLLOUT_WEIGHTS_MIN_RATE=64KiB", "ROLLOUT_WEIGHTS_MIN_RATE_WINDOW=300ms"},
		"--kv-blocks", "64", "--no-spare-weights")
	drip := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(1<<20))
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			if _, err := w.Write([]byte{' '}); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-tick.C:
			}
		}
	}))
	defer drip.Close()
	tok := p.AdminToken()
	start := time.Now()
	var code int
	var out string
	done := make(chan error, 1)
	go func() {
		var err error
		code, out, err = p.Do("", http.MethodPost, "/update_weights", tok,
			fmt.Sprintf(`{"version":1,"source":%q,"sha256":%q}`, drip.URL+"/", strings.Repeat("ab", 32)))
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(60 * time.Second):
		t.Fatal("the dripping source still holds the update after 60s")
	}
	took := time.Since(start)
	assert.Equal(t, http.StatusUnprocessableEntity, code, "%s", out)
	assert.Equal(t, "source_too_slow", errorCode(t, out))
	assert.Less(t, took, 30*time.Second, "cut off after a window, not the overall deadline")

	dir := filepath.Join(t.TempDir(), "v1")
	sum := checkpoint(t, dir, 71)
	good := httptest.NewServer(http.FileServer(http.Dir(dir)))
	defer good.Close()
	code, out, err := p.Do("", http.MethodPost, "/update_weights", tok, fmt.Sprintf(`{"version":1,"source":%q,"sha256":%q}`, good.URL+"/", sum))
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code, "the lock is free: %s", out)
}

// TestFileSourcesConfined (finding 10): `rollout serve` refuses file weight sources unless
// --weights-root is given, and then only those under it, a symlink out of it refused.
func TestFileSourcesConfined(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "outside")
	outSum := checkpoint(t, outside, 72)
	root := t.TempDir()
	inSum := checkpoint(t, filepath.Join(root, "v1"), 73)
	require.NoError(t, os.Symlink(outside, filepath.Join(root, "escape")))

	bare := fleettest.Serve(t, nil, "--kv-blocks", "64", "--no-spare-weights")
	code, out, err := bare.Do("", http.MethodPost, "/update_weights", bare.AdminToken(),
		fmt.Sprintf(`{"version":1,"source":%q,"sha256":%q}`, "file://"+outside, outSum))
	require.NoError(t, err)
	assert.Equal(t, http.StatusUnprocessableEntity, code, "%s", out)
	assert.Equal(t, "source_refused", errorCode(t, out))

	rooted := fleettest.Serve(t, nil, "--kv-blocks", "64", "--no-spare-weights", "--weights-root", root)
	tok := rooted.AdminToken()
	for _, src := range []string{"file://" + filepath.Join(root, "escape"), "file://" + outside, filepath.Join(root, "..", filepath.Base(filepath.Dir(outside)), "outside")} {
		code, out, err := rooted.Do("", http.MethodPost, "/update_weights", tok, fmt.Sprintf(`{"version":1,"source":%q,"sha256":%q}`, src, outSum))
		require.NoError(t, err)
		assert.Equal(t, http.StatusBadRequest, code, "%s: %s", src, out)
		assert.Equal(t, "invalid_source", errorCode(t, out), src)
	}
	code, out, err = rooted.Do("", http.MethodPost, "/update_weights", tok, fmt.Sprintf(`{"version":1,"source":%q,"sha256":%q}`, "file://"+filepath.Join(root, "v1"), inSum))
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code, "%s", out)
}

// TestUnboundedSourceStopsAtTheLimit (finding 10): a source that streams a file without end
// (no Content-Length) is cut off at the download limit the model's shape gives. (The
// download limit predates issue 26: this guards it.)
func TestUnboundedSourceStopsAtTheLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("streams the download limit")
	}
	p := fleettest.Serve(t, nil, "--kv-blocks", "64", "--no-spare-weights")
	dir := filepath.Join(t.TempDir(), "v1")
	checkpoint(t, dir, 74)
	config, err := os.ReadFile(filepath.Join(dir, "config.json"))
	require.NoError(t, err)
	var streamed int64
	endless := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "config.json") {
			_, _ = w.Write(config)
			return
		}
		chunk := make([]byte, 1<<20)
		for {
			n, err := w.Write(chunk)
			streamed += int64(n)
			if err != nil {
				return
			}
		}
	}))
	code, out, err := p.Do("", http.MethodPost, "/update_weights", p.AdminToken(),
		fmt.Sprintf(`{"version":1,"source":%q,"sha256":%q}`, endless.URL+"/", strings.Repeat("ab", 32)))
	require.NoError(t, err)
	endless.Close() // waits for the handler: streamed is final
	assert.Equal(t, http.StatusUnprocessableEntity, code, "%s", out)
	assert.Less(t, streamed, int64(1<<30), "the download stopped near its limit")
	t.Logf("the endless source sent %d MiB before the server hung up", streamed>>20)
}
