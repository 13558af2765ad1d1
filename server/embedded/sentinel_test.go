package embedded_test

import (
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/internal/redistest"
	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/bus/redisconf"
	"github.com/rolloutkit/rollout/server"
	"github.com/rolloutkit/rollout/server/embedded"
	"github.com/rolloutkit/rollout/weightstore"
)

// gatedStore serves a weight store, holding every request for version 1's files until
// release is closed, and closing fetching at the first one: the test's handle on "the
// update is in the middle of staging".
type gatedStore struct {
	h        http.Handler
	fetching chan struct{}
	release  chan struct{}
	once     sync.Once
}

func (g *gatedStore) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/v1/") {
		g.once.Do(func() { close(g.fetching) })
		select {
		case <-g.release:
		case <-r.Context().Done():
			return
		}
	}
	g.h.ServeHTTP(w, r)
}

// The primary fails over while an UpdateWeights is staging: the update either completes or
// fails with an error that says what happened, and afterwards the fleet converges: a later
// update commits on every server, each of which dials Redis itself through the
// redis+sentinel:// URL, as `rollout serve --redis` does.
func TestSentinelFailoverDuringUpdateWeights(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a primary, a replica and three sentinels")
	}
	ss := redistest.StartSentinel(t, 1, 3, nil, nil)
	ctx := t.Context()
	conf := redisconf.Config{URL: ss.URL()}

	dir := t.TempDir()
	writeCheckpoint(t, filepath.Join(dir, "v1"), 42)
	writeCheckpoint(t, filepath.Join(dir, "v2"), 43)
	store, err := weightstore.Open(ctx, dir)
	require.NoError(t, err)
	gate := &gatedStore{h: store.Handler(), fetching: make(chan struct{}), release: make(chan struct{})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := &http.Server{Handler: gate, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	var released sync.Once
	release := func() { released.Do(func() { close(gate.release) }) }
	t.Cleanup(release)
	refs := map[int64]sdk.WeightsRef{}
	for _, e := range store.Versions() {
		refs[e.Version] = e.Ref("http://" + ln.Addr().String())
	}
	require.Len(t, refs, 2)

	// The fleet's own bus (heartbeat reads at start-up) and every server's go through Sentinel.
	fb, err := bus.DialRedisConfig(ctx, conf, bus.RedisOptions{Logger: quiet})
	require.NoError(t, err)
	defer fb.Close()
	f, err := embedded.Start(ctx, embedded.Options{Servers: 2, Secret: secret, Logger: quiet, Bus: fb, Server: func(_ int, c *server.Config) {
		c.Bus, c.Redis.URL = nil, ss.URL()
		c.FleetHeartbeat = 100 * time.Millisecond
		c.FleetHeartbeatTTL = time.Second
	}})
	require.NoError(t, err)
	defer func() { require.NoError(t, f.Close()) }()
	c, err := sdk.Dial(ctx, sdk.Options{Redis: conf, Fleet: f.DialOptions().Fleet, Secret: secret, Logger: quiet})
	require.NoError(t, err)
	defer c.Close()
	waitStatus(t, c, allAt(0), "both servers in rotation over sentinel")

	type outcome struct {
		res *sdk.UpdateResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := c.UpdateWeights(ctx, refs[1], sdk.Plan{Policy: sdk.AllOrNothing, StageTimeout: time.Minute, CommitTimeout: 20 * time.Second})
		done <- outcome{res, err}
	}()
	select {
	case <-gate.fetching:
	case o := <-done:
		t.Fatalf("the update ended before staging: %+v %v", o.res, o.err)
	case <-time.After(time.Minute):
		t.Fatal("no server started fetching version 1")
	}
	old := ss.Primary()
	now := ss.Failover()
	require.NotEqual(t, old, now)
	t.Logf("primary failed over from %s to %s during staging", old, now)
	release()

	var o outcome
	select {
	case o = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("UpdateWeights did not return after the failover")
	}
	if o.err != nil {
		// Failing is allowed; failing silently or vaguely is not: the error must be one a
		// caller can branch on.
		t.Logf("update across the failover failed: %v", o.err)
		assert.True(t, errorIsAny(o.err, sdk.ErrAborted, sdk.ErrTimeout, sdk.ErrPartial, sdk.ErrConflict, bus.ErrUnavailable),
			"the error says what happened: %v", o.err)
	} else {
		t.Logf("update across the failover: %s", o.res.Outcome)
	}

	// Afterwards the fleet converges on the new primary: the next update commits everywhere.
	var res *sdk.UpdateResult
	require.Eventually(t, func() bool {
		res, err = c.UpdateWeights(ctx, refs[2], sdk.Plan{Policy: sdk.AllOrNothing, StageTimeout: time.Minute})
		if err != nil {
			t.Logf("update after the failover: %v (retrying)", err)
		}
		return err == nil
	}, 2*time.Minute, 100*time.Millisecond, "an update after the failover commits")
	assert.Equal(t, sdk.OutcomeCommitted, res.Outcome)
	waitStatus(t, c, allAt(2), "every server serves version 2 after the failover")
}

func errorIsAny(err error, targets ...error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}
