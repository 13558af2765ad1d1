package bus_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rolloutkit/rollout/internal/redistest"
	"github.com/rolloutkit/rollout/sdk/bus"
)

func TestRedisSmoke(t *testing.T) {
	s := redistest.Start(t)
	ctx := t.Context()
	b, err := bus.DialRedis(ctx, s.URL(), bus.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	sub, err := b.Subscribe(ctx, "c")
	if err != nil {
		t.Fatal(err)
	}
	n, err := b.Publish(ctx, "c", []byte("hi"))
	if err != nil || n != 1 {
		t.Fatalf("publish: %d %v", n, err)
	}
	ev := <-sub.Events()
	if string(ev.Payload) != "hi" {
		t.Fatalf("got %+v", ev)
	}
	if err := b.Push(ctx, "l", []byte("a"), time.Minute); err != nil {
		t.Fatal(err)
	}
	got, err := b.Pop(ctx, "l", 5, time.Second)
	if err != nil || len(got) != 1 {
		t.Fatalf("pop %q %v", got, err)
	}
	ok, err := b.CompareAndSwap(ctx, "k", nil, []byte("1"))
	if err != nil || !ok {
		t.Fatalf("cas %v %v", ok, err)
	}
	if _, err := b.Get(ctx, "nope"); !errors.Is(err, bus.ErrNotFound) {
		t.Fatal(err)
	}
	s.Kill()
	s.Restart()
	ev = <-sub.Events()
	if ev.Kind != bus.EventSubscribed {
		t.Fatalf("got %+v", ev)
	}
	_ = sub.Close()
	_, err = bus.DialRedis(context.Background(), "redis://127.0.0.1:1", bus.RedisOptions{})
	t.Log(err, errors.Is(err, bus.ErrUnavailable))
	_, err = bus.DialRedis(context.Background(), "http://127.0.0.1:1", bus.RedisOptions{})
	t.Log(err)
}
