package weights

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// events records a fetch's events.
type events struct {
	mu  sync.Mutex
	evs []FetchEvent
}

func (e *events) observe(_ context.Context, ev FetchEvent) {
	e.mu.Lock()
	e.evs = append(e.evs, ev)
	e.mu.Unlock()
}

func (e *events) bytes(peer bool) int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	var n int64
	for _, ev := range e.evs {
		if ev.Kind == EventBytes && ev.Peer == peer {
			n += ev.Bytes
		}
	}
	return n
}

func (e *events) kinds(kind string) []FetchEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []FetchEvent
	for _, ev := range e.evs {
		if ev.Kind == kind {
			out = append(out, ev)
		}
	}
	return out
}

// mirror serves dir like the origin, but model.safetensors goes wrong as bad says: "die"
// sends the first half and breaks the connection, "flip" serves every byte with one changed.
func mirror(t *testing.T, dir, bad string) (*httptest.Server, *int) {
	t.Helper()
	ranged := new(int)
	fs := http.FileServer(http.Dir(dir))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, "no token", http.StatusUnauthorized)
			return
		}
		if r.Header.Get("Range") != "" {
			*ranged++
		}
		if !strings.HasSuffix(r.URL.Path, SafetensorsFile) {
			fs.ServeHTTP(w, r)
			return
		}
		b, err := os.ReadFile(filepath.Join(dir, SafetensorsFile))
		if err != nil {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		switch bad {
		case "die":
			_, _ = w.Write(b[:len(b)/2])
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		case "flip":
			b[len(b)-1] ^= 0xff
		}
		_, _ = w.Write(b)
	}))
	t.Cleanup(srv.Close)
	return srv, ranged
}

func TestMirrorDiesResumesAtOrigin(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	origin, hits := serveDir(t, f.root)
	peer, _ := mirror(t, f.hf, "die")
	want, err := Digest(ctx, f.hf)
	require.NoError(t, err)
	st, err := os.Stat(filepath.Join(f.hf, SafetensorsFile))
	require.NoError(t, err)
	var ev events
	keep := filepath.Join(t.TempDir(), "v4")
	w, info, err := LoadWithInfo(ctx, Ref{Version: 4, URI: origin.URL + "/hf/", SHA256: want}, Options{HTTPClient: loopback, KeepDir: keep,
		Mirrors: []Mirror{{URL: peer.URL + "/", Header: http.Header{"Authorization": {"Bearer tok"}}}}, Observe: ev.observe})
	require.NoError(t, err)
	require.NoError(t, w.Check())
	assert.Equal(t, want, info.Digest)
	failed := ev.kinds(EventSourceFailed)
	require.Len(t, failed, 1)
	assert.True(t, failed[0].Peer && failed[0].Resumed)
	assert.Equal(t, SafetensorsFile, failed[0].File)
	assert.Zero(t, hits["/hf/"+ConfigFile], "the config came from the peer")
	assert.Equal(t, 1, hits["/hf/"+SafetensorsFile], "the origin served the rest once")
	half := st.Size() / 2
	assert.Equal(t, st.Size()-half, ev.bytes(false), "the origin sent only the second half (a Range request)")
	got, err := Digest(ctx, keep)
	require.NoError(t, err)
	assert.Equal(t, want, got, "the kept directory is the verified checkpoint")
}

func TestMirrorBadBytesRestartsFromOrigin(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	origin, _ := serveDir(t, f.root)
	peer, _ := mirror(t, f.hf, "flip")
	want, err := Digest(ctx, f.hf)
	require.NoError(t, err)
	var ev events
	w, err := Load(ctx, Ref{Version: 4, URI: origin.URL + "/hf/", SHA256: want}, Options{HTTPClient: loopback,
		Mirrors: []Mirror{{URL: peer.URL + "/", Header: http.Header{"Authorization": {"Bearer tok"}}}}, Observe: ev.observe})
	require.NoError(t, err)
	require.NoError(t, w.Check())
	assert.Len(t, ev.kinds(EventDigestMismatch), 1)
	assert.Len(t, ev.kinds(EventSourceFailed), 1)
	assert.Len(t, ev.kinds(EventRestart), 0)
}

func TestEverySourceBadFailsClearly(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	origin, _ := serveDir(t, f.root)
	peer, _ := mirror(t, f.hf, "")
	keep := filepath.Join(t.TempDir(), "v4")
	_, err := Load(ctx, Ref{Version: 4, URI: origin.URL + "/hf/", SHA256: strings.Repeat("0", 64)}, Options{HTTPClient: loopback, KeepDir: keep,
		Mirrors: []Mirror{{URL: peer.URL + "/", Header: http.Header{"Authorization": {"Bearer tok"}}}}})
	require.ErrorIs(t, err, ErrDigestMismatch)
	assert.Contains(t, err.Error(), "from every one of 2 sources")
	_, serr := os.Stat(keep)
	assert.True(t, os.IsNotExist(serr), "nothing unverified is kept")
}
