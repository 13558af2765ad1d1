package bus_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rolloutkit/rollout/internal/redistest"
	"github.com/rolloutkit/rollout/sdk/bus"
)

// BenchmarkControlRoundTrip measures one control round trip as the fleet does it: publish a
// command-sized message to N subscribers, each pushes an ack onto the command's list, the
// publisher pops until it has all N. It runs on the in-process bus, on the Redis bus (one bus
// per subscriber, as one per server process), and beside them the same exchange written
// straight against go-redis (PUBLISH, RPUSH, BLMPOP ... COUNT): the floor our abstraction adds
// to. Reported: p50 and p99 latency per round trip.
//
//	go test ./sdk/bus/ -run '^$' -bench ControlRoundTrip
func BenchmarkControlRoundTrip(b *testing.B) {
	srv := redistest.Start(b)
	for _, n := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("floor/N=%d", n), func(b *testing.B) { benchFloor(b, srv.URL(), n) })
		b.Run(fmt.Sprintf("redis/N=%d", n), func(b *testing.B) {
			benchBus(b, n, func() bus.Bus {
				r, err := bus.DialRedis(context.Background(), srv.URL(), bus.RedisOptions{})
				if err != nil {
					b.Fatal(err)
				}
				return r
			})
		})
		b.Run(fmt.Sprintf("mem/N=%d", n), func(b *testing.B) {
			m := bus.NewMem(bus.MemOptions{})
			benchBus(b, n, func() bus.Bus { return m })
		})
	}
}

// message is a command-sized payload (about what a signed envelope weighs) that starts with
// the ack list's name.
func message(list string) []byte {
	return append([]byte(list+"|"), bytes.Repeat([]byte("x"), 320-len(list)-1)...)
}

func ackList(payload string) string {
	list, _, _ := strings.Cut(payload, "|")
	return list
}

// report adds the latency percentiles of one run.
func report(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	ms := func(q float64) float64 {
		return float64(lat[min(len(lat)-1, int(q*float64(len(lat))))]) / float64(time.Millisecond)
	}
	b.ReportMetric(ms(0.50), "p50-ms")
	b.ReportMetric(ms(0.99), "p99-ms")
}

func benchBus(b *testing.B, n int, newBus func() bus.Bus) {
	ctx := context.Background()
	ctrl := newBus()
	ch := "bench:control:" + strconv.Itoa(n)
	var wg sync.WaitGroup
	var subs []bus.Subscription
	var buses []bus.Bus
	errs := make(chan error, n)
	for range n {
		sb := newBus()
		buses = append(buses, sb)
		sub, err := sb.Subscribe(ctx, ch)
		if err != nil {
			b.Fatal(err)
		}
		subs = append(subs, sub)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ev := range sub.Events() {
				if ev.Kind != bus.EventMessage {
					continue
				}
				if err := sb.Push(ctx, ackList(string(ev.Payload)), []byte("ack"), time.Minute); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	defer func() {
		for _, s := range subs {
			_ = s.Close()
		}
		wg.Wait()
		for _, sb := range buses {
			_ = sb.Close()
		}
		_ = ctrl.Close()
	}()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		list := "bench:ack:" + strconv.Itoa(n) + ":" + strconv.Itoa(i)
		start := time.Now()
		got, err := ctrl.Publish(ctx, ch, message(list))
		if err != nil || got != n {
			b.Fatalf("publish reached %d of %d: %v", got, n, err)
		}
		for acks := 0; acks < n; {
			vals, err := ctrl.Pop(ctx, list, n-acks, 5*time.Second)
			if err != nil {
				b.Fatal(err)
			}
			if len(vals) == 0 {
				b.Fatalf("acks missing: %d of %d", acks, n)
			}
			acks += len(vals)
		}
		lat = append(lat, time.Since(start))
		select {
		case err := <-errs:
			b.Fatal(err)
		default:
		}
	}
	b.StopTimer()
	report(b, lat)
}

// benchFloor is the same exchange on bare go-redis: each subscriber a client and PubSub of
// its own, acks by RPUSH, the publisher draining with BLMPOP ... COUNT.
func benchFloor(b *testing.B, url string, n int) {
	ctx := context.Background()
	opt, err := redis.ParseURL(url)
	if err != nil {
		b.Fatal(err)
	}
	opt.DisableIdentity = true
	ctrl := redis.NewClient(opt)
	defer ctrl.Close()
	ch := "floor:control:" + strconv.Itoa(n)
	var wg sync.WaitGroup
	var closers []func()
	errs := make(chan error, n)
	for range n {
		c := redis.NewClient(opt)
		ps := c.Subscribe(ctx, ch)
		if _, err := ps.Receive(ctx); err != nil { // the subscribe confirmation
			b.Fatal(err)
		}
		closers = append(closers, func() { _ = ps.Close(); _ = c.Close() })
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				msg, err := ps.ReceiveMessage(ctx)
				if err != nil {
					return // closed
				}
				if err := c.RPush(ctx, ackList(msg.Payload), "ack").Err(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	defer func() {
		for _, c := range closers {
			c()
		}
		wg.Wait()
	}()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		list := "floor:ack:" + strconv.Itoa(n) + ":" + strconv.Itoa(i)
		start := time.Now()
		got, err := ctrl.Publish(ctx, ch, message(list)).Result()
		if err != nil || int(got) != n {
			b.Fatalf("publish reached %d of %d: %v", got, n, err)
		}
		for acks := 0; acks < n; {
			_, vals, err := ctrl.BLMPop(ctx, 5*time.Second, "left", int64(n-acks), list).Result()
			if err != nil {
				b.Fatal(err)
			}
			acks += len(vals)
		}
		lat = append(lat, time.Since(start))
		select {
		case err := <-errs:
			b.Fatal(err)
		default:
		}
	}
	b.StopTimer()
	report(b, lat)
}
