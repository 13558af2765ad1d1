package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/load"
	"github.com/rolloutkit/rollout/engine/weights"
	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/bus/redisconf"
	"github.com/rolloutkit/rollout/sdk/protocol"
	"github.com/rolloutkit/rollout/server/agent"
	"github.com/rolloutkit/rollout/server/api"
	"github.com/rolloutkit/rollout/server/peer"
)

// tracerName is the instrumentation scope of the server's own spans (engine, fleet agent).
const tracerName = "github.com/rolloutkit/rollout/server"

// Errors callers branch on.
var (
	// ErrInvalidConfig wraps every configuration error.
	ErrInvalidConfig = errors.New("server: invalid config")
)

// Defaults of the Config fields a zero value stands for (the engine's and the api package's
// are theirs: engine.DefaultBlockSize, api.DefaultMaxConcurrent, ...).
const (
	// DefaultAddr is the listen address.
	DefaultAddr = "127.0.0.1:8000"
	// DefaultShutdownGrace bounds how long in-flight requests may run after a shutdown signal.
	DefaultShutdownGrace = 30 * time.Second
)

// Config configures one rollout server. The zero value serves builtin:tiny on 127.0.0.1:8000.
type Config struct {
	// Model is a model spec for load.Open (default load.DefaultSpec); Tokenizer overrides the
	// tokenizer beside it. ModelName is the id clients name (default: the spec for builtins,
	// the base name of a path).
	Model, Tokenizer, ModelName string
	// WeightVersion is the version of the initial weights (default 0).
	WeightVersion int64
	// Addr is the listen address (default DefaultAddr); Listener, when set, is used instead
	// (the server closes it, as New does when it fails).
	Addr     string
	Listener net.Listener
	// Engine sizing: KV pool in blocks (or bytes), block size, batch bounds; zero takes the
	// engine's defaults. Workers is the kernel worker count (0: GOMAXPROCS).
	KVBlocks int
	KVBytes  int64
	// MemoryBytes budgets the packed model and the KV pool together (engine.Config.MemoryBytes).
	MemoryBytes      int64
	BlockSize        int
	MaxNumSeqs       int
	MaxBatchedTokens int
	Workers          int
	// Precision is how the engine stores the weights (engine.Config.Precision): every set it
	// loads, the initial one and each update, is rounded or quantized to it when packed.
	Precision kernels.Precision
	// PrefaultKV commits the KV pool's memory when it is allocated (engine.Config.PrefaultKV).
	PrefaultKV bool
	// OffloadCPUBytes enables the KV offloading connector with this much CPU memory;
	// OffloadDelay slows every transfer (tests and benchmarks only).
	OffloadCPUBytes int64
	OffloadDelay    time.Duration
	// BeforeForward is engine.Hooks.BeforeForward: tests hold the engine loop with it to catch
	// requests mid-generation without racing them. Nil in production.
	BeforeForward func(step uint64) error
	// Fleet membership: with Fleet set the server runs a fleet agent over Bus (an open bus
	// the server uses and does not close, e.g. an embedded fleet's in-process bus) or over
	// the Redis that Redis describes (dialled, and redialled while it is down, by the server).
	// ServerID defaults to hostname-port, AdvertiseURL to the server's URL. FleetSecret, when
	// set, must be at least 32 bytes.
	Fleet, ServerID, AdvertiseURL, FleetSecret string
	Bus                                        bus.Bus
	// Redis is how to reach the fleet's Redis: Redis.URL (the --redis flag), and the rest
	// (password or its file, TLS files, Sentinel master and credentials). Its files are read
	// again at every dial, so a rotated password or CA is picked up on reconnect.
	Redis redisconf.Config
	// FleetHeartbeat and FleetHeartbeatTTL pace the agent's heartbeat (0: 1s and 5s).
	FleetHeartbeat, FleetHeartbeatTTL time.Duration
	// FleetKey is this server's issued key file's contents (`rollout fleet keys issue`),
	// used instead of FleetSecret: the server then verifies the trainer's commands and signs
	// only its own heartbeats and acks, and holds nothing that signs for the fleet.
	FleetKey []byte
	// InsecureUnsignedFleet lets a fleet member run without FleetSecret: it then obeys any
	// publisher on its Redis. Refused by default.
	InsecureUnsignedFleet bool
	// StateDir, when set, is where the fleet agent keeps the newest desired state it
	// accepted, so that after a restart (and a Redis restart that lost the key) the server
	// still knows the fleet's version and run state.
	StateDir string
	// PeerDir holds the versions a fleet server serves its peers at /weights/ (default: a
	// temporary directory removed when the server stops); NoPeers turns the route off (the
	// server then fetches only from the origin and feeds nobody).
	PeerDir string
	NoPeers bool
	// AdminToken guards the admin routes; APIKey the generation routes. Without an admin
	// token New generates one (AdminToken reports it, AdminTokenPath receives it): no admin
	// route answers a TCP client without a token. Only an admin unix socket (AdminAddr
	// unix:PATH, created 0600) admits tokenless clients, whom its permissions let in.
	AdminToken, APIKey string
	// AdminTokenPath, when set, is where a generated admin token is written (mode 0600, in a
	// directory created 0700 that must not be writable by others) for local clients to find,
	// and removed when the server stops. `rollout serve` sets it to
	// AdminTokenFile(DefaultStateDir(), port).
	AdminTokenPath string
	// FleetAdminRoutes keeps, on a fleet member, the admin routes that change weights and run
	// state (/pause, /resume, /sleep, /wake_up, /update_weights); without it they answer 403
	// fleet_managed, since the fleet is their authority (api.Config.FleetManaged).
	FleetAdminRoutes bool
	// AdminAddr puts the admin routes on a listener of their own: host:port, or unix:PATH
	// for a unix socket (created 0600, replacing a stale socket file). AdminListener, when
	// set, is used instead.
	AdminAddr     string
	AdminListener net.Listener
	// WeightsRoot confines file sources (paths and file:// URIs) of weight updates, the
	// admin route's and the fleet's, to a directory (symlinks out of it are refused).
	// NoFileWeights refuses file sources altogether: `rollout serve` sets it when no
	// --weights-root is given.
	WeightsRoot   string
	NoFileWeights bool
	// WeightsFetchTimeout bounds a whole weight fetch and load (0: weights.DefaultFetchTimeout);
	// WeightsMinRate is the least an http(s) download must average over every
	// WeightsMinRateWindow (0: weights.DefaultMinRate over weights.DefaultMinRateWindow;
	// negative: none).
	WeightsFetchTimeout  time.Duration
	WeightsMinRate       int64
	WeightsMinRateWindow time.Duration
	// AllowUnverifiedWeights accepts http(s) weight sources without a sha256.
	AllowUnverifiedWeights bool
	// NoSpareWeights skips the spare weight sets prepared at start-up for the first update
	// (api.Config.NoSpareWeights, which states their memory).
	NoSpareWeights bool
	// WeightsAllowPrivate lets http(s) weight fetches reach loopback, private and link-local
	// addresses. Loopback alone is allowed when the server listens on loopback only.
	WeightsAllowPrivate bool
	// MaxQueued bounds the engine's waiting queue (0: the engine's default).
	MaxQueued int
	// BodyReadTimeout and WriteTimeout bound reading a request body and each response write
	// (0: the api package's defaults).
	BodyReadTimeout, WriteTimeout time.Duration
	// OTel names the trace exporter the main package installed (none, stdout or otlp), for
	// validation and logs; the spans go to TracerProvider.
	OTel string
	// HTTP limits; zero takes the api package's defaults.
	MaxConcurrent, MaxQueue int
	MaxBodyBytes            int64
	// MaxBodyBytesInFlight is the memory budget of request bodies in flight
	// (api.Config.MaxBodyBytesInFlight).
	MaxBodyBytesInFlight int64
	// ShutdownGrace bounds how long in-flight requests may run after a shutdown signal before
	// they are aborted (default 30s).
	ShutdownGrace time.Duration
	// Version is the build version /version reports.
	Version string
	// Logger defaults to slog.Default(). TracerProvider makes every span of the server (the
	// HTTP routes', the fleet agent's, the engine's, the connector's); nil: none. Tracer, when
	// set, replaces the engine's and the agent's tracer.
	Logger         *slog.Logger
	TracerProvider trace.TracerProvider
	Tracer         trace.Tracer
}

// Server is one rollout server: engine, connector, HTTP API and, in a fleet, the fleet agent.
type Server struct {
	cfg  Config
	log  *slog.Logger
	eng  *engine.Engine
	api  *api.API
	ln   net.Listener
	adm  net.Listener // the admin listener, nil when admin routes share ln
	conn *connector
	// parts are long-lived components run beside the engine (the fleet agent plugs in here);
	// they stop after HTTP has drained and before the engine does.
	parts []part
	agent *agent.Agent
	// auth signs and verifies the fleet's messages (from FleetKey or FleetSecret; unsigned
	// without either).
	auth *protocol.Auth
	// peer is the fleet's peer route (nil without one); peerTmp its directory when the
	// server made it.
	peer    *peer.Server
	peerTmp string
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
		// Listeners handed in are the server's: close them as a failed start would.
		for _, l := range []net.Listener{cfg.Listener, cfg.AdminListener} {
			if l != nil {
				_ = l.Close()
			}
		}
		return nil, err
	}
	ln := cfg.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", cfg.Addr); err != nil {
			return nil, fmt.Errorf("server: listen %s: %w", cfg.Addr, err)
		}
	}
	adm, err := listenAdmin(cfg)
	if err != nil {
		_ = ln.Close()
		return nil, err
	}
	closeAll := func() {
		_ = ln.Close()
		if adm != nil {
			_ = adm.Close()
		}
	}
	if cfg.AdminToken == "" && (adm == nil || !isUnix(adm.Addr())) {
		if cfg.AdminToken, err = newAdminToken(); err != nil {
			closeAll()
			return nil, err
		}
		if cfg.AdminTokenPath != "" {
			if err := writeAdminToken(cfg.AdminTokenPath, cfg.AdminToken); err != nil {
				closeAll()
				return nil, err
			}
			cfg.Logger.Info("server: admin token generated (send it as Authorization: Bearer; `rollout admin` reads it)", "admin_token_file", cfg.AdminTokenPath)
		}
	} else {
		cfg.AdminTokenPath = "" // nothing written, nothing to remove
	}
	s, err := newServer(cfg, ln, adm)
	if err != nil {
		removeAdminToken(cfg.AdminTokenPath, cfg.AdminToken)
		closeAll()
		return nil, err
	}
	return s, nil
}

// listenAdmin opens the admin listener of AdminAddr (nil without one).
func listenAdmin(cfg Config) (net.Listener, error) {
	if cfg.AdminListener != nil {
		return cfg.AdminListener, nil
	}
	if cfg.AdminAddr == "" {
		return nil, nil
	}
	if path, ok := strings.CutPrefix(cfg.AdminAddr, "unix:"); ok {
		if path == "" {
			return nil, fmt.Errorf("%w: --admin-addr unix: needs a path", ErrInvalidConfig)
		}
		// A socket file left by a server that died would make Listen fail; anything else at
		// the path is not ours to remove.
		if st, err := os.Lstat(path); err == nil && st.Mode()&os.ModeSocket != 0 {
			_ = os.Remove(path)
		}
		ln, err := net.Listen("unix", path)
		if err != nil {
			return nil, fmt.Errorf("server: admin listen %s: %w", cfg.AdminAddr, err)
		}
		if err := os.Chmod(path, 0o600); err != nil {
			_ = ln.Close()
			return nil, fmt.Errorf("server: admin socket %s: %w", path, err)
		}
		return ln, nil
	}
	ln, err := net.Listen("tcp", cfg.AdminAddr)
	if err != nil {
		return nil, fmt.Errorf("server: admin listen %s: %w", cfg.AdminAddr, err)
	}
	return ln, nil
}

// isUnix reports whether addr is a unix socket.
func isUnix(addr net.Addr) bool { return addr.Network() == "unix" || addr.Network() == "unixpacket" }

// isLocal reports whether addr is a unix socket or a loopback TCP address.
func isLocal(addr net.Addr) bool {
	if addr.Network() == "unix" || addr.Network() == "unixpacket" {
		return true
	}
	host, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func newServer(cfg Config, ln, adm net.Listener) (*Server, error) {
	m, err := load.OpenAs(cfg.Model, cfg.Tokenizer, cfg.Precision)
	if err != nil {
		return nil, fmt.Errorf("server: model %s: %w", cfg.Model, err)
	}
	if cfg.ModelName == "" {
		cfg.ModelName = modelName(cfg.Model)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, ln: ln, adm: adm, auth: cfg.fleetAuth()}
	metrics := api.NewMetrics()
	s.conn, err = newConnector(cfg, m.Config, cfg.Logger, cfg.TracerProvider, metrics.ObserveResetToFlush)
	if err != nil {
		return nil, err
	}
	hooks := metrics.Hooks()
	hooks.BeforeForward = cfg.BeforeForward
	var steps *agent.StepClock
	if cfg.Fleet != "" {
		steps = agent.NewStepClock(nil)
		hooks.OnStep = steps.Hook(hooks.OnStep)
	}
	ecfg := engine.Config{Weights: m.Weights, Builder: m.Builder, WeightVersion: cfg.WeightVersion, BlockSize: cfg.BlockSize,
		NumBlocks: cfg.KVBlocks, KVBytes: cfg.KVBytes, MemoryBytes: cfg.MemoryBytes, MaxNumSeqs: cfg.MaxNumSeqs, MaxBatchedTokens: cfg.MaxBatchedTokens,
		Workers: cfg.Workers, Precision: cfg.Precision, PrefaultKV: cfg.PrefaultKV, MaxQueued: cfg.MaxQueued, Logger: cfg.Logger, Tracer: cfg.Tracer, Hooks: hooks}
	var connStats func() map[string]float64
	if s.conn != nil {
		ecfg.Connector, ecfg.ConnectorWorker = s.conn.scheduler, s.conn.worker
		connStats = s.conn.stats
	}
	if s.eng, err = engine.New(ecfg); err != nil {
		return nil, fmt.Errorf("server: engine: %w", err)
	}
	var ready func() error
	if cfg.Fleet != "" {
		// s.agent is set below, before anything can call /ready (the server is not running).
		ready = func() error { return s.agent.Ready() }
	}
	// The API owns m.Weights (nil below F32: m.Builder is the engine's) from here on:
	// nothing else keeps it, and an update reuses it.
	s.api, err = api.New(api.Config{Engine: s.eng, Tokenizer: m.Tokenizer, ModelConfig: m.Config, Weights: m.Weights,
		ModelName: cfg.ModelName, ChatTemplate: m.ChatTemplate, BOSToken: m.BOSToken, EOSToken: m.EOSToken, APIKey: cfg.APIKey, AdminToken: cfg.AdminToken,
		WeightsRoot: cfg.WeightsRoot, NoFileWeights: cfg.NoFileWeights, MaxConcurrent: cfg.MaxConcurrent, MaxQueue: cfg.MaxQueue,
		MaxBodyBytes: cfg.MaxBodyBytes, MaxBodyBytesInFlight: cfg.MaxBodyBytesInFlight,
		SeparateAdmin: adm != nil, FleetManaged: cfg.Fleet != "" && !cfg.FleetAdminRoutes, AllowUnverifiedWeights: cfg.AllowUnverifiedWeights,
		NoSpareWeights: cfg.NoSpareWeights,
		// A server bound to loopback is a local setup: its weights may come from this host.
		WeightsFetch: weights.FetchPolicy{AllowLoopback: cfg.WeightsAllowPrivate || isLocal(ln.Addr()), AllowPrivate: cfg.WeightsAllowPrivate,
			FetchTimeout: cfg.WeightsFetchTimeout, MinRate: cfg.WeightsMinRate, MinRateWindow: cfg.WeightsMinRateWindow},
		BodyReadTimeout: cfg.BodyReadTimeout, WriteTimeout: cfg.WriteTimeout,
		Metrics: metrics, ConnectorStats: connStats, Ready: ready, Version: cfg.Version, Logger: cfg.Logger, TracerProvider: cfg.TracerProvider})
	if err != nil {
		s.closeEngine()
		return nil, err
	}
	if cfg.Fleet != "" {
		if s.agent, err = s.newAgent(steps, metrics); err != nil {
			s.closeEngine()
			return nil, err
		}
		s.parts = append(s.parts, s.agent)
	}
	return s, nil
}

// newAgent builds the fleet agent over the engine and the API's staging path.
func (s *Server) newAgent(steps *agent.StepClock, metrics *api.Metrics) (*agent.Agent, error) {
	cfg := s.cfg
	id := cfg.ServerID
	if id == "" {
		id = defaultServerID(s.ln.Addr())
	}
	adv := cfg.AdvertiseURL
	if adv == "" {
		adv = advertiseURL(s.ln.Addr())
	}
	if !cfg.NoPeers {
		if err := s.startPeer(); err != nil {
			return nil, err
		}
	}
	acfg := agent.Config{Bus: cfg.Bus, Fleet: cfg.Fleet, ServerID: id, AdvertiseURL: adv, Build: cfg.Version,
		Secret: []byte(cfg.FleetSecret), Auth: s.auth, Engine: &agent.EngineAdapter{Engine: s.eng, AbortRequests: s.api.Abort, Clock: steps, Slept: s.api.ReleaseWeightSets},
		Stage: func(ctx context.Context, ref protocol.WeightsRef) (int64, error) {
			return s.api.StageWeights(ctx, weights.Ref{Version: ref.Version, URI: ref.URI, SHA256: ref.SHA256})
		},
		ErrorCode: api.ErrorCode, HeartbeatInterval: cfg.FleetHeartbeat, HeartbeatTTL: cfg.FleetHeartbeatTTL, StateDir: cfg.StateDir,
		Logger: cfg.Logger, Tracer: cfg.Tracer, Metrics: metrics}
	if s.peer != nil {
		acfg.PeerURL = strings.TrimSuffix(adv, "/") + strings.TrimSuffix(peer.Route, "/")
		acfg.Holds = s.peer.Holds
		acfg.StagePeers = func(ctx context.Context, req agent.StageRequest) (agent.StageReport, error) {
			return s.stagePeers(ctx, req, metrics)
		}
	}
	if acfg.Bus == nil {
		conf, log := cfg.Redis, cfg.Logger
		acfg.Dial = func(ctx context.Context) (bus.Bus, error) { return dialRedis(ctx, conf, id, log) }
	}
	a, err := agent.New(acfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return a, nil
}

// defaultServerID is hostname-port, or a random id when the hostname is unknown.
func defaultServerID(addr net.Addr) string {
	_, port, _ := net.SplitHostPort(addr.String())
	host, err := os.Hostname()
	if err != nil || host == "" {
		return "server-" + protocol.NewID()[:12]
	}
	return host + "-" + port
}

// advertiseURL is the server's URL as others reach it: the listen address, or the hostname
// when it listens on every interface.
func advertiseURL(addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "http://" + addr.String()
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if h, err := os.Hostname(); err == nil && h != "" {
			host = h
		} else {
			host = "127.0.0.1"
		}
	}
	return "http://" + net.JoinHostPort(host, port)
}

// Agent is the server's fleet agent (nil when it is not in a fleet).
func (s *Server) Agent() *agent.Agent { return s.agent }

// fleetAuth is the Auth of the fleet key or secret (validated by defaults).
func (c *Config) fleetAuth() *protocol.Auth {
	if len(c.FleetKey) > 0 {
		if a, err := protocol.ParseServerKey(c.FleetKey); err == nil {
			return a
		}
		return protocol.Untrusting()
	}
	return protocol.SecretAuth([]byte(c.FleetSecret))
}

func (c *Config) defaults() error {
	if c.Model == "" {
		c.Model = load.DefaultSpec
	}
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.ShutdownGrace <= 0 {
		c.ShutdownGrace = DefaultShutdownGrace
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.TracerProvider == nil {
		c.TracerProvider = noop.NewTracerProvider()
	}
	if c.Tracer == nil {
		c.Tracer = c.TracerProvider.Tracer(tracerName)
	}
	return c.Validate()
}

// Validate reports the first setting New would refuse, as "server: invalid config: --flag:
// reason" (errors.Is ErrInvalidConfig). The server's fields are the flags of `rollout serve`,
// so its errors name the flag a user sets; the engine's and the api package's own fields are
// checked by their Validate when New builds them.
func (c Config) Validate() error {
	switch c.OTel {
	case "", "none", "stdout", "otlp":
		// The main package installs the exporter (sdk/telemetry) and passes Config.Tracer.
	default:
		return fmt.Errorf("%w: --otel: %q, want none, stdout or otlp", ErrInvalidConfig, c.OTel)
	}
	if c.OffloadCPUBytes < 0 {
		return fmt.Errorf("%w: --offload-cpu-bytes: %d is negative", ErrInvalidConfig, c.OffloadCPUBytes)
	}
	if c.OffloadDelay < 0 {
		return fmt.Errorf("%w: --offload-delay: %v is negative", ErrInvalidConfig, c.OffloadDelay)
	}
	if c.OffloadDelay > 0 && c.OffloadCPUBytes == 0 {
		return fmt.Errorf("%w: --offload-delay: needs --offload-cpu-bytes", ErrInvalidConfig)
	}
	return c.fleetDefaults()
}

// fleetDefaults checks the fleet settings: a fleet needs a bus (Redis or Bus, not both),
// and the other fleet settings need a fleet.
func (c *Config) fleetDefaults() error {
	if c.Redis.URL != "" && c.Bus != nil {
		return fmt.Errorf("%w: Redis and Bus are exclusive", ErrInvalidConfig)
	}
	if c.Fleet == "" {
		var given []string
		for _, f := range []struct{ flag, v string }{{"--redis", c.Redis.URL}, {"--server-id", c.ServerID},
			{"--advertise-url", c.AdvertiseURL}, {"--fleet-secret", c.FleetSecret}} {
			if f.v != "" {
				given = append(given, f.flag)
			}
		}
		if c.Bus != nil {
			given = append(given, "Bus")
		}
		if len(given) > 0 {
			return fmt.Errorf("%w: %s need --fleet NAME", ErrInvalidConfig, strings.Join(given, ", "))
		}
		return nil
	}
	if c.Redis.URL == "" && c.Bus == nil {
		return fmt.Errorf("%w: --fleet needs --redis URL", ErrInvalidConfig)
	}
	if c.Redis.URL != "" {
		if err := c.checkRedis(); err != nil {
			return err
		}
	}
	if err := protocol.CheckSecret([]byte(c.FleetSecret)); err != nil {
		return fmt.Errorf("%w: --fleet-secret: %w", ErrInvalidConfig, err)
	}
	if c.FleetSecret != "" && len(c.FleetKey) > 0 {
		return fmt.Errorf("%w: --fleet-secret-file and --fleet-key-file are exclusive", ErrInvalidConfig)
	}
	if len(c.FleetKey) > 0 {
		k, err := protocol.ParseServerKey(c.FleetKey)
		if err != nil {
			return fmt.Errorf("%w: --fleet-key-file: %w", ErrInvalidConfig, err)
		}
		if c.ServerID == "" {
			c.ServerID = k.ServerID() // the key names the server
		}
		if k.ServerID() != c.ServerID {
			return fmt.Errorf("%w: --fleet-key-file was issued to server %q, not %q", ErrInvalidConfig, k.ServerID(), c.ServerID)
		}
	}
	if c.FleetSecret == "" && len(c.FleetKey) == 0 && !c.InsecureUnsignedFleet {
		return fmt.Errorf("%w: a fleet member needs --fleet-key-file or --fleet-secret-file (without one anyone who reaches Redis steers the fleet); "+
			"--insecure-unsigned-fleet runs it unsigned anyway", ErrInvalidConfig)
	}
	if c.FleetHeartbeat < 0 || c.FleetHeartbeatTTL < 0 {
		return fmt.Errorf("%w: negative fleet heartbeat interval or TTL", ErrInvalidConfig)
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

// AdminToken is the admin routes' bearer token: Config.AdminToken, or the one New generated
// ("" when the admin routes are on a unix socket and no token was given).
func (s *Server) AdminToken() string { return s.cfg.AdminToken }

// Close releases a server that was never run: its listener and its engine's workers.
func (s *Server) Close() error {
	s.closeEngine()
	removeAdminToken(s.cfg.AdminTokenPath, s.cfg.AdminToken)
	s.removePeerDir()
	if s.adm != nil {
		_ = s.adm.Close()
	}
	return s.ln.Close()
}

// AdminAddr is the admin listener's address ("" when the admin routes share Addr).
func (s *Server) AdminAddr() string {
	if s.adm == nil {
		return ""
	}
	return s.adm.Addr().String()
}

// closeEngine releases an engine that was never run (or stops one that is).
func (s *Server) closeEngine() {
	if err := s.eng.Close(); err != nil {
		s.log.Error("server: closing the engine", "err", err)
	}
}

// startParts runs the server's parts (the fleet agent, the peer route) until stop, which
// waits for them. A part that ends on its own (the agent refusing to join a fleet) ends the
// server: its error arrives on failed.
func (s *Server) startParts(ctx context.Context) (failed <-chan error, stop func()) {
	partsCtx, stopParts := context.WithCancel(context.WithoutCancel(ctx))
	partsDone := make(chan error, len(s.parts))
	for _, p := range s.parts {
		go func() { partsDone <- p.Run(partsCtx) }()
	}
	partFailed := make(chan error, 1)
	stopWatch := func() {}
	if len(s.parts) > 0 {
		var watchCtx context.Context
		watchCtx, stopWatch = context.WithCancel(context.Background())
		go func() {
			select {
			case err := <-partsDone:
				partsDone <- err // stop's wait collects it
				partFailed <- err
			case <-watchCtx.Done():
			}
		}()
	}
	return partFailed, func() {
		stopWatch()
		stopParts()
		for range s.parts {
			if err := <-partsDone; err != nil {
				s.log.Error("server: component stopped with an error", "err", err)
			}
		}
	}
}

// serveAdmin serves the admin routes on their own listener until the returned stop. The
// admin listener lives as long as the server; its requests are short.
func (s *Server) serveAdmin() (stop func()) {
	admSrv := &http.Server{Handler: s.api.AdminHandler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)}
	admDone := make(chan error, 1)
	go func() { admDone <- admSrv.Serve(s.adm) }()
	s.log.Info("server: admin routes on their own listener", "admin_addr", s.adm.Addr().String())
	return func() {
		_ = admSrv.Close()
		if err := <-admDone; err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("server: admin listener stopped with an error", "err", err)
		}
	}
}

// shutdown refuses new work and lets admitted requests finish within the grace period, then
// aborts what is left and closes the listener.
func (s *Server) shutdown(srv *http.Server, conns *connTracker) {
	s.api.BeginShutdown()
	if s.agent != nil {
		s.agent.Drain()
	}
	s.log.Info("server: shutting down", "inflight", s.api.Inflight(), "grace", s.cfg.ShutdownGrace)
	graceCtx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownGrace)
	defer cancel()
	// Keep listening while admitted requests finish, so a client arriving now gets a 503
	// (and a Retry-After) instead of a refused connection; connections close after their
	// answer.
	srv.SetKeepAlivesEnabled(false)
	s.waitIdle(graceCtx)
	if err := s.drain(graceCtx, srv, conns); err == nil {
		return
	}
	n := s.api.AbortAll()
	s.log.Warn("server: grace period over; aborted in-flight requests", "aborted", n)
	last, cancelLast := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelLast()
	if err := s.drain(last, srv, conns); err != nil {
		_ = srv.Close()
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
	// Serve nothing before the engine loop runs: until then /ready and every request would
	// answer 503 "engine loop not running", for the moment the loop takes to start. Requests
	// that arrive meanwhile wait in the listener's backlog. A call the loop answers proves it
	// runs.
	if _, err := s.eng.IsPaused(ctx); err != nil && ctx.Err() == nil {
		return fmt.Errorf("server: engine loop did not start: %w", err)
	}

	partFailed, stopParts := s.startParts(ctx)
	defer stopParts()

	defer s.removePeerDir()
	defer removeAdminToken(s.cfg.AdminTokenPath, s.cfg.AdminToken)
	conns := &connTracker{states: map[net.Conn]http.ConnState{}}
	srv := &http.Server{Handler: s.handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, ConnState: conns.track,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)}
	serveDone := make(chan error, 1)
	go func() { serveDone <- srv.Serve(s.ln) }()
	if s.adm != nil {
		defer s.serveAdmin()()
	}
	if s.cfg.Fleet != "" && !s.auth.Signed() {
		s.log.Warn("server: INSECURE: this fleet member runs unsigned (--insecure-unsigned-fleet): anyone who can publish on its Redis can pause it, swap its weights or fake its state")
	}
	s.log.Info("server: listening", "addr", s.Addr(), "model", s.cfg.ModelName, "weight_version", s.eng.Version(),
		"precision", s.cfg.Precision.String(), "offload", s.conn != nil, "admin_token", s.cfg.AdminToken != "", "fleet_admin_routes", s.cfg.Fleet == "" || s.cfg.FleetAdminRoutes, "api_key", s.cfg.APIKey != "")

	var serveErr, partErr error
	select {
	case <-ctx.Done():
	case serveErr = <-serveDone:
		serveDone = nil
	case partErr = <-partFailed:
		if partErr == nil {
			partErr = errors.New("a server component stopped")
		}
		s.log.Error("server: a component stopped; shutting down", "err", partErr)
	}
	s.shutdown(srv, conns)
	if serveDone != nil {
		serveErr = <-serveDone
	}
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("server: serve: %w", serveErr)
	}
	if partErr != nil {
		return fmt.Errorf("server: %w", partErr)
	}
	s.log.Info("server: stopped")
	return nil
}

// waitIdle waits until no generation request is admitted or reading its body, or ctx ends.
func (s *Server) waitIdle(ctx context.Context) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for s.api.Busy() {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
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
