package peer

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/weights"
	"github.com/rolloutkit/rollout/sdk/protocol"
	"github.com/rolloutkit/rollout/weightstore"
)

var secret = []byte("peer-test-secret-0123456789abcdef-0123")

var loopback = weights.NewHTTPClient(weights.FetchPolicy{AllowLoopback: true})

// gatedOrigin serves a weight store with version 1; model.safetensors waits for release
// after its first half, so a test can look at a relay mid-fetch.
func gatedOrigin(t *testing.T) (*httptest.Server, weightstore.Entry, chan struct{}, chan struct{}) {
	t.Helper()
	st, err := weightstore.Open(t.Context(), t.TempDir())
	require.NoError(t, err)
	w, err := model.Preset("tiny", 3)
	require.NoError(t, err)
	e, err := st.Publish(t.Context(), 1, w)
	require.NoError(t, err)
	half, release := make(chan struct{}), make(chan struct{})
	inner := st.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, weights.SafetensorsFile) {
			inner.ServeHTTP(w, r)
			return
		}
		inner.ServeHTTP(&halting{ResponseWriter: w, half: half, release: release, gone: r.Context().Done()}, r)
	}))
	t.Cleanup(srv.Close)
	return srv, e, half, release
}

// halting passes writes through until half the body is out, then waits for release.
type halting struct {
	http.ResponseWriter
	gone          <-chan struct{} // the request's end
	half, release chan struct{}
	n, size       int
	stopped       bool
}

func (h *halting) Write(p []byte) (int, error) {
	if h.size == 0 {
		h.size = int(atoi(h.Header().Get("Content-Length")))
	}
	if !h.stopped && h.n+len(p) > h.size/2 {
		k := h.size/2 - h.n
		m, err := h.ResponseWriter.Write(p[:k])
		h.n += m
		if err != nil {
			return m, err
		}
		h.ResponseWriter.(http.Flusher).Flush()
		h.stopped = true
		close(h.half)
		select {
		case <-h.release:
		case <-h.gone:
			return m, context.Canceled
		}
		n, err := h.ResponseWriter.Write(p[k:])
		h.n += n
		return m + n, err
	}
	n, err := h.ResponseWriter.Write(p)
	h.n += n
	return n, err
}

func atoi(s string) int64 {
	var n int64
	for _, c := range s {
		n = 10*n + int64(c-'0')
	}
	return n
}

// A parent relays the version it is fetching: the child's download starts before the
// parent has the whole file, ends with the verified checkpoint, and the parent serves it
// from its store afterwards. Wrong tokens and versions the parent lacks are refused.
func TestRelayWhileFetching(t *testing.T) {
	ctx := t.Context()
	origin, e, half, release := gatedOrigin(t)
	p, err := New(ctx, Config{Dir: t.TempDir(), Fleet: "f", Secret: secret, BeginWait: time.Millisecond})
	require.NoError(t, err)
	route := httptest.NewServer(p.Handler())
	t.Cleanup(route.Close)

	f, err := p.Begin(1, e.SHA256)
	require.NoError(t, err)
	parent := make(chan error, 1)
	go func() {
		_, err := weights.Load(ctx, weights.Ref{Version: 1, URI: origin.URL + e.Path, SHA256: e.SHA256},
			weights.Options{HTTPClient: loopback, KeepDir: f.Dir, Observe: f.Observe})
		parent <- f.End(ctx, err == nil)
	}()
	<-half // the parent holds half of model.safetensors

	tok := protocol.PeerToken(secret, "f", 1, e.SHA256)
	child := make(chan error, 1)
	var peerBytes, originBytes int64
	go func() {
		_, err := weights.Load(ctx, weights.Ref{Version: 1, URI: origin.URL + "/nowhere/", SHA256: e.SHA256}, weights.Options{HTTPClient: loopback,
			Mirrors: []weights.Mirror{{URL: route.URL + Route + "v1/", Header: http.Header{"Authorization": {"Bearer " + tok}}}},
			Observe: func(_ context.Context, ev weights.FetchEvent) {
				if ev.Kind == weights.EventBytes && ev.Peer {
					peerBytes += ev.Bytes
				} else if ev.Kind == weights.EventBytes {
					originBytes += ev.Bytes
				}
			}})
		child <- err
	}()
	// The child gets the first half while the parent still waits for the rest.
	for p.ServedBytes() < e.Bytes/2 {
		select {
		case err := <-child:
			t.Fatalf("the child ended before the parent had the file: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	close(release)
	require.NoError(t, <-parent)
	require.NoError(t, <-child)
	assert.Equal(t, e.Bytes, peerBytes, "every byte came from the relay")
	assert.Zero(t, originBytes)
	assert.Equal(t, []int64{1}, p.Holds())

	get := func(path, tok string) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, route.URL+path, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	assert.Equal(t, http.StatusOK, get(Route+"v1/"+weights.ConfigFile, tok), "served from the store once adopted")
	assert.Equal(t, http.StatusUnauthorized, get(Route+"v1/"+weights.ConfigFile, ""))
	assert.Equal(t, http.StatusUnauthorized, get(Route+"v1/"+weights.ConfigFile, protocol.PeerToken(secret, "f", 2, e.SHA256)))
	assert.Equal(t, http.StatusServiceUnavailable, get(Route+"v2/"+weights.ConfigFile, tok), "a version it lacks")
	assert.Equal(t, http.StatusNotFound, get(Route+"v1/../../etc/passwd", tok))
	p.Keep()
	assert.Empty(t, p.Holds())
}
