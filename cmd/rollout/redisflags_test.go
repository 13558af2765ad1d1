package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/internal/redistest"
	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/bus/redisconf"
	"github.com/rolloutkit/rollout/sdk/protocol"
)

// TestRedisFlagsBadInput: every command that takes --redis refuses a Redis configuration it
// could never use, on one line that names the problem and never the password.
func TestRedisFlagsBadInput(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.pem")
	fleet := []string{"--fleet", "demo", "--addr", "127.0.0.1:0"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--redis", "http://u:s3cret@127.0.0.1:1"}, "unknown scheme"},
		{[]string{"serve", "--redis", "127.0.0.1:6379"}, "not a URL"},
		{[]string{"serve", "--redis", "redis://u:s3cret@127.0.0.1:1/db0"}, "database"},
		{[]string{"serve", "--redis", "redis+sentinel://u:s3cret@127.0.0.1:1"}, "sentinel master"},
		{[]string{"serve", "--redis", "rediss://127.0.0.1:1", "--redis-ca-file", missing}, "missing.pem"},
		{[]string{"serve", "--redis", "redis://127.0.0.1:1", "--redis-ca-file", missing}, "rediss://"},
		{[]string{"serve", "--redis", "redis://127.0.0.1:1", "--redis-password-file", missing}, "password file"},
		{[]string{"serve", "--redis", "redis+cluster://127.0.0.1:1", "--redis-sentinel-master", "m"}, "conflicting"},
	} {
		args := append(tc.args, fleet...)
		var out, errb bytes.Buffer
		assert.Equal(t, 1, run(t.Context(), args, &out, &errb), args)
		assert.Contains(t, errb.String(), tc.want, args)
		assert.NotContains(t, errb.String(), "s3cret", args)
		assert.Equal(t, 1, bytes.Count(errb.Bytes(), []byte("\n")), errb.String())
	}
	for _, args := range [][]string{
		{"fleet", "status", "--redis", "redis+sentinel://u:s3cret@127.0.0.1:1", "--fleet", "demo"},
		{"generate", "--redis", "rediss://127.0.0.1:1", "--redis-ca-file", missing, "--fleet", "demo", "hi"},
		{"bench", "fleet", "--redis", "redis+cluster://127.0.0.1:1/2", "--figures", "control", "--servers", "1"},
	} {
		var out, errb bytes.Buffer
		assert.Equal(t, 1, run(t.Context(), args, &out, &errb), args)
		assert.Contains(t, errb.String(), "invalid", args)
		assert.NotContains(t, errb.String(), "s3cret", args)
	}
}

// TestServeAndFleetOverTLSWithACL: `rollout serve` reaches a TLS-only redis-server as an ACL
// user (CA from --redis-ca-file, password from ROLLOUT_REDIS_PASSWORD), and `rollout fleet
// status` sees it through the same flags with --redis-password-file.
func TestServeAndFleetOverTLSWithACL(t *testing.T) {
	rs := redistest.StartWith(t, redistest.Options{TLS: true, Args: []string{
		"--user", "default", "off", "--user", "alice", "on", ">alice-pw", "~*", "&*", "+@all"}})
	url := "rediss://alice@" + rs.Addr()
	ca := rs.TLS().CA
	pwFile := filepath.Join(t.TempDir(), "redis-pw")
	require.NoError(t, os.WriteFile(pwFile, []byte("alice-pw\n"), 0o600))

	t.Setenv(redisconf.EnvPassword, "alice-pw")
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var serveOut, serveErr syncBuffer // read while the server writes its log
	exited := make(chan int, 1)
	go func() {
		exited <- run(ctx, []string{"serve", "--addr", addr, "--kv-blocks", "256", "--server-id", "tls-1", "--log-level", "warn",
			"--fleet", "tls", "--redis", url, "--redis-ca-file", ca, "--insecure-unsigned-fleet"}, &serveOut, &serveErr)
	}()
	b, err := bus.DialRedisConfig(t.Context(), redisconf.Config{URL: url, CAFile: ca, PasswordFile: pwFile}, bus.RedisOptions{})
	require.NoError(t, err)
	defer b.Close()
	key := protocol.Names{Fleet: "tls"}.Heartbeat("tls-1")
	require.Eventually(t, func() bool {
		raw, err := b.Get(t.Context(), key)
		if err != nil {
			return false
		}
		hb, err := protocol.DecodeHeartbeat(raw)
		return err == nil && hb.InRotation
	}, 30*time.Second, 10*time.Millisecond, "no heartbeat over TLS: %s", serveErr.String())

	t.Setenv(redisconf.EnvPassword, "") // the file alone, now
	var out, errb bytes.Buffer
	require.Equal(t, 0, run(t.Context(), []string{"fleet", "status", "--fleet", "tls", "--redis", url, "--redis-ca-file", ca,
		"--redis-password-file", pwFile, "--insecure-unsigned-fleet"}, &out, &errb), errb.String())
	assert.Contains(t, out.String(), "tls-1")

	// The same without the CA: refused, never plain text.
	out.Reset()
	errb.Reset()
	assert.Equal(t, 1, run(t.Context(), []string{"fleet", "status", "--fleet", "tls", "--redis", url,
		"--redis-password-file", pwFile, "--insecure-unsigned-fleet"}, &out, &errb))
	assert.Contains(t, errb.String(), "TLS")

	cancel()
	select {
	case code := <-exited:
		assert.Equal(t, 0, code, serveErr.String())
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not exit after cancellation")
	}
}
