package agent_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/internal/redistest"
	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/protocol"
	"github.com/rolloutkit/rollout/server"
)

// BenchmarkControlRoundTrip: one signed command to one server and its ack read back (sign,
// publish, verify, run an abort on the engine, push, pop), over the in-process bus and over
// a real redis-server, beside Redis's bare publish → subscribe → push → pop floor measured
// in the same run.
func BenchmarkControlRoundTrip(b *testing.B) {
	b.Run("mem", func(b *testing.B) {
		mem := bus.NewMem(bus.MemOptions{})
		b.Cleanup(func() { _ = mem.Close() })
		startNode(b, mem, nil)
		roundTrips(b, mem)
	})
	b.Run("redis", func(b *testing.B) {
		rs := redistest.Start(b)
		startNode(b, nil, func(c *server.Config) { c.Bus, c.Redis.URL = nil, rs.URL() })
		roundTrips(b, dialBench(b, rs.URL()))
	})
	b.Run("redis-floor", func(b *testing.B) {
		rs := redistest.Start(b)
		rb, peer := dialBench(b, rs.URL()), dialBench(b, rs.URL())
		sub, err := peer.Subscribe(b.Context(), "floor")
		require.NoError(b, err)
		b.Cleanup(func() { _ = sub.Close() })
		go func() {
			for ev := range sub.Events() {
				if ev.Kind == bus.EventMessage {
					_ = peer.Push(b.Context(), "floor:ack", ev.Payload, time.Minute)
				}
			}
		}()
		msg := []byte(`{"v":1}`)
		for b.Loop() {
			_, err := rb.Publish(b.Context(), "floor", msg)
			require.NoError(b, err)
			vals, err := rb.Pop(b.Context(), "floor:ack", 1, 10*time.Second)
			require.NoError(b, err)
			require.Len(b, vals, 1)
		}
	})
}

func dialBench(b *testing.B, url string) *bus.Redis {
	rb, err := bus.DialRedis(b.Context(), url, bus.RedisOptions{})
	require.NoError(b, err)
	b.Cleanup(func() { _ = rb.Close() })
	return rb
}

func roundTrips(b *testing.B, sdkBus bus.Bus) {
	names := protocol.Names{Fleet: fleetName}
	waitFor(b, "the first heartbeat", func() bool { _, err := sdkBus.Get(b.Context(), names.Heartbeat(serverID)); return err == nil })
	cmd := protocol.Abort{RequestIDs: []string{"none"}}
	for b.Loop() {
		e, err := protocol.NewEnvelope(fleetName, nil, cmd, time.Now(), 30*time.Second)
		require.NoError(b, err)
		e.Sign(testSecret)
		raw, err := e.Encode()
		require.NoError(b, err)
		_, err = sdkBus.Publish(b.Context(), names.Control(), raw)
		require.NoError(b, err)
		vals, err := sdkBus.Pop(b.Context(), names.Acks(e.ID), 1, 10*time.Second)
		require.NoError(b, err)
		require.Len(b, vals, 1)
	}
}
