package bus_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/internal/redistest"
	"github.com/rolloutkit/rollout/sdk/bus"
)

// patience bounds waits for what must happen; it never decides a result.
const patience = 30 * time.Second

// fastRecovery makes a test's reconnects quick; the values only shorten waits.
var fastRecovery = bus.RedisOptions{
	ReadTimeout:         500 * time.Millisecond,
	HealthCheck:         200 * time.Millisecond,
	MaxReconnectBackoff: 100 * time.Millisecond,
	ClientName:          "bustest",
}

func next(t *testing.T, s bus.Subscription) bus.Event {
	t.Helper()
	select {
	case ev, ok := <-s.Events():
		require.True(t, ok, "events channel closed")
		return ev
	case <-time.After(patience):
		t.Fatal("no event")
	}
	return bus.Event{}
}

func TestDialRedisBadURL(t *testing.T) {
	for _, u := range []string{
		"",
		"127.0.0.1:6379",
		"http://127.0.0.1:6379",
		"redis://",
		"redis://user:s3cret@127.0.0.1:6379/notadb",
		"redis://user:s3cret@127.0.0.1:6379/0/1",
		"redis://127.0.0.1:6379/0?pool_size=many",
		"redis://[::1",
	} {
		_, err := bus.DialRedis(t.Context(), u, bus.RedisOptions{})
		require.Error(t, err, u)
		require.NotErrorIs(t, err, bus.ErrUnavailable, "%q is a bad URL, not an outage", u)
		require.NotContains(t, err.Error(), "s3cret", "the password leaked into the error")
	}
}

func TestDialRedisUnreachable(t *testing.T) {
	s := redistest.Start(t)
	addr := s.Addr()
	s.Kill() // a port nothing listens on
	_, err := bus.DialRedis(t.Context(), "redis://user:s3cret@"+addr, bus.RedisOptions{})
	require.ErrorIs(t, err, bus.ErrUnavailable)
	require.NotContains(t, err.Error(), "s3cret")

	// A Redis that accepts but never answers fails by ctx's deadline, not hangs.
	s.Restart()
	p := redistest.NewProxy(t, s.Addr())
	p.Partition()
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	_, err = bus.DialRedis(ctx, p.URL(), bus.RedisOptions{})
	require.ErrorIs(t, err, bus.ErrUnavailable)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	// Without a deadline the first answer may take one dial and one read, not every retry.
	_, err = bus.DialRedis(context.Background(), p.URL(), bus.RedisOptions{DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond})
	require.ErrorIs(t, err, bus.ErrUnavailable)
}

// Killing redis-server and starting it again: calls fail with ErrUnavailable meanwhile, the
// subscription reports EventSubscribed once it is back, and then delivers again.
func TestRedisRestart(t *testing.T) {
	s := redistest.Start(t)
	b := dialRedis(t, s.URL(), fastRecovery)
	ctx := t.Context()
	sub, err := b.Subscribe(ctx, "c")
	require.NoError(t, err)
	defer sub.Close()
	n, err := b.Publish(ctx, "c", []byte("before"))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, "before", string(next(t, sub).Payload))
	require.NoError(t, b.Set(ctx, "k", []byte("v"), 0))

	s.Kill()
	_, err = b.Get(ctx, "k")
	require.ErrorIs(t, err, bus.ErrUnavailable)
	require.ErrorIs(t, b.Push(ctx, "l", []byte("x"), time.Minute), bus.ErrUnavailable)
	_, err = b.Pop(ctx, "l", 1, time.Second)
	require.ErrorIs(t, err, bus.ErrUnavailable)
	_, err = b.Subscribe(ctx, "other")
	require.ErrorIs(t, err, bus.ErrUnavailable)

	s.Restart()
	ev := next(t, sub)
	require.Equal(t, bus.EventSubscribed, ev.Kind, "the first event after the outage is the resubscription")
	n, err = b.Publish(ctx, "c", []byte("after"))
	require.NoError(t, err)
	require.Equal(t, 1, n, "subscribed again when EventSubscribed arrived")
	ev = next(t, sub)
	require.Equal(t, bus.EventMessage, ev.Kind)
	require.Equal(t, "after", string(ev.Payload))
	_, err = b.Get(ctx, "k")
	require.ErrorIs(t, err, bus.ErrNotFound, "the restarted server is empty: keys must be rewritten by their owners")
}

// A partition that resets connections: the subscription comes back after Heal.
func TestRedisPartition(t *testing.T) {
	s := redistest.Start(t)
	p := redistest.NewProxy(t, s.Addr())
	b := dialRedis(t, p.URL(), fastRecovery)
	direct := dialRedis(t, s.URL(), bus.RedisOptions{})
	ctx := t.Context()
	sub, err := b.Subscribe(ctx, "c")
	require.NoError(t, err)
	defer sub.Close()
	publish := func(msg string) int {
		n, err := direct.Publish(ctx, "c", []byte(msg))
		require.NoError(t, err)
		return n
	}
	require.Equal(t, 1, publish("before"))
	require.Equal(t, "before", string(next(t, sub).Payload))

	p.Partition()
	_, err = b.Get(context.Background(), "k")
	require.ErrorIs(t, err, bus.ErrUnavailable)
	require.Eventually(t, func() bool { return publish("lost") == 0 }, patience, time.Millisecond,
		"redis never noticed the subscriber was gone")
	p.Heal()

	for {
		ev := next(t, sub)
		if ev.Kind == bus.EventSubscribed {
			break
		}
		require.Equal(t, "lost", string(ev.Payload), "only messages published before the cut may arrive")
	}
	require.Equal(t, 1, publish("after"))
	require.Equal(t, "after", string(next(t, sub).Payload))
	require.NoError(t, b.Set(ctx, "k", []byte("v"), 0))
}

// A silent partition (nothing crosses, nothing is reset): only the subscription's own health
// check can notice, and it must, or the server would wait for commands forever.
func TestRedisSilentPartition(t *testing.T) {
	s := redistest.Start(t)
	p := redistest.NewProxy(t, s.Addr())
	b := dialRedis(t, p.URL(), fastRecovery)
	direct := dialRedis(t, s.URL(), bus.RedisOptions{})
	ctx := t.Context()
	sub, err := b.Subscribe(ctx, "c")
	require.NoError(t, err)
	defer sub.Close()
	n, err := direct.Publish(ctx, "c", []byte("before"))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, "before", string(next(t, sub).Payload))

	p.Freeze()
	// The subscriber gives up on the frozen connection and redials: the proxy holds the new one.
	require.Eventually(t, func() bool { return p.Held() > 0 }, patience, time.Millisecond,
		"the subscription never noticed its connection went silent")
	p.Heal()
	for {
		ev := next(t, sub)
		if ev.Kind == bus.EventSubscribed {
			break
		}
		require.Equal(t, "before", string(ev.Payload))
	}
	require.Eventually(t, func() bool {
		n, err := direct.Publish(ctx, "c", []byte("after"))
		require.NoError(t, err)
		return n >= 1
	}, patience, time.Millisecond)
	for {
		ev := next(t, sub)
		if ev.Kind == bus.EventMessage && string(ev.Payload) == "after" {
			break
		}
	}
}

// Subscribe returns an error, not a subscription that never confirms, when Redis does not
// answer, and gives up with ctx.
func TestRedisSubscribeHonoursContext(t *testing.T) {
	s := redistest.Start(t)
	p := redistest.NewProxy(t, s.Addr())
	b := dialRedis(t, p.URL(), fastRecovery)
	p.Freeze()
	defer p.Heal()
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := b.Subscribe(ctx, "c")
		errc <- err
	}()
	cancel()
	select {
	case err := <-errc:
		require.Error(t, err)
		require.True(t, errors.Is(err, context.Canceled) || errors.Is(err, bus.ErrUnavailable), "%v", err)
	case <-time.After(patience):
		t.Fatal("Subscribe ignored its context")
	}
	// Without a deadline it fails on its own once the health check gives up.
	_, err := b.Subscribe(t.Context(), "c")
	require.ErrorIs(t, err, bus.ErrUnavailable)
}

func TestRedisReplyErrorsAreNotOutages(t *testing.T) {
	s := redistest.Start(t)
	b := dialRedis(t, s.URL(), bus.RedisOptions{})
	ctx := t.Context()
	require.NoError(t, b.Push(ctx, "list", []byte("x"), time.Minute))
	_, err := b.Get(ctx, "list") // WRONGTYPE
	require.Error(t, err)
	require.NotErrorIs(t, err, bus.ErrUnavailable)
	require.NotErrorIs(t, err, bus.ErrNotFound)
	require.True(t, strings.Contains(err.Error(), "WRONGTYPE"), "%v", err)
}

func TestMemResubscribed(t *testing.T) {
	m := bus.NewMem(bus.MemOptions{})
	defer m.Close()
	sub, err := m.Subscribe(t.Context(), "c")
	require.NoError(t, err)
	other, err := m.Subscribe(t.Context(), "d")
	require.NoError(t, err)
	m.Resubscribed("c")
	require.Equal(t, bus.EventSubscribed, next(t, sub).Kind)
	_, err = m.Publish(t.Context(), "d", []byte("x"))
	require.NoError(t, err)
	require.Equal(t, bus.Event{Kind: bus.EventMessage, Payload: []byte("x")}, next(t, other), "only c's subscribers are told")
}
