package redisconf_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/sdk/bus/redisconf"
)

func write(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

func TestResolveModes(t *testing.T) {
	for _, tc := range []struct {
		name     string
		conf     redisconf.Config
		mode     redisconf.Mode
		addrs    []string
		master   string
		db       int
		user, pw string
		tls      bool
	}{
		{name: "single", conf: redisconf.Config{URL: "redis://127.0.0.1:6380/2"}, mode: redisconf.Single, addrs: []string{"127.0.0.1:6380"}, db: 2},
		{name: "default port", conf: redisconf.Config{URL: "redis://localhost"}, mode: redisconf.Single, addrs: []string{"localhost:6379"}},
		{name: "ipv6", conf: redisconf.Config{URL: "redis://[::1]:7000"}, mode: redisconf.Single, addrs: []string{"[::1]:7000"}},
		{name: "acl in URL", conf: redisconf.Config{URL: "redis://alice:pw@h:1/0"}, mode: redisconf.Single, addrs: []string{"h:1"}, user: "alice", pw: "pw"},
		{name: "acl from settings", conf: redisconf.Config{URL: "redis://h:1", Username: "alice", Password: "pw"}, mode: redisconf.Single, addrs: []string{"h:1"}, user: "alice", pw: "pw"},
		{name: "tls", conf: redisconf.Config{URL: "rediss://h:1"}, mode: redisconf.Single, addrs: []string{"h:1"}, tls: true},
		{name: "sentinel URL", conf: redisconf.Config{URL: "redis+sentinel://alice@s1,s2:26380/mymaster/3"}, mode: redisconf.Sentinel,
			addrs: []string{"s1:26379", "s2:26380"}, master: "mymaster", db: 3, user: "alice"},
		{name: "sentinel flag", conf: redisconf.Config{URL: "redis://s1:5000,s2:5001/1", SentinelMaster: "m"}, mode: redisconf.Sentinel,
			addrs: []string{"s1:5000", "s2:5001"}, master: "m", db: 1},
		{name: "sentinel URL and matching flag", conf: redisconf.Config{URL: "rediss+sentinel://s1/m", SentinelMaster: "m"}, mode: redisconf.Sentinel,
			addrs: []string{"s1:26379"}, master: "m", tls: true},
		{name: "cluster scheme one seed", conf: redisconf.Config{URL: "redis+cluster://n1:7000"}, mode: redisconf.Cluster, addrs: []string{"n1:7000"}},
		{name: "cluster by addresses", conf: redisconf.Config{URL: "rediss://n1:7000,n2:7001,[::1]:7002?pool_size=7"}, mode: redisconf.Cluster,
			addrs: []string{"n1:7000", "n2:7001", "[::1]:7002"}, tls: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := tc.conf.Resolve()
			require.NoError(t, err)
			assert.Equal(t, tc.mode, r.Mode)
			o := r.Options
			assert.Equal(t, tc.addrs, o.Addrs)
			assert.Equal(t, tc.master, o.MasterName)
			assert.Equal(t, tc.db, o.DB)
			assert.Equal(t, tc.user, o.Username)
			assert.Equal(t, tc.pw, o.Password)
			assert.Equal(t, tc.mode == redisconf.Cluster, o.IsClusterMode)
			assert.Equal(t, tc.tls, o.TLSConfig != nil)
			if o.TLSConfig != nil {
				assert.NotEmpty(t, o.TLSConfig.ServerName)
			}
			assert.NotContains(t, r.Redacted, ":pw@")
			// The go-redis client it builds is the kind the mode says.
			c := r.NewClient()
			defer c.Close()
			switch tc.mode {
			case redisconf.Cluster:
				assert.Contains(t, typeName(c), "ClusterClient")
			default:
				assert.Contains(t, typeName(c), "redis.Client")
			}
		})
	}
}

func typeName(v any) string { return fmt.Sprintf("%T", v) }

func TestResolveQueryOptionsReachGoRedis(t *testing.T) {
	r, err := redisconf.Config{URL: "redis://h:1/0?pool_size=9&dial_timeout=2s"}.Resolve()
	require.NoError(t, err)
	assert.Equal(t, 9, r.Options.PoolSize)
	assert.Equal(t, "2s", r.Options.DialTimeout.String())
	r, err = redisconf.Config{URL: "redis+cluster://a:1,b:2?max_redirects=4"}.Resolve()
	require.NoError(t, err)
	assert.Equal(t, 4, r.Options.MaxRedirects)
	r, err = redisconf.Config{URL: "redis+sentinel://a:1/m?pool_size=3"}.Resolve()
	require.NoError(t, err)
	assert.Equal(t, 3, r.Options.PoolSize)
}

func TestSecrets(t *testing.T) {
	pwFile := write(t, "pw", "s3cret\n")
	r, err := redisconf.Config{URL: "redis://alice@h:1", PasswordFile: pwFile}.Resolve()
	require.NoError(t, err)
	assert.Equal(t, "s3cret", r.Options.Password, "trailing newline dropped")
	assert.Empty(t, r.Warnings)

	r, err = redisconf.Config{URL: "redis://alice:s3cret@h:1"}.Resolve()
	require.NoError(t, err)
	require.Len(t, r.Warnings, 1, "a password in the URL is warned about")
	assert.NotContains(t, r.Warnings[0], "s3cret")
	assert.NotContains(t, r.Redacted, "s3cret")

	sFile := write(t, "spw", "sentinel-pw")
	r, err = redisconf.Config{URL: "redis+sentinel://s:1/m", SentinelPasswordFile: sFile, SentinelUsername: "sen"}.Resolve()
	require.NoError(t, err)
	assert.Equal(t, "sentinel-pw", r.Options.SentinelPassword)
	assert.Equal(t, "sen", r.Options.SentinelUsername)
	assert.Empty(t, r.Options.Password, "the sentinels' password is not the data nodes'")
}

func TestLoadEnv(t *testing.T) {
	env := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	c := redisconf.Config{URL: "redis+sentinel://s:1/m"}
	c.LoadEnv(env(map[string]string{redisconf.EnvPassword: "a", redisconf.EnvRedisCLIAuth: "b", redisconf.EnvSentinelPassword: "c"}))
	assert.Equal(t, "a", c.Password)
	assert.Equal(t, "c", c.SentinelPassword)

	c = redisconf.Config{URL: "redis://h:1"}
	c.LoadEnv(env(map[string]string{redisconf.EnvRedisCLIAuth: "b"}))
	assert.Equal(t, "b", c.Password, "REDISCLI_AUTH is the fallback")

	// A password given otherwise wins, and the configuration stays valid.
	c = redisconf.Config{URL: "redis://u:inurl@h:1"}
	c.LoadEnv(env(map[string]string{redisconf.EnvPassword: "a"}))
	assert.Empty(t, c.Password)
	_, err := c.Resolve()
	require.NoError(t, err)
	c = redisconf.Config{URL: "redis+cluster://u:inurl@a:1,b"}
	c.LoadEnv(env(map[string]string{redisconf.EnvPassword: "a"}))
	assert.Empty(t, c.Password, "several hosts")
	_, err = c.Resolve()
	require.NoError(t, err)
	c = redisconf.Config{URL: "redis://h:1", PasswordFile: "/f"}
	c.LoadEnv(env(map[string]string{redisconf.EnvPassword: "a"}))
	assert.Empty(t, c.Password)
}

func TestResolveBadInput(t *testing.T) {
	dir := t.TempDir()
	notPEM := write(t, "ca.pem", "not a certificate")
	empty := write(t, "empty", "\n")
	for _, tc := range []struct {
		name string
		conf redisconf.Config
		want error
		says string
	}{
		{"empty", redisconf.Config{}, redisconf.ErrURL, "no Redis URL"},
		{"host:port alone", redisconf.Config{URL: "127.0.0.1:6379"}, redisconf.ErrScheme, "not a URL"},
		{"unknown scheme", redisconf.Config{URL: "http://u:s3cret@h:1"}, redisconf.ErrScheme, `"http"`},
		{"typo scheme", redisconf.Config{URL: "redis+sentinal://h:1/m"}, redisconf.ErrScheme, "redis+sentinal"},
		{"no host", redisconf.Config{URL: "redis://"}, redisconf.ErrURL, "no host"},
		{"no host with user", redisconf.Config{URL: "redis://u:s3cret@/0"}, redisconf.ErrURL, "no host"},
		{"unclosed ipv6", redisconf.Config{URL: "redis://[::1"}, redisconf.ErrURL, ""},
		{"bare ipv6", redisconf.Config{URL: "redis+cluster://a:1,::1:2"}, redisconf.ErrURL, "brackets"},
		{"bad port", redisconf.Config{URL: "redis://u:s3cret@h:99999"}, redisconf.ErrURL, "port"},
		{"empty address", redisconf.Config{URL: "redis+cluster://a:1,,b:2"}, redisconf.ErrURL, "empty"},
		{"bad db", redisconf.Config{URL: "redis://u:s3cret@h:1/notadb"}, redisconf.ErrURL, "database"},
		{"negative db", redisconf.Config{URL: "redis://h:1/-1"}, redisconf.ErrURL, "database"},
		{"deep path", redisconf.Config{URL: "redis://u:s3cret@h:1/0/1"}, redisconf.ErrURL, "path"},
		{"bad option", redisconf.Config{URL: "redis://h:1/0?pool_size=many"}, redisconf.ErrURL, "pool_size"},
		{"unknown option", redisconf.Config{URL: "redis://h:1/0?colour=blue"}, redisconf.ErrURL, "colour"},
		{"password in query", redisconf.Config{URL: "redis://h:1/0?password=s3cret"}, redisconf.ErrURL, "password file"},
		{"addr in query", redisconf.Config{URL: "redis://h:1/0?addr=h:2"}, redisconf.ErrURL, "host part"},
		{"replica reads", redisconf.Config{URL: "redis+cluster://h:1?read_only=true"}, redisconf.ErrURL, "primary"},
		{"fragment", redisconf.Config{URL: "redis://h:1#x"}, redisconf.ErrURL, "fragment"},
		{"sentinel without master", redisconf.Config{URL: "redis+sentinel://u:s3cret@s:1"}, redisconf.ErrNoMaster, "MASTER"},
		{"sentinel blank master", redisconf.Config{URL: "redis+sentinel://s:1/%20"}, redisconf.ErrNoMaster, ""},
		{"sentinel master differs", redisconf.Config{URL: "redis+sentinel://s:1/a", SentinelMaster: "b"}, redisconf.ErrConflict, `"a"`},
		{"sentinel master on cluster", redisconf.Config{URL: "redis+cluster://s:1", SentinelMaster: "b"}, redisconf.ErrConflict, "cluster"},
		{"sentinel path too deep", redisconf.Config{URL: "redis+sentinel://s:1/m/0/1"}, redisconf.ErrURL, "path"},
		{"cluster db", redisconf.Config{URL: "redis+cluster://a:1,b:2/3"}, redisconf.ErrURL, "database 0"},
		{"sentinel creds without sentinel", redisconf.Config{URL: "redis://h:1", SentinelPassword: "x"}, redisconf.ErrConflict, "not a sentinel"},
		{"two passwords", redisconf.Config{URL: "redis://u:s3cret@h:1", PasswordFile: empty}, redisconf.ErrConflict, "more than one"},
		{"two sentinel passwords", redisconf.Config{URL: "redis+sentinel://h:1/m", SentinelPassword: "x", SentinelPasswordFile: empty}, redisconf.ErrConflict, "exclusive"},
		{"two users", redisconf.Config{URL: "redis://alice@h:1", Username: "bob"}, redisconf.ErrConflict, "bob"},
		{"missing password file", redisconf.Config{URL: "redis://h:1", PasswordFile: filepath.Join(dir, "nope")}, redisconf.ErrSecretFile, "nope"},
		{"empty password file", redisconf.Config{URL: "redis://h:1", PasswordFile: empty}, redisconf.ErrSecretFile, "empty"},
		{"missing sentinel password file", redisconf.Config{URL: "redis+sentinel://h:1/m", SentinelPasswordFile: filepath.Join(dir, "nope")}, redisconf.ErrSecretFile, "nope"},
		{"CA file with redis://", redisconf.Config{URL: "redis://h:1", CAFile: notPEM}, redisconf.ErrTLSFiles, "rediss://"},
		{"unreadable CA file", redisconf.Config{URL: "rediss://h:1", CAFile: filepath.Join(dir, "missing-ca.pem")}, redisconf.ErrTLSFiles, "missing-ca.pem"},
		{"CA file not PEM", redisconf.Config{URL: "rediss://h:1", CAFile: notPEM}, redisconf.ErrTLSFiles, "no PEM certificate"},
		{"cert without key", redisconf.Config{URL: "rediss://h:1", CertFile: notPEM}, redisconf.ErrTLSFiles, "both"},
		{"bad client cert", redisconf.Config{URL: "rediss://h:1", CertFile: notPEM, KeyFile: notPEM}, redisconf.ErrTLSFiles, "client certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.conf.Resolve()
			require.Error(t, err)
			assert.ErrorIs(t, err, redisconf.ErrInvalid)
			assert.ErrorIs(t, err, tc.want)
			assert.Contains(t, err.Error(), tc.says)
			assert.NotContains(t, err.Error(), "s3cret", "the password leaked into the error")
			for _, other := range []error{redisconf.ErrScheme, redisconf.ErrURL, redisconf.ErrNoMaster, redisconf.ErrTLSFiles, redisconf.ErrSecretFile, redisconf.ErrConflict} {
				if !errors.Is(tc.want, other) {
					assert.NotErrorIs(t, err, other, "one kind per error")
				}
			}
		})
	}
}

func TestRedact(t *testing.T) {
	assert.Equal(t, "redis://alice:xxxxx@h:1/0", redisconf.Redact("redis://alice:s3cret@h:1/0"))
	assert.Equal(t, "redis://h:1", redisconf.Redact("redis://h:1"))
	assert.NotContains(t, redisconf.Redact("redis://u:s3cret@[::1"), "s3cret")
	assert.NotContains(t, redisconf.Redact("u:s3cret@[::1"), "s3cret")
	r, err := redisconf.Config{URL: "redis+sentinel://u:s3cret@a:1,b:2/m"}.Resolve()
	require.NoError(t, err)
	assert.Equal(t, "redis+sentinel://u:xxxxx@a:1,b:2/m", r.Redacted, "every address, no password")
	assert.Equal(t, "master m via sentinels a:1,b:2", r.Addrs())
}
