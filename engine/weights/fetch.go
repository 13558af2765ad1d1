package weights

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rolloutkit/rollout/engine/model"
)

// ErrAddressRefused means an http(s) source resolved to an address the fetch policy refuses
// (loopback, link-local, private, ...). It wraps ErrFetch.
var ErrAddressRefused = fmt.Errorf("%w: address refused", ErrFetch)

// Defaults of FetchPolicy.
const (
	DefaultDialTimeout   = 10 * time.Second
	DefaultHeaderTimeout = 30 * time.Second
	DefaultStallTimeout  = 30 * time.Second
	DefaultFetchTimeout  = 10 * time.Minute
	// DefaultMinRate and DefaultMinRateWindow: a download must average at least 1 MiB/s
	// over every 30 s, so a source that drips a byte now and then (which StallTimeout alone
	// lets through) is cut off within a window, not after FetchTimeout.
	DefaultMinRate       = 1 << 20
	DefaultMinRateWindow = 30 * time.Second
)

// FetchPolicy is what NewHTTPClient's client may reach and how long it may take. The zero
// value refuses every non-public address and takes the default timeouts.
type FetchPolicy struct {
	// AllowLoopback admits 127.0.0.0/8 and ::1 (a weights server on the same host).
	AllowLoopback bool
	// AllowPrivate admits every non-public address: loopback, private (10/8, 172.16/12,
	// 192.168/16, fc00::/7), link-local (169.254/16 with cloud metadata services, fe80::/10)
	// and shared (100.64/10) ranges.
	AllowPrivate bool
	// DialTimeout bounds a connection, HeaderTimeout the wait for response headers,
	// StallTimeout a wait for the next body bytes, FetchTimeout a whole download (zero:
	// the defaults above). A client's Timeout is FetchTimeout.
	DialTimeout, HeaderTimeout, StallTimeout, FetchTimeout time.Duration
	// MinRate is the least a response body must deliver, in bytes per second averaged over
	// every MinRateWindow (zero: DefaultMinRate over DefaultMinRateWindow; negative: no
	// minimum). A body below it fails with ErrTooSlow.
	MinRate       int64
	MinRateWindow time.Duration
}

// ErrTooSlow means a download delivered less than FetchPolicy.MinRate over a window. It
// wraps ErrFetch.
var ErrTooSlow = fmt.Errorf("%w: the source sent too slowly", ErrFetch)

func (p FetchPolicy) withDefaults() FetchPolicy {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&p.DialTimeout, DefaultDialTimeout)
	def(&p.HeaderTimeout, DefaultHeaderTimeout)
	def(&p.StallTimeout, DefaultStallTimeout)
	def(&p.FetchTimeout, DefaultFetchTimeout)
	def(&p.MinRateWindow, DefaultMinRateWindow)
	if p.MinRate == 0 {
		p.MinRate = DefaultMinRate
	}
	return p
}

// allowed reports whether the policy admits a connection to ip.
func (p FetchPolicy) allowed(ip netip.Addr) bool {
	ip = ip.Unmap()
	switch {
	case ip.IsUnspecified(), ip.IsMulticast(), ip.IsInterfaceLocalMulticast():
		return false
	case p.AllowPrivate:
		return true
	case ip.IsLoopback():
		return p.AllowLoopback
	case ip.IsPrivate(), ip.IsLinkLocalUnicast(), ip.IsLinkLocalMulticast(), shared.Contains(ip):
		return false
	}
	return true
}

// shared is the carrier-grade NAT range, private in all but name.
var shared = netip.MustParsePrefix("100.64.0.0/10")

// NewHTTPClient returns the client weight downloads use by default: it dials only addresses
// the policy admits (checked on the resolved address of every connection, so a name that
// resolves to 127.0.0.1 or 169.254.169.254 is refused too), follows redirects only to the
// same scheme and host, bounds the dial, the response headers and the whole download, and
// reads no proxy settings from the environment.
func NewHTTPClient(p FetchPolicy) *http.Client {
	p = p.withDefaults()
	d := &net.Dialer{Timeout: p.DialTimeout, Control: func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil || !p.allowed(ap.Addr()) {
			return ErrAddressRefused
		}
		return nil
	}}
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           d.DialContext,
		TLSHandshakeTimeout:   p.DialTimeout,
		ResponseHeaderTimeout: p.HeaderTimeout,
		IdleConnTimeout:       30 * time.Second,
		MaxIdleConnsPerHost:   2,
		ForceAttemptHTTP2:     true,
	}
	st := &stallTransport{base: tr, stall: p.StallTimeout, window: p.MinRateWindow}
	if p.MinRate > 0 {
		st.minBytes = max(1, int64(float64(p.MinRate)*p.MinRateWindow.Seconds()))
	}
	return &http.Client{Transport: st, Timeout: p.FetchTimeout, CheckRedirect: sameHostRedirect}
}

// sameHostRedirect follows at most 5 redirects, each to the scheme and host of the first
// request: a weights server may move a file, but may not send the fetch elsewhere.
func sameHostRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= 5 {
		return errors.New("too many redirects")
	}
	first := via[0].URL
	if req.URL.Scheme != first.Scheme || !strings.EqualFold(req.URL.Host, first.Host) {
		return errRedirectOff
	}
	return nil
}

var errRedirectOff = errors.New("redirect to another host refused")

// stallTransport fails a response body that delivers no bytes for stall, or fewer than
// minBytes in a window (0: no minimum).
type stallTransport struct {
	base     http.RoundTripper
	stall    time.Duration
	window   time.Duration
	minBytes int64
}

// RoundTrip implements http.RoundTripper.
func (t *stallTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancelCause(req.Context())
	resp, err := t.base.RoundTrip(req.WithContext(ctx))
	if err != nil {
		cancel(nil)
		return nil, err
	}
	b := &stallBody{ReadCloser: resp.Body, stall: t.stall, cancel: cancel}
	b.stalled = func() error {
		if c := context.Cause(ctx); errors.Is(c, errStalled) || errors.Is(c, ErrTooSlow) {
			return c
		}
		return nil
	}
	b.timer = time.AfterFunc(t.stall, func() { cancel(errStalled) })
	if t.minBytes > 0 {
		b.done = make(chan struct{})
		go b.watchRate(ctx, t.window, t.minBytes)
	}
	resp.Body = b
	return resp, nil
}

var errStalled = fmt.Errorf("%w: the source stopped sending", ErrFetch)

// stallBody is a response body under stallTransport's watch: timer fires after stall
// without bytes; watchRate (when there is a minimum) checks the bytes counted in window.
type stallBody struct {
	io.ReadCloser
	timer     *time.Timer
	done      chan struct{} // closed by Close; nil without a minimum rate
	window    atomic.Int64
	stall     time.Duration
	cancel    context.CancelCauseFunc
	stalled   func() error
	closeOnce sync.Once
}

func (b *stallBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.timer.Reset(b.stall)
		b.window.Add(int64(n))
	}
	if err != nil {
		if cause := b.stalled(); cause != nil {
			err = cause
		}
	}
	return n, err
}

// watchRate cancels the body's request with ErrTooSlow at the end of the first window in
// which fewer than minBytes arrived.
func (b *stallBody) watchRate(ctx context.Context, window time.Duration, minBytes int64) {
	tick := time.NewTicker(window)
	defer tick.Stop()
	for {
		select {
		case <-b.done:
			return
		case <-ctx.Done():
			return
		case <-tick.C:
			if b.window.Swap(0) < minBytes {
				b.cancel(ErrTooSlow)
				return
			}
		}
	}
}

func (b *stallBody) Close() error {
	b.timer.Stop()
	if b.done != nil {
		b.closeOnce.Do(func() { close(b.done) })
	}
	b.cancel(nil)
	return b.ReadCloser.Close()
}

// IsHTTP reports whether uri is an http(s) source.
func IsHTTP(uri string) bool {
	scheme, _, ok := strings.Cut(uri, "://")
	s := strings.ToLower(scheme)
	return ok && (s == "http" || s == "https")
}

// RedactURI is uri fit for logs and error messages: credentials, query and fragment (where
// presigned URLs keep their signatures) are dropped from http(s) URLs.
func RedactURI(uri string) string {
	if !IsHTTP(uri) {
		return uri
	}
	u, err := url.Parse(uri)
	if err != nil {
		return "(unparsable URL)"
	}
	r := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}
	if u.User != nil {
		r.User = url.User("redacted")
	}
	if u.RawQuery != "" {
		r.RawQuery = "redacted"
	}
	return r.String()
}

// DownloadLimit is the most bytes a checkpoint of config c can take: every parameter in
// float32 plus room for headers, the config and an index (tensors may be stored wider than
// the served dtype, never wider than 4 bytes).
func DownloadLimit(c model.Config) int64 {
	return 4*c.NumParams() + 64<<20
}

// publicFetchError replaces the detail of an http(s) failure by a generic message that keeps
// its sentinel: dial errors, status lines and the bytes a server sent say whether an address
// is open and what it serves, and the caller of /update_weights need not learn that.
func publicFetchError(ctx context.Context, uri string, err error) error {
	r := RedactURI(uri)
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		// The caller gave up: that, not the fetch, is the error.
		return fmt.Errorf("%s: %w", r, ctx.Err())
	case errors.Is(err, ErrDigestMismatch):
		return err // digests only: nothing about the source to hide
	case errors.Is(err, ErrTooSlow):
		return fmt.Errorf("%w: %s: the download fell below the minimum rate", ErrTooSlow, r)
	case errors.Is(err, ErrAddressRefused):
		return fmt.Errorf("%w: %s: the address is not allowed by the fetch policy", ErrAddressRefused, r)
	case errors.Is(err, ErrFetch):
		return fmt.Errorf("%w: %s: the download failed", ErrFetch, r)
	case errors.Is(err, ErrBadCheckpoint):
		return fmt.Errorf("%w: %s did not serve a valid checkpoint", ErrBadCheckpoint, r)
	}
	return fmt.Errorf("%w: %s: the download failed", ErrFetch, r)
}
