package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/internal/redistest"
	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/protocol"
	"github.com/rolloutkit/rollout/server"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// TestServeGenerateOverHTTPAndShutdown runs `rollout serve`, checks that `generate --server`
// prints what in-process `generate` prints, then stops the server as SIGINT would and expects
// exit code 0.
func TestServeGenerateOverHTTPAndShutdown(t *testing.T) {
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var serveOut, serveErr bytes.Buffer
	exited := make(chan int, 1)
	go func() {
		exited <- run(ctx, []string{"serve", "--addr", addr, "--kv-blocks", "512", "--log-level", "warn"}, &serveOut, &serveErr)
	}()
	url := "http://" + addr
	require.Eventually(t, func() bool {
		resp, err := http.Get(url + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 20*time.Second, 10*time.Millisecond, "server did not come up: %s", serveErr.String())

	gen := func(args ...string) generateResult {
		var out, errb bytes.Buffer
		code := run(t.Context(), append([]string{"generate", "--json", "--max-tokens", "12", "--seed", "5", "--temperature", "0.8"}, args...), &out, &errb)
		require.Equal(t, 0, code, errb.String())
		var r generateResult
		require.NoError(t, json.Unmarshal(out.Bytes(), &r), out.String())
		return r
	}
	local := gen("Once upon a time")
	remote := gen("--server", url, "Once upon a time")
	assert.Equal(t, local.Model, remote.Model)
	require.Len(t, local.Samples, 1)
	require.Len(t, remote.Samples, 1)
	ls, rs := local.Samples[0], remote.Samples[0]
	assert.Equal(t, local.PromptTokenIDs, remote.PromptTokenIDs)
	assert.NotEmpty(t, ls.Tokens)
	assert.Equal(t, ls.TokenIDs(), rs.TokenIDs())
	assert.Equal(t, local.Text, remote.Text)
	assert.Equal(t, ls.Logprobs(), rs.Logprobs())
	assert.Equal(t, ls.FinishReason, rs.FinishReason)
	assert.Equal(t, ls.WeightVersions(), rs.WeightVersions())

	// Text mode streams.
	var out, errb bytes.Buffer
	require.Equal(t, 0, run(t.Context(), []string{"generate", "--server", url, "--max-tokens", "4", "hi"}, &out, &errb), errb.String())
	assert.Contains(t, out.String(), "[4 tokens")

	cancel()
	select {
	case code := <-exited:
		assert.Equal(t, 0, code, serveErr.String())
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not exit after cancellation")
	}
}

func TestServeAndGenerateRefuseBadFlags(t *testing.T) {
	var out, errb bytes.Buffer
	assert.Equal(t, 1, run(t.Context(), []string{"generate", "--server", "http://127.0.0.1:1", "--model", "builtin:tiny", "hi"}, &out, &errb))
	assert.Contains(t, errb.String(), "exclusive")
	errb.Reset()
	assert.Equal(t, 1, run(t.Context(), []string{"serve", "--kv-bytes", "lots"}, &out, &errb))
	assert.Contains(t, errb.String(), "--kv-bytes")
	errb.Reset()
	assert.Equal(t, 1, run(t.Context(), []string{"serve", "--precision", "fp8"}, &out, &errb))
	assert.Contains(t, errb.String(), "--precision")
	errb.Reset()
	assert.Equal(t, 1, run(t.Context(), []string{"serve", "--memory", "1GiB", "--kv-bytes", "64MiB"}, &out, &errb))
	assert.Contains(t, errb.String(), "--memory")
	for _, bad := range []string{"fp8", "bf16,bf16", "w8a8,int8-dot", ""} {
		errb.Reset()
		assert.Equal(t, 1, run(t.Context(), []string{"bench", "engine", "--precision", bad}, &out, &errb), bad)
		assert.Contains(t, errb.String(), "--precision", bad)
	}
}

// TestServeRefusesPoolSizesThatDoNotFit is issue 25's flags: an overflowing --max-num-seqs
// used to derive a 129-block pool without a word, and a huge --kv-blocks panicked in the
// pool's allocation. Each now fails to start with one line naming the engine setting.
func TestServeRefusesPoolSizesThatDoNotFit(t *testing.T) {
	for _, tc := range []struct{ flag, value, want string }{
		{"--max-num-seqs", "576460752303423489", "invalid argument: MaxNumSeqs: "},
		{"--kv-blocks", "1125899906842624", "invalid argument: NumBlocks: "},
		{"--kv-blocks", "2147483647", "invalid argument: NumBlocks: "},
		{"--memory", "64KiB", "invalid argument: MemoryBytes: "}, // less than builtin:tiny's weights
	} {
		var out, errb bytes.Buffer
		assert.Equal(t, 1, run(t.Context(), []string{"serve", "--addr", "127.0.0.1:0", "--log-level", "error", tc.flag, tc.value}, &out, &errb), tc.flag)
		assert.Contains(t, errb.String(), tc.want, "%s %s", tc.flag, tc.value)
	}
}

// TestServeHidesTestKnobs: --offload-delay, a test knob, is not in `serve --help` but is still
// a flag: it is parsed and checked (it needs --offload-cpu-bytes).
func TestServeHidesTestKnobs(t *testing.T) {
	var out, errb bytes.Buffer
	require.Equal(t, 0, run(t.Context(), []string{"serve", "--help"}, &out, &errb), errb.String())
	assert.Contains(t, out.String(), "--offload-cpu-bytes")
	assert.NotContains(t, out.String(), "offload-delay")
	out.Reset()
	assert.Equal(t, 1, run(t.Context(), []string{"serve", "--offload-delay", "1ms", "--addr", "127.0.0.1:0"}, &out, &errb))
	assert.Contains(t, errb.String(), "--offload-delay: needs --offload-cpu-bytes")
}

// TestServeRefusesBadFleetFlags: fleet flags are checked before anything starts, each with
// one clear line.
func TestServeRefusesBadFleetFlags(t *testing.T) {
	short := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(short, []byte("too-short\n"), 0o600))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--redis", "redis://127.0.0.1:1", "--addr", "127.0.0.1:0"}, "need --fleet"},
		{[]string{"serve", "--fleet", "demo", "--addr", "127.0.0.1:0"}, "--fleet needs --redis"},
		{[]string{"serve", "--redis", "redis://127.0.0.1:1", "--fleet", "demo", "--fleet-secret", "short", "--addr", "127.0.0.1:0"}, "shorter than 32 bytes"},
		{[]string{"serve", "--redis", "redis://127.0.0.1:1", "--fleet", "demo", "--fleet-secret-file", short, "--addr", "127.0.0.1:0"}, "shorter than 32 bytes"},
		{[]string{"serve", "--fleet-secret-file", filepath.Join(t.TempDir(), "missing"), "--addr", "127.0.0.1:0"}, "--fleet-secret-file"},
		// Closed by default: no secret, no fleet membership unless asked for loudly.
		{[]string{"serve", "--redis", "redis://127.0.0.1:1", "--fleet", "demo", "--addr", "127.0.0.1:0"}, "--insecure-unsigned-fleet"},
	} {
		var out, errb bytes.Buffer
		assert.Equal(t, 1, run(t.Context(), tc.args, &out, &errb), tc.args)
		assert.Contains(t, errb.String(), tc.want, tc.args)
		// One error line (beside the warning a secret on the command line earns).
		lines := 0
		for _, l := range strings.Split(strings.TrimSpace(errb.String()), "\n") {
			if !strings.Contains(l, "level=WARN") {
				lines++
			}
		}
		assert.Equal(t, 1, lines, errb.String())
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "1048576": 1 << 20, "512MiB": 512 << 20, "2GB": 2e9, "1.5k": 1536, "8 MB": 8e6, "3G": 3 << 30} {
		got, err := parseSize(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "lots", "-1", "5XB", "MiB"} {
		_, err := parseSize(in)
		assert.Error(t, err, in)
	}
}

// TestServeJoinsAFleetOverRedis: `rollout serve` with fleet settings from the environment
// (the secret from a file) joins a real redis-server: its signed heartbeat appears, in
// rotation, and on shutdown its last heartbeat says stopping.
func TestServeJoinsAFleetOverRedis(t *testing.T) {
	rs := redistest.Start(t)
	secret := "a-fleet-secret-of-at-least-32-bytes!"
	file := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(file, []byte(secret+"\n"), 0o600))
	t.Setenv("ROLLOUT_REDIS", rs.URL())
	t.Setenv("ROLLOUT_FLEET", "cli")
	t.Setenv("ROLLOUT_FLEET_SECRET_FILE", file)
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var serveOut, serveErr bytes.Buffer
	exited := make(chan int, 1)
	go func() {
		exited <- run(ctx, []string{"serve", "--addr", addr, "--kv-blocks", "256", "--server-id", "cli-1", "--log-level", "warn"}, &serveOut, &serveErr)
	}()
	b, err := bus.DialRedis(t.Context(), rs.URL(), bus.RedisOptions{})
	require.NoError(t, err)
	defer b.Close()
	key := protocol.Names{Fleet: "cli"}.Heartbeat("cli-1")
	heartbeat := func() *protocol.Heartbeat {
		raw, err := b.Get(t.Context(), key)
		if err != nil {
			return nil
		}
		hb, err := protocol.DecodeHeartbeat(raw)
		require.NoError(t, err)
		require.NoError(t, hb.Verify([]byte(secret), "cli"))
		return hb
	}
	require.Eventually(t, func() bool { hb := heartbeat(); return hb != nil && hb.InRotation }, 20*time.Second, 10*time.Millisecond,
		"no heartbeat: %s", serveErr.String())
	hb := heartbeat()
	assert.Equal(t, "http://"+addr, hb.AdvertiseURL)
	assert.Equal(t, protocol.StateRunning, hb.State)
	resp, err := http.Get("http://" + addr + "/ready")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)

	cancel()
	select {
	case code := <-exited:
		assert.Equal(t, 0, code, serveErr.String())
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not exit after cancellation")
	}
	hb = heartbeat()
	require.NotNil(t, hb)
	assert.Equal(t, protocol.StateStopping, hb.State)
	assert.False(t, hb.InRotation)
}

// TestServeAdminPostureAndTokenFiles: --admin-token-file (as docker-compose passes it) and
// --api-key-file keep the secrets out of ps and guard their routes.
func TestServeAdminPostureAndTokenFiles(t *testing.T) {
	var out, errb bytes.Buffer
	dir := t.TempDir()
	tokFile, keyFile := filepath.Join(dir, "admin_token"), filepath.Join(dir, "api_key")
	require.NoError(t, os.WriteFile(tokFile, []byte("adm-secret\n"), 0o600))
	require.NoError(t, os.WriteFile(keyFile, []byte("gen-secret\n"), 0o600))
	for _, args := range [][]string{
		{"serve", "--admin-token", "x", "--admin-token-file", tokFile},
		{"serve", "--api-key", "x", "--api-key-file", keyFile},
		{"serve", "--admin-token-file", filepath.Join(dir, "missing")},
	} {
		errb.Reset()
		assert.Equal(t, 1, run(t.Context(), append(args, "--addr", "127.0.0.1:0"), &out, &errb), args)
		assert.Contains(t, errb.String(), "-file", args)
	}

	l, err := net.Listen("tcp", "0.0.0.0:0")
	require.NoError(t, err)
	_, port, _ := net.SplitHostPort(l.Addr().String())
	require.NoError(t, l.Close())
	ctx, cancel := context.WithCancel(t.Context())
	exited := make(chan int, 1)
	var serveErr syncBuffer // the server writes it while the test reads it
	go func() {
		exited <- run(ctx, []string{"serve", "--addr", "0.0.0.0:" + port, "--kv-blocks", "64", "--log-level", "warn",
			"--admin-token-file", tokFile, "--api-key-file", keyFile}, &out, &serveErr)
	}()
	url := "http://127.0.0.1:" + port
	require.Eventually(t, func() bool {
		resp, err := http.Get(url + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 20*time.Second, 10*time.Millisecond, "server did not come up: %s", serveErr.String())
	get := func(path, token string) int {
		req, err := http.NewRequest(http.MethodGet, url+path, nil)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	assert.Equal(t, http.StatusUnauthorized, get("/state", ""))
	assert.Equal(t, http.StatusOK, get("/state", "adm-secret"))
	assert.Equal(t, http.StatusUnauthorized, get("/v1/models", ""))
	assert.Equal(t, http.StatusOK, get("/v1/models", "gen-secret"))
	cancel()
	assert.Equal(t, 0, <-exited, serveErr.String())
	http.DefaultClient.CloseIdleConnections()
}

// TestServeGeneratesAdminTokenForTheCLI: `rollout serve` with no admin token generates one and
// writes it 0600 into the state directory, where `rollout admin` finds it; a client without
// it gets 401 even on loopback. The file goes when the server stops.
func TestServeGeneratesAdminTokenForTheCLI(t *testing.T) {
	addr := freeAddr(t)
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var serveErr syncBuffer
	exited := make(chan int, 1)
	go func() {
		exited <- run(ctx, []string{"serve", "--addr", addr, "--kv-blocks", "64", "--no-spare-weights"}, &bytes.Buffer{}, &serveErr)
	}()
	url := "http://" + addr
	require.Eventually(t, func() bool {
		resp, err := http.Get(url + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 20*time.Second, 10*time.Millisecond, "server did not come up: %s", serveErr.String())
	path := server.AdminTokenFile(server.DefaultStateDir(), port)
	st, err := os.Stat(path)
	require.NoError(t, err, "%s", serveErr.String())
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	assert.Contains(t, serveErr.String(), path, "the path is printed at start")

	resp, err := http.Post(url+"/pause", "application/json", nil)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "%s", body)
	assert.Contains(t, string(body), "admin_token_required")

	var out, errb bytes.Buffer
	require.Equal(t, 0, run(t.Context(), []string{"admin", "--server", url, "POST", "/pause?mode=keep"}, &out, &errb), errb.String())
	assert.Contains(t, out.String(), `"status":"paused"`)
	out.Reset()
	require.Equal(t, 0, run(t.Context(), []string{"admin", "--server", url, "GET", "/state"}, &out, &errb), errb.String())
	assert.Contains(t, out.String(), `"state":"paused"`)
	out.Reset()
	require.Equal(t, 0, run(t.Context(), []string{"admin", "--server", url, "POST", "/resume"}, &out, &errb), errb.String())
	out.Reset()
	require.Equal(t, 0, run(t.Context(), []string{"admin", "--server", url, "--print-token"}, &out, &errb), errb.String())
	tok, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, string(tok), out.String())
	// A refused call exits 1 with the server's error on one line.
	errb.Reset()
	assert.Equal(t, 1, run(t.Context(), []string{"admin", "--server", url, "POST", "/sleep?level=9"}, &out, &errb))
	assert.Contains(t, errb.String(), "invalid_value")

	cancel()
	select {
	case code := <-exited:
		assert.Equal(t, 0, code, serveErr.String())
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not exit")
	}
	_, err = os.Stat(path)
	assert.ErrorIs(t, err, os.ErrNotExist, "the token file is removed at stop")
	http.DefaultClient.CloseIdleConnections()
}

// TestSecretFlagsWarn: a secret given as a flag value on the command line (visible in ps) is
// warned about, naming the -file flag; the same secret from a file or the environment is not.
func TestSecretFlagsWarn(t *testing.T) {
	secret := "a-fleet-secret-of-at-least-32-bytes!"
	var out, errb bytes.Buffer
	// Without --fleet the server refuses to start after the warning: no server needed.
	assert.Equal(t, 1, run(t.Context(), []string{"serve", "--addr", "127.0.0.1:0", "--fleet-secret", secret}, &out, &errb))
	assert.Contains(t, errb.String(), "--fleet-secret on the command line is visible to every local user")
	assert.Contains(t, errb.String(), "--fleet-secret-file")
	assert.NotContains(t, errb.String(), secret, "the warning does not repeat the secret")

	file := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(file, []byte(secret), 0o600))
	errb.Reset()
	assert.Equal(t, 1, run(t.Context(), []string{"serve", "--addr", "127.0.0.1:0", "--fleet-secret-file", file}, &out, &errb))
	assert.NotContains(t, errb.String(), "visible to every local user")
	t.Setenv("ROLLOUT_FLEET_SECRET", secret)
	errb.Reset()
	assert.Equal(t, 1, run(t.Context(), []string{"serve", "--addr", "127.0.0.1:0"}, &out, &errb))
	assert.NotContains(t, errb.String(), "visible to every local user")
	assert.Contains(t, errb.String(), "need --fleet", "the environment's secret was read")
}

// TestServeAdminListenerTokenFile: with the admin routes on a TCP listener of their own, the
// generated token is filed under that listener's port, so `rollout admin --server` pointed at
// it finds the token.
func TestServeAdminListenerTokenFile(t *testing.T) {
	addr, admAddr := freeAddr(t), freeAddr(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var serveErr syncBuffer
	exited := make(chan int, 1)
	go func() {
		exited <- run(ctx, []string{"serve", "--addr", addr, "--admin-addr", admAddr, "--kv-blocks", "64", "--no-spare-weights"}, &bytes.Buffer{}, &serveErr)
	}()
	adm := "http://" + admAddr
	require.Eventually(t, func() bool {
		resp, err := http.Get(adm + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 20*time.Second, 10*time.Millisecond, "server did not come up: %s", serveErr.String())
	var out, errb bytes.Buffer
	require.Equal(t, 0, run(t.Context(), []string{"admin", "--server", adm, "GET", "/is_paused"}, &out, &errb), errb.String())
	assert.JSONEq(t, `{"is_paused":false}`, out.String())
	cancel()
	assert.Equal(t, 0, <-exited, serveErr.String())
	http.DefaultClient.CloseIdleConnections()
}
