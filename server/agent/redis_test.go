package agent_test

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/internal/redistest"
	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/protocol"
	"github.com/rolloutkit/rollout/server"
	"github.com/rolloutkit/rollout/server/agent"
)

// dialTest opens the test's own client of the Redis at url.
func dialTest(t *testing.T, url string) *bus.Redis {
	t.Helper()
	b, err := bus.DialRedis(t.Context(), url, bus.RedisOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// startRedisNode runs a server that joins the fleet over the Redis at url, heartbeating
// every 50ms.
func startRedisNode(t *testing.T, url string, mut func(*server.Config)) *node {
	return startNode(t, nil, func(c *server.Config) {
		c.Bus, c.Redis.URL = nil, url
		c.FleetHeartbeat, c.FleetHeartbeatTTL = 50*time.Millisecond, 10*time.Second
		if mut != nil {
			mut(c)
		}
	})
}

// doWhenSubscribed publishes cmd until someone is subscribed (after a restart the agent
// resubscribes on its own schedule) and returns its ack.
func (f *fleet) doWhenSubscribed(cmd any) protocol.Ack {
	f.t.Helper()
	e := f.envelope(cmd)
	raw, err := e.Encode()
	require.NoError(f.t, err)
	waitFor(f.t, "a subscriber", func() bool {
		n, err := f.b.Publish(f.t.Context(), f.names.Control(), raw)
		if err != nil && !errors.Is(err, bus.ErrUnavailable) {
			require.NoError(f.t, err)
		}
		return n > 0
	})
	return f.ack(e.ID)
}

// TestOverRedis: the agent over a real redis-server: commands and acks, rejections, and a
// Redis restart in the middle: the server keeps serving, the agent resubscribes, and it
// converges to the desired state written after the restart.
func TestOverRedis(t *testing.T) {
	rs := redistest.Start(t)
	n := startRedisNode(t, rs.URL(), nil)
	rb := dialTest(t, rs.URL())
	f := newFleet(t, rb)
	n.joined(f)

	a := f.do(protocol.Pause{Mode: protocol.ModeAbort, ClearCache: true})
	require.Equal(t, protocol.ResultOK, a.Result, "%+v", a)
	require.Equal(t, protocol.ResultOK, f.do(protocol.Resume{}).Result)
	e := f.envelope(protocol.Pause{Mode: protocol.ModeAbort})
	e.Sign([]byte("another-secret-another-secret-another-secret"))
	f.publish(e)
	assert.Equal(t, agent.ReasonBadSignature, f.ack(e.ID).Code)
	assert.EqualValues(t, "running", n.stats().State)

	// Redis dies: the server keeps serving and stays in rotation on what it knows.
	rs.Kill()
	res, err := n.add("during-outage", 4).Collect(t.Context())
	require.NoError(t, err)
	assert.Len(t, res.Tokens, 4)
	code, _ := n.get("/health")
	assert.Equal(t, http.StatusOK, code)
	ok, body := n.ready()
	assert.True(t, ok, body)

	// Redis is back, empty. The fleet writes its desired state again, at a new version.
	rs.Restart()
	ref := checkpoint(t, 2, 2)
	f.setDesired(protocol.DesiredState{Epoch: 1, Weights: &ref, Plan: &protocol.Commit{Mode: protocol.ModeAbort, ClearCache: true}, Signed: true}, true)
	waitFor(t, "convergence after the restart", func() bool {
		hb, ok := f.heartbeat(serverID)
		return ok && hb.WeightVersion == 2 && hb.InRotation
	})
	assert.EqualValues(t, 2, n.stats().WeightVersion)
	a = f.doWhenSubscribed(protocol.Reset{})
	assert.Equal(t, protocol.ResultOK, a.Result, "%+v", a)
	assert.EqualValues(t, 2, a.WeightVersion)
}

// TestPartitionedServerCatchesUp: a server cut off from Redis misses the commit; once the
// partition heals it converges to the desired version by itself.
func TestPartitionedServerCatchesUp(t *testing.T) {
	rs := redistest.Start(t)
	px := redistest.NewProxy(t, rs.Addr())
	n := startRedisNode(t, px.URL(), nil)
	rb := dialTest(t, rs.URL())
	f := newFleet(t, rb)
	n.joined(f)

	px.Partition()
	ref := checkpoint(t, 2, 2)
	f.setDesired(protocol.DesiredState{Epoch: 1, Weights: &ref, Signed: true}, true)
	// A commit published now reaches nobody.
	e := f.envelope(protocol.Commit{Version: 2, Mode: protocol.ModeAbort, SHA256: ref.SHA256})
	raw, err := e.Encode()
	require.NoError(t, err)
	got, err := rb.Publish(t.Context(), f.names.Control(), raw)
	require.NoError(t, err)
	assert.Zero(t, got)
	assert.EqualValues(t, 1, n.stats().WeightVersion)

	px.Heal()
	waitFor(t, "convergence after the heal", func() bool {
		hb, ok := f.heartbeat(serverID)
		return ok && hb.WeightVersion == 2 && hb.InRotation && hb.Epoch == 1
	})
	ok, body := n.ready()
	assert.True(t, ok, body)
}
