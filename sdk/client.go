package sdk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/bus/redisconf"
	"github.com/rolloutkit/rollout/sdk/protocol"
)

// WeightsRef names one version of the weights: where servers fetch it and its SHA-256 digest.
type WeightsRef = protocol.WeightsRef

// Defaults of Options.
const (
	DefaultRefreshInterval = 500 * time.Millisecond
	DefaultCommandTimeout  = 30 * time.Second
	DefaultRouteTimeout    = 60 * time.Second
	DefaultHeartbeatTTL    = protocol.HeartbeatTTL
)

// tracerName names the SDK's tracer.
const tracerName = "github.com/rolloutkit/rollout/sdk"

// Options configure a Client. Fleet and one of Redis.URL or Bus are required.
type Options struct {
	// Redis is how to reach the fleet's Redis, ignored when Bus is set. Redis.URL is
	// redis://[user@]host:port[/db], rediss:// for TLS, redis+sentinel://host:port,.../MASTER
	// or redis+cluster://host:port,... (see package redisconf); the other fields add a
	// password (or a file holding it), TLS files, Sentinel credentials. It is what the
	// --redis flags fill (redisconf.Config.RegisterFlags); call Redis.LoadEnv(os.LookupEnv)
	// to take passwords from the environment.
	Redis redisconf.Config
	// Bus is an open bus to use instead of Redis (e.g. an embedded fleet's in-process bus).
	// The client does not close it.
	Bus bus.Bus
	// Fleet is the fleet name every server was started with.
	Fleet string
	// Secret is the fleet secret (at least 32 bytes). Dial refuses an empty one unless
	// InsecureUnsigned is set: an unsigned client obeys and is obeyed by anyone who reaches
	// Redis.
	Secret []byte
	// VerifySecrets are earlier fleet secrets still accepted, never used to sign: during a
	// key rotation servers keep heartbeating and acking with keys issued under the old
	// secret until they are issued new ones.
	VerifySecrets [][]byte
	// InsecureUnsigned allows an empty Secret (a fleet started with
	// --insecure-unsigned-fleet).
	InsecureUnsigned bool
	// HTTPClient carries Generate's requests (default: a client with keep-alive pooling
	// sized for many concurrent requests per server).
	HTTPClient *http.Client
	// APIKey is sent as a bearer token to the servers' generation routes, when set.
	APIKey string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// TracerProvider makes the client's spans (default otel.GetTracerProvider()).
	TracerProvider trace.TracerProvider
	// Propagator injects the trace context into command envelopes and HTTP requests
	// (default W3C trace context).
	Propagator propagation.TextMapPropagator
	// RefreshInterval is how often the routing cache rereads heartbeats (default 500ms).
	RefreshInterval time.Duration
	// CommandTimeout bounds a control call whose Call.Timeout is 0 (default 30s).
	CommandTimeout time.Duration
	// RouteTimeout bounds how long Generate waits for a server in rotation (during an
	// update every server may be out of rotation for a moment; default 60s).
	RouteTimeout time.Duration
	// HeartbeatTTL is how long after its last heartbeat a server whose heartbeat key is
	// missing still counts as live (default protocol.HeartbeatTTL, the agents' TTL): keys lost early, as when
	// Redis restarts empty, do not take serving servers out of routing.
	HeartbeatTTL time.Duration
}

// Client drives one fleet. It is safe for concurrent use; Close it when done.
type Client struct {
	opts   Options
	bus    bus.Bus
	ownBus bool
	names  protocol.Names
	log    *slog.Logger
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	http   *http.Client

	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once

	// auth signs commands and desired states and checks servers' messages (Secret, then
	// VerifySecrets).
	auth *protocol.Auth
	// verifiedHB: a server's heartbeat verified with the client's secret, so the secret is
	// right and a desired state that does not verify is forged or garbage.
	verifiedHB atomic.Bool
	// heldEpoch is the highest desired-state epoch a verified heartbeat reported.
	heldEpoch atomic.Int64

	mu      sync.Mutex
	closed  bool
	view    map[string]*serverView // routing cache, by server id
	desired *protocol.DesiredState // last desired state read (nil: none)
	// desiredRaw is desired's bytes as read from the key (nil when the client wrote it).
	desiredRaw []byte
	refreshed  chan struct{} // closed and replaced after every refresh
	kick       chan struct{} // asks the refresher for an early refresh
	aborts     abortLog      // aborts the caller asked for (Generate does not continue them)
	garbage    chan string   // ack lists read, for the janitor to delete
}

// serverView is the client's routing knowledge of one server.
type serverView struct {
	hb       protocol.Heartbeat
	live     bool      // hb's key had not expired at the last refresh
	seen     time.Time // when the client read hb
	inflight int       // sequences this client has in flight on the server
	// committing is the version of this client's commit in flight to the server (0: none).
	committing int64
	suspect    time.Time // a request to it failed at this time; cleared by a newer heartbeat
	// ack is what an ack newer than hb said about the server (nil: nothing newer): the agent
	// heartbeats on its own schedule, so after a commit or a pause the ack is the fresher
	// word until the next heartbeat.
	ack *ackView
}

// ackView is the routing state an ack implies, from the server's clock at ack.At.
type ackView struct {
	at         int64 // Unix ms
	inRotation bool
	state      protocol.EngineState
	version    int64
	sha        string // the digest of the checkpoint the ack says the server serves
}

// apply lays an ack's view over an older heartbeat, and drops it once a heartbeat is newer.
func (v *serverView) apply() {
	if v.ack == nil {
		return
	}
	if v.hb.At > v.ack.at {
		v.ack = nil
		return
	}
	v.hb.InRotation, v.hb.State = v.ack.inRotation, v.ack.state
	if v.ack.version >= v.hb.WeightVersion {
		// The digest goes with the version: routing checks both, and a view with the new
		// version and the old heartbeat's digest kept a committed server out of routing until
		// its next heartbeat was read, so a session's turn right after an update could
		// leave its home for a server whose heartbeat happened to be read first.
		v.hb.WeightVersion, v.hb.WeightSHA256 = v.ack.version, v.ack.sha
	}
}

// Dial connects to the fleet and checks it before returning: the bus answers, the fleet's
// desired state (created on a fresh fleet) and every heartbeat pass the signature check with
// Secret. It fails fast on a bad URL, an unreachable Redis, an empty fleet name, a short
// secret or a wrong one (ErrBadSecret).
//
// Errors: ErrInvalid (a bad option: fleet name, secret, URL, durations), ErrBadSecret,
// bus.ErrUnavailable wrapped (Redis unreachable), or the context's error.
func Dial(ctx context.Context, o Options) (*Client, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := validFleetName(o.Fleet); err != nil {
		return nil, err
	}
	if err := protocol.CheckSecret(o.Secret); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	for _, s := range o.VerifySecrets {
		if err := protocol.CheckSecret(s); err != nil || len(s) == 0 {
			return nil, invalid("VerifySecrets: every secret must be at least %d bytes", protocol.MinSecretBytes)
		}
	}
	if len(o.Secret) == 0 && len(o.VerifySecrets) > 0 {
		return nil, invalid("VerifySecrets without a Secret")
	}
	if len(o.Secret) == 0 && !o.InsecureUnsigned {
		return nil, invalid("a fleet client needs the fleet secret (Options.InsecureUnsigned for a fleet run with --insecure-unsigned-fleet)")
	}
	o.defaults()
	c := &Client{opts: o, names: protocol.Names{Fleet: o.Fleet}, log: o.Logger,
		tracer: o.TracerProvider.Tracer(tracerName), prop: o.Propagator, http: o.HTTPClient,
		stop: make(chan struct{}), view: map[string]*serverView{}, refreshed: make(chan struct{}),
		kick: make(chan struct{}, 1), garbage: make(chan string, 1024)}
	auth, err := protocol.NewAuth(append([][]byte{o.Secret}, o.VerifySecrets...)...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	c.auth = auth
	if o.CommandTimeout > protocol.MaxCommandLifetime {
		return nil, invalid("CommandTimeout %s: servers refuse commands living longer than %s (protocol.MaxCommandLifetime)", o.CommandTimeout, protocol.MaxCommandLifetime)
	}
	switch {
	case o.Bus != nil:
		c.bus = o.Bus
	case o.Redis.URL == "":
		return nil, invalid("Redis.URL or Bus is required")
	default:
		conf := o.Redis
		b, err := bus.DialRedisConfig(ctx, conf, bus.RedisOptions{Logger: o.Logger})
		if errors.Is(err, redisconf.ErrInvalid) {
			return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		if err != nil {
			return nil, fmt.Errorf("sdk: dial %s: %w", redisconf.Redact(conf.URL), err)
		}
		c.bus, c.ownBus = b, true
	}
	// Check the servers' heartbeats before writing anything: a client with a wrong secret, or
	// none on a signed fleet, must not create a fresh fleet's desired state under its key
	// (the servers would then ignore it and the right secret could no longer verify it).
	if err := c.checkHeartbeatSecret(ctx); err != nil {
		c.closeBus()
		return nil, err
	}
	if err := c.ensureDesired(ctx); err != nil {
		c.closeBus()
		return nil, err
	}
	if err := c.refresh(ctx, true); err != nil {
		c.closeBus()
		return nil, err
	}
	c.wg.Add(2)
	go c.refresher()
	go c.janitor()
	return c, nil
}

func (o *Options) defaults() {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.TracerProvider == nil {
		o.TracerProvider = otel.GetTracerProvider()
	}
	if o.Propagator == nil {
		o.Propagator = propagation.TraceContext{}
	}
	if o.HTTPClient == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 256
		t.MaxIdleConns = 1024
		o.HTTPClient = &http.Client{Transport: t}
	}
	if o.RefreshInterval <= 0 {
		o.RefreshInterval = DefaultRefreshInterval
	}
	if o.CommandTimeout <= 0 {
		o.CommandTimeout = DefaultCommandTimeout
	}
	if o.RouteTimeout <= 0 {
		o.RouteTimeout = DefaultRouteTimeout
	}
	if o.HeartbeatTTL <= 0 {
		o.HeartbeatTTL = DefaultHeartbeatTTL
	}
}

// validFleetName refuses names that would break the key layout: the name sits inside a Redis
// Cluster hash tag, so braces are not allowed.
func validFleetName(f string) error {
	if f == "" {
		return invalid("fleet name is empty")
	}
	if len(f) > 128 || strings.ContainsAny(f, "{}: \t\r\n") {
		return invalid("fleet name %q: want at most 128 characters without braces, colons or spaces", f)
	}
	return nil
}

// Fleet is the fleet's name.
func (c *Client) Fleet() string { return c.opts.Fleet }

// Close stops the client's background refresh and closes the bus if the client dialed it.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
		close(c.stop)
		c.wg.Wait()
		c.closeBus()
		c.http.CloseIdleConnections()
	})
	return nil
}

func (c *Client) closeBus() {
	if c.ownBus {
		_ = c.bus.Close()
	}
}

func (c *Client) checkOpen(ctx context.Context) error {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return ErrClosed
	}
	return ctx.Err()
}

// verifyErr maps a signature failure to ErrBadSecret.
func verifyErr(what string, err error) error {
	if errors.Is(err, protocol.ErrBadSignature) || errors.Is(err, protocol.ErrUnsigned) {
		return fmt.Errorf("%w: %s: %w", ErrBadSecret, what, err)
	}
	return fmt.Errorf("sdk: %s: %w", what, err)
}

// readDesired returns the verified desired state and the key's raw bytes. The state is nil
// when the key is missing or holds garbage (raw is then what a write must replace); when
// the key holds a record older than one this client read (a replay, or a rebuild after a
// Redis restart), the newer one is returned with the key's bytes. A record that decodes but
// does not verify is ErrBadSecret: the client cannot tell its own wrong secret from a
// forged record, unless a server's heartbeat verified with its secret (verifiedHB), in
// which case the record is treated as garbage.
func (c *Client) readDesired(ctx context.Context) (*protocol.DesiredState, []byte, error) {
	raw, err := c.bus.Get(ctx, c.names.Desired())
	if errors.Is(err, bus.ErrNotFound) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("sdk: read desired state: %w", err)
	}
	c.mu.Lock()
	same := c.desired != nil && bytes.Equal(raw, c.desiredRaw)
	d0 := c.desired
	c.mu.Unlock()
	if same {
		return d0, raw, nil // verified when it was first read: an Ed25519 check per read costs 100 µs
	}
	d, err := protocol.DecodeDesiredState(raw)
	if err != nil {
		c.log.Warn("sdk: the fleet's desired-state key holds garbage; ignoring it (the servers write their record back)", "fleet", c.opts.Fleet, "err", err)
		return c.cachedDesired(), raw, nil
	}
	if err := d.VerifyWith(c.auth, c.opts.Fleet); err != nil {
		if c.verifiedHB.Load() {
			c.log.Warn("sdk: the fleet's desired state does not verify although its servers' heartbeats do; ignoring it", "fleet", c.opts.Fleet, "err", err)
			return c.cachedDesired(), raw, nil
		}
		return nil, nil, verifyErr("desired state", err)
	}
	if d.Signed && !c.auth.Signed() {
		return nil, nil, fmt.Errorf("%w: fleet %q is signed and the client has no secret", ErrBadSecret, c.opts.Fleet)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.desired != nil && d.Epoch < c.desired.Epoch {
		return c.desired, raw, nil
	}
	c.desired, c.desiredRaw = d, bytes.Clone(raw)
	return d, raw, nil
}

// cachedDesired is the last desired state this client verified (nil: none).
func (c *Client) cachedDesired() *protocol.DesiredState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.desired
}

// DesiredState returns the fleet's verified desired state (nil when none was ever written).
// Errors: ErrBadSecret (the record fails the signature check), ErrClosed, a bus error, or
// the context's error.
func (c *Client) DesiredState(ctx context.Context) (*protocol.DesiredState, error) {
	if err := c.checkOpen(ctx); err != nil {
		return nil, err
	}
	d, _, err := c.readDesired(ctx)
	return d, err
}

// checkHeartbeatSecret fails with ErrBadSecret when a heartbeat does not verify with the
// client's secret, or is signed while the client has none.
func (c *Client) checkHeartbeatSecret(ctx context.Context) error {
	hbs, err := c.readHeartbeats(ctx, true)
	if err != nil {
		return err
	}
	if len(hbs) > 0 {
		c.verifiedHB.Store(true)
	}
	if !c.auth.Signed() {
		for id, hb := range hbs {
			if hb.Sig != "" {
				return fmt.Errorf("%w: server %s of fleet %q signs its heartbeat and the client has no secret", ErrBadSecret, id, c.opts.Fleet)
			}
		}
	}
	return nil
}

// ensureDesired creates the desired state of a fresh fleet.
func (c *Client) ensureDesired(ctx context.Context) error {
	d, _, err := c.readDesired(ctx)
	if err != nil || d != nil {
		return err
	}
	_, err = c.updateDesired(ctx, func(*protocol.DesiredState) error { return nil })
	return err
}

// updateDesired applies change to the current desired state (a fresh one when none exists)
// and writes it back with compare-and-swap, retrying when another writer got in between.
// change returning an error stops the update.
func (c *Client) updateDesired(ctx context.Context, change func(*protocol.DesiredState) error) (*protocol.DesiredState, error) {
	for attempt := range 16 {
		cur, raw, err := c.readDesired(ctx)
		if err != nil {
			return nil, err
		}
		if held, heard, err := c.serversEpoch(ctx); err != nil {
			return nil, err
		} else if !heard || cur == nil && held > 0 || cur != nil && cur.Epoch < held {
			// The key is gone or older than the record the servers hold (a Redis restart,
			// or a replay), or a live server has not heartbeated since Redis came back and
			// may hold a newer record than any heartbeat shows: building on it would undo
			// the fleet's state, or fork it (another writer's version bound to another
			// checkpoint on the servers that saw it). The servers heartbeat and write their
			// record back within a heartbeat; wait for it.
			if err := sleepCtx(ctx, time.Duration(attempt+1)*100*time.Millisecond); err != nil {
				return nil, err
			}
			continue
		}
		next := protocol.DesiredState{V: protocol.Version, Fleet: c.opts.Fleet, Signed: c.auth.Signed()}
		if cur == nil {
			// The key is gone but this client saw it (Redis restarted empty): rebuild from
			// what it last read, so the epoch keeps growing past what the servers have seen.
			c.mu.Lock()
			cur = c.desired
			c.mu.Unlock()
		}
		if cur != nil {
			next = *cur
			if cur.Weights != nil {
				w := *cur.Weights
				next.Weights = &w
			}
			if cur.Plan != nil {
				p := *cur.Plan
				next.Plan = &p
			}
		}
		if err := change(&next); err != nil {
			return nil, err
		}
		if raw != nil && cur != nil && sameState(cur, &next) && c.keyHolds(raw, cur) {
			return cur, nil // nothing to change: no write, no new epoch
		}
		next.Epoch++
		next.UpdatedAt = time.Now().UnixMilli()
		next.Trace = nil
		carrier := propagation.MapCarrier{}
		c.prop.Inject(ctx, carrier)
		if len(carrier) > 0 {
			next.Trace = map[string]string(carrier)
		}
		next.Sig = ""
		if c.auth.Signed() {
			next.Signed = true
			next.SignWith(c.auth)
		}
		b, err := next.Encode()
		if err != nil {
			return nil, err
		}
		ok, err := c.bus.CompareAndSwap(ctx, c.names.Desired(), raw, b)
		if err != nil {
			return nil, fmt.Errorf("sdk: write desired state: %w", err)
		}
		if ok {
			// The cached record and its bytes move together, and only forward: a read that
			// ran meanwhile may have cached a later record, and bytes cached beside another
			// record would make readDesired answer that record for them.
			c.mu.Lock()
			if c.desired == nil || next.Epoch >= c.desired.Epoch {
				c.desired, c.desiredRaw = &next, b
			}
			c.mu.Unlock()
			return &next, nil
		}
	}
	return nil, fmt.Errorf("%w: gave up after 16 attempts (another writer, or a desired-state key older than the servers' that they have not written back)", ErrConflict)
}

// storeMax raises v to x when x is larger.
func storeMax(v *atomic.Int64, x int64) {
	for {
		cur := v.Load()
		if x <= cur || v.CompareAndSwap(cur, x) {
			return
		}
	}
}

// sameState reports whether two desired states ask the same of the fleet (weights, plan,
// run state), whatever their epochs, times and signatures.
func sameState(a, b *protocol.DesiredState) bool {
	return eqPtr(a.Weights, b.Weights) && eqPtr(a.Plan, b.Plan) && eqPtr(a.Rolling, b.Rolling) && a.Paused == b.Paused &&
		a.PauseMode == b.PauseMode && a.Sleep == b.Sleep && a.Signed == b.Signed
}

func eqPtr[T comparable](a, b *T) bool {
	return a == nil && b == nil || a != nil && b != nil && *a == *b
}

// keyHolds reports whether raw, the key's value, is the record d (and not garbage or an
// older record readDesired replaced with its cached one).
func (c *Client) keyHolds(raw []byte, d *protocol.DesiredState) bool {
	k, err := protocol.DecodeDesiredState(raw)
	return err == nil && k.Epoch == d.Epoch && k.Sig == d.Sig
}

// serversEpoch reads the heartbeats now and returns the highest desired-state epoch a
// server said it accepted, in any heartbeat this client verified, and whether every server
// this client counts as live has been heard: its heartbeat key is there and not older than
// the last heartbeat the client read from it. After Redis restarts empty the keys are gone
// until each server heartbeats again, and until then the epoch a server holds is unknown;
// a heartbeat older than one already read is a stale copy (a Redis restored from an old
// snapshot). One read of the heartbeats per write of the desired state.
func (c *Client) serversEpoch(ctx context.Context) (held int64, heard bool, err error) {
	hbs, err := c.readHeartbeats(ctx, false)
	if err != nil {
		return 0, false, err
	}
	now := time.Now()
	heard = true
	c.mu.Lock()
	for id, v := range c.view {
		if now.Sub(time.UnixMilli(v.hb.At)) >= c.opts.HeartbeatTTL {
			continue // not live: its key would have expired
		}
		if hb, ok := hbs[id]; !ok || hb.At < v.hb.At {
			heard = false
		}
	}
	c.mu.Unlock()
	return c.heldEpoch.Load(), heard, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// readHeartbeats returns every live server's verified heartbeat. With strict, a heartbeat
// that fails verification fails the call (Dial uses it to detect a wrong secret); otherwise
// it is skipped and logged.
func (c *Client) readHeartbeats(ctx context.Context, strict bool) (map[string]protocol.Heartbeat, error) {
	kv, err := c.bus.Scan(ctx, c.names.HeartbeatPrefix())
	if err != nil {
		return nil, fmt.Errorf("sdk: read heartbeats: %w", err)
	}
	out := make(map[string]protocol.Heartbeat, len(kv))
	for key, raw := range kv {
		id := strings.TrimPrefix(key, c.names.HeartbeatPrefix())
		hb, err := protocol.DecodeHeartbeat(raw)
		if err == nil && hb.ServerID != id {
			err = fmt.Errorf("%w: heartbeat key %q holds server %q", protocol.ErrMalformed, key, hb.ServerID)
		}
		if err == nil {
			err = hb.VerifyWith(c.auth, c.opts.Fleet)
		}
		if err == nil && time.Since(time.UnixMilli(hb.At)) > c.opts.HeartbeatTTL+protocol.ClockSkew {
			// The key exists but the heartbeat inside is old: someone wrote back a dead
			// server's heartbeat (the key's TTL is not signed, the time inside is).
			c.log.Debug("sdk: ignoring a stale heartbeat", "server", id, "at", time.UnixMilli(hb.At))
			continue
		}
		if err != nil {
			if strict {
				return nil, verifyErr("heartbeat of "+id, err)
			}
			c.log.Warn("sdk: ignoring heartbeat", "server", id, "err", err)
			continue
		}
		out[id] = *hb
		storeMax(&c.heldEpoch, hb.DesiredEpoch)
	}
	return out, nil
}

// refresh rereads heartbeats (and the desired state) into the routing cache.
func (c *Client) refresh(ctx context.Context, strict bool) error {
	if _, _, err := c.readDesired(ctx); err != nil {
		return err
	}
	hbs, err := c.readHeartbeats(ctx, strict)
	if err != nil {
		return err
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()

	// A server whose key is missing stays live until its last heartbeat is HeartbeatTTL old,
	// as its key would have expired: a key lost early (Redis restarted empty) does not take a
	// serving server out of routing before it heartbeats again.
	for id, v := range c.view {
		if _, ok := hbs[id]; !ok && now.Sub(time.UnixMilli(v.hb.At)) >= c.opts.HeartbeatTTL && v.inflight == 0 {
			delete(c.view, id)
		}
	}
	for id, hb := range hbs {
		v := c.view[id]
		if v == nil {
			v = &serverView{}
			c.view[id] = v
		}
		if hb.At > v.hb.At && !v.suspect.IsZero() && time.UnixMilli(hb.At).After(v.suspect) {
			v.suspect = time.Time{} // the server heartbeated after the failure: trust it again
		}
		v.hb, v.seen, v.live = hb, now, true
		v.apply()
	}
	// A server whose heartbeat expired while the client had requests on it stays only for
	// the in-flight count; it is not routable.
	for id, v := range c.view {
		if _, ok := hbs[id]; !ok {
			v.live = now.Sub(time.UnixMilli(v.hb.At)) < c.opts.HeartbeatTTL
		}
	}
	close(c.refreshed)
	c.refreshed = make(chan struct{})
	return nil
}

// refresher keeps the routing cache fresh until Close.
func (c *Client) refresher() {
	defer c.wg.Done()
	t := time.NewTicker(c.opts.RefreshInterval)
	defer t.Stop()
	// Kicks (after failures, or while Generate waits for a server) refresh early, but at
	// most every minKick, so waiting callers do not spin on the bus.
	const minKick = 25 * time.Millisecond
	var last time.Time
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-c.stop
		cancel()
	}()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		case <-c.kick:
			if d := minKick - time.Since(last); d > 0 {
				select {
				case <-time.After(d):
				case <-c.stop:
					return
				}
			}
		}
		last = time.Now()
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := c.refresh(rctx, false)
		cancel()
		if err != nil && ctx.Err() == nil {
			c.log.Warn("sdk: refreshing fleet view", "fleet", c.opts.Fleet, "err", err)
		}
	}
}

// kickRefresh asks for an early refresh (after a failure) without waiting for it.
func (c *Client) kickRefresh() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// ServerStatus is one live server as its heartbeat reports it.
type ServerStatus struct {
	ID    string               `json:"id"`
	State protocol.EngineState `json:"state"`
	// InRotation is the server's own word that it takes traffic (at the desired version,
	// neither paused nor asleep).
	InRotation    bool  `json:"in_rotation"`
	WeightVersion int64 `json:"weight_version"`
	StagedVersion int64 `json:"staged_version,omitempty"`
	// Stale is set when the server serves a version below the fleet's desired one.
	Stale        bool          `json:"stale"`
	Epoch        int64         `json:"epoch"`
	Running      int           `json:"running"`
	Waiting      int           `json:"waiting"`
	KVUsage      float64       `json:"kv_usage"`
	AdvertiseURL string        `json:"advertise_url"`
	Build        string        `json:"build,omitempty"`
	Error        string        `json:"error,omitempty"`
	Age          time.Duration `json:"age"`
}

// Status reads every live server's heartbeat (verified with the fleet secret), sorted by id.
// Errors: ErrBadSecret, ErrClosed, a bus error, or the context's error; no live server is
// an empty list, not an error.
func (c *Client) Status(ctx context.Context) ([]ServerStatus, error) {
	if err := c.checkOpen(ctx); err != nil {
		return nil, err
	}
	if err := c.refresh(ctx, false); err != nil {
		return nil, err
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	var desired int64
	if c.desired != nil && c.desired.Weights != nil {
		desired = c.desired.Weights.Version
	}
	out := make([]ServerStatus, 0, len(c.view))
	for id, v := range c.view {
		if !v.live {
			continue
		}
		hb := v.hb
		out = append(out, ServerStatus{ID: id, State: hb.State, InRotation: hb.InRotation, WeightVersion: hb.WeightVersion,
			StagedVersion: hb.StagedVersion, Stale: hb.WeightVersion < desired, Epoch: hb.Epoch, Running: hb.Running,
			Waiting: hb.Waiting, KVUsage: hb.KVUsage, AdvertiseURL: hb.AdvertiseURL, Build: hb.Build, Error: hb.Error,
			Age: max(0, now.Sub(time.UnixMilli(hb.At)))})
	}
	slices.SortFunc(out, func(a, b ServerStatus) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// liveIDs returns the ids of servers with a live heartbeat, sorted.
func (c *Client) liveIDs(ctx context.Context) ([]string, error) {
	hbs, err := c.readHeartbeats(ctx, false)
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(hbs))
	for id := range hbs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

// noteAck updates the routing view from a successful ack: a paused or sleeping server leaves
// rotation at once, a committed or resumed one comes back (when the fleet is not paused and
// it serves the desired version) without waiting for its next heartbeat.
func (c *Client) noteAck(a *protocol.Ack) {
	if a == nil || a.Result != protocol.ResultOK {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	v := c.view[a.ServerID]
	if v == nil || !v.live {
		return
	}
	var desired int64
	var desiredSHA string
	paused := false
	if c.desired != nil {
		paused = c.desired.Paused || c.desired.Sleep > 0
		if c.desired.Weights != nil {
			desired, desiredSHA = c.desired.Weights.Version, c.desired.Weights.SHA256
		}
	}
	for _, p := range a.Phases {
		if p.Detail["superseded"] > 0 {
			return // the server did nothing: its heartbeat stays the word
		}
	}
	av := &ackView{at: a.At, version: a.WeightVersion, sha: a.WeightSHA256}
	switch a.Kind {
	case protocol.KindPause:
		av.state = protocol.StatePaused
	case protocol.KindSleep:
		av.state = protocol.StateSleeping
	case protocol.KindCommit, protocol.KindResume:
		av.state = protocol.StateRunning
		av.inRotation = !paused && (a.WeightVersion > desired || a.WeightVersion == desired && (desired == 0 || a.WeightSHA256 == desiredSHA))
	default:
		return
	}
	v.ack = av
	v.apply()
	// Wake Generate calls waiting for a server to come back.
	close(c.refreshed)
	c.refreshed = make(chan struct{})
}

// cachedIDs returns the ids of the servers live at the last refresh, sorted.
func (c *Client) cachedIDs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	ids := make([]string, 0, len(c.view))
	for id, v := range c.view {
		if v.live {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// discard hands a read ack list to the janitor. The list expires by its TTL anyway; deleting
// it keeps an in-process bus from holding every command's list until then.
func (c *Client) discard(list string) {
	select {
	case c.garbage <- list:
	default: // the janitor is behind: leave this one to the TTL
	}
}

// janitor deletes read ack lists in batches, off the calls' path.
func (c *Client) janitor() {
	defer c.wg.Done()
	for {
		var batch []string
		select {
		case <-c.stop:
			return
		case l := <-c.garbage:
			batch = append(batch, l)
		}
	more:
		for len(batch) < 256 {
			select {
			case l := <-c.garbage:
				batch = append(batch, l)
			default:
				break more
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := c.bus.Delete(ctx, batch...); err != nil && !errors.Is(err, bus.ErrClosed) {
			c.log.Debug("sdk: deleting ack lists", "n", len(batch), "err", err)
		}
		cancel()
	}
}
