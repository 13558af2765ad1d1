package bench

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func startRedis(t *testing.T) *RedisServer {
	t.Helper()
	s, err := StartRedis(context.Background())
	if errors.Is(err, ErrNoRedisServer) {
		t.Skip("redis-server is not installed")
	}
	require.NoError(t, err)
	t.Cleanup(s.Stop)
	return s
}

func TestSummarize(t *testing.T) {
	var s []time.Duration
	for i := 1; i <= 100; i++ {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	l := Summarize(s)
	assert.Equal(t, Latency{N: 100, P50Ms: 50, P90Ms: 90, P99Ms: 99, MeanMs: 50.5}, l)
	assert.Equal(t, Latency{}, Summarize(nil))
}

func TestRedisFloor(t *testing.T) {
	r := startRedis(t)
	for _, n := range []int{1, 4} {
		l, err := RedisFloor(context.Background(), r.URL, n, 20)
		require.NoError(t, err)
		assert.Equal(t, 20, l.N)
		assert.Positive(t, l.P50Ms)
		assert.GreaterOrEqual(t, l.P99Ms, l.P50Ms)
		t.Logf("floor n=%d: %+v", n, l)
	}
}

// The fleet figures are checked for shape on tiny fleets; `rollout bench fleet` measures.
func TestFleetFigures(t *testing.T) {
	if testing.Short() {
		t.Skip("starts fleets")
	}
	ctx := context.Background()
	c, err := ControlRoundTrip(ctx, "mem", nil, 2, 10)
	require.NoError(t, err)
	assert.Equal(t, 10, c.SDK.N)
	assert.Equal(t, 10, c.Floor.N)
	assert.Positive(t, c.Ratio)

	b, err := UpdateBubble(ctx, "tiny", 1, 1, t.TempDir())
	require.NoError(t, err)
	require.Len(t, b.BubblesMs, 1)
	assert.Positive(t, b.StageP50Ms)
	assert.Positive(t, b.CheckpointBytes)

	g, err := GenerateVsDirect(ctx, "tiny", 4, 8, 8, 1)
	require.NoError(t, err)
	assert.Zero(t, g.SDKErrors+g.DirectErrors)
	assert.Positive(t, g.SDKTokS)
	assert.Positive(t, g.DirectTokS)
	t.Logf("control %+v\nbubble %+v\ngenerate %+v", c, b, g)
}
