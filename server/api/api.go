package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"go.opentelemetry.io/contrib/instrumentation/github.com/gin-gonic/gin/otelgin"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/tokenizer"
	"github.com/rolloutkit/rollout/engine/weights"
)

// Defaults of the Config limits.
const (
	DefaultMaxConcurrent = 256
	DefaultMaxQueue      = 1024
	DefaultMaxBodyBytes  = 8 << 20
	// DefaultMaxBodyBytesInFlight is the memory budget of request bodies being read or held
	// by their requests at once: eight bodies of the default MaxBodyBytes.
	DefaultMaxBodyBytesInFlight = 64 << 20
	DefaultMaxN                 = 64
)

// tracerName is the instrumentation scope of the API's own spans.
const tracerName = "github.com/rolloutkit/rollout/server/api"

var errShuttingDown = errors.New("api: server is shutting down")

// Config configures the HTTP API. Engine, Tokenizer and ModelConfig are required; zero limits
// take the defaults above.
type Config struct {
	// Engine serves the requests; it must be running (or about to run).
	Engine *engine.Engine
	// Tokenizer and ModelConfig describe the served model; ModelConfig is the config of the
	// initial weights (weight updates keep the shape).
	Tokenizer   tokenizer.Tokenizer
	ModelConfig model.Config
	// ModelName is the id /v1/models lists and requests must name (empty "model" is accepted).
	ModelName string
	// ChatTemplate is the checkpoint's Jinja chat template, rendered for /v1/chat/completions
	// and /tokenize with messages; empty means the built-in ChatML template. New fails when it
	// does not compile.
	ChatTemplate string
	// BOSToken and EOSToken are the checkpoint's bos_token and eos_token strings, the
	// template's variables of those names.
	BOSToken, EOSToken string
	// APIKey, when set, is required as a bearer token on the generation routes. AdminToken,
	// when set, is required on the admin routes; unset, they answer only clients of a unix
	// socket listener (SeparateAdmin on a unix listener): never a TCP client.
	APIKey, AdminToken string
	// SeparateAdmin moves the admin routes off Handler onto AdminHandler, for a listener of
	// their own.
	SeparateAdmin bool
	// FleetManaged marks a fleet member: the admin routes that change its weights or run
	// state (/pause, /resume, /sleep, /wake_up, /update_weights) answer 403 fleet_managed,
	// since the fleet's signed commands are their authority. The read-only routes,
	// /abort_requests and /reset_prefix_cache stay.
	FleetManaged bool
	// WeightsRoot confines file sources (paths and file:// URIs) of weight updates
	// (weights.Options.Root); NoFileWeights refuses them altogether (422 source_refused), the
	// `rollout serve` default without --weights-root.
	WeightsRoot   string
	NoFileWeights bool
	// WeightsHTTPClient fetches http(s) weight sources (nil: weights.NewHTTPClient with
	// WeightsFetch).
	WeightsHTTPClient *http.Client
	// WeightsFetch is the address policy and timeouts of the default weights client.
	WeightsFetch weights.FetchPolicy
	// AllowUnverifiedWeights accepts http(s) weight sources without a sha256; by default one
	// is required (a file source may omit it).
	AllowUnverifiedWeights bool
	// Weights, when set, is the set Engine was started with (at its serving version): the API
	// owns it from then on (nobody else may read it once it is retired) and, at F32, loads a
	// later update into its memory (see API.sets); at a lower precision it drops it.
	Weights *model.Weights
	// NoSpareWeights turns off the spare weight sets New prepares in the background: one set
	// of ModelConfig's shape (its parameter count × 4 bytes, 0.44 GB for stories110m), every
	// page written once, and the engine's packed model of it (engine.Engine.PrepareSpare,
	// about as large again), at the lowest CPU priority, so that the first update decodes
	// and packs into memory without page faults, as every later one does into the sets the
	// one before retired. Off, the first update (or two, without Weights) allocates new sets,
	// which on a virtual machine makes its load and stage several times slower. The memory
	// is what a server holds anyway from its second update on; a level-2 sleep gives
	// it back. At a precision below F32 only the packed spare is kept (the float32 set it
	// was packed from is dropped, as every loaded set is: see API.recycles).
	NoSpareWeights bool
	// BodyReadTimeout bounds reading a request body (default 30s: 408 beyond); WriteTimeout
	// bounds every write of a response (default 60s; a stream extends it per chunk).
	BodyReadTimeout, WriteTimeout time.Duration
	// MaxConcurrent generation requests run at once; up to MaxQueue more wait for a slot;
	// beyond that a request gets 429.
	MaxConcurrent int
	MaxQueue      int
	// MaxBodyBytes bounds a request body (413 beyond).
	MaxBodyBytes int64
	// MaxBodyBytesInFlight is the memory budget of request bodies admitted at once (default
	// DefaultMaxBodyBytesInFlight, at least MaxBodyBytes): a body is admitted before its
	// first byte is read, for its Content-Length or, chunked, 64 KiB at a time, and holds its
	// share until its request is answered; one that does not fit gets 503
	// body_budget_exhausted with Retry-After, unread.
	MaxBodyBytesInFlight int64
	// MaxN bounds n (choices per prompt) times the number of prompts (default 64).
	MaxN int
	// Metrics exports the Prometheus metrics (nil: a private set, not shared with the engine
	// hooks, so the TTFT histogram stays empty).
	Metrics *Metrics
	// ConnectorStats returns the KV connector's counters (nil: none), read at scrape time and
	// by /state; it must be safe to call from any goroutine.
	ConnectorStats func() map[string]float64
	// Ready reports extra readiness conditions (e.g. the fleet's desired version); nil error
	// means ready. Nil means no extra condition.
	Ready func() error
	// Version is the build version /version reports.
	Version string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// TracerProvider makes a server span per request (nil: none), the parent of the engine's
	// spans; a W3C traceparent header makes it a child of the caller's span, and a malformed
	// one is ignored (the request is served as if it had none). /metrics, /health and /ready
	// are not traced: scrapes and probes would drown the traces that matter.
	TracerProvider trace.TracerProvider
}

// API is the HTTP surface of one server. Create it with New and serve Handler.
type API struct {
	cfg     Config
	eng     *engine.Engine
	tok     tokenizer.Tokenizer
	log     *slog.Logger
	metrics *Metrics
	router  *gin.Engine
	limit   *limiter
	chat    *chatTemplate
	created int64
	// maxPromptBytes bounds prompt text before it is encoded (promptByteLimit).
	maxPromptBytes int

	idPrefix string
	nextID   atomic.Uint64

	// updating is set while an update commits (for /ready, /state and the engine_state
	// metric; fetching and staging leave the old weights serving); updateMu serialises
	// updates.
	updating atomic.Bool
	updateMu updateLock
	// sets holds the weight sets the update path loaded (and Config.Weights), so that a load
	// decodes into one the engine no longer reads instead of faulting in new memory. Rule:
	// only fetchAndStage takes a set, under updateMu, as Options.Reuse; it keeps every set it
	// loaded under the version it staged it as, whatever the stage's outcome (a stage whose
	// context ends may still happen), so a set is reused only once its version is neither
	// staged nor served (engine.Engine.VersionsInUse): versions only grow, so nothing reads
	// it again. A failed load drops the set it was given. A sleep drops the free sets, and at
	// level 2 the serving one too (ReleaseWeightSets). The packed spare the engine keeps
	// aliases a retired set's embedding and norms, but is never run. Only at F32 (recycles):
	// at a lower precision it stays empty and every load allocates, so no float32 set
	// outlives its packing.
	sets weights.Recycler
	// spareReady is closed once the spare set of Config.NoSpareWeights is ready (or failed).
	spareReady chan struct{}
	// reading counts requests reading their body (not yet admitted).
	reading atomic.Int64
	// budget is the memory budget of request bodies (Config.MaxBodyBytesInFlight).
	budget *bodyBudget
	csrf   *http.CrossOriginProtection
	adminR *gin.Engine

	closing atomic.Bool

	// afterAdd, when set (tests only), runs after the engine took choice k of a request.
	afterAdd func(k int)

	mu   sync.Mutex
	live map[string][]*liveRun // request id (as the client sees it) → its runs' engine ids
}

// ErrInvalidConfig wraps every error of Config.Validate.
var ErrInvalidConfig = errors.New("api: invalid config")

// Validate reports the first field New would refuse, as "api: invalid config: Field: reason"
// (errors.Is ErrInvalidConfig). Zero limits stand for their defaults and are valid.
func (cfg Config) Validate() error {
	switch {
	case cfg.Engine == nil:
		return fmt.Errorf("%w: Engine: required", ErrInvalidConfig)
	case cfg.Tokenizer == nil:
		return fmt.Errorf("%w: Tokenizer: required", ErrInvalidConfig)
	case cfg.ModelConfig.VocabSize <= 0 || cfg.ModelConfig.MaxPositionEmbeddings <= 0:
		return fmt.Errorf("%w: ModelConfig: no vocabulary or context size", ErrInvalidConfig)
	}
	return nil
}

// New builds the API and its routes.
func New(cfg Config) (*API, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = DefaultMaxConcurrent
	}
	if cfg.MaxQueue < 0 {
		cfg.MaxQueue = 0
	} else if cfg.MaxQueue == 0 {
		cfg.MaxQueue = DefaultMaxQueue
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MaxBodyBytesInFlight <= 0 {
		cfg.MaxBodyBytesInFlight = DefaultMaxBodyBytesInFlight
	}
	cfg.MaxBodyBytesInFlight = max(cfg.MaxBodyBytesInFlight, cfg.MaxBodyBytes)
	if cfg.MaxN <= 0 {
		cfg.MaxN = DefaultMaxN
	}
	if cfg.ModelName == "" {
		cfg.ModelName = "rollout"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics()
	}
	if cfg.BodyReadTimeout <= 0 {
		cfg.BodyReadTimeout = DefaultBodyReadTimeout
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.WeightsHTTPClient == nil {
		cfg.WeightsHTTPClient = weights.NewHTTPClient(cfg.WeightsFetch)
	}
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = noop.NewTracerProvider()
	}
	chat, err := newChatTemplate(cfg.ChatTemplate, cfg.BOSToken, cfg.EOSToken)
	if err != nil {
		return nil, err
	}
	a := &API{cfg: cfg, chat: chat, eng: cfg.Engine, tok: cfg.Tokenizer, log: cfg.Logger, metrics: cfg.Metrics,
		limit: newLimiter(cfg.MaxConcurrent, cfg.MaxQueue), created: time.Now().Unix(),
		idPrefix: fmt.Sprintf("%x", time.Now().UnixNano()&0xffffffffff), live: map[string][]*liveRun{},
		maxPromptBytes: promptByteLimit(cfg.Tokenizer, cfg.ModelConfig.MaxPositionEmbeddings),
		updateMu:       make(updateLock, 1), csrf: http.NewCrossOriginProtection(),
		budget: &bodyBudget{max: cfg.MaxBodyBytesInFlight}}
	if !chat.builtin {
		a.log.Info("api: chat uses the checkpoint's template", "chatml", isChatML(cfg.ChatTemplate))
		// A template can compile and still fail on every conversation (a construct the
		// evaluator lacks): say so at startup rather than only in 400s.
		probe := []chatMessage{{Role: "user", Content: []byte(`"hi"`)}}
		if _, err := chat.render(probe); err != nil {
			a.log.Warn("api: the chat template fails on a one-message user conversation", "error", err)
		}
	}
	if a.recycles() {
		a.sets.Keep(cfg.Weights, cfg.Engine.Version())
	}
	a.spareReady = make(chan struct{})
	if cfg.NoSpareWeights {
		close(a.spareReady)
	} else {
		go a.prepareSpare()
	}
	a.metrics.bind(a)
	a.router = a.routes(true, !cfg.SeparateAdmin)
	if cfg.SeparateAdmin {
		a.adminR = a.routes(false, true)
	}
	return a, nil
}

// prepareSpare makes the spare weight set (Config.NoSpareWeights) at the lowest priority.
func (a *API) prepareSpare() {
	defer close(a.spareReady)
	lowPriority()
	w, err := weights.Prefault(a.cfg.ModelConfig)
	if err != nil {
		a.log.Debug("api: no spare weight set", "err", err)
		return
	}
	// The engine's packed spare too (the first stage's memory); its values do not matter.
	if err := a.eng.PrepareSpare(context.Background(), w); err != nil {
		a.log.Debug("api: no packed spare", "err", err)
	}
	if a.recycles() {
		a.sets.KeepFree(w)
	}
}

// recycles says whether the API keeps float32 sets for reuse (API.sets): at F32 only. At a
// lower precision the engine keeps no float32 set once it packed one, so a kept set would be
// the only float32 copy in the process, four (bf16) or seven (int8) times the packed model's
// size in memory for the sake of an update's page faults: docs/precision.md, "Memory".
func (a *API) recycles() bool { return a.eng.Precision() == kernels.F32 }

// SpareReady is closed once the spare weight sets prepared at start-up are ready, failed, or
// were not asked for (Config.NoSpareWeights). Until then a preparation call may still reach
// the engine loop; tests that count the loop's queued calls wait for it.
func (a *API) SpareReady() <-chan struct{} { return a.spareReady }

// Handler is the http.Handler serving every route, or with Config.SeparateAdmin every route
// but the admin ones. Every write of a response extends the connection's write deadline.
func (a *API) Handler() http.Handler { return a.withDeadlines(a.router) }

// AdminHandler serves the admin routes (and the always-open ones) when Config.SeparateAdmin
// is set; otherwise it is nil.
func (a *API) AdminHandler() http.Handler {
	if a.adminR == nil {
		return nil
	}
	return a.withDeadlines(a.adminR)
}

// Metrics returns the metric set the API exports.
func (a *API) Metrics() *Metrics { return a.metrics }

// BeginShutdown makes new generation requests fail with 503 and /ready answer 503; requests
// already admitted continue.
func (a *API) BeginShutdown() { a.closing.Store(true) }

// AbortAll aborts every engine request the API started and returns how many.
func (a *API) AbortAll() int {
	ids := a.abortIDs(nil)
	a.eng.Abort(ids...)
	return len(ids)
}

// Busy reports whether a generation request is admitted or queued for a slot (a request
// still reading its body holds nothing and is refused when it gets there).
func (a *API) Busy() bool {
	return a.limit.inflight() > 0 || a.limit.queued.Load() > 0
}

// Inflight is the number of generation requests admitted and not yet answered.
func (a *API) Inflight() int { return a.limit.inflight() }

// routes builds a router with the generation routes (public), the admin routes (admin), or
// both, and always the open ones.
func (a *API) routes(public, admin bool) *gin.Engine {
	quietGin()
	r := gin.New()
	r.HandleMethodNotAllowed = true
	r.ContextWithFallback = true
	r.Use(func(c *gin.Context) { c.Set(ctxAPI, a) })
	r.Use(gin.CustomRecoveryWithWriter(nil, func(c *gin.Context, rec any) {
		a.log.Error("api: panic in handler", "path", c.Request.URL.Path, "panic", rec)
		writeError(c, &Error{Status: http.StatusInternalServerError, Type: typeInternal, Code: "internal", Message: "internal error"})
	}))
	r.NoRoute(func(c *gin.Context) {
		writeError(c, &Error{Status: http.StatusNotFound, Type: typeNotFound, Code: "not_found", Message: "no such route"})
	})
	r.NoMethod(func(c *gin.Context) {
		writeError(c, &Error{Status: http.StatusMethodNotAllowed, Type: typeInvalidRequest, Code: "method_not_allowed",
			Message: c.Request.Method + " is not allowed on this route"})
	})
	r.Use(otelgin.Middleware("rollout", otelgin.WithTracerProvider(a.cfg.TracerProvider),
		otelgin.WithPropagators(propagation.TraceContext{}), otelgin.WithMeterProvider(metricnoop.NewMeterProvider()),
		otelgin.WithFilter(func(r *http.Request) bool {
			switch r.URL.Path {
			case "/metrics", "/health", "/ready":
				return false
			}
			return true
		})))

	if public {
		// Authentication, then the body (admitted into the memory budget, then read, bounded
		// in size and time), then a concurrency slot: a slow or oversized body never holds a
		// slot.
		gen := r.Group("/", a.requireKey(a.cfg.APIKey, "API key"), a.readBody)
		gen.GET("/v1/models", a.handleModels)
		limited := gen.Group("/", a.admit)
		limited.POST("/tokenize", a.handleTokenize)
		limited.POST("/detokenize", a.handleDetokenize)
		limited.POST("/v1/completions", a.handleCompletions)
		limited.POST("/v1/chat/completions", a.handleChat)
		limited.POST("/generate", a.handleGenerate)
	}

	if admin {
		adm := r.Group("/", a.crossOrigin, a.requireAdmin, a.readBody, a.requireJSON)
		// Weights and run state: the fleet's on a fleet member.
		run := adm.Group("/", a.fleetManaged)
		run.POST("/pause", a.handlePause)
		run.POST("/resume", a.handleResume)
		adm.GET("/is_paused", a.handleIsPaused)
		run.POST("/sleep", a.handleSleep)
		run.POST("/wake_up", a.handleWakeUp)
		adm.GET("/is_sleeping", a.handleIsSleeping)
		adm.POST("/reset_prefix_cache", a.handleResetPrefixCache)
		run.POST("/update_weights", a.handleUpdateWeights)
		adm.POST("/abort_requests", a.handleAbortRequests)
		adm.GET("/state", a.handleState)
	}

	r.GET("/health", a.handleHealth)
	r.GET("/ready", a.handleReady)
	r.GET("/version", a.handleVersion)
	r.GET("/metrics", gin.WrapH(a.metrics.handler()))
	return r
}

func tooLarge(limit int64) *Error {
	return &Error{Status: http.StatusRequestEntityTooLarge, Type: typeInvalidRequest, Code: "request_too_large",
		Message: fmt.Sprintf("request body larger than %d bytes", limit)}
}

// tokenEqual compares in constant time; hashing first makes the time independent of the
// lengths as well.
func tokenEqual(got, want string) bool {
	g, w := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(g[:], w[:]) == 1
}

func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	const p = "Bearer "
	if len(h) < len(p) || !strings.EqualFold(h[:len(p)], p) {
		return "", false
	}
	return strings.TrimSpace(h[len(p):]), true
}

func unauthorized(code, msg string) *Error {
	return &Error{Status: http.StatusUnauthorized, Type: typeAuthentication, Code: code, Message: msg}
}

// requireKey requires key as the bearer token (nothing when key is empty). what names it in
// messages; the admin token's refusals carry their own codes (admin_token_required,
// invalid_admin_token), the API key's invalid_api_key.
func (a *API) requireKey(key, what string) gin.HandlerFunc {
	missing, wrong := "invalid_api_key", "invalid_api_key"
	if what == "admin token" {
		missing, wrong = "admin_token_required", "invalid_admin_token"
	}
	return func(c *gin.Context) {
		if key == "" {
			c.Next()
			return
		}
		got, ok := bearer(c.Request)
		if !ok {
			writeError(c, unauthorized(missing, "missing "+what+": send Authorization: Bearer <key>"))
			return
		}
		if !tokenEqual(got, key) {
			writeError(c, unauthorized(wrong, "wrong "+what))
			return
		}
		c.Next()
	}
}

// admit applies the concurrency limit to generation routes.
func (a *API) admit(c *gin.Context) {
	if a.closing.Load() {
		c.Header("Retry-After", "1")
		writeError(c, errShuttingDown)
		return
	}
	release, err := a.limit.acquire(c.Request.Context())
	if err != nil {
		if errors.Is(err, errTooMany) {
			writeError(c, &Error{Status: http.StatusTooManyRequests, Type: typeRateLimit, Code: "too_many_requests", Message: err.Error()})
		} else {
			// The client went away while queued: nobody reads the answer.
			c.Abort()
		}
		return
	}
	defer release()
	c.Next()
}

// newID returns a fresh request id with the given prefix.
func (a *API) newID(prefix string) string {
	return fmt.Sprintf("%s-%s-%d", prefix, a.idPrefix, a.nextID.Add(1))
}

// liveRun is one submitted request: the client-visible id it is tracked under, its engine
// ids, and whether an abort named it.
type liveRun struct {
	client  string
	ids     []string
	aborted bool
}

// track records that the client-visible id runs as the engine ids; untrack forgets them.
func (a *API) track(id string, engineIDs []string) *liveRun {
	r := &liveRun{client: id, ids: engineIDs}
	a.mu.Lock()
	a.live[id] = append(a.live[id], r)
	a.mu.Unlock()
	return r
}

// untrack forgets r; another request may share its client id.
func (a *API) untrack(r *liveRun) {
	a.mu.Lock()
	defer a.mu.Unlock()
	left := slices.DeleteFunc(a.live[r.client], func(x *liveRun) bool { return x == r })
	if len(left) == 0 {
		delete(a.live, r.client)
	} else {
		a.live[r.client] = left
	}
}

// abortedDuring reports whether an abort named r since it was tracked.
func (a *API) abortedDuring(r *liveRun) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return r.aborted
}

// abortIDs maps client ids to engine ids (nil: all live requests) and marks their runs
// aborted, so that a run still adding choices aborts the ones the engine did not yet have when
// the abort reached it. An id that is not a tracked client id is passed through, so engine ids
// work too.
func (a *API) abortIDs(ids []string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	mark := func(runs []*liveRun) {
		for _, r := range runs {
			r.aborted = true
			out = append(out, r.ids...)
		}
	}
	if len(ids) == 0 {
		for _, runs := range a.live {
			mark(runs)
		}
		return out
	}
	for _, id := range ids {
		if runs, ok := a.live[id]; ok {
			mark(runs)
		} else {
			out = append(out, id)
		}
	}
	return out
}

var errTooMany = errors.New("too many concurrent requests: the queue is full")

// limiter admits up to n requests at once and queues up to q more.
type limiter struct {
	slots  chan struct{}
	queued atomic.Int64
	maxQ   int64
}

func newLimiter(n, q int) *limiter {
	return &limiter{slots: make(chan struct{}, n), maxQ: int64(q)}
}

func (l *limiter) acquire(ctx interface{ Done() <-chan struct{} }) (func(), error) {
	release := func() { <-l.slots }
	select {
	case l.slots <- struct{}{}:
		return release, nil
	default:
	}
	if l.queued.Add(1) > l.maxQ {
		l.queued.Add(-1)
		return nil, errTooMany
	}
	defer l.queued.Add(-1)
	select {
	case l.slots <- struct{}{}:
		return release, nil
	case <-ctx.Done():
		return nil, errors.New("client gone while queued")
	}
}

func (l *limiter) inflight() int { return len(l.slots) }
