package bus_test

import (
	"sync"
	"testing"
	"time"

	"github.com/rolloutkit/rollout/internal/redistest"
	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/bus/bustest"
)

// fakeClock is the Mem bus's clock in the contract suite.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// clockedMem lets the suite advance a Mem bus's clock (bustest.Clock).
type clockedMem struct {
	*bus.Mem
	clock *fakeClock
}

func (m clockedMem) Advance(d time.Duration) {
	m.clock.mu.Lock()
	m.clock.now = m.clock.now.Add(d)
	m.clock.mu.Unlock()
}

func TestMemContract(t *testing.T) {
	bustest.Run(t, func(t *testing.T) bus.Bus {
		c := &fakeClock{now: time.Unix(1_700_000_000, 0)}
		return clockedMem{Mem: bus.NewMem(bus.MemOptions{Now: c.Now}), clock: c}
	})
}

func TestRedisContract(t *testing.T) {
	s := redistest.Start(t)
	bustest.Run(t, func(t *testing.T) bus.Bus {
		return dialRedis(t, s.URL(), bus.RedisOptions{})
	})
}

func dialRedis(t *testing.T, url string, o bus.RedisOptions) *bus.Redis {
	t.Helper()
	b, err := bus.DialRedis(t.Context(), url, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}
