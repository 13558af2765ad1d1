package api

import (
	"context"
	"errors"
	"io"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
)

// Keys of the values the middleware leaves in the gin context.
const (
	ctxAPI  = "rollout.api"
	ctxBody = "rollout.body"
)

// Defaults of the Config deadlines.
const (
	DefaultBodyReadTimeout = 30 * time.Second
	DefaultWriteTimeout    = 60 * time.Second
)

// forwardingHeaders are the headers proxies, sidecars and tunnels add. A tokenless admin
// request carrying one came through such a hop, so its loopback peer says nothing about who
// sent it.
var forwardingHeaders = []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto",
	"X-Forwarded-Port", "X-Forwarded-Server", "X-Real-IP", "X-Client-IP", "X-Cluster-Client-IP", "True-Client-IP",
	"CF-Connecting-IP", "Fastly-Client-IP", "X-Original-Forwarded-For", "Via"}

// requestBody is the body readBody read, nil when there was none.
func requestBody(c *gin.Context) []byte {
	v, _ := c.Get(ctxBody)
	b, _ := v.([]byte)
	return b
}

// hasBody reports whether the request announces a body.
func hasBody(r *http.Request) bool {
	return r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0
}

// readBody reads the whole body, within MaxBodyBytes and BodyReadTimeout, before the
// request goes further: a client that sends its body slowly then holds a goroutine and a
// buffer, never a concurrency slot or the update lock.
func (a *API) readBody(c *gin.Context) {
	r := c.Request
	if !hasBody(r) {
		c.Next()
		return
	}
	a.reading.Add(1)
	rc := http.NewResponseController(c.Writer)
	_ = rc.SetReadDeadline(time.Now().Add(a.cfg.BodyReadTimeout))
	body, err := a.readLimited(c)
	a.reading.Add(-1)
	if err != nil {
		// Keep the deadline: net/http discards an unread body before it answers, and that
		// must not wait for a client that stopped sending. The connection then closes.
		c.Header("Connection", "close")
		writeError(c, err)
		return
	}
	// Clear the deadline: net/http keeps reading the connection in the background to notice
	// a client that leaves, and a deadline passing there would cancel the request.
	_ = rc.SetReadDeadline(time.Time{})
	c.Set(ctxBody, body)
	c.Next()
}

// readLimited reads the body up to MaxBodyBytes. Beyond that it answers 413, but first reads
// and discards up to drainBytes more: a client that sends its whole body before reading
// (Python's http.client, requests) would otherwise see a reset connection, not the 413.
func (a *API) readLimited(c *gin.Context) ([]byte, error) {
	r, limit := c.Request, a.cfg.MaxBodyBytes
	if r.ContentLength > limit {
		a.drain(c)
		return nil, tooLarge(limit)
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, readError(err)
	}
	if int64(len(body)) > limit {
		a.drain(c)
		return nil, tooLarge(limit)
	}
	return body, nil
}

// drain discards what is left of an oversized body, up to a bound, and closes the
// connection after the answer when more remains.
func (a *API) drain(c *gin.Context) {
	bound := max(4*a.cfg.MaxBodyBytes, 1<<20)
	n, err := io.CopyN(io.Discard, c.Request.Body, bound)
	if err == nil && n == bound {
		c.Header("Connection", "close")
	}
}

func readError(err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return &Error{Status: http.StatusRequestTimeout, Type: typeInvalidRequest, Code: "request_timeout",
			Message: "the request body did not arrive in time"}
	}
	return badRequest("bad_body", "", "the request body could not be read")
}

// deadlineWriter extends the connection's write deadline before every write, so a client
// that stops reading loses its connection after WriteTimeout while a stream that keeps
// moving (a chunk per token) never hits it.
type deadlineWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
}

func (w *deadlineWriter) extend() { _ = w.rc.SetWriteDeadline(time.Now().Add(w.d)) }

// WriteHeader implements http.ResponseWriter.
func (w *deadlineWriter) WriteHeader(code int) {
	w.extend()
	w.ResponseWriter.WriteHeader(code)
}

// Write implements http.ResponseWriter.
func (w *deadlineWriter) Write(b []byte) (int, error) {
	w.extend()
	return w.ResponseWriter.Write(b)
}

// Flush implements http.Flusher.
func (w *deadlineWriter) Flush() {
	w.extend()
	_ = w.rc.Flush()
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// withDeadlines wraps h so every response write extends the write deadline.
func (a *API) withDeadlines(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(&deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w), d: a.cfg.WriteTimeout}, r)
	})
}

// onUnixSocket reports whether the request came over a unix socket (the admin listener's
// --admin-addr unix:PATH), which only local users with access to the file can reach.
func onUnixSocket(r *http.Request) bool {
	la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	return ok && (la.Network() == "unix" || la.Network() == "unixpacket")
}

// crossOrigin refuses non-safe cross-origin browser requests (CSRF) on the admin routes.
func (a *API) crossOrigin(c *gin.Context) {
	if err := a.csrf.Check(c.Request); err != nil {
		writeError(c, &Error{Status: http.StatusForbidden, Type: typeAuthentication, Code: "cross_origin",
			Message: "cross-origin requests may not use the admin routes"})
		return
	}
	c.Next()
}

// requireAdmin checks the admin token. With none configured it admits only clients that are
// direct and local: a unix-socket peer, or a loopback peer whose request carries no
// forwarding header and whose Host names this listener (a DNS-rebound name does not).
func (a *API) requireAdmin(c *gin.Context) {
	if a.cfg.AdminToken != "" {
		a.requireKey(a.cfg.AdminToken, "admin token")(c)
		return
	}
	r := c.Request
	if onUnixSocket(r) {
		c.Next()
		return
	}
	deny := func(code, msg string) {
		writeError(c, &Error{Status: http.StatusUnauthorized, Type: typeAuthentication, Code: code, Message: msg})
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		deny("admin_loopback_only", "admin routes answer only loopback clients when no admin token is configured")
		return
	}
	for _, h := range forwardingHeaders {
		if r.Header.Get(h) != "" {
			deny("admin_forwarded", "admin routes without an admin token refuse proxied requests (header "+h+")")
			return
		}
	}
	if !a.hostAllowed(r) {
		deny("admin_bad_host", "admin routes without an admin token need a Host naming this listener")
		return
	}
	c.Next()
}

// hostAllowed reports whether the Host header names this listener: a loopback address or
// localhost with the listener's port, or a name of Config.AllowedHosts.
func (a *API) hostAllowed(r *http.Request) bool {
	h := strings.ToLower(r.Host)
	name, port, err := net.SplitHostPort(h)
	if err != nil {
		name, port = strings.Trim(h, "[]"), "80"
	}
	for _, ok := range a.cfg.AllowedHosts {
		if ok = strings.ToLower(ok); ok == h || ok == name {
			return true
		}
	}
	local := ""
	if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		if _, p, err := net.SplitHostPort(la.String()); err == nil {
			local = p
		}
	}
	if port != local {
		return false
	}
	if name == "localhost" {
		return true
	}
	ip := net.ParseIP(name)
	return ip != nil && ip.IsLoopback()
}

// requireJSON refuses an admin request whose body is not declared application/json: an HTML
// form or a "simple" cross-site fetch cannot send that type without a CORS preflight.
func (a *API) requireJSON(c *gin.Context) {
	if len(requestBody(c)) == 0 {
		c.Next()
		return
	}
	mt, _, err := mime.ParseMediaType(c.GetHeader("Content-Type"))
	if err != nil || mt != "application/json" {
		writeError(c, &Error{Status: http.StatusUnsupportedMediaType, Type: typeInvalidRequest, Code: "unsupported_media_type",
			Message: "admin request bodies must be sent as Content-Type: application/json"})
		return
	}
	c.Next()
}

// updateLock serialises weight updates; a waiter whose context ends gives up.
type updateLock chan struct{}

func (l updateLock) lock(ctx context.Context) error {
	select {
	case l <- struct{}{}:
		return nil
	case <-ctx.Done():
		return &Error{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: "update_busy",
			Message: "gave up waiting for the weight update in progress: " + strconv.Quote(ctx.Err().Error())}
	}
}

func (l updateLock) unlock() { <-l }
