package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rolloutkit/rollout/sdk/bus/redisconf"
)

// Latency summarises round-trip samples in milliseconds.
type Latency struct {
	N      int     `json:"n"`
	P50Ms  float64 `json:"p50_ms"`
	P90Ms  float64 `json:"p90_ms"`
	P99Ms  float64 `json:"p99_ms"`
	MeanMs float64 `json:"mean_ms"`
}

// Summarize computes the percentiles of samples (nearest rank).
func Summarize(samples []time.Duration) Latency {
	if len(samples) == 0 {
		return Latency{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	at := func(q float64) float64 {
		i := int(q*float64(len(s))+0.5) - 1
		i = min(max(i, 0), len(s)-1)
		return float64(s[i]) / 1e6
	}
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return Latency{N: len(s), P50Ms: at(0.50), P90Ms: at(0.90), P99Ms: at(0.99), MeanMs: float64(sum) / float64(len(s)) / 1e6}
}

// RedisFloor measures the round trip no control command over Redis can beat: one PUBLISH
// reaches n subscribers, each on its own client as each server has its own, and each RPUSHes
// a small ack onto the round's list, which the publisher BLPOPs until it holds n acks. No
// signing, no JSON, no engine: just the messages a command and its acks are made of.
func RedisFloor(ctx context.Context, url string, n, rounds int) (Latency, error) {
	return RedisFloorConfig(ctx, redisconf.Config{URL: url}, n, rounds)
}

// RedisFloorConfig is RedisFloor on any Redis deployment conf describes (TLS, Sentinel,
// Cluster: there with SPUBLISH and SSUBSCRIBE, as the bus does).
func RedisFloorConfig(ctx context.Context, conf redisconf.Config, n, rounds int) (Latency, error) {
	res, err := conf.Resolve()
	if err != nil {
		return Latency{}, fmt.Errorf("bench: %w", err)
	}
	res.Options.DisableIdentity = true
	sharded := res.Mode == redisconf.Cluster
	pub := res.NewClient()
	defer pub.Close()
	channel := "rollout-bench-floor:" + strconv.FormatInt(time.Now().UnixNano(), 36)

	ctx, cancel := context.WithCancel(ctx)
	var (
		wg   sync.WaitGroup
		subs []*redis.PubSub
	)
	// A blocked ReceiveMessage does not watch ctx; closing its PubSub is what ends it.
	defer func() {
		cancel()
		for _, ps := range subs {
			_ = ps.Close()
		}
		wg.Wait()
	}()
	errc := make(chan error, n)
	for i := range n {
		c := res.NewClient()
		var ps *redis.PubSub
		if sharded {
			ps = c.SSubscribe(ctx, channel)
		} else {
			ps = c.Subscribe(ctx, channel)
		}
		subs = append(subs, ps)
		// Receive returns the subscription confirmation: only then is the subscriber counted.
		if _, err := ps.Receive(ctx); err != nil {
			_ = c.Close()
			return Latency{}, fmt.Errorf("bench: subscribe: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			ack := "ack-" + strconv.Itoa(i)
			for {
				m, err := ps.ReceiveMessage(ctx)
				if err != nil {
					if ctx.Err() == nil {
						errc <- err
					}
					return
				}
				if err := c.RPush(ctx, m.Payload, ack).Err(); err != nil {
					if ctx.Err() == nil {
						errc <- err
					}
					return
				}
			}
		}()
	}
	samples := make([]time.Duration, 0, rounds)
	for r := range rounds {
		list := channel + ":ack:" + strconv.Itoa(r)
		start := time.Now()
		publish := pub.Publish
		if sharded {
			publish = pub.SPublish
		}
		if err := publish(ctx, channel, list).Err(); err != nil {
			return Latency{}, fmt.Errorf("bench: publish: %w", err)
		}
		for got := 0; got < n; {
			select {
			case err := <-errc:
				return Latency{}, fmt.Errorf("bench: subscriber: %w", err)
			default:
			}
			v, err := pub.BLPop(ctx, 5*time.Second, list).Result()
			if err != nil {
				return Latency{}, fmt.Errorf("bench: reading acks: %w", err)
			}
			got += len(v) / 2 // BLPOP answers [list, value]
		}
		samples = append(samples, time.Since(start))
		pub.Del(ctx, list)
	}
	return Summarize(samples), nil
}

// RedisServer is a redis-server the benchmark started for itself.
type RedisServer struct {
	URL  string
	cmd  *exec.Cmd
	done chan struct{}
	dir  string
}

// ErrNoRedisServer means redis-server is not on PATH.
var ErrNoRedisServer = errors.New("bench: redis-server is not on PATH")

// StartRedis starts redis-server on a free 127.0.0.1 port without persistence and waits until
// it answers PING.
func StartRedis(ctx context.Context) (*RedisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, ErrNoRedisServer
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir, err := os.MkdirTemp("", "rollout-bench-redis-")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("bench: start redis-server: %w", err)
	}
	s := &RedisServer{URL: "redis://127.0.0.1:" + strconv.Itoa(port), cmd: cmd, done: make(chan struct{}), dir: dir}
	go func() { _ = cmd.Wait(); close(s.done) }()
	opt, _ := redis.ParseURL(s.URL)
	opt.DisableIdentity = true
	c := redis.NewClient(opt)
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := c.Ping(ctx).Err(); err == nil {
			return s, nil
		}
		select {
		case <-s.done:
			s.Stop()
			return nil, errors.New("bench: redis-server exited at start")
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.Stop()
			return nil, errors.New("bench: redis-server did not answer PING")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Stop kills the server and removes its directory.
func (s *RedisServer) Stop() {
	_ = s.cmd.Process.Kill()
	<-s.done
	_ = os.RemoveAll(s.dir)
}
