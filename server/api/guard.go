package api

import (
	"context"
	"errors"
	"io"
	"mime"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
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

// readBody admits the body into the memory budget of bodies in flight, then reads it whole,
// within MaxBodyBytes and BodyReadTimeout, before the request goes further: a client that
// sends its body slowly then holds a goroutine and at most its share of the budget, never a
// concurrency slot or the update lock. Admission comes before the first byte is read: a body
// declared larger than MaxBodyBytes is refused (413), and one the budget cannot take (its
// Content-Length, or for a chunked body each further step of bodyStep bytes) is refused with
// 503 and Retry-After without reading it (large bodies may take only part of the budget:
// bodyBudget). The reservation is held until the request is answered, since the handler
// keeps the body.
func (a *API) readBody(c *gin.Context) {
	r := c.Request
	if !hasBody(r) {
		c.Next()
		return
	}
	res := &bodyReservation{b: a.budget}
	defer res.release()
	if r.ContentLength > 0 && r.ContentLength <= a.cfg.MaxBodyBytes && !res.grow(r.ContentLength) {
		a.refuseBody(c, "budget", errBodyBudget)
		return
	}
	a.reading.Add(1)
	rc := http.NewResponseController(c.Writer)
	_ = rc.SetReadDeadline(time.Now().Add(a.cfg.BodyReadTimeout))
	body, err := a.readLimited(c, res)
	a.reading.Add(-1)
	if err != nil {
		// Keep the deadline: net/http discards an unread body before it answers, and that
		// must not wait for a client that stopped sending. The connection then closes.
		a.refuseBody(c, bodyRefusal(err), err)
		return
	}
	// Clear the deadline: net/http keeps reading the connection in the background to notice
	// a client that leaves, and a deadline passing there would cancel the request.
	_ = rc.SetReadDeadline(time.Time{})
	c.Set(ctxBody, body)
	c.Next()
}

// refuseBody answers a refused body and closes the connection after the answer: whatever
// the client still sends is not read (beyond readLimited's bounded drain of an oversized
// one), so a refusal costs the server a constant amount whatever the client declared.
func (a *API) refuseBody(c *gin.Context, reason string, err error) {
	a.metrics.bodyRejected.WithLabelValues(reason).Inc()
	if errors.Is(err, errBodyBudget) {
		c.Header("Retry-After", "1") // and writeError leaves the body unread
	}
	c.Header("Connection", "close")
	writeError(c, err)
}

// bodyRefusal is the reason label of rollout_http_body_rejected_total for a read error.
func bodyRefusal(err error) string {
	var ae *Error
	switch {
	case errors.Is(err, errBodyBudget):
		return "budget"
	case errors.As(err, &ae) && ae.Status == http.StatusRequestEntityTooLarge:
		return "too_large"
	case errors.As(err, &ae) && ae.Status == http.StatusRequestTimeout:
		return "timeout"
	}
	return "bad_body"
}

// bodyStep is how much of the budget a body of unknown length (chunked) reserves at a time.
const bodyStep = 64 << 10

// errBodyBudget refuses a body the memory budget of bodies in flight cannot take.
var errBodyBudget = &Error{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: "body_budget_exhausted",
	Message: "the server is reading as many request bodies as its memory budget allows; retry shortly"}

// bodyBudget is the memory budget of request bodies in flight (Config.MaxBodyBytesInFlight):
// a body is admitted only when its bytes fit beside the others'. Large bodies (over
// smallBody) may fill only three quarters of it, so that clients holding large uploads
// cannot keep the ordinary small requests out: those need as many held connections as the
// last quarter holds small bodies.
type bodyBudget struct {
	max  int64
	used atomic.Int64
}

// smallBody is the largest reservation that may use the whole budget.
func (b *bodyBudget) smallBody() int64 { return max(b.max/64, bodyStep) }

// tryAcquire takes n bytes of the budget for a reservation that then holds total bytes,
// when they fit, without waiting.
func (b *bodyBudget) tryAcquire(n, total int64) bool {
	limit := b.max
	if total > b.smallBody() {
		limit = b.max / 4 * 3
	}
	for {
		u := b.used.Load()
		if u+n > limit {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// bodyReservation is the part of the budget one request holds.
type bodyReservation struct {
	b *bodyBudget
	n int64
}

// grow reserves n more bytes; false when the budget cannot take them.
func (r *bodyReservation) grow(n int64) bool {
	if !r.b.tryAcquire(n, r.n+n) {
		return false
	}
	r.n += n
	return true
}

func (r *bodyReservation) release() {
	r.b.used.Add(-r.n)
	r.n = 0
}

// readLimited reads the body up to MaxBodyBytes, within the reservation res (grown as a body
// of unknown length arrives). Beyond MaxBodyBytes it answers 413, but first reads and
// discards up to a bound more: a client that sends its whole body before reading (Python's
// http.client, requests) would otherwise see a reset connection, not the 413.
func (a *API) readLimited(c *gin.Context, res *bodyReservation) ([]byte, error) {
	r, limit := c.Request, a.cfg.MaxBodyBytes
	if r.ContentLength > limit {
		a.drain(c)
		return nil, tooLarge(limit)
	}
	if r.ContentLength > 0 {
		// Admitted for exactly its declared length: one buffer of that size.
		body := make([]byte, r.ContentLength)
		if _, err := io.ReadFull(r.Body, body); err != nil {
			return nil, readError(err)
		}
		return body, nil
	}
	// Unknown length: read in steps, each reserved before it is read.
	var body []byte
	for {
		if int64(len(body)) == res.n {
			if int64(len(body)) > limit {
				a.drain(c)
				return nil, tooLarge(limit)
			}
			if !res.grow(min(bodyStep, limit+1-res.n)) {
				return nil, errBodyBudget
			}
			body = slices.Grow(body, int(res.n)-len(body))
		}
		n, err := r.Body.Read(body[len(body):res.n])
		body = body[:len(body)+n]
		if err == io.EOF {
			if int64(len(body)) > limit {
				return nil, tooLarge(limit)
			}
			return body, nil
		}
		if err != nil {
			return nil, readError(err)
		}
	}
}

// drain discards what is left of an oversized body, up to a bound, and closes the
// connection after the answer when more remains.
func (a *API) drain(c *gin.Context) {
	bound := min(max(4*a.cfg.MaxBodyBytes, 1<<20), maxDrainBytes)
	n, err := io.CopyN(io.Discard, c.Request.Body, bound)
	if err == nil && n == bound {
		c.Header("Connection", "close")
	}
}

// maxDrainBytes bounds what drain reads of one refused body.
const maxDrainBytes = 32 << 20

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

// requireAdmin checks the admin token. Without one configured, only a client of the admin
// unix socket (--admin-addr unix:PATH, created 0600: the file's permissions decide) is
// admitted; over TCP there is no tokenless admin at all, since a loopback peer may be any
// local process or any client of a local reverse proxy.
func (a *API) requireAdmin(c *gin.Context) {
	if a.cfg.AdminToken != "" {
		a.requireKey(a.cfg.AdminToken, "admin token")(c)
		return
	}
	if onUnixSocket(c.Request) {
		c.Next()
		return
	}
	writeError(c, &Error{Status: http.StatusUnauthorized, Type: typeAuthentication, Code: "admin_token_required",
		Message: "admin routes over TCP need an admin token: send Authorization: Bearer <token> (rollout serve prints where it wrote it)"})
}

// fleetManaged refuses, on a fleet member (Config.FleetManaged), the admin routes that change
// the weights or the run state: the fleet's signed commands are their authority, and an
// admin change beside them would leave the member out of step with what the trainer
// committed.
func (a *API) fleetManaged(c *gin.Context) {
	if a.cfg.FleetManaged {
		writeError(c, &Error{Status: http.StatusForbidden, Type: typeAuthentication, Code: "fleet_managed",
			Message: "this server is a fleet member: the fleet changes its weights and run state (start it with --fleet-admin-routes to allow this route)"})
		return
	}
	c.Next()
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
