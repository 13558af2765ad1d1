package weightstore

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/weights"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func tinyWeights(t *testing.T, seed uint64) *model.Weights {
	t.Helper()
	w, err := model.Preset("tiny", seed)
	require.NoError(t, err)
	return w
}

func get(t *testing.T, url string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, b
}

// TestPublishServeLoad publishes versions and loads them with the engine's loader over HTTP,
// verifying the digest; a wrong digest is refused.
func TestPublishServeLoad(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	st, err := Open(ctx, dir)
	require.NoError(t, err)
	w1, w2 := tinyWeights(t, 1), tinyWeights(t, 2)
	e1, err := st.Publish(ctx, 1, w1)
	require.NoError(t, err)
	e2, err := st.Publish(ctx, 2, w2)
	require.NoError(t, err)
	_, err = st.Publish(ctx, 2, w1)
	require.ErrorIs(t, err, ErrVersionExists)
	_, err = st.Publish(ctx, -1, w1)
	require.ErrorIs(t, err, ErrInvalidVersion)

	want, err := weights.Digest(ctx, filepath.Join(dir, "v2"))
	require.NoError(t, err)
	require.Equal(t, want, e2.SHA256, "the engine's digest definition")
	require.NotEqual(t, e1.SHA256, e2.SHA256)
	require.Equal(t, "/v2/", e2.Path)
	require.Equal(t, []string{weights.ConfigFile, weights.SafetensorsFile}, e2.Files)

	sv, err := Serve("127.0.0.1:0", st)
	require.NoError(t, err)
	defer func() { require.NoError(t, sv.Close(ctx)) }()

	sref, err := sv.Ref(2)
	require.NoError(t, err)
	require.Equal(t, sv.URL()+"/v2/", sref.URI)
	// What a server does with the ref it is sent.
	ref := weights.Ref{Version: sref.Version, URI: sref.URI, SHA256: sref.SHA256}
	got, info, err := weights.LoadWithInfo(ctx, ref, weights.Options{RequireDigest: true, TempDir: t.TempDir(), HTTPClient: loopback})
	require.NoError(t, err)
	require.Equal(t, e2.SHA256, info.Digest)
	require.True(t, slices.Equal(w2.Embed, got.Embed))
	require.True(t, slices.Equal(w2.Layers[1].WDown, got.Layers[1].WDown))

	bad := ref
	bad.SHA256 = e1.SHA256
	_, err = weights.Load(ctx, bad, weights.Options{TempDir: t.TempDir(), HTTPClient: loopback})
	require.ErrorIs(t, err, weights.ErrDigestMismatch)

	_, err = sv.Ref(9)
	require.ErrorIs(t, err, ErrNotFound)

	// Publish: trained weights to a ref in one call; again for the same version, the same ref.
	w3 := tinyWeights(t, 3)
	r3, err := sv.Publish(ctx, 3, w3)
	require.NoError(t, err)
	e3, err := st.Get(3)
	require.NoError(t, err)
	require.Equal(t, e3.Ref(sv.URL()), r3)
	require.Equal(t, sv.URL()+"/v3/", r3.URI)
	require.NoError(t, r3.Validate())
	again, err := sv.Publish(ctx, 3, w2)
	require.NoError(t, err)
	require.Equal(t, r3, again, "a published version is not rewritten")
	_, err = sv.Publish(ctx, -1, w3)
	require.ErrorIs(t, err, ErrInvalidVersion)
}

// TestPublishBF16: a store set to bfloat16 publishes half the bytes, and the engine's loader
// reads back each value rounded to bfloat16 once.
func TestPublishBF16(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	st, err := Open(ctx, dir)
	require.NoError(t, err)
	w := tinyWeights(t, 1)
	f32, err := st.Publish(ctx, 1, w)
	require.NoError(t, err)
	require.NoError(t, st.SetDType(weights.BF16))
	require.Error(t, st.SetDType(weights.DType(7)))
	bf, err := st.Publish(ctx, 2, w)
	require.NoError(t, err)
	require.Less(t, bf.Bytes, f32.Bytes*6/10, "about half the bytes")
	got, err := weights.Load(ctx, weights.Ref{Version: 2, URI: filepath.Join(dir, "v2"), SHA256: bf.SHA256}, weights.Options{TempDir: t.TempDir()})
	require.NoError(t, err)
	for i, v := range w.Layers[1].WDown {
		require.Equal(t, kernels.RoundBF16(v), got.Layers[1].WDown[i], "value %d", i)
	}
}

// TestHandler covers the index, another process publishing into the same directory, files
// outside a version's digest, unknown paths and methods.
func TestHandler(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	st, err := Open(ctx, dir)
	require.NoError(t, err)
	_, err = st.Publish(ctx, 0, tinyWeights(t, 1))
	require.NoError(t, err)
	sv, err := Serve("127.0.0.1:0", st)
	require.NoError(t, err)
	defer func() { require.NoError(t, sv.Close(ctx)) }()

	other, err := Open(ctx, dir) // a second writer, e.g. the trainer in another process
	require.NoError(t, err)
	e7, err := other.Publish(ctx, 7, tinyWeights(t, 7))
	require.NoError(t, err)

	resp, body := get(t, sv.URL()+"/index.json")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var idx Index
	require.NoError(t, json.Unmarshal(body, &idx))
	require.Len(t, idx.Versions, 2)
	require.Equal(t, int64(7), idx.Latest)
	require.Equal(t, e7.SHA256, idx.Versions[1].SHA256)

	resp, body = get(t, sv.URL()+"/v7/")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var e Entry
	require.NoError(t, json.Unmarshal(body, &e))
	require.Equal(t, e7.SHA256, e.SHA256)

	resp, body = get(t, sv.URL()+"/v0/config.json")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, string(body), "hidden_size")

	require.NoError(t, os.WriteFile(filepath.Join(dir, "v0", "notes.txt"), []byte("private"), 0o644))
	for _, p := range []string{"/v0/notes.txt", "/v0/../v0/config.json", "/v3/config.json", "/v01/config.json",
		"/x/config.json", "/v0/a/b", "/.publish-v1/config.json"} {
		resp, _ := get(t, sv.URL()+p)
		require.Equal(t, http.StatusNotFound, resp.StatusCode, p)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, sv.URL()+"/index.json", nil)
	require.NoError(t, err)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)

	// A fresh Open indexes what is there; Prune keeps the newest.
	again, err := Open(ctx, dir)
	require.NoError(t, err)
	require.Len(t, again.Versions(), 2)
	require.NoError(t, again.Prune(1))
	latest, ok := again.Latest()
	require.True(t, ok)
	require.Equal(t, int64(7), latest.Version)
	_, err = os.Stat(filepath.Join(dir, "v0"))
	require.True(t, os.IsNotExist(err))
	require.ErrorIs(t, again.Prune(0), ErrInvalidVersion)

	h, err := Handler(ctx, dir)
	require.NoError(t, err)
	require.NotNil(t, h)
}

// loopback fetches from the test's own listener, which the default fetch policy refuses.
var loopback = weights.NewHTTPClient(weights.FetchPolicy{AllowLoopback: true})

// Adopt takes a checkpoint directory in as a version only when it hashes to the digest
// given; the handler counts the file bytes it serves (the egress a fleet keeps at one
// checkpoint per update).
func TestAdoptRemoveAndEgress(t *testing.T) {
	ctx := t.Context()
	s, err := Open(ctx, t.TempDir())
	require.NoError(t, err)
	src := filepath.Join(s.Dir(), ".incoming")
	require.NoError(t, weights.SaveHF(src, tinyWeights(t, 5), weights.F32))
	sum, err := weights.Digest(ctx, src)
	require.NoError(t, err)

	bad := filepath.Join(s.Dir(), ".bad")
	require.NoError(t, weights.SaveHF(bad, tinyWeights(t, 6), weights.F32))
	_, err = s.Adopt(ctx, 3, bad, sum)
	require.ErrorIs(t, err, ErrDigest)
	_, err = s.Get(3)
	require.ErrorIs(t, err, ErrNotFound, "a checkpoint that does not hash right is not adopted")

	e, err := s.Adopt(ctx, 3, src, sum)
	require.NoError(t, err)
	require.Equal(t, sum, e.SHA256)
	sv, err := Serve("127.0.0.1:0", s)
	require.NoError(t, err)
	defer sv.Close(ctx)
	for _, f := range e.Files {
		resp, _ := get(t, sv.URL()+e.Path+f)
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	require.Equal(t, e.Bytes, s.BytesServed(), "one checkpoint served, counted exactly")

	require.NoError(t, s.Remove(3))
	_, err = s.Get(3)
	require.ErrorIs(t, err, ErrNotFound)
	_, err = os.Stat(filepath.Join(s.Dir(), VersionDir(3)))
	require.True(t, os.IsNotExist(err))
}
