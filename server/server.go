package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/load"
	"github.com/rolloutkit/rollout/server/api"
)

// Errors callers branch on.
var (
	// ErrFleetNotBuilt is returned when fleet flags (--redis, --fleet, ...) are given: the
	// fleet agent is not part of this build yet.
	ErrFleetNotBuilt = errors.New("server: fleet control plane not built yet")
	// ErrInvalidConfig wraps every configuration error.
	ErrInvalidConfig = errors.New("server: invalid config")
)

// Config configures one rollout server. The zero value serves builtin:tiny on 127.0.0.1:8000.
type Config struct {
	// Model is a model spec for load.Open (default "builtin:tiny"); Tokenizer overrides the
	// tokenizer beside it. ModelName is the id clients name (default: the spec for builtins,
	// the base name of a path).
	Model, Tokenizer, ModelName string
	// WeightVersion is the version of the initial weights (default 0).
	WeightVersion int64
	// Addr is the listen address (default 127.0.0.1:8000); Listener, when set, is used instead.
	Addr     string
	Listener net.Listener
	// Engine sizing: KV pool in blocks (or bytes), block size, batch bounds; zero takes the
	// engine's defaults. Workers is the kernel worker count (0: GOMAXPROCS).
	KVBlocks         int
	KVBytes          int64
	BlockSize        int
	MaxNumSeqs       int
	MaxBatchedTokens int
	Workers          int
	// OffloadCPUBytes enables the KV offloading connector with this much CPU memory;
	// OffloadDelay slows every transfer (tests and benchmarks only).
	OffloadCPUBytes int64
	OffloadDelay    time.Duration
	// Fleet membership (not built yet: any of these set makes New fail with ErrFleetNotBuilt).
	Redis, Fleet, ServerID, AdvertiseURL, FleetSecret string
	// AdminToken guards the admin routes (unset: loopback only); APIKey the generation routes.
	AdminToken, APIKey string
	// WeightsRoot confines file sources of /update_weights.
	WeightsRoot string
	// OTel selects the trace exporter: "" or "none". (Exporters live in the telemetry package,
	// which is not built yet: "stdout" and "otlp" are refused.)
	OTel string
	// HTTP limits; zero takes the api package's defaults.
	MaxConcurrent, MaxQueue int
	MaxBodyBytes            int64
	// ShutdownGrace bounds how long in-flight requests may run after a shutdown signal before
	// they are aborted (default 30s).
	ShutdownGrace time.Duration
	// Version is the build version /version reports.
	Version string
	// Logger defaults to slog.Default(); Tracer to a no-op tracer.
	Logger *slog.Logger
	Tracer trace.Tracer
}

// Server is one rollout server: engine, connector and HTTP API (and, later, the fleet agent).
type Server struct {
	cfg  Config
	log  *slog.Logger
	eng  *engine.Engine
	api  *api.API
	ln   net.Listener
	conn *connector
	// parts are long-lived components run beside the engine (the fleet agent plugs in here);
	// they stop after HTTP has drained and before the engine does.
	parts []part
}

// part is a long-lived component of the server.
type part interface {
	Run(ctx context.Context) error
}

// New loads the model, builds the engine, the connector and the API, and listens (so Addr is
// known before Run). Close the server by running it and cancelling the context; a server that
// is never run must be closed with Close.
func New(cfg Config) (*Server, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	ln := cfg.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", cfg.Addr); err != nil {
			return nil, fmt.Errorf("server: listen %s: %w", cfg.Addr, err)
		}
	}
	s, err := newServer(cfg, ln)
	if err != nil {
		_ = ln.Close()
		return nil, err
	}
	return s, nil
}

func newServer(cfg Config, ln net.Listener) (*Server, error) {
	m, err := load.Open(cfg.Model, cfg.Tokenizer)
	if err != nil {
		return nil, fmt.Errorf("server: model %s: %w", cfg.Model, err)
	}
	if cfg.ModelName == "" {
		cfg.ModelName = modelName(cfg.Model)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, ln: ln}
	metrics := api.NewMetrics()
	s.conn, err = newConnector(cfg, m.Weights.Config, cfg.Logger, metrics.ObserveResetToFlush)
	if err != nil {
		return nil, err
	}
	ecfg := engine.Config{Weights: m.Weights, WeightVersion: cfg.WeightVersion, BlockSize: cfg.BlockSize,
		NumBlocks: cfg.KVBlocks, KVBytes: cfg.KVBytes, MaxNumSeqs: cfg.MaxNumSeqs, MaxBatchedTokens: cfg.MaxBatchedTokens,
		Workers: cfg.Workers, Logger: cfg.Logger, Tracer: cfg.Tracer, Hooks: metrics.Hooks()}
	var connStats func() map[string]float64
	if s.conn != nil {
		ecfg.Connector, ecfg.ConnectorWorker = s.conn.scheduler, s.conn.worker
		connStats = s.conn.stats
	}
	if s.eng, err = engine.New(ecfg); err != nil {
		return nil, fmt.Errorf("server: engine: %w", err)
	}
	s.api, err = api.New(api.Config{Engine: s.eng, Tokenizer: m.Tokenizer, ModelConfig: m.Weights.Config,
		ModelName: cfg.ModelName, ChatTemplate: m.ChatTemplate, BOSToken: m.BOSToken, EOSToken: m.EOSToken, APIKey: cfg.APIKey, AdminToken: cfg.AdminToken,
		WeightsRoot: cfg.WeightsRoot, MaxConcurrent: cfg.MaxConcurrent, MaxQueue: cfg.MaxQueue, MaxBodyBytes: cfg.MaxBodyBytes,
		Metrics: metrics, ConnectorStats: connStats, Version: cfg.Version, Logger: cfg.Logger})
	if err != nil {
		s.closeEngine()
		return nil, err
	}
	return s, nil
}

func (c *Config) defaults() error {
	if c.Model == "" {
		c.Model = "builtin:tiny"
	}
	if c.Addr == "" {
		c.Addr = "127.0.0.1:8000"
	}
	if c.ShutdownGrace <= 0 {
		c.ShutdownGrace = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch c.OTel {
	case "", "none", "stdout", "otlp":
		// The main package installs the exporter (sdk/telemetry) and passes Config.Tracer.
	default:
		return fmt.Errorf("%w: --otel %q: want none, stdout or otlp", ErrInvalidConfig, c.OTel)
	}
	if c.OffloadCPUBytes < 0 || c.OffloadDelay < 0 {
		return fmt.Errorf("%w: negative offload size or delay", ErrInvalidConfig)
	}
	if c.OffloadDelay > 0 && c.OffloadCPUBytes == 0 {
		return fmt.Errorf("%w: --offload-delay needs --offload-cpu-bytes", ErrInvalidConfig)
	}
	var fleet []string
	for flag, v := range map[string]string{"--redis": c.Redis, "--fleet": c.Fleet, "--server-id": c.ServerID,
		"--advertise-url": c.AdvertiseURL, "--fleet-secret": c.FleetSecret} {
		if v != "" {
			fleet = append(fleet, flag)
		}
	}
	if len(fleet) > 0 {
		return fmt.Errorf("%w (given: %s); run without fleet flags for a standalone server", ErrFleetNotBuilt, strings.Join(fleet, ", "))
	}
	return nil
}

func modelName(spec string) string {
	if strings.HasPrefix(spec, "builtin:") {
		return spec
	}
	return filepath.Base(filepath.Clean(spec))
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// URL is the server's base URL, http://Addr.
func (s *Server) URL() string { return "http://" + s.Addr() }

// Engine is the server's engine.
func (s *Server) Engine() *engine.Engine { return s.eng }

// API is the server's HTTP API.
func (s *Server) API() *api.API { return s.api }

// Close releases a server that was never run: its listener and its engine's workers.
func (s *Server) Close() error {
	s.closeEngine()
	return s.ln.Close()
}

// closeEngine releases an engine that was never run (or stops one that is).
func (s *Server) closeEngine() {
	if err := s.eng.Close(); err != nil {
		s.log.Error("server: closing the engine", "err", err)
	}
}

// Run serves until ctx is cancelled, then shuts down gracefully: intake stops (new requests
// get 503, /ready fails), in-flight requests get ShutdownGrace to finish and are then
// aborted, the other parts stop, and the engine stops last. A clean shutdown returns nil.
func (s *Server) Run(ctx context.Context) error {
	engCtx, stopEngine := context.WithCancel(context.WithoutCancel(ctx))
	engDone := make(chan error, 1)
	go func() { engDone <- s.eng.Run(engCtx) }()
	defer func() {
		stopEngine()
		if err := <-engDone; err != nil {
			s.log.Error("server: engine stopped with an error", "err", err)
		}
	}()

	partsCtx, stopParts := context.WithCancel(context.WithoutCancel(ctx))
	partsDone := make(chan error, len(s.parts))
	for _, p := range s.parts {
		go func() { partsDone <- p.Run(partsCtx) }()
	}
	defer func() {
		stopParts()
		for range s.parts {
			if err := <-partsDone; err != nil {
				s.log.Error("server: component stopped with an error", "err", err)
			}
		}
	}()

	conns := &connTracker{states: map[net.Conn]http.ConnState{}}
	srv := &http.Server{Handler: s.api.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, ConnState: conns.track,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)}
	serveDone := make(chan error, 1)
	go func() { serveDone <- srv.Serve(s.ln) }()
	s.log.Info("server: listening", "addr", s.Addr(), "model", s.cfg.ModelName, "weight_version", s.eng.Version(),
		"offload", s.conn != nil, "admin_token", s.cfg.AdminToken != "", "api_key", s.cfg.APIKey != "")

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-serveDone:
		serveDone = nil
	}
	s.api.BeginShutdown()
	s.log.Info("server: shutting down", "inflight", s.api.Inflight(), "grace", s.cfg.ShutdownGrace)
	graceCtx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownGrace)
	err := s.drain(graceCtx, srv, conns)
	cancel()
	if err != nil {
		n := s.api.AbortAll()
		s.log.Warn("server: grace period over; aborted in-flight requests", "aborted", n)
		last, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := s.drain(last, srv, conns); err != nil {
			_ = srv.Close()
		}
		cancel()
	}
	if serveDone != nil {
		serveErr = <-serveDone
	}
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("server: serve: %w", serveErr)
	}
	s.log.Info("server: stopped")
	return nil
}

// drain shuts srv down gracefully. http.Server.Shutdown waits up to 5s for connections that
// were accepted but never sent a request; once no connection is serving a request (a response
// is flushed before its connection leaves StateActive) there is nothing left to wait for, so
// drain closes those at once.
func (s *Server) drain(ctx context.Context, srv *http.Server, conns *connTracker) error {
	done := make(chan error, 1)
	go func() { done <- srv.Shutdown(ctx) }()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-tick.C:
			if conns.active() == 0 {
				_ = srv.Close()
			}
		}
	}
}

// connTracker follows http.Server.ConnState to count connections serving a request.
type connTracker struct {
	mu     sync.Mutex
	states map[net.Conn]http.ConnState
}

func (t *connTracker) track(c net.Conn, st http.ConnState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if st == http.StateClosed || st == http.StateHijacked {
		delete(t.states, c)
		return
	}
	t.states[c] = st
}

func (t *connTracker) active() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, st := range t.states {
		if st == http.StateActive {
			n++
		}
	}
	return n
}

// Run builds a server from cfg and runs it until ctx is cancelled.
func Run(ctx context.Context, cfg Config) error {
	s, err := New(cfg)
	if err != nil {
		return err
	}
	return s.Run(ctx)
}
