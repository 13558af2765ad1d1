package sdk

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/internal/redistest"
	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/bus/redisconf"
)

func TestDialRedisFailsFast(t *testing.T) {
	_, err := Dial(t.Context(), Options{Redis: redisconf.Config{PasswordFile: "p"}, Fleet: "f", Secret: secret})
	require.ErrorIs(t, err, ErrInvalid, "neither a Redis URL nor a Bus")
	_, err = Dial(t.Context(), Options{Redis: redisconf.Config{URL: "http://nope"}, Fleet: "f", Secret: secret})
	require.ErrorIs(t, err, ErrInvalid, "not a Redis URL")
	// A port with nothing listening.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	_, err = Dial(t.Context(), Options{Redis: redisconf.Config{URL: "redis://" + addr}, Fleet: "f", Secret: secret})
	require.ErrorIs(t, err, bus.ErrUnavailable)
	_, err = Dial(t.Context(), Options{Redis: redisconf.Config{URL: "redis://:hunter2@" + addr}, Fleet: "f", Secret: secret})
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "hunter2")
}

func TestOverRedis(t *testing.T) {
	srv := redistest.Start(t)
	rb, err := bus.DialRedis(t.Context(), srv.URL(), bus.RedisOptions{})
	require.NoError(t, err)
	defer rb.Close()
	agents := []*fakeAgent{startFake(t, rb, "f", secret, "a", 0), startFake(t, rb, "f", secret, "b", 0)}
	c, err := Dial(t.Context(), Options{Redis: redisconf.Config{URL: srv.URL()}, Fleet: "f", Secret: secret})
	require.NoError(t, err)
	defer c.Close()
	st, err := c.Status(t.Context())
	require.NoError(t, err)
	require.Len(t, st, 2)
	require.NoError(t, errOf(c.Pause(t.Context(), PauseOptions{})))
	require.NoError(t, errOf(c.Resume(t.Context(), ResumeOptions{})))
	agents[1].set(func(a *fakeAgent) { a.fail["stage"] = "digest_mismatch" })
	res, err := c.UpdateWeights(t.Context(), ref(1), Plan{Policy: Quorum(1), StageTimeout: 10 * time.Second})
	require.NoError(t, err)
	assert.Equal(t, []string{"b"}, res.Stale)

	// A client with the wrong secret is refused at Dial.
	_, err = Dial(t.Context(), Options{Redis: redisconf.Config{URL: srv.URL()}, Fleet: "f", Secret: []byte("0123456789abcdef0123456789abcdef")})
	require.ErrorIs(t, err, ErrBadSecret)
}
