package bus_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/internal/redistest"
	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/bus/bustest"
	"github.com/rolloutkit/rollout/sdk/bus/redisconf"
)

func dialConfig(t *testing.T, c redisconf.Config, o bus.RedisOptions) *bus.Redis {
	t.Helper()
	b, err := bus.DialRedisConfig(t.Context(), c, o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// roundTrip checks a bus works end to end: a key, and a message to a subscriber.
func roundTrip(t *testing.T, b bus.Bus) {
	t.Helper()
	ctx := t.Context()
	require.NoError(t, b.Set(ctx, "rt:k", []byte("v"), time.Minute))
	v, err := b.Get(ctx, "rt:k")
	require.NoError(t, err)
	require.Equal(t, "v", string(v))
	sub, err := b.Subscribe(ctx, "rt:c")
	require.NoError(t, err)
	defer sub.Close()
	n, err := b.Publish(ctx, "rt:c", []byte("hi"))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, "hi", string(next(t, sub).Payload))
}

func TestRedisTLSContract(t *testing.T) {
	s := redistest.StartWith(t, redistest.Options{TLS: true})
	conf := redisconf.Config{URL: s.URL(), CAFile: s.TLS().CA}
	bustest.Run(t, func(t *testing.T) bus.Bus { return dialConfig(t, conf, bus.RedisOptions{}) })
}

// A TLS server is never reached in plain text, nor with a CA that did not sign it, and a
// plain server is not mistaken for a TLS one: each fails at dial with an error saying so.
func TestRedisTLSRefusals(t *testing.T) {
	s := redistest.StartWith(t, redistest.Options{TLS: true})
	ctx := t.Context()
	fast := bus.RedisOptions{DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second}

	wrong := redistest.GenerateTLS(t, t.TempDir())
	_, err := bus.DialRedisConfig(ctx, redisconf.Config{URL: s.URL(), CAFile: wrong.CA}, fast)
	require.ErrorIs(t, err, bus.ErrTLS)
	require.NotErrorIs(t, err, bus.ErrUnavailable)
	require.Contains(t, err.Error(), "certificate")

	// Without a CA file the system roots do not know the test CA either.
	_, err = bus.DialRedisConfig(ctx, redisconf.Config{URL: s.URL()}, fast)
	require.ErrorIs(t, err, bus.ErrTLS)

	// The right CA but a name the certificate does not carry.
	_, err = bus.DialRedisConfig(ctx, redisconf.Config{URL: s.URL(), CAFile: s.TLS().CA, ServerName: "redis.example"}, fast)
	require.ErrorIs(t, err, bus.ErrTLS)
	require.Contains(t, err.Error(), "redis.example")

	// Plain text to the TLS port: the server hangs up, and the error points at rediss://.
	_, err = bus.DialRedis(ctx, "redis://"+s.Addr(), fast)
	require.Error(t, err)
	require.Contains(t, err.Error(), "rediss://")

	// A CA file with a plain URL is refused before any dial: it would talk plain text.
	_, err = bus.DialRedisConfig(ctx, redisconf.Config{URL: "redis://" + s.Addr(), CAFile: s.TLS().CA}, fast)
	require.ErrorIs(t, err, redisconf.ErrTLSFiles)

	// TLS to a plain server: it reads the ClientHello as a command that never ends, so the
	// handshake fails by the deadline (or by the server's error reply): never a connection.
	plain := redistest.Start(t)
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = bus.DialRedisConfig(short, redisconf.Config{URL: "rediss://" + plain.Addr(), CAFile: s.TLS().CA}, fast)
	require.Error(t, err)
	require.True(t, errors.Is(err, bus.ErrTLS) || errors.Is(err, bus.ErrUnavailable), "%v", err)
}

func TestRedisTLSClientCertificate(t *testing.T) {
	s := redistest.StartWith(t, redistest.Options{TLS: true, TLSClientAuth: true})
	f := s.TLS()
	_, err := bus.DialRedisConfig(t.Context(), redisconf.Config{URL: s.URL(), CAFile: f.CA},
		bus.RedisOptions{DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second})
	require.Error(t, err, "the server requires a client certificate")
	b := dialConfig(t, redisconf.Config{URL: s.URL(), CAFile: f.CA, CertFile: f.ClientCert, KeyFile: f.ClientKey}, bus.RedisOptions{})
	roundTrip(t, b)
}

func TestRedisACL(t *testing.T) {
	s := redistest.StartWith(t, redistest.Options{Args: []string{
		"--user", "default", "off",
		"--user", "alice", "on", ">alice-pw", "~*", "&*", "+@all",
	}})
	ctx := t.Context()
	pwFile := filepath.Join(t.TempDir(), "pw")
	require.NoError(t, os.WriteFile(pwFile, []byte("alice-pw\n"), 0o600))

	roundTrip(t, dialConfig(t, redisconf.Config{URL: "redis://alice:alice-pw@" + s.Addr()}, bus.RedisOptions{}))
	roundTrip(t, dialConfig(t, redisconf.Config{URL: "redis://alice@" + s.Addr(), PasswordFile: pwFile}, bus.RedisOptions{}))
	c := redisconf.Config{URL: s.URL(), Username: "alice"}
	c.LoadEnv(func(k string) (string, bool) {
		if k == redisconf.EnvPassword {
			return "alice-pw", true
		}
		return "", false
	})
	roundTrip(t, dialConfig(t, c, bus.RedisOptions{}))

	for name, conf := range map[string]redisconf.Config{
		"wrong password": {URL: "redis://alice:wrong-s3cret@" + s.Addr()},
		"wrong user":     {URL: "redis://bob:alice-pw@" + s.Addr()},
		"no password":    {URL: "redis://alice@" + s.Addr()},
		"default user":   {URL: s.URL()},
	} {
		_, err := bus.DialRedisConfig(ctx, conf, bus.RedisOptions{})
		require.ErrorIs(t, err, bus.ErrAuth, name)
		require.NotErrorIs(t, err, bus.ErrUnavailable, name)
		require.NotContains(t, err.Error(), "wrong-s3cret", name)
	}
}

func TestRedisSentinelContract(t *testing.T) {
	ss := redistest.StartSentinel(t, 1, 1, nil, nil)
	bustest.Run(t, func(t *testing.T) bus.Bus {
		b := dialConfig(t, redisconf.Config{URL: ss.URL()}, bus.RedisOptions{})
		require.Equal(t, redisconf.Sentinel, b.Mode())
		return b
	})
}

// Sentinel with passwords on the data nodes and on the sentinels, each from its own file.
func TestRedisSentinelAuth(t *testing.T) {
	ss := redistest.StartSentinel(t, 1, 1,
		[]string{"--requirepass", "data-pw", "--masterauth", "data-pw"},
		[]string{"--requirepass", "sentinel-pw"})
	dir := t.TempDir()
	data, sen := filepath.Join(dir, "data"), filepath.Join(dir, "sentinel")
	require.NoError(t, os.WriteFile(data, []byte("data-pw"), 0o600))
	require.NoError(t, os.WriteFile(sen, []byte("sentinel-pw"), 0o600))
	roundTrip(t, dialConfig(t, redisconf.Config{URL: ss.URL(), PasswordFile: data, SentinelPasswordFile: sen}, bus.RedisOptions{}))
	_, err := bus.DialRedisConfig(t.Context(), redisconf.Config{URL: ss.URL(), PasswordFile: data},
		bus.RedisOptions{DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second})
	require.Error(t, err, "the sentinels want their own password")
}

func TestRedisClusterContract(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node cluster")
	}
	c := redistest.StartCluster(t, 3)
	bustest.Run(t, func(t *testing.T) bus.Bus {
		b := dialConfig(t, redisconf.Config{URL: c.URL()}, bus.RedisOptions{})
		require.Equal(t, redisconf.Cluster, b.Mode())
		return b
	})
}
