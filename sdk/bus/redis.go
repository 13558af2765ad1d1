package bus

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rolloutkit/rollout/sdk/bus/redisconf"
)

// RedisOptions tune a Redis bus. The zero value is a sensible default; a field left zero keeps
// what the URL's query says (e.g. ?pool_size=20) or go-redis's default.
type RedisOptions struct {
	// PoolSize is the number of pooled connections (each subscription holds one more of its own).
	PoolSize int
	// DialTimeout bounds establishing a connection (default 5 s).
	DialTimeout time.Duration
	// ReadTimeout and WriteTimeout bound one socket read or write (default 3 s). A blocking Pop
	// waits in slices shorter than ReadTimeout, so it is never cut short by it.
	ReadTimeout  time.Duration
	WriteTimeout time.Duration
	// HealthCheck is how often an idle subscription pings Redis; a ping without an answer for
	// another HealthCheck makes it reconnect, so a silently dead connection is noticed within
	// about twice this (default 1 s).
	HealthCheck time.Duration
	// MaxReconnectBackoff caps the wait between a subscription's reconnect attempts while Redis
	// is unreachable (default 1 s; the first retry waits 25 ms).
	MaxReconnectBackoff time.Duration
	// ClientName is what CLIENT LIST shows for this process's connections.
	ClientName string
	// Logger receives reconnects and other transport events (default slog.Default()).
	Logger *slog.Logger
}

// Redis is the Bus over a Redis deployment (go-redis/v9's universal client: one server, a
// Sentinel-managed primary or a Cluster). Every transport failure wraps ErrUnavailable; after
// Close every call returns ErrClosed.
type Redis struct {
	c           redis.UniversalClient
	mode        redisconf.Mode
	log         *slog.Logger
	health      time.Duration
	backoff     time.Duration
	slice       time.Duration // longest single BLMPOP block, so a cancelled Pop returns soon
	readTimeout time.Duration
	closed      atomic.Bool

	mu   sync.Mutex
	subs map[*redisSub]struct{}

	// Sentinel only: the watch of the primary's switches (see watchFailovers).
	stop      chan struct{} // closed by Close
	watchPS   *redis.PubSub // the watch's current connection, closed by Close
	watchDone chan struct{} // closed when the watch has exited (nil: no watch)
}

var _ Bus = (*Redis)(nil)

// ErrTLS wraps a TLS handshake with Redis that failed (an untrusted or mismatched
// certificate, or a server that does not speak TLS): a configuration problem, so it does not
// wrap ErrUnavailable, and the connection never goes on in plain text.
var ErrTLS = errors.New("bus: TLS handshake with redis failed")

// ErrAuth wraps Redis refusing the credentials (a wrong user or password, a password it needs
// and did not get, an ACL user without the permissions the bus needs). Like ErrTLS it is a
// configuration problem and does not wrap ErrUnavailable.
var ErrAuth = errors.New("bus: redis refused the credentials")

// casScript sets KEYS[1] to ARGV[3] if its value is ARGV[2] (ARGV[1] == "1"), or if it does not
// exist (ARGV[1] == "0"). One script is atomic in Redis, so concurrent swaps have one winner.
var casScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if ARGV[1] == '0' then
  if cur then return 0 end
elseif cur ~= ARGV[2] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[3])
return 1
`)

// DialRedis is DialRedisConfig with nothing but a URL (see package redisconf for the forms:
// redis://, rediss://, redis+sentinel://, redis+cluster://).
func DialRedis(ctx context.Context, rawURL string, o RedisOptions) (*Redis, error) {
	return DialRedisConfig(ctx, redisconf.Config{URL: rawURL}, o)
}

// DialRedisConfig connects to the Redis deployment conf describes and PINGs it, so a bad
// configuration or an unreachable server fails here rather than on first use. A bad
// configuration wraps redisconf.ErrInvalid, a failed TLS handshake ErrTLS, refused
// credentials ErrAuth, and a server that does not answer ErrUnavailable; none of them repeats a password. What the
// configuration warns about (a password inside the URL) is logged.
func DialRedisConfig(ctx context.Context, conf redisconf.Config, o RedisOptions) (*Redis, error) {
	res, err := conf.Resolve()
	if err != nil {
		return nil, fmt.Errorf("bus: %w", err)
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	for _, w := range res.Warnings {
		log.Warn("bus: "+w, "redis", res.Redacted)
	}
	opt := res.Options
	// ctx deadlines bound every command, not only the socket timeouts.
	opt.ContextTimeoutEnabled = true
	if o.PoolSize > 0 {
		opt.PoolSize = o.PoolSize
	}
	if o.DialTimeout > 0 {
		opt.DialTimeout = o.DialTimeout
	}
	if opt.DialTimeout <= 0 {
		opt.DialTimeout = 5 * time.Second
	}
	if o.ReadTimeout > 0 {
		opt.ReadTimeout = o.ReadTimeout
	}
	if opt.ReadTimeout <= 0 {
		opt.ReadTimeout = 3 * time.Second
	}
	if o.WriteTimeout > 0 {
		opt.WriteTimeout = o.WriteTimeout
	}
	if o.ClientName != "" {
		opt.ClientName = o.ClientName
	}
	// Redis 7.0 does not know CLIENT SETINFO; skip it rather than send a failing command on
	// every new connection.
	opt.DisableIdentity = true
	// The first PING goes through a client of its own that does not retry: go-redis's retries
	// would turn a server that hangs up at once (a TLS port spoken to in plain text, a
	// refused handshake) into a wait for the deadline, hiding why.
	probeOpt := *opt
	probeOpt.MaxRetries = -1
	probe := redis.NewUniversalClient(&probeOpt)
	// Without a deadline, a server that accepts connections but never answers would keep go-redis
	// retrying; one dial and one read is as long as the first answer may take (twice over
	// for Sentinel, which asks a sentinel first).
	pctx, cancel := ctx, context.CancelFunc(func() {})
	if _, ok := ctx.Deadline(); !ok {
		pctx, cancel = context.WithTimeout(ctx, 2*(opt.DialTimeout+opt.ReadTimeout))
	}
	err = probe.Ping(pctx).Err()
	if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		// The socket deadline is set from ctx's and may fire before ctx's own timer: a
		// timeout at or past the deadline is the deadline's.
		if cerr := pctx.Err(); cerr != nil {
			err = fmt.Errorf("%w: %w", cerr, err)
		} else if dl, ok := pctx.Deadline(); ok && !time.Now().Before(dl) {
			err = fmt.Errorf("%w: %w", context.DeadlineExceeded, err)
		}
	}
	cancel()
	_ = probe.Close()
	if err != nil {
		if tlsFailure(err) {
			return nil, fmt.Errorf("%w: redis at %s: %w (check the CA file, the server name, and that the port speaks TLS)", ErrTLS, res.Addrs(), err)
		}
		if authFailure(err) {
			return nil, fmt.Errorf("%w: redis at %s: %w", ErrAuth, res.Addrs(), err)
		}
		hint := ""
		if opt.TLSConfig == nil && dropped(err) {
			hint = " (the connection was closed: either the server went away, or the port speaks TLS and wants rediss://)"
		}
		return nil, fmt.Errorf("%w: redis at %s does not answer: %w%s", ErrUnavailable, res.Addrs(), err, hint)
	}
	r := &Redis{
		c:       res.NewClient(),
		mode:    res.Mode,
		log:     log,
		health:  o.HealthCheck,
		backoff: o.MaxReconnectBackoff,
		subs:    map[*redisSub]struct{}{},
		stop:    make(chan struct{}),
	}
	if r.health <= 0 {
		r.health = time.Second
	}
	if r.backoff <= 0 {
		r.backoff = time.Second
	}
	if res.Mode == redisconf.Sentinel {
		r.watchDone = make(chan struct{})
		go r.watchFailovers(opt)
	}
	r.readTimeout = opt.ReadTimeout
	r.slice = min(250*time.Millisecond, opt.ReadTimeout/2)
	return r, nil
}

// tlsFailure reports a failed TLS handshake: an untrusted or mismatched certificate, or a
// peer that answered in plain text.
func tlsFailure(err error) bool {
	var (
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		verify   *tls.CertificateVerificationError
		header   tls.RecordHeaderError
		alert    tls.AlertError
	)
	return errors.As(err, &unknown) || errors.As(err, &hostname) || errors.As(err, &invalid) ||
		errors.As(err, &verify) || errors.As(err, &header) || errors.As(err, &alert)
}

// authFailure reports Redis's answers to bad or missing credentials.
func authFailure(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := rerr.Error()
	for _, p := range []string{"WRONGPASS", "NOAUTH", "NOPERM", "ERR AUTH"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// dropped reports a connection the server closed before answering.
func dropped(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

// Mode is the kind of deployment the bus talks to.
func (r *Redis) Mode() redisconf.Mode { return r.mode }

// Client returns the underlying go-redis client, for diagnostics and benchmarks.
func (r *Redis) Client() redis.UniversalClient { return r.c }

// fail maps a go-redis error onto the bus's errors: ctx's own error stays itself, a closed
// client is ErrClosed, a reply error from Redis is returned as is (it is a bug, not an
// outage) unless it is one of Redis's transient states, and everything else (refused dial,
// broken or timed-out connection) wraps ErrUnavailable.
func (r *Redis) fail(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("bus: %s: %w", op, cerr)
	}
	if r.closed.Load() || errors.Is(err, redis.ErrClosed) {
		return ErrClosed
	}
	var rerr redis.Error
	if errors.As(err, &rerr) && !transientReply(rerr.Error()) {
		return fmt.Errorf("bus: %s: %w", op, err)
	}
	return fmt.Errorf("%w: %s: %w", ErrUnavailable, op, err)
}

// transientReply reports a Redis reply that means "not now" rather than "wrong".
func transientReply(msg string) bool {
	for _, p := range []string{"LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "BUSY "} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

func (r *Redis) check(ctx context.Context) error {
	if r.closed.Load() {
		return ErrClosed
	}
	return ctx.Err()
}

// Publish implements Bus with PUBLISH, or SPUBLISH on a Cluster (a sharded channel lives on
// its slot's shard, where a plain PUBLISH would be broadcast to every node); the count is
// Redis's number of receivers.
func (r *Redis) Publish(ctx context.Context, channel string, msg []byte) (int, error) {
	if err := r.check(ctx); err != nil {
		return 0, err
	}
	var cmd *redis.IntCmd
	if r.mode == redisconf.Cluster {
		cmd = r.c.SPublish(ctx, channel, msg)
	} else {
		cmd = r.c.Publish(ctx, channel, msg)
	}
	n, err := cmd.Result()
	if err != nil {
		return 0, r.fail(ctx, "publish", err)
	}
	return int(n), nil
}

// Set implements Bus with SET (PX ttl, rounded up to a millisecond).
func (r *Redis) Set(ctx context.Context, key string, val []byte, ttl time.Duration) error {
	if ttl < 0 {
		return fmt.Errorf("bus: negative ttl %s", ttl)
	}
	if err := r.check(ctx); err != nil {
		return err
	}
	return r.fail(ctx, "set", r.c.Set(ctx, key, val, ceilMilli(ttl)).Err())
}

// ceilMilli rounds a positive duration up to whole milliseconds, Redis's TTL resolution (and
// what keeps go-redis from logging about a sub-millisecond one).
func ceilMilli(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	return (d + time.Millisecond - 1).Truncate(time.Millisecond)
}

// Get implements Bus.
func (r *Redis) Get(ctx context.Context, key string) ([]byte, error) {
	if err := r.check(ctx); err != nil {
		return nil, err
	}
	v, err := r.c.Get(ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, r.fail(ctx, "get", err)
	}
	return v, nil
}

// Scan implements Bus with SCAN MATCH and one MGET per batch. Keys that are not strings
// (lists) or vanish between the two are left out, as in the in-process bus. On a Cluster
// every primary is scanned, and the values are read with one GET per key in a pipeline
// (go-redis sends each to its slot's node), since an MGET may not span slots.
func (r *Redis) Scan(ctx context.Context, prefix string) (map[string][]byte, error) {
	if err := r.check(ctx); err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	match := globEscape(prefix) + "*"
	if cc, ok := r.c.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		err := cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			return scanNode(ctx, node, match, func(keys []string) error {
				vals, err := getEach(ctx, cc, keys)
				mu.Lock()
				defer mu.Unlock()
				maps.Copy(out, vals)
				return err
			})
		})
		if err != nil {
			return nil, r.fail(ctx, "scan", err)
		}
		return out, nil
	}
	err := scanNode(ctx, r.c, match, func(keys []string) error {
		vals, err := r.c.MGet(ctx, keys...).Result()
		if err != nil {
			return err
		}
		for i, v := range vals {
			if s, ok := v.(string); ok {
				out[keys[i]] = []byte(s)
			}
		}
		return nil
	})
	if err != nil {
		return nil, r.fail(ctx, "scan", err)
	}
	return out, nil
}

// scanNode runs SCAN MATCH over one node's keyspace and hands every non-empty batch to got.
func scanNode(ctx context.Context, c redis.Cmdable, match string, got func([]string) error) error {
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, match, 1000).Result()
		if err != nil {
			return err
		}
		if len(keys) > 0 {
			if err := got(keys); err != nil {
				return err
			}
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
}

// getEach reads keys with one GET each in a pipeline; missing keys and lists are left out.
func getEach(ctx context.Context, c redis.Cmdable, keys []string) (map[string][]byte, error) {
	cmds := make([]*redis.StringCmd, len(keys))
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = p.Get(ctx, k)
		}
		return nil
	})
	out := make(map[string][]byte, len(keys))
	for i, cmd := range cmds {
		v, cerr := cmd.Bytes()
		if cerr == nil {
			out[keys[i]] = v
		}
	}
	var rerr redis.Error
	if err != nil && !errors.Is(err, redis.Nil) && !(errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "WRONGTYPE")) {
		return out, err
	}
	return out, nil
}

// globEscape quotes the characters Redis's MATCH pattern treats specially.
func globEscape(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		switch c {
		case '*', '?', '[', ']', '\\', '^', '-':
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	return b.String()
}

// CompareAndSwap implements Bus with a Lua script (atomic in Redis). The swapped value has no
// TTL, as in the in-process bus.
func (r *Redis) CompareAndSwap(ctx context.Context, key string, old, val []byte) (bool, error) {
	if err := r.check(ctx); err != nil {
		return false, err
	}
	mustExist := "1"
	if old == nil {
		mustExist = "0"
	}
	n, err := casScript.Run(ctx, r.c, []string{key}, mustExist, old, val).Int()
	if err != nil {
		return false, r.fail(ctx, "compare-and-swap", err)
	}
	return n == 1, nil
}

// Delete implements Bus.
func (r *Redis) Delete(ctx context.Context, keys ...string) error {
	if err := r.check(ctx); err != nil {
		return err
	}
	if len(keys) == 0 {
		return nil
	}
	if r.mode == redisconf.Cluster && len(keys) > 1 {
		// A multi-key DEL may not span slots: one DEL per key, pipelined per node.
		_, err := r.c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, k := range keys {
				p.Del(ctx, k)
			}
			return nil
		})
		return r.fail(ctx, "delete", err)
	}
	return r.fail(ctx, "delete", r.c.Del(ctx, keys...).Err())
}

// Push implements Bus: RPUSH and PEXPIRE in one MULTI, so no list is left without a TTL.
func (r *Redis) Push(ctx context.Context, list string, val []byte, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("bus: list ttl must be > 0 (got %s)", ttl)
	}
	if err := r.check(ctx); err != nil {
		return err
	}
	_, err := r.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.RPush(ctx, list, val)
		p.PExpire(ctx, list, ceilMilli(ttl))
		return nil
	})
	return r.fail(ctx, "push", err)
}

// Pop implements Bus with LMPOP, or BLMPOP ... COUNT limit while waiting. A blocked read is not
// interrupted by cancelling ctx (go-redis cannot), so it blocks in short slices and checks ctx
// between them.
func (r *Redis) Pop(ctx context.Context, list string, limit int, wait time.Duration) ([][]byte, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("bus: pop limit must be > 0 (got %d)", limit)
	}
	if err := r.check(ctx); err != nil {
		return nil, err
	}
	if wait <= 0 {
		cctx, cancel := r.popContext(ctx, 0)
		_, vals, err := r.c.LMPop(cctx, "left", int64(limit), list).Result()
		cancel()
		return r.popped(ctx, vals, err)
	}
	end := time.Now().Add(wait)
	for {
		block := min(time.Until(end), r.slice)
		if dl, ok := ctx.Deadline(); ok {
			if until := time.Until(dl); until <= 0 {
				// The deadline has passed but ctx's timer may not have fired yet: wait for it,
				// so the caller sees the deadline's error rather than an empty pop.
				<-ctx.Done()
				return nil, ctx.Err()
			} else if until < block {
				block = until
			}
		}
		if block <= 0 {
			return nil, r.check(ctx)
		}
		// BLMPOP takes seconds as a decimal; go-redis's BLMPop would round down to whole ones
		// (and 0 would block forever).
		secs := strconv.FormatFloat(max(block.Seconds(), 0.001), 'f', 3, 64)
		cctx, cancel := r.popContext(ctx, block)
		cmd := redis.NewKeyValuesCmd(cctx, "blmpop", secs, 1, list, "left", "count", limit)
		cmd.SetFirstKeyPos(3) // the key, for a Cluster's slot routing
		_ = r.c.Process(cctx, cmd)
		cancel()
		_, vals, err := cmd.Result()
		if out, err := r.popped(ctx, vals, err); out != nil || err != nil {
			return out, err
		}
		if err := r.check(ctx); err != nil {
			return nil, err
		}
	}
}

// popContext is the context a pop command runs under: not cut short by ctx's deadline,
// because once Redis has popped values the reply must be read or they are lost. Pop limits how
// long it blocks by ctx's deadline instead.
func (r *Redis) popContext(ctx context.Context, block time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), block+r.readTimeout)
}

func (r *Redis) popped(ctx context.Context, vals []string, err error) ([][]byte, error) {
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, r.fail(ctx, "pop", err)
	}
	out := make([][]byte, len(vals))
	for i, v := range vals {
		out[i] = []byte(v)
	}
	return out, nil
}

// Close implements Bus: every subscription ends (and its goroutines exit) before the pool
// closes.
func (r *Redis) Close() error {
	if r.closed.Swap(true) {
		return nil
	}
	close(r.stop)
	r.mu.Lock()
	subs := make([]*redisSub, 0, len(r.subs))
	for s := range r.subs {
		subs = append(subs, s)
	}
	watch := r.watchPS
	r.mu.Unlock()
	if r.watchDone != nil {
		if watch != nil {
			_ = watch.Close() // ends its blocked read
		}
		<-r.watchDone
	}
	for _, s := range subs {
		_ = s.Close()
	}
	return r.c.Close()
}

// subscribe opens a PubSub on channel: SSUBSCRIBE on a Cluster, SUBSCRIBE otherwise. The
// confirmation arrives through the PubSub's next receive.
func (r *Redis) subscribe(ctx context.Context, channel string) (*redis.PubSub, error) {
	if r.mode == redisconf.Cluster {
		ps := r.c.SSubscribe(ctx)
		return ps, ps.SSubscribe(ctx, channel)
	}
	ps := r.c.Subscribe(ctx)
	return ps, ps.Subscribe(ctx, channel)
}

// Subscribe implements Bus. It returns once Redis has confirmed the subscription; every later
// confirmation (after go-redis or the health check reconnected) is delivered as
// EventSubscribed. Messages are read on the subscription's own goroutine into an unbounded
// queue, so a slow reader never makes go-redis drop one.
func (r *Redis) Subscribe(ctx context.Context, channel string) (Subscription, error) {
	if err := r.check(ctx); err != nil {
		return nil, err
	}
	ps, err := r.subscribe(ctx, channel)
	if err != nil {
		_ = ps.Close()
		return nil, r.fail(ctx, "subscribe", err)
	}
	s := &redisSub{r: r, channel: channel, ps: ps, q: newEventQueue(), confirmed: make(chan error, 1), stop: make(chan struct{}), exited: make(chan struct{})}
	r.mu.Lock()
	if r.closed.Load() {
		r.mu.Unlock()
		_ = ps.Close()
		s.q.stop()
		return nil, ErrClosed
	}
	r.subs[s] = struct{}{}
	r.mu.Unlock()
	go s.run()
	select {
	case err := <-s.confirmed:
		if err != nil {
			_ = s.Close()
			return nil, r.fail(ctx, "subscribe", err)
		}
		return s, nil
	case <-s.exited:
		// The reader ended without confirming: it failed (its error is in confirmed) or the
		// bus was closed meanwhile.
		_ = s.Close()
		select {
		case err := <-s.confirmed:
			if err != nil {
				return nil, r.fail(ctx, "subscribe", err)
			}
		default:
		}
		return nil, ErrClosed
	case <-ctx.Done():
		_ = s.Close()
		return nil, fmt.Errorf("bus: subscribe: %w", ctx.Err())
	}
}

// redisSub is one subscription: run reads the PubSub connection and feeds q.
type redisSub struct {
	r         *Redis
	channel   string
	q         *eventQueue
	confirmed chan error // the first confirmation (nil) or why it failed
	stop      chan struct{}
	exited    chan struct{}
	once      sync.Once

	mu     sync.Mutex
	ps     *redis.PubSub // replaced by reconnect
	closed bool
}

// errNoPong is why the health check gave up on a connection.
var errNoPong = errors.New("no answer to ping")

func (s *redisSub) run() {
	defer close(s.exited)
	first := true
	pinged := false
	fails := 0
	for {
		s.mu.Lock()
		ps := s.ps
		s.mu.Unlock()
		msg, err := ps.ReceiveTimeout(context.Background(), s.r.health)
		if s.stopped() {
			return
		}
		if err != nil {
			var nerr net.Error
			if errors.As(err, &nerr) && nerr.Timeout() {
				if !pinged {
					// Idle for an interval: ping, and expect the pong within the next one.
					pinged = true
					if err := ps.Ping(context.Background()); err == nil {
						continue
					}
				}
				err = errNoPong
			}
			if first {
				s.confirmed <- err
				return
			}
			// go-redis reconnects on a broken connection by itself; a connection that is
			// only silent (a black-holed network) it would wait on forever, so a fresh
			// PubSub replaces it.
			if errors.Is(err, errNoPong) {
				s.reconnect()
			}
			pinged = false
			fails++
			if fails == 1 {
				s.r.log.Warn("bus: redis subscription lost, reconnecting", "channel", s.channel, "err", err)
			} else {
				s.r.log.Debug("bus: redis subscription still down", "channel", s.channel, "err", err, "attempt", fails)
			}
			if !s.sleep(backoff(fails, s.r.backoff)) {
				return
			}
			continue
		}
		pinged = false
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind != "subscribe" && m.Kind != "ssubscribe" {
				continue
			}
			if first {
				first = false
				s.confirmed <- nil
				continue
			}
			if fails > 0 {
				s.r.log.Info("bus: redis subscription re-established", "channel", s.channel, "attempts", fails)
			}
			fails = 0
			s.q.put(Event{Kind: EventSubscribed})
		case *redis.Message:
			s.q.put(Event{Kind: EventMessage, Payload: []byte(m.Payload)})
		}
	}
}

// reconnect swaps in a new PubSub on a new connection; its subscribe confirmation arrives
// through the next receive.
func (s *redisSub) reconnect() {
	ps, _ := s.r.subscribe(context.Background(), s.channel) // a failure retries inside the next receive
	s.mu.Lock()
	old := s.ps
	if s.closed {
		s.mu.Unlock()
		_ = ps.Close()
		return
	}
	s.ps = ps
	s.mu.Unlock()
	_ = old.Close()
}

func (s *redisSub) stopped() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

// sleep waits d or until the subscription closes; it reports whether to go on.
func (s *redisSub) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.stop:
		return false
	}
}

// backoff doubles from 25 ms per failed attempt up to limit.
func backoff(attempt int, limit time.Duration) time.Duration {
	d := 25 * time.Millisecond
	for i := 1; i < attempt && d < limit; i++ {
		d *= 2
	}
	return min(d, limit)
}

// Events implements Subscription.
func (s *redisSub) Events() <-chan Event { return s.q.out }

// Close implements Subscription: it closes the PubSub (which is what ends go-redis's blocked
// read: cancelling a context would not) and waits for the reader to exit.
func (s *redisSub) Close() error {
	s.once.Do(func() {
		close(s.stop)
		s.mu.Lock()
		s.closed = true
		ps := s.ps
		s.mu.Unlock()
		_ = ps.Close()
		<-s.exited
		s.q.stop()
		s.r.mu.Lock()
		delete(s.r.subs, s)
		s.r.mu.Unlock()
	})
	return nil
}
