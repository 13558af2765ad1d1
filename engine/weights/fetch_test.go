package weights

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFetchPolicyAddresses(t *testing.T) {
	for _, c := range []struct {
		addr                 string
		none, loopback, priv bool
	}{
		{"8.8.8.8", true, true, true},
		{"2606:4700::1111", true, true, true},
		{"127.0.0.1", false, true, true},
		{"::1", false, true, true},
		{"::ffff:127.0.0.1", false, true, true},
		{"10.1.2.3", false, false, true},
		{"192.168.0.1", false, false, true},
		{"172.16.0.1", false, false, true},
		{"169.254.169.254", false, false, true},
		{"fe80::1", false, false, true},
		{"fd00::1", false, false, true},
		{"100.64.0.1", false, false, true},
		{"0.0.0.0", false, false, false},
		{"224.0.0.1", false, false, false},
	} {
		ip := netip.MustParseAddr(c.addr)
		assert.Equal(t, c.none, FetchPolicy{}.allowed(ip), "%s, default policy", c.addr)
		assert.Equal(t, c.loopback, FetchPolicy{AllowLoopback: true}.allowed(ip), "%s, loopback allowed", c.addr)
		assert.Equal(t, c.priv, FetchPolicy{AllowPrivate: true}.allowed(ip), "%s, private allowed", c.addr)
	}
}

// TestFetchRefusesInternalAddress: the default client never connects to loopback.
func TestFetchRefusesInternalAddress(t *testing.T) {
	f := newFixture(t)
	srv, hits := serveDir(t, f.root)
	_, err := Load(context.Background(), Ref{URI: srv.URL + "/m.bin"}, Options{})
	require.ErrorIs(t, err, ErrAddressRefused)
	require.ErrorIs(t, err, ErrFetch)
	assert.Empty(t, hits)
	// A name resolving to loopback is refused at connect time too.
	u := strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)
	_, err = Load(context.Background(), Ref{URI: u + "/m.bin"}, Options{})
	require.ErrorIs(t, err, ErrAddressRefused)
	assert.Empty(t, hits)
}

// TestFetchRedirects: a redirect to the same host is followed, one to another host is not
// (the other host is never contacted).
func TestFetchRedirects(t *testing.T) {
	f := newFixture(t)
	other, otherHits := serveDir(t, f.root)
	mux := http.NewServeMux()
	mux.HandleFunc("/elsewhere/", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/m.bin", http.StatusFound)
	})
	mux.Handle("/", http.FileServer(http.Dir(f.root)))
	mux.HandleFunc("/moved/", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/m.bin", http.StatusMovedPermanently)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	want, err := Digest(context.Background(), f.bin)
	require.NoError(t, err)

	_, err = Load(context.Background(), Ref{URI: srv.URL + "/moved/m.bin", SHA256: want}, Options{HTTPClient: loopback})
	require.NoError(t, err, "same-host redirect")
	_, err = Load(context.Background(), Ref{URI: srv.URL + "/elsewhere/m.bin", SHA256: want}, Options{HTTPClient: loopback})
	require.ErrorIs(t, err, ErrFetch)
	assert.Empty(t, otherHits, "the other host is never contacted")
}

// TestFetchStalledSource: a source that stops sending fails the fetch after the stall
// timeout instead of holding it for ever.
func TestFetchStalledSource(t *testing.T) {
	release := make(chan struct{})
	drip := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100000")
		_, _ = io.WriteString(w, "x")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer drip.Close()
	defer close(release)
	client := NewHTTPClient(FetchPolicy{AllowLoopback: true, StallTimeout: 50 * time.Millisecond})
	_, err := Load(context.Background(), Ref{URI: drip.URL + "/m.bin"}, Options{HTTPClient: client})
	require.ErrorIs(t, err, ErrFetch)
	// Headers that never come are bounded too.
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer hang.Close()
	client = NewHTTPClient(FetchPolicy{AllowLoopback: true, HeaderTimeout: 50 * time.Millisecond})
	_, err = Load(context.Background(), Ref{URI: hang.URL + "/m.bin"}, Options{HTTPClient: client})
	require.ErrorIs(t, err, ErrFetch)
}

// TestFetchOversize: a source larger than the limit (announced or not) is cut off.
func TestFetchOversize(t *testing.T) {
	big := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Has("chunked") {
			w.(http.Flusher).Flush() // no Content-Length
		}
		_, _ = w.Write(make([]byte, 64<<10))
	}))
	defer big.Close()
	for _, q := range []string{"", "?chunked=1"} {
		_, err := Load(context.Background(), Ref{URI: big.URL + "/m.bin" + q}, Options{HTTPClient: loopback, MaxDownloadBytes: 10 << 10})
		require.ErrorIs(t, err, ErrFetch, q)
	}
	// The limit derived from a config covers its float32 parameters.
	c := smallConfig()
	assert.GreaterOrEqual(t, DownloadLimit(c), 4*c.NumParams())
}

// TestFetchBadDigestAndRedaction: a wrong digest is refused, and errors name the source
// without its credentials or query.
func TestFetchBadDigestAndRedaction(t *testing.T) {
	f := newFixture(t)
	srv, _ := serveDir(t, f.root)
	u := strings.Replace(srv.URL, "http://", "http://alice:s3cret@", 1) + "/m.bin?sig=topsecret"
	_, err := Load(context.Background(), Ref{URI: u, SHA256: strings.Repeat("0", 64)}, Options{HTTPClient: loopback})
	require.ErrorIs(t, err, ErrDigestMismatch)
	assert.NotContains(t, err.Error(), "s3cret")
	assert.NotContains(t, err.Error(), "topsecret")
	assert.Equal(t, "http://redacted@h/p?redacted", RedactURI("http://u:p@h/p?x=1#f"))
	assert.Equal(t, "/local/path", RedactURI("/local/path"))
}

// TestFetchGenericErrors: a page that is no checkpoint and a refused connection come back
// without the page's bytes or the dial error.
func TestFetchGenericErrors(t *testing.T) {
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"INTERNAL": "<html>admin console</html>"`)
	}))
	defer page.Close()
	_, err := Load(context.Background(), Ref{URI: page.URL + "/ckpt"}, Options{HTTPClient: loopback})
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "INTERNAL")
	assert.NotContains(t, err.Error(), "html")
	_, err = Load(context.Background(), Ref{URI: "http://127.0.0.1:1/ckpt"}, Options{HTTPClient: loopback})
	require.ErrorIs(t, err, ErrFetch)
	assert.NotContains(t, err.Error(), "refused")
	assert.NotContains(t, err.Error(), "dial")
}

// TestMinimumRateCutsADrip: a body that keeps sending, a byte at a time, never stalls but
// averages less than MinRate over a window: its read fails with ErrTooSlow. A body at speed
// reads through.
func TestMinimumRateCutsADrip(t *testing.T) {
	drip := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "1000000")
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			if _, err := w.Write([]byte{'x'}); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-tick.C:
			}
		}
	}))
	defer drip.Close()
	fast := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write(make([]byte, 4<<20))
	}))
	defer fast.Close()
	c := NewHTTPClient(FetchPolicy{AllowLoopback: true, MinRate: 64 << 10, MinRateWindow: 100 * time.Millisecond})
	defer c.CloseIdleConnections()

	resp, err := c.Get(drip.URL)
	require.NoError(t, err)
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.ErrorIs(t, err, ErrTooSlow)
	require.ErrorIs(t, err, ErrFetch)

	resp, err = c.Get(fast.URL)
	require.NoError(t, err)
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.EqualValues(t, 4<<20, n)
}
