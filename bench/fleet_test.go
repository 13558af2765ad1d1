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
