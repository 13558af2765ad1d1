package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/sdk/protocol"
)

// TestFleetKeys: `fleet keys new` writes a secret (0600), `issue` a server key under it that
// trusts its trainer key (and an earlier one with --also-trust), `show` prints both; no file
// is overwritten.
func TestFleetKeys(t *testing.T) {
	dir := t.TempDir()
	secret, old := filepath.Join(dir, "fleet.secret"), filepath.Join(dir, "old.secret")
	assert.Contains(t, runOK(t, "fleet", "keys", "new", "--out", secret), "trainer key id")
	runOK(t, "fleet", "keys", "new", "--out", old)
	st, err := os.Stat(secret)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	var out, errb bytes.Buffer
	assert.Equal(t, 1, run(t.Context(), []string{"fleet", "keys", "new", "--out", secret}, &out, &errb), "never overwritten")

	key := filepath.Join(dir, "s1.key")
	runOK(t, "fleet", "keys", "issue", "--fleet", "demo", "--fleet-secret-file", secret, "--server-id", "s1", "--out", key, "--also-trust", old)
	b, err := os.ReadFile(key)
	require.NoError(t, err)
	k, err := protocol.ParseServerKey(b)
	require.NoError(t, err)
	assert.Equal(t, "s1", k.ServerID())
	assert.Len(t, k.TrustedKeys(), 2)
	s, err := readSecretFile(secret)
	require.NoError(t, err)
	trainer, err := protocol.NewAuth([]byte(s))
	require.NoError(t, err)
	assert.Equal(t, trainer.KeyID(), k.KeyID())

	shown := runOK(t, "fleet", "keys", "show", "--fleet-secret-file", secret)
	assert.Contains(t, shown, trainer.KeyID())
	assert.Contains(t, runOK(t, "fleet", "keys", "show", key), "server s1")

	out.Reset()
	errb.Reset()
	assert.Equal(t, 1, run(t.Context(), []string{"fleet", "keys", "issue", "--fleet", "demo", "--server-id", "s2", "--out", filepath.Join(dir, "s2.key")}, &out, &errb))
	assert.Contains(t, errb.String(), "--fleet-secret-file")
}
