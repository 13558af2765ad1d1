package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/weights"
)

// runOK runs the CLI and fails the test on a non-zero exit; it returns stdout.
func runOK(t *testing.T, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	require.Equal(t, 0, run(t.Context(), args, &out, &errb), "%v: %s", args, errb.String())
	return out.String()
}

func fileSHA(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestWeightsDigestMatchesShellRecipe checks both checkpoint formats against what the help
// text promises: sha256sum of the .bin, and `sha256sum config.json model.safetensors | sha256sum`
// for a Hugging Face directory.
func TestWeightsDigestMatchesShellRecipe(t *testing.T) {
	dir := t.TempDir()
	hf, l2c := filepath.Join(dir, "hf"), filepath.Join(dir, "l2c")
	runOK(t, "model", "init", "--preset", "tiny", "--seed", "3", "--out", hf)
	runOK(t, "model", "init", "--preset", "tiny", "--seed", "3", "--out", l2c, "--format", "llama2c")

	listing := fmt.Sprintf("%s  config.json\n%s  model.safetensors\n",
		fileSHA(t, filepath.Join(hf, "config.json")), fileSHA(t, filepath.Join(hf, "model.safetensors")))
	want := sha256.Sum256([]byte(listing))
	assert.Equal(t, hex.EncodeToString(want[:])+"\n", runOK(t, "weights", "digest", hf))

	bin := filepath.Join(l2c, "model.bin")
	assert.Equal(t, fileSHA(t, bin)+"\n", runOK(t, "weights", "digest", bin))

	var r digestResult
	require.NoError(t, json.Unmarshal([]byte(runOK(t, "weights", "digest", "--json", bin)), &r))
	assert.Equal(t, digestResult{Path: bin, Format: "llama2c", SHA256: fileSHA(t, bin)}, r)
	require.NoError(t, json.Unmarshal([]byte(runOK(t, "weights", "digest", "--json", hf)), &r))
	assert.Equal(t, "hf", r.Format)
}

func TestWeightsDigestBadInput(t *testing.T) {
	dir := t.TempDir()
	notCkpt := filepath.Join(dir, "notes.txt")
	require.NoError(t, os.WriteFile(notCkpt, []byte("x"), 0o600))
	for _, args := range [][]string{
		{"weights", "digest"},
		{"weights", "digest", filepath.Join(dir, "missing")},
		{"weights", "digest", dir}, // a directory without config.json
	} {
		var out, errb bytes.Buffer
		assert.Equal(t, 1, run(t.Context(), args, &out, &errb), args)
		assert.Empty(t, out.String(), args)
		assert.Equal(t, 1, strings.Count(errb.String(), "\n"), "%v: %q", args, errb.String())
	}
}

// TestWeightsDigestIsWhatUpdateWeightsChecks feeds the printed digest to a running server's
// /update_weights: accepted as is, refused with one hex digit changed.
func TestWeightsDigestIsWhatUpdateWeightsChecks(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	ckpt := filepath.Join(t.TempDir(), "ckpt")
	runOK(t, "model", "init", "--preset", "tiny", "--seed", "9", "--out", ckpt)
	sum := strings.TrimSpace(runOK(t, "weights", "digest", ckpt))

	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var serveErr bytes.Buffer
	exited := make(chan int, 1)
	go func() {
		exited <- run(ctx, []string{"serve", "--model", ckpt, "--addr", addr, "--kv-blocks", "64", "--log-level", "error",
			"--weights-root", filepath.Dir(ckpt)}, &bytes.Buffer{}, &serveErr)
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

	// Through `rollout admin`, which finds the token the server generated.
	update := func(version int, digest string) int {
		body := fmt.Sprintf(`{"version":%d,"source":%q,"sha256":%q}`, version, ckpt, digest)
		var out, errb bytes.Buffer
		if run(t.Context(), []string{"admin", "--server", url, "POST", "/update_weights", body}, &out, &errb) == 0 {
			return http.StatusOK
		}
		if strings.Contains(errb.String(), ": 422 ") {
			return http.StatusUnprocessableEntity
		}
		t.Logf("rollout admin: %s", errb.String())
		return 0
	}
	bad := []byte(sum)
	if bad[0] == '0' {
		bad[0] = '1'
	} else {
		bad[0] = '0'
	}
	assert.Equal(t, http.StatusUnprocessableEntity, update(1, string(bad)), "a changed digest is refused")
	assert.Equal(t, http.StatusOK, update(1, sum), "the printed digest is accepted")

	cancel()
	select {
	case code := <-exited:
		assert.Equal(t, 0, code, serveErr.String())
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not exit")
	}
}

// TestWeightsServe serves a store with one version and loads it over HTTP the way a server's
// weight update does, with the digest the index lists, which is `weights digest`'s.
func TestWeightsServe(t *testing.T) {
	store := t.TempDir()
	runOK(t, "model", "init", "--preset", "tiny", "--seed", "4", "--out", filepath.Join(store, "v1"))
	sum := strings.TrimSpace(runOK(t, "weights", "digest", filepath.Join(store, "v1")))

	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var out, errb syncBuffer
	exited := make(chan int, 1)
	go func() { exited <- run(ctx, []string{"weights", "serve", store, "--addr", addr}, &out, &errb) }()
	base := "http://" + addr
	var idx struct {
		Versions []struct {
			Version int64  `json:"version"`
			SHA256  string `json:"sha256"`
			Path    string `json:"path"`
		} `json:"versions"`
		Latest int64 `json:"latest"`
	}
	require.Eventually(t, func() bool {
		resp, err := http.Get(base + "/index.json")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&idx) == nil
	}, 20*time.Second, 10*time.Millisecond, "weights serve did not come up: %s", errb.String())
	require.Len(t, idx.Versions, 1)
	assert.Equal(t, int64(1), idx.Latest)
	assert.Equal(t, sum, idx.Versions[0].SHA256)
	assert.Contains(t, out.String(), "--source "+base+"/v1/ --sha256 "+sum)

	w, err := weights.Load(t.Context(), weights.Ref{Version: 1, URI: base + idx.Versions[0].Path, SHA256: sum},
		weights.Options{HTTPClient: weights.NewHTTPClient(weights.FetchPolicy{AllowLoopback: true})})
	require.NoError(t, err)
	assert.Positive(t, w.Config.NumParams())

	// A version published while serving appears without a restart.
	runOK(t, "model", "init", "--preset", "tiny", "--seed", "5", "--out", filepath.Join(store, "v2"))
	resp, err := http.Get(base + "/index.json")
	require.NoError(t, err)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&idx))
	resp.Body.Close()
	assert.Equal(t, int64(2), idx.Latest)

	cancel()
	select {
	case code := <-exited:
		assert.Equal(t, 0, code, errb.String())
	case <-time.After(20 * time.Second):
		t.Fatal("weights serve did not exit")
	}

	var eo, ee bytes.Buffer
	assert.Equal(t, 1, run(t.Context(), []string{"weights", "serve", filepath.Join(store, "missing")}, &eo, &ee))
	assert.Contains(t, ee.String(), "not a directory")
}

// syncBuffer is a bytes.Buffer safe to read while a command writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
