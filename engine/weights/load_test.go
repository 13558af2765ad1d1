package weights

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func sum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// fixture is one directory holding an HF checkpoint, a sharded one and a .bin.
type fixture struct {
	root, hf, sharded, bin string
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	root := t.TempDir()
	f := fixture{root: root, hf: filepath.Join(root, "hf"), sharded: filepath.Join(root, "sharded"),
		bin: filepath.Join(root, "m.bin")}
	w := randomWeights(t, smallConfig(), 9)
	require.NoError(t, SaveHF(f.hf, w, BF16))
	require.NoError(t, SaveHFSharded(f.sharded, w, F16, 500))
	require.NoError(t, SaveLlama2C(f.bin, w))
	return f
}

func TestDigestDefinition(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()

	d, err := Digest(ctx, f.bin)
	require.NoError(t, err)
	assert.Equal(t, sum(readFile(t, f.bin)), d, ".bin digest is the file's SHA-256")

	// HF: SHA-256 of `sha256sum config.json model.safetensors`.
	listing := fmt.Sprintf("%s  config.json\n%s  model.safetensors\n",
		sum(readFile(t, filepath.Join(f.hf, ConfigFile))), sum(readFile(t, filepath.Join(f.hf, SafetensorsFile))))
	d, err = Digest(ctx, f.hf)
	require.NoError(t, err)
	assert.Equal(t, sum([]byte(listing)), d)

	shards, err := filepath.Glob(filepath.Join(f.sharded, "model-*.safetensors"))
	require.NoError(t, err)
	require.Greater(t, len(shards), 1)
	listing = fmt.Sprintf("%s  config.json\n%s  %s\n", sum(readFile(t, filepath.Join(f.sharded, ConfigFile))),
		sum(readFile(t, filepath.Join(f.sharded, IndexFile))), IndexFile)
	for _, s := range shards { // Glob sorts
		listing += fmt.Sprintf("%s  %s\n", sum(readFile(t, s)), filepath.Base(s))
	}
	d, err = Digest(ctx, f.sharded)
	require.NoError(t, err)
	assert.Equal(t, sum([]byte(listing)), d)

	// Load computes the same digest while parsing.
	for _, p := range []string{f.hf, f.sharded, f.bin} {
		want, err := Digest(ctx, p)
		require.NoError(t, err)
		_, info, err := LoadWithInfo(ctx, Ref{Version: 1, URI: p, SHA256: strings.ToUpper(want)}, Options{})
		require.NoError(t, err, p)
		assert.Equal(t, want, info.Digest)
		assert.Positive(t, info.Bytes)
	}

	// The config is covered: editing it changes the digest.
	before, err := Digest(ctx, f.hf)
	require.NoError(t, err)
	cfg := readFile(t, filepath.Join(f.hf, ConfigFile))
	writeFile(t, filepath.Join(f.hf, ConfigFile), []byte(strings.Replace(string(cfg), `"rope_theta": 10000`, `"rope_theta": 10001`, 1)))
	after, err := Digest(ctx, f.hf)
	require.NoError(t, err)
	assert.NotEqual(t, before, after)
}

func TestLoadLocal(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	want, err := LoadHF(f.hf)
	require.NoError(t, err)
	for _, uri := range []string{f.hf, "file://" + f.hf, "file://localhost" + f.hf} {
		w, info, err := LoadWithInfo(ctx, Ref{Version: 3, URI: uri}, Options{})
		require.NoError(t, err, uri)
		assert.Equal(t, FormatHF, info.Format)
		requireSameWeights(t, want, w)
	}
	w, info, err := LoadWithInfo(ctx, Ref{URI: "file://" + f.bin}, Options{})
	require.NoError(t, err)
	assert.Equal(t, FormatLlama2C, info.Format)
	require.NoError(t, w.Check())
	_, err = Load(ctx, Ref{URI: f.sharded}, Options{})
	require.NoError(t, err)
}

func TestLoadDigestMismatch(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for _, p := range []string{f.hf, f.sharded, f.bin} {
		w, err := Load(ctx, Ref{Version: 2, URI: p, SHA256: strings.Repeat("ab", 32)}, Options{})
		require.ErrorIs(t, err, ErrDigestMismatch, p)
		assert.Nil(t, w)
		assert.Contains(t, err.Error(), "version 2")
	}
	// Flip one byte of tensor data: shapes still check out, the digest does not.
	good, err := Digest(ctx, f.bin)
	require.NoError(t, err)
	b := readFile(t, f.bin)
	b[100] ^= 1
	writeFile(t, f.bin, b)
	_, err = Load(ctx, Ref{URI: f.bin, SHA256: good}, Options{})
	require.ErrorIs(t, err, ErrDigestMismatch)
}

func TestLoadRefErrors(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	cases := []struct {
		ref  Ref
		opts Options
		want error
	}{
		{Ref{}, Options{}, ErrInvalidRef},
		{Ref{URI: f.hf, SHA256: "xyz"}, Options{}, ErrInvalidRef},
		{Ref{URI: f.hf, SHA256: "abcd"}, Options{}, ErrInvalidRef},
		{Ref{URI: f.hf}, Options{RequireDigest: true}, ErrInvalidRef},
		{Ref{URI: "s3://bucket/model"}, Options{}, ErrUnsupportedSource},
		{Ref{URI: "file://otherhost/x"}, Options{}, ErrUnsupportedSource},
		{Ref{URI: filepath.Join(f.hf, ConfigFile)}, Options{}, ErrUnsupportedSource},
		{Ref{URI: filepath.Join(f.root, "nope")}, Options{}, ErrFetch},
		{Ref{URI: filepath.Join(t.TempDir())}, Options{}, ErrBadCheckpoint},
	}
	for _, c := range cases {
		_, err := Load(ctx, c.ref, c.opts)
		require.ErrorIs(t, err, c.want, "%+v", c.ref)
	}
}

func TestLoadRoot(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	opts := Options{Root: f.root}
	for _, uri := range []string{f.hf, "hf", "sharded", "m.bin", "file://" + f.bin, "./hf/../hf"} {
		_, err := Load(ctx, Ref{URI: uri}, opts)
		require.NoError(t, err, uri)
	}
	outside := t.TempDir()
	require.NoError(t, SaveHF(outside, randomWeights(t, smallConfig(), 1), F32))
	require.NoError(t, os.Symlink(outside, filepath.Join(f.root, "link")))
	require.NoError(t, os.Symlink(filepath.Join(outside, SafetensorsFile), filepath.Join(f.hf, "evil.safetensors")))
	for _, uri := range []string{outside, "../" + filepath.Base(outside), "file://" + outside, "link", "/etc"} {
		_, err := Load(ctx, Ref{URI: uri}, opts)
		require.ErrorIs(t, err, ErrUnsupportedSource, uri)
	}
	// A symlinked directory that escapes is refused even when reached through a shard name.
	require.NoError(t, os.Remove(filepath.Join(f.sharded, IndexFile)))
	writeFile(t, filepath.Join(f.sharded, IndexFile), []byte(`{"weight_map":{"model.embed_tokens.weight":"evil.safetensors"}}`))
	require.NoError(t, os.Symlink(filepath.Join(outside, SafetensorsFile), filepath.Join(f.sharded, "evil.safetensors")))
	_, err := Load(ctx, Ref{URI: "sharded"}, opts)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "evil.safetensors")
	// Without a root the same symlinked single-file checkpoint loads.
	_, err = Load(ctx, Ref{URI: filepath.Join(f.root, "link")}, Options{})
	require.NoError(t, err)
}

// loopback is the weights client of a server on the same host as its weights (the test
// servers listen on 127.0.0.1).
var loopback = NewHTTPClient(FetchPolicy{AllowLoopback: true})

// serveDir serves dir over HTTP, counting requests per path.
func serveDir(t *testing.T, dir string) (*httptest.Server, map[string]int) {
	t.Helper()
	hits := map[string]int{}
	fs := http.FileServer(http.Dir(dir))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits[r.URL.Path]++
		fs.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, hits
}

func TestLoadHTTP(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	srv, hits := serveDir(t, f.root)
	for _, c := range []struct{ path, local, format string }{
		{"/hf", f.hf, FormatHF},
		{"/sharded/", f.sharded, FormatHF},
		{"/m.bin", f.bin, FormatLlama2C},
	} {
		want, err := Digest(ctx, c.local)
		require.NoError(t, err)
		tmp := t.TempDir()
		w, info, err := LoadWithInfo(ctx, Ref{Version: 4, URI: srv.URL + c.path, SHA256: want}, Options{TempDir: tmp, HTTPClient: loopback})
		require.NoError(t, err, c.path)
		assert.Equal(t, c.format, info.Format)
		assert.Equal(t, want, info.Digest)
		require.NoError(t, w.Check())
		ents, err := os.ReadDir(tmp)
		require.NoError(t, err)
		assert.Empty(t, ents, "downloads are removed")

		_, err = Load(ctx, Ref{URI: srv.URL + c.path, SHA256: strings.Repeat("0", 64)}, Options{HTTPClient: loopback})
		require.ErrorIs(t, err, ErrDigestMismatch)
	}
	assert.Positive(t, hits["/sharded/"+IndexFile])

	_, err := Load(ctx, Ref{URI: srv.URL + "/missing.bin"}, Options{HTTPClient: loopback})
	require.ErrorIs(t, err, ErrFetch)
	_, err = Load(ctx, Ref{URI: srv.URL + "/hf"}, Options{MaxDownloadBytes: 2000, HTTPClient: loopback})
	require.ErrorIs(t, err, ErrFetch)

	fail := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "boom", http.StatusInternalServerError)
	}))
	defer fail.Close()
	_, err = Load(ctx, Ref{URI: fail.URL + "/m.bin"}, Options{HTTPClient: loopback})
	require.ErrorIs(t, err, ErrFetch)
	assert.NotContains(t, err.Error(), "boom", "the source's answer stays out of the error")

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = Load(cctx, Ref{URI: srv.URL + "/m.bin"}, Options{HTTPClient: loopback})
	require.ErrorIs(t, err, context.Canceled)
}

func TestLoadHTTPRejectsEscapingShardNames(t *testing.T) {
	f := newFixture(t)
	writeFile(t, filepath.Join(f.sharded, IndexFile), []byte(`{"weight_map":{"model.norm.weight":"../m.bin"}}`))
	srv, hits := serveDir(t, f.root)
	_, err := Load(context.Background(), Ref{URI: srv.URL + "/sharded"}, Options{HTTPClient: loopback})
	require.ErrorIs(t, err, ErrBadCheckpoint)
	assert.Zero(t, hits["/m.bin"])
}

func TestRefJSON(t *testing.T) {
	b, err := json.Marshal(Ref{Version: 7, URI: "http://x/v7", SHA256: strings.Repeat("a", 64)})
	require.NoError(t, err)
	assert.JSONEq(t, `{"version":7,"uri":"http://x/v7","sha256":"`+strings.Repeat("a", 64)+`"}`, string(b))
	require.NoError(t, Ref{URI: "x", SHA256: strings.Repeat("A", 64)}.Validate())
}

func TestDigestCancelled(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, p := range []string{f.hf, f.bin} {
		_, err := Digest(ctx, p)
		require.ErrorIs(t, err, context.Canceled)
		_, err = Load(ctx, Ref{URI: p}, Options{})
		require.ErrorIs(t, err, context.Canceled)
	}
	_, err := Digest(context.Background(), filepath.Join(f.root, "nope"))
	require.Error(t, err)
}
