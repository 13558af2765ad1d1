package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/protocol"
)

// Defaults of Config: the fleet protocol's timings, which the SDK assumes too.
const (
	DefaultHeartbeatInterval = protocol.HeartbeatInterval
	DefaultHeartbeatTTL      = protocol.HeartbeatTTL
	DefaultAckTTL            = protocol.AckTTL
)

// Errors callers branch on (and ErrRefuseJoin).
var (
	// ErrInvalidConfig wraps every configuration error of New.
	ErrInvalidConfig = errors.New("agent: invalid config")
	// ErrAlreadyRunning is Run's answer on a second call.
	ErrAlreadyRunning = errors.New("agent: already running")
)

// Metrics are the agent's counters (the server's api.Metrics implements them).
type Metrics interface {
	// CommandDone counts an executed command by kind and result (ok, failed).
	CommandDone(kind, result string)
	// Rejected counts a refused message by reason (the Reason constants).
	Rejected(reason string)
}

// UpdateObserver is implemented by Metrics that record weight-update phases
// (rollout_update_weights_seconds{phase}); ctx holds the command's span, for exemplars.
type UpdateObserver interface {
	ObserveUpdate(ctx context.Context, phase string, d time.Duration)
}

// Config configures an agent. Bus (or Dial), Fleet, ServerID, Engine and Stage are required.
type Config struct {
	// Bus is an open bus the agent uses and does not close. Dial, when Bus is nil, opens one
	// in Run (retried with backoff while it fails) that the agent closes when it stops.
	Bus  bus.Bus
	Dial func(ctx context.Context) (bus.Bus, error)
	// Fleet and ServerID name this server; AdvertiseURL is where the fleet sends it requests;
	// Build is the build version its heartbeat reports.
	Fleet, ServerID, AdvertiseURL, Build string
	// Secret is the fleet secret (empty: unsigned; else at least 32 bytes). Auth, when set,
	// is used instead: an issued server key (protocol.ParseServerKey), which verifies the
	// trainer's commands and signs only this server's own messages.
	Secret []byte
	Auth   *protocol.Auth
	// Engine executes the commands.
	Engine Engine
	// Stage fetches, verifies and stages a weights version while the server keeps serving,
	// and returns the bytes it read.
	Stage func(ctx context.Context, ref protocol.WeightsRef) (bytes int64, err error)
	// StagePeers, when set, replaces Stage: it gets the peer the stage command assigned this
	// server (checked against the fleet's heartbeats) and reports where the bytes came from.
	StagePeers func(ctx context.Context, req StageRequest) (StageReport, error)
	// PeerURL is the base of this server's /weights/ route its heartbeat advertises, and
	// Holds the versions it can serve there (both empty: no peer route).
	PeerURL string
	Holds   func() []int64
	// ErrorCode maps an engine or stage error to the short code of its ack (nil: generic
	// codes).
	ErrorCode func(error) string
	// HeartbeatInterval (default protocol.HeartbeatInterval, 1s) and HeartbeatTTL (default
	// protocol.HeartbeatTTL, 5s) pace the heartbeat key; AckTTL (default protocol.AckTTL,
	// 10m) is how long an ack list lives. A TTL other than the default must be the clients'
	// Options.HeartbeatTTL too.
	HeartbeatInterval, HeartbeatTTL, AckTTL time.Duration
	// ClockSkew and MaxLifetime tune replay protection (CoreConfig).
	ClockSkew, MaxLifetime time.Duration
	// Now is the clock of deadlines and timestamps (default time.Now).
	Now func() time.Time
	// StateDir, when set, is where the agent keeps the newest desired state it accepted
	// (DesiredStateFile), so that after a restart, and a Redis restart that lost the key, it
	// still knows the fleet's version and run state and writes them back.
	StateDir string
	// Logger defaults to slog.Default(); Tracer to a no-op tracer; Metrics to none.
	Logger  *slog.Logger
	Tracer  trace.Tracer
	Metrics Metrics
}

func (c *Config) validate() error {
	var errs []error
	// Each error names the field ("Field: reason"), as every config of the module does.
	field := func(name, reason string) error { return fmt.Errorf("%s: %s", name, reason) }
	if c.Bus == nil && c.Dial == nil {
		errs = append(errs, field("Bus", "a Bus or a Dial func is required"))
	}
	if c.Fleet == "" {
		errs = append(errs, field("Fleet", "required"))
	}
	if c.ServerID == "" {
		errs = append(errs, field("ServerID", "required"))
	}
	if c.Engine == nil || c.Stage == nil && c.StagePeers == nil {
		errs = append(errs, field("Engine, Stage", "an Engine and a Stage or StagePeers func are required"))
	}
	if err := protocol.CheckSecret(c.Secret); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", "Secret", err))
	}
	if c.Auth != nil && c.Auth.ServerID() != "" && c.Auth.ServerID() != c.ServerID {
		errs = append(errs, field("Auth", fmt.Sprintf("the server key was issued to %q, this server is %q", c.Auth.ServerID(), c.ServerID)))
	}
	if c.HeartbeatInterval < 0 || c.HeartbeatTTL < 0 || c.AckTTL < 0 {
		errs = append(errs, field("HeartbeatInterval, HeartbeatTTL, AckTTL", "negative"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.HeartbeatTTL == 0 {
		c.HeartbeatTTL = max(DefaultHeartbeatTTL, 3*c.HeartbeatInterval)
	}
	if c.HeartbeatTTL <= c.HeartbeatInterval {
		return fmt.Errorf("%w: heartbeat TTL %s must exceed the interval %s", ErrInvalidConfig, c.HeartbeatTTL, c.HeartbeatInterval)
	}
	if c.AckTTL == 0 {
		c.AckTTL = DefaultAckTTL
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Tracer == nil {
		c.Tracer = noop.NewTracerProvider().Tracer("github.com/rolloutkit/rollout/server/agent")
	}
	if c.ErrorCode == nil {
		c.ErrorCode = func(error) string { return "" }
	}
	if c.Auth == nil {
		a, err := protocol.NewAuth(c.Secret)
		if err != nil {
			return fmt.Errorf("%w: Secret: %w", ErrInvalidConfig, err)
		}
		c.Auth = a
	}
	return nil
}

// Agent is one server's member of a fleet: it runs commands from the control channel on the
// engine, heartbeats, and converges to the fleet's desired state. Create it with New and run
// it with Run; InRotation and Ready are safe to call from any goroutine.
type Agent struct {
	cfg   Config
	names protocol.Names
	log   *slog.Logger

	started  atomic.Bool
	drainReq chan struct{}

	// What InRotation reads: the desired state as last verified, and whether it is known.
	mu           sync.Mutex
	desiredKnown bool
	desired      *protocol.DesiredState
	stopping     bool
	draining     bool

	// The digests of the checkpoints this agent staged and committed, by version: the
	// engine knows versions only. Guarded by mu (the two lanes' workers and the loop).
	staged, serving digestOf

	// bus is the loop's bus once connected: the worker reads a peer's heartbeat through it.
	bus atomic.Pointer[busBox]

	// The span kinds of a command's process and ack spans, built once: every server starts
	// both per command, traced or not.
	consumerSpan, producerSpan []trace.SpanStartOption
}

type busBox struct{ b bus.Bus }

// New validates cfg and returns an agent that has not joined yet.
func New(cfg Config) (*Agent, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Agent{cfg: cfg, names: protocol.Names{Fleet: cfg.Fleet}, log: cfg.Logger.With("fleet", cfg.Fleet, "server_id", cfg.ServerID),
		drainReq:     make(chan struct{}, 1),
		consumerSpan: []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)},
		producerSpan: []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer)}}, nil
}

// Drain takes the server out of rotation at once (its next heartbeat, written right away,
// says so) while it keeps executing commands: the server calls it when it begins to shut
// down, so the fleet stops routing to it before its listener closes.
func (a *Agent) Drain() {
	a.mu.Lock()
	a.draining = true
	a.mu.Unlock()
	select {
	case a.drainReq <- struct{}{}:
	default:
	}
}

// ServerID is the id this agent answers to.
func (a *Agent) ServerID() string { return a.cfg.ServerID }

// InRotation reports whether the server may take fleet traffic: the desired state has been
// read, the engine serves at least its version and is neither paused nor asleep, the fleet is
// not paused, and the agent is not stopping.
func (a *Agent) InRotation() bool { return a.Ready() == nil }

// Ready is InRotation with the reason when not (for /ready).
func (a *Agent) Ready() error {
	a.mu.Lock()
	known, d, stopping := a.desiredKnown, a.desired, a.stopping || a.draining
	a.mu.Unlock()
	return RotationError(known, d, a.engineState(), stopping)
}

// digestOf is a checkpoint digest and the version it was recorded for.
type digestOf struct {
	version int64
	sha     string
}

// of is the digest when v is the version recorded ("" otherwise: unknown).
func (d digestOf) of(v int64) string {
	if d.version == v && v > 0 {
		return d.sha
	}
	return ""
}

// engineState is the engine's snapshot with the digests this agent knows and the versions
// the peer route holds.
func (a *Agent) engineState() EngineState {
	st := a.cfg.Engine.State()
	a.mu.Lock()
	st.WeightSHA256, st.StagedSHA256 = a.serving.of(st.WeightVersion), a.staged.of(st.StagedVersion)
	a.mu.Unlock()
	if a.cfg.Holds != nil {
		st.Holds = a.cfg.Holds()
	}
	return st
}

func (a *Agent) publish(c *Core, stopping bool) {
	d, known := c.DesiredState()
	a.mu.Lock()
	a.desiredKnown, a.desired, a.stopping = known, d, stopping
	a.mu.Unlock()
}

// Run joins the fleet and serves until ctx is cancelled; then it finishes the command in
// progress, acks, writes a last "stopping" heartbeat and returns nil. Bus failures are
// logged and retried with backoff (the server keeps serving meanwhile); Run returns an error
// only when it must not join (ErrRefuseJoin) or is run twice.
func (a *Agent) Run(ctx context.Context) error {
	if !a.started.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	saved, err := a.loadState()
	if err != nil {
		return err
	}
	l := &loop{a: a, core: NewCore(CoreConfig{Fleet: a.cfg.Fleet, ServerID: a.cfg.ServerID, AdvertiseURL: a.cfg.AdvertiseURL, PeerURL: a.cfg.PeerURL,
		Build: a.cfg.Build, Secret: a.cfg.Secret, Auth: a.cfg.Auth, Start: a.cfg.Now(), ClockSkew: a.cfg.ClockSkew, MaxLifetime: a.cfg.MaxLifetime,
		RetryMin: a.cfg.HeartbeatInterval, Saved: saved}), done: make(chan workDone, 2)}
	if d, _ := l.core.DesiredState(); d != nil {
		a.log.Info("agent: restored the fleet's desired state from the state directory", "epoch", d.Epoch, "dir", a.cfg.StateDir)
	}
	return l.run(ctx)
}

// DesiredStateFile is the file in Config.StateDir holding the newest desired state the agent
// accepted (the signed record as read from the bus).
const DesiredStateFile = "desired-state.json"

// loadState reads the saved desired state (nil when there is no state directory or file).
func (a *Agent) loadState() ([]byte, error) {
	if a.cfg.StateDir == "" {
		return nil, nil
	}
	b, err := os.ReadFile(filepath.Join(a.cfg.StateDir, DesiredStateFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("agent: read the saved desired state: %w", err)
	}
	return b, nil
}

// saveState writes raw to the state directory atomically (a temporary file renamed over
// the old one), so a crash leaves the old record or the new, never half of one.
func (a *Agent) saveState(raw []byte) error {
	if a.cfg.StateDir == "" {
		return nil
	}
	if err := os.MkdirAll(a.cfg.StateDir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(a.cfg.StateDir, DesiredStateFile+".*")
	if err != nil {
		return err
	}
	_, werr := f.Write(raw)
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		_ = os.Remove(f.Name())
		return err
	}
	return os.Rename(f.Name(), filepath.Join(a.cfg.StateDir, DesiredStateFile))
}

type workDone struct {
	w   *Work
	res Result
}

// laneJob is a Work handed to a lane, bound to the context it runs under.
type laneJob func() workDone

// startLanes starts the two long-lived goroutines that run Works: a command then costs no
// goroutine start and no stack growth, which every server pays per command. The core hands
// a lane its next Work only after the loop heard the last one is done, so a lane's channel
// (one slot) never blocks the loop.
func (l *loop) startLanes() {
	l.control, l.fetch = make(chan laneJob, 1), make(chan laneJob, 1)
	for _, in := range []chan laneJob{l.control, l.fetch} {
		l.lanes.Go(func() {
			for run := range in {
				l.done <- run()
			}
		})
	}
}

// stopLanes ends the lanes once no Work is out.
func (l *loop) stopLanes() {
	close(l.control)
	close(l.fetch)
	l.lanes.Wait()
}

// loop is Run's state: the I/O around the core. One goroutine runs it; two more, the
// lanes, execute the core's Work (at most one Work per lane at a time) and report on done.
type loop struct {
	a    *Agent
	core *Core
	b    bus.Bus
	sub  bus.Subscription

	working     int // Works out (at most one per lane)
	done        chan workDone
	control     chan laneJob // the control lane's next Work
	fetch       chan laneJob // the fetch lane's next Work
	lanes       sync.WaitGroup
	cancelFetch context.CancelFunc // cancels the fetch lane's convergence stage (nil: none)
	fetchWork   *Work
	pending     []pendingAck // acks not pushed yet (the bus was down)
	// last is what the last heartbeat written said.
	last facts
	// rejectLogged is when refused messages were last logged; rejectedSince counts those
	// refused since.
	rejectLogged  time.Time
	rejectedSince int
	busDown       bool
	subFails      int
	joined        bool
}

func (l *loop) run(ctx context.Context) (err error) {
	a := l.a
	tick := time.NewTicker(a.cfg.HeartbeatInterval)
	defer tick.Stop()
	retry := time.NewTimer(0)
	defer retry.Stop()
	var events <-chan bus.Event

	l.startLanes()
	defer func() { l.stop(ctx, err) }()
	beat := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-retry.C:
			if err := l.connect(ctx); err != nil {
				l.subFails++
				d := backoff(l.subFails, a.cfg.HeartbeatInterval)
				a.log.Warn("agent: cannot join the fleet's control channel; retrying", "err", err, "retry_in", d)
				retry.Reset(d)
				continue
			}
			if !l.joined {
				a.log.Info("agent: joined the fleet", "advertise_url", a.cfg.AdvertiseURL, "signed", a.cfg.Auth.Signed(), "key_id", a.cfg.Auth.KeyID(), "attempts", l.subFails+1)
				l.joined = true
			} else {
				a.log.Info("agent: control channel joined again", "attempts", l.subFails+1)
			}
			l.subFails = 0
			events = l.sub.Events()
			if err := l.resync(ctx); err != nil {
				return err
			}
			l.heartbeat(ctx)
		case ev, ok := <-events:
			if !ok {
				events = nil
				_ = l.sub.Close()
				l.sub = nil
				a.log.Warn("agent: control subscription ended; resubscribing")
				retry.Reset(0)
				continue
			}
			switch ev.Kind {
			case bus.EventSubscribed:
				// Messages may have been lost while the subscription was down: resync.
				if err := l.resync(ctx); err != nil {
					return err
				}
			case bus.EventMessage:
				l.core.Envelope(ev.Payload, a.cfg.Now())
			}
		case <-a.drainReq:
			l.core.Drain()
			if l.b != nil && ctx.Err() == nil { // stopping: stop's heartbeat says it
				l.heartbeat(ctx)
			}
		case <-tick.C:
			if l.b == nil || ctx.Err() != nil {
				continue
			}
			if err := l.resync(ctx); err != nil {
				return err
			}
			l.heartbeat(ctx)
		case d := <-l.done:
			l.finished(d)
			beat = true
		}
		l.flush(ctx)
		if beat && l.b != nil && ctx.Err() == nil {
			// The work changed the server (paused it, swapped its weights): say so now, after
			// its ack, rather than up to an interval later, so the fleet's view follows. Work
			// that changed nothing a heartbeat says (a resume of a running server) writes
			// nothing more: a control call costs each server one write, its ack.
			if hb := l.build(); beatFacts(&hb) != l.last {
				l.write(ctx, &hb)
			}
		}
		beat = false
	}
}

// connect dials (when needed) and subscribes, waiting for the confirmation.
func (l *loop) connect(ctx context.Context) error {
	if l.b == nil {
		if l.a.cfg.Bus != nil {
			l.b = l.a.cfg.Bus
		} else {
			b, err := l.a.cfg.Dial(ctx)
			if err != nil {
				return fmt.Errorf("dial: %w", err)
			}
			l.b = b
		}
		l.a.bus.Store(&busBox{l.b})
	}
	sctx, cancel := context.WithTimeout(ctx, max(5*time.Second, l.a.cfg.HeartbeatTTL))
	defer cancel()
	sub, err := l.b.Subscribe(sctx, l.a.names.Control())
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", l.a.names.Control(), err)
	}
	l.sub = sub
	return nil
}

func backoff(fails int, base time.Duration) time.Duration {
	d := base
	for i := 1; i < fails && d < 30*time.Second; i++ {
		d *= 2
	}
	return min(d, 30*time.Second)
}

// finished reports a Work's end to the core.
func (l *loop) finished(d workDone) {
	l.working--
	if d.w == l.fetchWork {
		if l.cancelFetch != nil {
			l.cancelFetch()
		}
		l.cancelFetch, l.fetchWork = nil, nil
	}
	l.core.Done(d.w, d.res, l.a.engineState(), l.a.cfg.Now())
}

// resync reads the engine and the desired state into the core and asks it to converge.
func (l *loop) resync(ctx context.Context) error {
	a := l.a
	defer l.core.Resynced(a.cfg.Now())
	l.core.Engine(a.engineState())
	rctx, cancel := context.WithTimeout(ctx, a.cfg.HeartbeatInterval+time.Second)
	raw, err := l.b.Get(rctx, a.names.Desired())
	cancel()
	now := a.cfg.Now()
	switch {
	case errors.Is(err, bus.ErrNotFound):
		err = l.core.Desired(nil, false, now)
	case err != nil:
		l.busError("read the desired state", err)
		l.core.Converge(now)
		return nil
	default:
		err = l.core.Desired(raw, true, now)
	}
	if err != nil {
		a.log.Error("agent: leaving", "err", err)
		return err
	}
	if r := l.core.TakeRepair(); r != nil {
		l.repair(ctx, r) // before the heartbeat that follows: a client that sees it finds the key
	}
	l.core.Converge(now)
	return nil
}

func (l *loop) busError(what string, err error) {
	if errors.Is(err, context.Canceled) {
		return // the agent is stopping, not the bus failing
	}
	if !l.busDown {
		l.a.log.Warn("agent: bus unavailable; the server keeps serving and retries", "op", what, "err", err)
	}
	l.busDown = true
}

func (l *loop) busOK() {
	if l.busDown {
		l.a.log.Info("agent: bus available again")
	}
	l.busDown = false
}

// heartbeat writes the heartbeat key (and retries acks that could not be pushed).
func (l *loop) heartbeat(ctx context.Context) {
	hb := l.build()
	l.write(ctx, &hb)
}

// build is the heartbeat of the engine as it is now, unsigned: write signs it.
func (l *loop) build() protocol.Heartbeat {
	l.core.Engine(l.a.engineState())
	return l.core.heartbeat(l.a.cfg.Now())
}

// write writes hb and remembers what it said.
func (l *loop) write(ctx context.Context, hb *protocol.Heartbeat) {
	l.last = beatFacts(hb)
	l.writeHeartbeat(ctx, hb)
}

// facts are what a heartbeat says that routing and the fleet's view depend on.
type facts struct {
	state                          protocol.EngineState
	errText, sha                   string
	version, staged, epoch, dEpoch int64
	inRotation                     bool
}

func beatFacts(hb *protocol.Heartbeat) facts {
	return facts{state: hb.State, errText: hb.Error, sha: hb.WeightSHA256, version: hb.WeightVersion, staged: hb.StagedVersion,
		epoch: hb.Epoch, dEpoch: hb.DesiredEpoch, inRotation: hb.InRotation}
}

func (l *loop) writeHeartbeat(ctx context.Context, hb *protocol.Heartbeat) {
	a := l.a
	l.core.sign(hb)
	raw, err := hb.Encode()
	if err != nil {
		a.log.Error("agent: encode heartbeat", "err", err)
		return
	}
	hctx, cancel := context.WithTimeout(ctx, a.cfg.HeartbeatInterval+time.Second)
	defer cancel()
	if err := l.b.Set(hctx, a.names.Heartbeat(a.cfg.ServerID), raw, a.cfg.HeartbeatTTL); err != nil {
		l.busError("write the heartbeat", err)
		return
	}
	l.busOK()
}

// flush carries out the core's Ready: counts, acks, and the next work.
func (l *loop) flush(ctx context.Context) {
	a := l.a
	r := l.core.Ready()
	for r.Resync && l.b != nil && ctx.Err() == nil {
		// A command said a newer desired state exists: read it before the command runs.
		r = l.merge(r, ctx)
	}
	l.a.publish(l.core, false)
	if r.Persist != nil {
		if err := a.saveState(r.Persist); err != nil {
			a.log.Error("agent: cannot save the desired state; after a restart this server relies on Redis for it", "dir", a.cfg.StateDir, "err", err)
		}
	}
	if r.Repair != nil && l.b != nil {
		l.repair(ctx, r.Repair)
	}
	if r.CancelFetch && l.cancelFetch != nil {
		a.log.Info("agent: cancelling a stage the fleet no longer wants")
		l.cancelFetch()
	}
	if a.cfg.Metrics != nil {
		for _, reason := range r.Rejected {
			a.cfg.Metrics.Rejected(reason)
		}
		for _, c := range r.Commands {
			a.cfg.Metrics.CommandDone(c.Kind, c.Result)
		}
	}
	l.logRejected(r.Rejected)
	l.queueAcks(r)
	l.pushAcks(ctx)
	if r.Fetch != nil {
		l.start(ctx, r.Fetch, l.fetch)
	}
	if r.Work != nil {
		if res, ok := a.resumeAtOnce(ctx, r.Work); ok {
			// Done already: report it and carry out what follows (its ack, the next Work).
			l.working++
			l.finished(workDone{w: r.Work, res: res})
			l.flush(ctx)
			return
		}
		l.start(ctx, r.Work, l.control)
	}
}

// logRejected logs refused messages at most once per rejectLogEvery, with how many were
// refused since the last line: a flood of forged messages must not become a flood of logs.
func (l *loop) logRejected(reasons []string) {
	if len(reasons) == 0 {
		return
	}
	l.rejectedSince += len(reasons)
	now := l.a.cfg.Now()
	if !l.rejectLogged.IsZero() && now.Sub(l.rejectLogged) < rejectLogEvery {
		return
	}
	l.a.log.Warn("agent: refused control messages (rollout_control_rejected_total counts them by reason)", "last_reason", reasons[len(reasons)-1], "refused", l.rejectedSince)
	l.rejectLogged, l.rejectedSince = now, 0
}

// rejectLogEvery paces the log line of refused control messages.
const rejectLogEvery = 10 * time.Second

// merge runs the resync a Ready asked for and returns that Ready joined with the next one.
func (l *loop) merge(r Ready, ctx context.Context) Ready { //nolint:revive // ctx second: merge is a fold over r
	if err := l.resync(ctx); err != nil {
		l.a.log.Error("agent: resync", "err", err)
	}
	n := l.core.Ready()
	n.Acks = append(r.Acks, n.Acks...)
	n.AckTraces = append(r.AckTraces, n.AckTraces...)
	n.Rejected = append(r.Rejected, n.Rejected...)
	n.Commands = append(r.Commands, n.Commands...)
	n.CancelFetch = n.CancelFetch || r.CancelFetch
	if n.Work == nil {
		n.Work = r.Work
	}
	if n.Fetch == nil {
		n.Fetch = r.Fetch
	}
	if n.Persist == nil {
		n.Persist = r.Persist
	}
	if n.Repair == nil {
		n.Repair = r.Repair
	}
	return n
}

// repair writes the core's newest desired state back over what the key holds (missing,
// garbage, or an older record), by compare-and-swap so a newer write is never undone.
func (l *loop) repair(ctx context.Context, r *Repair) {
	a := l.a
	rctx, cancel := context.WithTimeout(ctx, a.cfg.HeartbeatInterval+time.Second)
	defer cancel()
	ok, err := l.b.CompareAndSwap(rctx, a.names.Desired(), r.Old, r.New)
	switch {
	case err != nil:
		l.busError("repair the desired state", err)
	case ok:
		a.log.Warn("agent: the fleet's desired state was missing, unreadable or older than this server's; wrote back the newest record it accepted",
			"was_missing", r.Old == nil)
	}
}

func (l *loop) pushAcks(ctx context.Context) {
	a := l.a
	if l.b == nil {
		return
	}
	for len(l.pending) > 0 {
		p := l.pending[0]
		ack := p.ack
		ack.SignWith(a.cfg.Auth, a.cfg.Fleet)
		raw, err := ack.Encode()
		if err != nil {
			a.log.Error("agent: encode ack", "command_id", ack.CommandID, "err", err)
			l.pending = l.pending[1:]
			continue
		}
		sctx, span := l.ackSpan(ctx, p)
		pctx, cancel := context.WithTimeout(sctx, a.cfg.HeartbeatInterval+time.Second)
		err = l.b.Push(pctx, a.names.Acks(ack.CommandID), raw, a.cfg.AckTTL)
		cancel()
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
			span.End()
			l.busError("push an ack", err)
			return // kept; retried after the next input
		}
		span.End()
		l.busOK()
		l.pending = l.pending[1:]
	}
}

// pendingAck is an ack waiting to be pushed, with where its span belongs.
type pendingAck struct {
	ack   protocol.Ack
	trace AckTrace
}

func (l *loop) queueAcks(r Ready) {
	for i, ack := range r.Acks {
		var at AckTrace
		if i < len(r.AckTraces) {
			at = r.AckTraces[i]
		}
		l.pending = append(l.pending, pendingAck{ack: ack, trace: at})
	}
}

// ackSpan starts the span of one ack push, a child of the command's process span (or of the
// sender's span), linked as the core says.
func (l *loop) ackSpan(ctx context.Context, p pendingAck) (context.Context, trace.Span) {
	if p.trace.Parent.IsValid() {
		ctx = trace.ContextWithSpanContext(ctx, p.trace.Parent)
	}
	ctx, span := l.a.cfg.Tracer.Start(ctx, SpanAck, l.a.producerSpan...)
	if !span.IsRecording() {
		return ctx, span
	}
	for _, sc := range p.trace.Links {
		span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{attribute.String("rollout.link", "original")}})
	}
	span.SetAttributes(attribute.String("rollout.command_id", p.ack.CommandID), attribute.String("rollout.server_id", l.a.cfg.ServerID),
		attribute.String("rollout.result", string(p.ack.Result)), attribute.Bool("rollout.duplicate", p.trace.Duplicate))
	return ctx, span
}

// start runs w on lane (the core's lane for it); the loop keeps heartbeating meanwhile.
// Convergence work is cancelled with ctx (the run's).
func (l *loop) start(ctx context.Context, w *Work, lane chan<- laneJob) {
	l.working++
	if w.Envelope != nil {
		// A command runs to its end even when the agent stops (its deadline bounds it), so a
		// commit never leaves the server half-cut.
		ctx = context.WithoutCancel(ctx)
	}
	if w.Fetch() {
		// A convergence stage can be cancelled when the fleet moves on (CancelFetch).
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		l.cancelFetch, l.fetchWork = cancel, w
	}
	lane <- func() workDone { return workDone{w: w, res: l.a.execute(ctx, w)} }
}

// stop is Run's epilogue: stop taking work, finish the work in progress, ack, heartbeat
// "stopping", and release the bus when the agent opened it.
func (l *loop) stop(ctx context.Context, runErr error) {
	a := l.a
	now := a.cfg.Now()
	l.core.Stop(now)
	a.publish(l.core, true)
	// Convergence work is cancelled (its context is the run's); a command finishes.
	for l.working > 0 {
		l.finished(<-l.done)
	}
	l.stopLanes()
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if l.b != nil {
		r := l.core.Ready()
		if a.cfg.Metrics != nil {
			for _, c := range r.Commands {
				a.cfg.Metrics.CommandDone(c.Kind, c.Result)
			}
		}
		l.queueAcks(r)
		l.pushAcks(bg)
		if runErr == nil {
			hb := l.core.heartbeat(a.cfg.Now())
			l.writeHeartbeat(bg, &hb)
		}
	}
	if l.sub != nil {
		_ = l.sub.Close()
	}
	if l.b != nil && a.cfg.Bus == nil {
		_ = l.b.Close()
	}
	a.log.Info("agent: stopped")
}
