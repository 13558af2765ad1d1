package bustest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/sdk/bus"
)

// Clock is implemented by a bus under test whose TTLs run on a fake clock. The suite then
// checks expiry exactly (present until the TTL, gone at it); on a bus without one it sets
// short real TTLs and only waits for them to pass, never asserting how quickly.
type Clock interface {
	// Advance moves the bus's clock forward by d.
	Advance(d time.Duration)
}

// patience bounds every wait for something that must happen. It only turns a hang into a
// failure: nothing passes or fails because something was quick or slow.
const patience = 20 * time.Second

// Run runs the contract every Bus must meet against buses from newBus, one fresh bus per
// subtest (it may share a server with earlier ones: every subtest uses keys and channels of
// its own). The suite closes each bus it gets.
func Run(t *testing.T, newBus func(t *testing.T) bus.Bus) {
	tests := []struct {
		name string
		fn   func(t *testing.T, b bus.Bus, ns string)
	}{
		{"PublishSubscribe", testPublishSubscribe},
		{"PublishCopiesPayload", testPublishCopiesPayload},
		{"PublishNoSubscribers", testPublishNoSubscribers},
		{"MultipleSubscribers", testMultipleSubscribers},
		{"SlowSubscriberLosesNothing", testSlowSubscriber},
		{"ConcurrentPublishers", testConcurrentPublishers},
		{"SubscriptionClose", testSubscriptionClose},
		{"SetGet", testSetGet},
		{"KeyTTL", testKeyTTL},
		{"Scan", testScan},
		{"ScanGlobCharacters", testScanGlob},
		{"ScanManyKeys", testScanMany},
		{"CompareAndSwap", testCompareAndSwap},
		{"CompareAndSwapRaces", testCompareAndSwapRaces},
		{"Delete", testDelete},
		{"PushPopOrder", testPushPopOrder},
		{"PopWait", testPopWait},
		{"PopCancel", testPopCancel},
		{"PopWaitAcrossDelete", testPopAcrossDelete},
		{"ListTTL", testListTTL},
		{"ConcurrentPushPop", testConcurrentPushPop},
		{"BadArguments", testBadArguments},
		{"CancelledContext", testCancelledContext},
		{"Close", testClose},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newBus(t)
			t.Cleanup(func() { _ = b.Close() })
			var r [6]byte
			_, _ = rand.Read(r[:])
			tc.fn(t, b, "bustest:"+tc.name+":"+hex.EncodeToString(r[:])+":")
		})
	}
}

// next returns the subscription's next event, failing the test if none comes.
func next(t *testing.T, s bus.Subscription) bus.Event {
	t.Helper()
	select {
	case ev, ok := <-s.Events():
		require.True(t, ok, "events channel closed")
		return ev
	case <-time.After(patience):
		t.Fatal("no event")
	}
	return bus.Event{}
}

// nextMessage skips resubscription notices (a bus may report a reconnect at any time) and
// returns the next message's payload.
func nextMessage(t *testing.T, s bus.Subscription) string {
	t.Helper()
	for {
		if ev := next(t, s); ev.Kind == bus.EventMessage {
			return string(ev.Payload)
		}
	}
}

// closed waits until the subscription's events channel is closed, draining it.
func closed(t *testing.T, s bus.Subscription) {
	t.Helper()
	timeout := time.After(patience)
	for {
		select {
		case _, ok := <-s.Events():
			if !ok {
				return
			}
		case <-timeout:
			t.Fatal("events channel not closed")
		}
	}
}

func subscribe(t *testing.T, b bus.Bus, channel string) bus.Subscription {
	t.Helper()
	s, err := b.Subscribe(t.Context(), channel)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func publish(t *testing.T, b bus.Bus, channel, msg string) int {
	t.Helper()
	n, err := b.Publish(t.Context(), channel, []byte(msg))
	require.NoError(t, err)
	return n
}

func testPublishSubscribe(t *testing.T, b bus.Bus, ns string) {
	s := subscribe(t, b, ns+"c")
	// Subscribe has returned, so the very first publish is delivered.
	require.Equal(t, 1, publish(t, b, ns+"c", "first"))
	require.Equal(t, "first", nextMessage(t, s))
	for i := range 50 {
		require.Equal(t, 1, publish(t, b, ns+"c", strconv.Itoa(i)))
	}
	for i := range 50 {
		require.Equal(t, strconv.Itoa(i), nextMessage(t, s), "messages arrive in publish order")
	}
	// Empty and binary payloads arrive intact.
	publish(t, b, ns+"c", "")
	require.Empty(t, nextMessage(t, s))
	bin := string([]byte{0, 1, 2, 0xff, '\r', '\n', 0})
	publish(t, b, ns+"c", bin)
	require.Equal(t, bin, nextMessage(t, s))
	big := string(bytes.Repeat([]byte("x"), 64<<10))
	publish(t, b, ns+"c", big)
	require.Equal(t, big, nextMessage(t, s))
}

func testPublishCopiesPayload(t *testing.T, b bus.Bus, ns string) {
	s := subscribe(t, b, ns+"c")
	msg := []byte("original")
	_, err := b.Publish(t.Context(), ns+"c", msg)
	require.NoError(t, err)
	copy(msg, "mutated!")
	require.Equal(t, "original", nextMessage(t, s))
}

func testPublishNoSubscribers(t *testing.T, b bus.Bus, ns string) {
	require.Equal(t, 0, publish(t, b, ns+"nobody", "x"))
}

func testMultipleSubscribers(t *testing.T, b bus.Bus, ns string) {
	subs := []bus.Subscription{subscribe(t, b, ns+"c"), subscribe(t, b, ns+"c"), subscribe(t, b, ns+"c")}
	other := subscribe(t, b, ns+"other")
	require.Equal(t, 3, publish(t, b, ns+"c", "m1"))
	require.Equal(t, 3, publish(t, b, ns+"c", "m2"))
	for _, s := range subs {
		require.Equal(t, "m1", nextMessage(t, s))
		require.Equal(t, "m2", nextMessage(t, s))
	}
	// The other channel's subscriber saw nothing of c: its first message is its own.
	require.Equal(t, 1, publish(t, b, ns+"other", "mine"))
	require.Equal(t, "mine", nextMessage(t, other))
}

// A subscriber that does not read for a while still gets every message, in order: Redis's
// client would drop them after its buffer filled, the bus must not.
func testSlowSubscriber(t *testing.T, b bus.Bus, ns string) {
	s := subscribe(t, b, ns+"c")
	const n = 3000
	for i := range n {
		publish(t, b, ns+"c", strconv.Itoa(i))
	}
	for i := range n {
		require.Equal(t, strconv.Itoa(i), nextMessage(t, s))
	}
}

func testConcurrentPublishers(t *testing.T, b bus.Bus, ns string) {
	s := subscribe(t, b, ns+"c")
	const pubs, each = 4, 50
	errs := make(chan error, pubs)
	for p := range pubs {
		go func() {
			for i := range each {
				if _, err := b.Publish(context.Background(), ns+"c", fmt.Appendf(nil, "%d/%d", p, i)); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range pubs {
		require.NoError(t, <-errs)
	}
	last := make([]int, pubs)
	for i := range last {
		last[i] = -1
	}
	for range pubs * each {
		var p, i int
		_, err := fmt.Sscanf(nextMessage(t, s), "%d/%d", &p, &i)
		require.NoError(t, err)
		require.Equal(t, last[p]+1, i, "publisher %d's messages in its order", p)
		last[p] = i
	}
}

func testSubscriptionClose(t *testing.T, b bus.Bus, ns string) {
	s := subscribe(t, b, ns+"c")
	keep := subscribe(t, b, ns+"c")
	require.Equal(t, 2, publish(t, b, ns+"c", "before"))
	require.NoError(t, s.Close())
	closed(t, s)
	require.NoError(t, s.Close(), "Close is idempotent")
	// The closed subscription stops counting as a receiver (Redis learns of it
	// asynchronously, so wait for it).
	require.Eventually(t, func() bool { return publish(t, b, ns+"c", "probe") == 1 }, patience, time.Millisecond)
	require.Equal(t, "before", nextMessage(t, keep))
	require.Equal(t, "probe", nextMessage(t, keep))
	// The bus itself is unaffected.
	s2 := subscribe(t, b, ns+"c")
	require.Equal(t, 2, publish(t, b, ns+"c", "after"))
	require.Equal(t, "after", nextMessage(t, s2))
}

func testSetGet(t *testing.T, b bus.Bus, ns string) {
	ctx := t.Context()
	_, err := b.Get(ctx, ns+"missing")
	require.ErrorIs(t, err, bus.ErrNotFound)

	val := []byte("v1")
	require.NoError(t, b.Set(ctx, ns+"k", val, 0))
	copy(val, "xx")
	got, err := b.Get(ctx, ns+"k")
	require.NoError(t, err)
	require.Equal(t, "v1", string(got), "Set stores a copy")
	got[0] = 'z'
	got, err = b.Get(ctx, ns+"k")
	require.NoError(t, err)
	require.Equal(t, "v1", string(got), "Get returns a copy")

	require.NoError(t, b.Set(ctx, ns+"k", []byte("v2"), time.Hour))
	got, err = b.Get(ctx, ns+"k")
	require.NoError(t, err)
	require.Equal(t, "v2", string(got))

	require.NoError(t, b.Set(ctx, ns+"empty", nil, 0))
	got, err = b.Get(ctx, ns+"empty")
	require.NoError(t, err, "an empty value is a value, not a missing key")
	require.Empty(t, got)

	bin := []byte{0, 0xff, '\n', 0}
	require.NoError(t, b.Set(ctx, ns+"bin", bin, 0))
	got, err = b.Get(ctx, ns+"bin")
	require.NoError(t, err)
	require.Equal(t, bin, got)
}

// gone waits until key has expired.
func gone(t *testing.T, b bus.Bus, key string) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, err := b.Get(t.Context(), key)
		return errors.Is(err, bus.ErrNotFound)
	}, patience, time.Millisecond, "key %s never expired", key)
}

func present(t *testing.T, b bus.Bus, key, want string) {
	t.Helper()
	got, err := b.Get(t.Context(), key)
	require.NoError(t, err, key)
	require.Equal(t, want, string(got), key)
}

func testKeyTTL(t *testing.T, b bus.Bus, ns string) {
	ctx := t.Context()
	if c, ok := b.(Clock); ok {
		require.NoError(t, b.Set(ctx, ns+"ttl", []byte("v"), 10*time.Second))
		require.NoError(t, b.Set(ctx, ns+"forever", []byte("f"), 0))
		require.NoError(t, b.Set(ctx, ns+"reset", []byte("r"), 10*time.Second))
		c.Advance(9 * time.Second)
		present(t, b, ns+"ttl", "v")
		require.NoError(t, b.Set(ctx, ns+"reset", []byte("r2"), 0)) // ttl 0 clears the TTL
		c.Advance(time.Second)
		_, err := b.Get(ctx, ns+"ttl")
		require.ErrorIs(t, err, bus.ErrNotFound, "expired at its TTL")
		c.Advance(1000 * time.Hour)
		present(t, b, ns+"forever", "f")
		present(t, b, ns+"reset", "r2")
		// An expired key can be set again.
		require.NoError(t, b.Set(ctx, ns+"ttl", []byte("again"), time.Second))
		present(t, b, ns+"ttl", "again")
		return
	}
	require.NoError(t, b.Set(ctx, ns+"forever", []byte("f"), 0))
	require.NoError(t, b.Set(ctx, ns+"long", []byte("l"), time.Hour))
	require.NoError(t, b.Set(ctx, ns+"reset", []byte("r"), 30*time.Millisecond))
	require.NoError(t, b.Set(ctx, ns+"reset", []byte("r2"), 0))
	require.NoError(t, b.Set(ctx, ns+"short", []byte("s"), 30*time.Millisecond))
	present(t, b, ns+"long", "l")
	gone(t, b, ns+"short")
	present(t, b, ns+"forever", "f")
	present(t, b, ns+"reset", "r2") // set before short expired, with its TTL cleared
	require.NoError(t, b.Set(ctx, ns+"short", []byte("again"), time.Hour))
	present(t, b, ns+"short", "again")
}

func keysOf(m map[string][]byte) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func testScan(t *testing.T, b bus.Bus, ns string) {
	ctx := t.Context()
	for _, k := range []string{"a:1", "a:2", "ab:3", "b:a:4"} {
		require.NoError(t, b.Set(ctx, ns+k, []byte("v"+k), 0))
	}
	require.NoError(t, b.Push(ctx, ns+"a:list", []byte("x"), time.Hour))
	got, err := b.Scan(ctx, ns+"a:")
	require.NoError(t, err)
	require.Equal(t, []string{ns + "a:1", ns + "a:2"}, keysOf(got), "only string keys with the prefix")
	require.Equal(t, "va:1", string(got[ns+"a:1"]))
	got, err = b.Scan(ctx, ns+"a")
	require.NoError(t, err)
	require.Equal(t, []string{ns + "a:1", ns + "a:2", ns + "ab:3"}, keysOf(got))
	got, err = b.Scan(ctx, ns+"none:")
	require.NoError(t, err)
	require.Empty(t, got)

	if c, ok := b.(Clock); ok {
		require.NoError(t, b.Set(ctx, ns+"a:ttl", []byte("t"), time.Second))
		got, err = b.Scan(ctx, ns+"a:")
		require.NoError(t, err)
		require.Len(t, got, 3)
		c.Advance(time.Second)
		got, err = b.Scan(ctx, ns+"a:")
		require.NoError(t, err)
		require.Equal(t, []string{ns + "a:1", ns + "a:2"}, keysOf(got), "expired keys are not scanned")
	}
}

// Prefixes are literal: characters a glob would treat specially match only themselves.
func testScanGlob(t *testing.T, b bus.Bus, ns string) {
	ctx := t.Context()
	keys := []string{
		"star*1", "starX1",
		"q?1", "qX1",
		"set[ab]1", "seta1", "setb1",
		`back\slash1`, "backslash1",
		"caret^1", "dash-1", "{tag}:1", "tag:1",
	}
	for _, k := range keys {
		require.NoError(t, b.Set(ctx, ns+k, []byte(k), 0))
	}
	for prefix, want := range map[string][]string{
		"star*":    {"star*1"},
		"q?":       {"q?1"},
		"set[ab]":  {"set[ab]1"},
		"set[":     {"set[ab]1"},
		`back\`:    {`back\slash1`},
		"caret^":   {"caret^1"},
		"dash-":    {"dash-1"},
		"{tag}:":   {"{tag}:1"},
		"set[ab]1": {"set[ab]1"},
	} {
		got, err := b.Scan(ctx, ns+prefix)
		require.NoError(t, err, prefix)
		var wantKeys []string
		for _, k := range want {
			wantKeys = append(wantKeys, ns+k)
		}
		require.Equal(t, wantKeys, keysOf(got), "prefix %q", prefix)
	}
}

// More keys than one SCAN batch returns.
func testScanMany(t *testing.T, b bus.Bus, ns string) {
	ctx := t.Context()
	const n = 2500
	for i := range n {
		require.NoError(t, b.Set(ctx, ns+"k:"+strconv.Itoa(i), []byte(strconv.Itoa(i)), 0))
	}
	require.NoError(t, b.Set(ctx, ns+"other", []byte("x"), 0))
	got, err := b.Scan(ctx, ns+"k:")
	require.NoError(t, err)
	require.Len(t, got, n)
	for i := range n {
		require.Equal(t, strconv.Itoa(i), string(got[ns+"k:"+strconv.Itoa(i)]))
	}
}

func cas(t *testing.T, b bus.Bus, key string, old, val []byte) bool {
	t.Helper()
	ok, err := b.CompareAndSwap(t.Context(), key, old, val)
	require.NoError(t, err)
	return ok
}

func testCompareAndSwap(t *testing.T, b bus.Bus, ns string) {
	k := ns + "k"
	require.False(t, cas(t, b, k, []byte("x"), []byte("1")), "a missing key matches no value")
	require.False(t, cas(t, b, k, []byte{}, []byte("1")), "a missing key does not match the empty value")
	require.True(t, cas(t, b, k, nil, []byte("1")), "old == nil creates a missing key")
	present(t, b, k, "1")
	require.False(t, cas(t, b, k, nil, []byte("2")), "old == nil fails on an existing key")
	require.False(t, cas(t, b, k, []byte("0"), []byte("2")))
	present(t, b, k, "1")
	require.True(t, cas(t, b, k, []byte("1"), []byte("2")))
	present(t, b, k, "2")
	require.True(t, cas(t, b, k, []byte("2"), []byte{}))
	require.True(t, cas(t, b, k, []byte{}, []byte("3")), "the empty value matches itself")
	present(t, b, k, "3")

	// A swapped key keeps no TTL: the desired state must not expire.
	if c, ok := b.(Clock); ok {
		require.NoError(t, b.Set(t.Context(), ns+"ttl", []byte("a"), time.Second))
		require.True(t, cas(t, b, ns+"ttl", []byte("a"), []byte("b")))
		c.Advance(time.Hour)
		present(t, b, ns+"ttl", "b")
		return
	}
	// With a real clock the swap has to beat the TTL; a slow machine may need a longer one.
	for ttl := 50 * time.Millisecond; ; ttl *= 2 {
		require.NoError(t, b.Set(t.Context(), ns+"ttl", []byte("a"), ttl))
		if !cas(t, b, ns+"ttl", []byte("a"), []byte("b")) {
			require.Less(t, ttl, patience, "never swapped before the TTL passed")
			continue
		}
		// The probe is set after the swap with the same TTL, so once it is gone the old TTL
		// has passed too.
		require.NoError(t, b.Set(t.Context(), ns+"probe", []byte("p"), ttl))
		gone(t, b, ns+"probe")
		present(t, b, ns+"ttl", "b")
		return
	}
}

// N goroutines swap the same expected value at once: exactly one wins each round.
func testCompareAndSwapRaces(t *testing.T, b bus.Bus, ns string) {
	const workers, rounds = 8, 25
	k := ns + "k"
	var cur []byte // nil: round 0 creates the key
	for round := range rounds {
		start := make(chan struct{})
		type result struct {
			won bool
			val []byte
			err error
		}
		results := make(chan result, workers)
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				val := fmt.Appendf(nil, "%d/%d", round, w)
				<-start
				ok, err := b.CompareAndSwap(context.Background(), k, cur, val)
				results <- result{ok, val, err}
			}()
		}
		close(start)
		wg.Wait()
		close(results)
		var winners [][]byte
		for r := range results {
			require.NoError(t, r.err)
			if r.won {
				winners = append(winners, r.val)
			}
		}
		require.Len(t, winners, 1, "round %d", round)
		present(t, b, k, string(winners[0]))
		cur = winners[0]
	}
}

func testDelete(t *testing.T, b bus.Bus, ns string) {
	ctx := t.Context()
	require.NoError(t, b.Set(ctx, ns+"a", []byte("1"), 0))
	require.NoError(t, b.Set(ctx, ns+"b", []byte("2"), time.Hour))
	require.NoError(t, b.Set(ctx, ns+"c", []byte("3"), 0))
	require.NoError(t, b.Push(ctx, ns+"list", []byte("x"), time.Hour))
	require.NoError(t, b.Delete(ctx, ns+"a", ns+"b", ns+"missing", ns+"list"))
	for _, k := range []string{"a", "b", "missing"} {
		_, err := b.Get(ctx, ns+k)
		require.ErrorIs(t, err, bus.ErrNotFound, k)
	}
	present(t, b, ns+"c", "3")
	got, err := b.Pop(ctx, ns+"list", 10, 0)
	require.NoError(t, err)
	require.Empty(t, got, "Delete removes lists too")
	require.NoError(t, b.Delete(ctx), "deleting nothing")
	require.NoError(t, b.Delete(ctx, ns+"missing"))
}

func pop(t *testing.T, b bus.Bus, list string, limit int, wait time.Duration) []string {
	t.Helper()
	vals, err := b.Pop(t.Context(), list, limit, wait)
	require.NoError(t, err)
	var out []string
	for _, v := range vals {
		out = append(out, string(v))
	}
	return out
}

func testPushPopOrder(t *testing.T, b bus.Bus, ns string) {
	ctx := t.Context()
	l := ns + "l"
	require.Empty(t, pop(t, b, l, 5, 0), "an empty list pops nothing, without error")
	for i := range 10 {
		require.NoError(t, b.Push(ctx, l, []byte(strconv.Itoa(i)), time.Hour))
	}
	require.Equal(t, []string{"0", "1", "2"}, pop(t, b, l, 3, 0))
	require.Equal(t, []string{"3"}, pop(t, b, l, 1, time.Second))
	require.Equal(t, []string{"4", "5", "6", "7", "8", "9"}, pop(t, b, l, 100, time.Second), "up to limit")
	require.Empty(t, pop(t, b, l, 5, 0))

	val := []byte("orig")
	require.NoError(t, b.Push(ctx, l, val, time.Hour))
	copy(val, "mut!")
	require.NoError(t, b.Push(ctx, l, nil, time.Hour))
	require.Equal(t, []string{"orig", ""}, pop(t, b, l, 5, 0), "Push stores a copy; empty values survive")
}

func testPopWait(t *testing.T, b bus.Bus, ns string) {
	ctx := t.Context()
	l := ns + "l"
	// A waiting Pop returns what is pushed while it waits (or just before: either way it
	// must be returned).
	got := make(chan []string, 1)
	errc := make(chan error, 1)
	go func() {
		vals, err := b.Pop(context.Background(), l, 10, patience)
		var out []string
		for _, v := range vals {
			out = append(out, string(v))
		}
		got <- out
		errc <- err
	}()
	require.NoError(t, b.Push(ctx, l, []byte("late"), time.Hour))
	require.NoError(t, <-errc)
	require.Equal(t, []string{"late"}, <-got)

	// With values already there a waiting Pop returns at once, at most limit of them.
	for i := range 5 {
		require.NoError(t, b.Push(ctx, l, []byte(strconv.Itoa(i)), time.Hour))
	}
	require.Equal(t, []string{"0", "1", "2"}, pop(t, b, l, 3, patience))
	require.Equal(t, []string{"3", "4"}, pop(t, b, l, 3, patience))

	// Nothing before the wait ends: (nil, nil).
	require.Empty(t, pop(t, b, l, 3, 20*time.Millisecond))
}

func testPopCancel(t *testing.T, b bus.Bus, ns string) {
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := b.Pop(ctx, ns+"l", 1, time.Hour)
		errc <- err
	}()
	cancel()
	select {
	case err := <-errc:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(patience):
		t.Fatal("Pop did not return after its context was cancelled")
	}

	// A deadline before the wait ends ends the Pop with the deadline's error.
	dctx, dcancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer dcancel()
	_, err := b.Pop(dctx, ns+"l", 1, time.Hour)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	// The bus still works.
	require.NoError(t, b.Push(t.Context(), ns+"l", []byte("x"), time.Hour))
	require.Equal(t, []string{"x"}, pop(t, b, ns+"l", 1, 0))
}

// A Pop waiting on a list that is deleted still gets what is pushed afterwards.
func testPopAcrossDelete(t *testing.T, b bus.Bus, ns string) {
	l := ns + "l"
	require.NoError(t, b.Push(t.Context(), l, []byte("old"), time.Hour))
	require.Equal(t, []string{"old"}, pop(t, b, l, 1, 0))
	got := make(chan []string, 1)
	errc := make(chan error, 1)
	go func() {
		vals, err := b.Pop(context.Background(), l, 1, patience)
		var out []string
		for _, v := range vals {
			out = append(out, string(v))
		}
		got <- out
		errc <- err
	}()
	require.NoError(t, b.Delete(t.Context(), l))
	require.NoError(t, b.Push(t.Context(), l, []byte("new"), time.Hour))
	require.NoError(t, <-errc)
	require.Equal(t, []string{"new"}, <-got)
}

func testListTTL(t *testing.T, b bus.Bus, ns string) {
	ctx := t.Context()
	l := ns + "l"
	if c, ok := b.(Clock); ok {
		require.NoError(t, b.Push(ctx, l, []byte("a"), 10*time.Second))
		c.Advance(9 * time.Second)
		require.NoError(t, b.Push(ctx, l, []byte("b"), 10*time.Second)) // resets the TTL
		c.Advance(9 * time.Second)
		require.NoError(t, b.Push(ctx, l+"2", []byte("x"), 10*time.Second))
		require.Equal(t, []string{"a"}, pop(t, b, l, 1, 0))
		c.Advance(500 * time.Millisecond) // past the first push's TTL, within the second's
		require.Equal(t, []string{"b"}, pop(t, b, l, 1, 0), "the second push moved the expiry")
		require.NoError(t, b.Push(ctx, l, []byte("c"), 10*time.Second))
		c.Advance(10 * time.Second)
		require.Empty(t, pop(t, b, l, 5, 0), "expired at its TTL")
		require.Empty(t, pop(t, b, l+"2", 5, 0))
		return
	}
	require.NoError(t, b.Push(ctx, l, []byte("a"), 30*time.Millisecond))
	// A key set after the push with the same TTL expires no earlier than the list, so once it
	// is gone the list has expired too (looking at the list itself would pop it).
	require.NoError(t, b.Set(ctx, ns+"probe", []byte("p"), 30*time.Millisecond))
	require.NoError(t, b.Push(ctx, ns+"long", []byte("kept"), time.Hour))
	gone(t, b, ns+"probe")
	require.Empty(t, pop(t, b, l, 5, 0), "expired list")
	require.Equal(t, []string{"kept"}, pop(t, b, ns+"long", 5, 0))
}

// Many pushers, several poppers: every value is popped exactly once, each pusher's in order.
func testConcurrentPushPop(t *testing.T, b bus.Bus, ns string) {
	const pushers, each, poppers = 8, 40, 3
	l := ns + "l"
	var wg sync.WaitGroup
	perr := make(chan error, pushers)
	for p := range pushers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if err := b.Push(context.Background(), l, fmt.Appendf(nil, "%d/%d", p, i), time.Hour); err != nil {
					perr <- err
					return
				}
			}
		}()
	}
	var mu sync.Mutex
	seen := map[string]bool{}
	popped := [][]string{}
	done := make(chan struct{})
	var pwg sync.WaitGroup
	popErr := make(chan error, poppers)
	for range poppers {
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			var mine []string
			defer func() {
				mu.Lock()
				popped = append(popped, mine)
				mu.Unlock()
			}()
			for {
				select {
				case <-done:
					return
				default:
				}
				vals, err := b.Pop(context.Background(), l, 7, 20*time.Millisecond)
				if err != nil {
					popErr <- err
					return
				}
				mu.Lock()
				for _, v := range vals {
					if seen[string(v)] {
						mu.Unlock()
						popErr <- fmt.Errorf("%s popped twice", v)
						return
					}
					seen[string(v)] = true
					mine = append(mine, string(v))
				}
				all := len(seen) == pushers*each
				mu.Unlock()
				if all {
					return
				}
			}
		}()
	}
	wg.Wait()
	close(perr)
	for err := range perr {
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == pushers*each || len(popErr) > 0
	}, patience, time.Millisecond)
	close(done)
	pwg.Wait()
	close(popErr)
	for err := range popErr {
		require.NoError(t, err)
	}
	require.Len(t, seen, pushers*each)
	// Each popper's values from one pusher are in that pusher's order (a list is FIFO).
	for _, mine := range popped {
		last := map[int]int{}
		for _, v := range mine {
			var p, i int
			_, err := fmt.Sscanf(v, "%d/%d", &p, &i)
			require.NoError(t, err)
			if prev, ok := last[p]; ok {
				require.Greater(t, i, prev, "pusher %d out of order", p)
			}
			last[p] = i
		}
	}
}

func testBadArguments(t *testing.T, b bus.Bus, ns string) {
	ctx := t.Context()
	require.Error(t, b.Set(ctx, ns+"k", []byte("v"), -time.Second), "negative TTL")
	require.Error(t, b.Push(ctx, ns+"l", []byte("v"), 0), "a list needs a TTL")
	require.Error(t, b.Push(ctx, ns+"l", []byte("v"), -time.Second))
	_, err := b.Pop(ctx, ns+"l", 0, 0)
	require.Error(t, err, "limit 0")
	_, err = b.Pop(ctx, ns+"l", -1, time.Second)
	require.Error(t, err, "negative limit")
	_, err = b.Get(ctx, ns+"k")
	require.ErrorIs(t, err, bus.ErrNotFound, "a refused Set stored nothing")
	require.Empty(t, pop(t, b, ns+"l", 1, 0), "a refused Push stored nothing")
}

func testCancelledContext(t *testing.T, b bus.Bus, ns string) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := b.Publish(ctx, ns+"c", []byte("x"))
	require.ErrorIs(t, err, context.Canceled)
	_, err = b.Subscribe(ctx, ns+"c")
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, b.Set(ctx, ns+"k", []byte("v"), 0), context.Canceled)
	_, err = b.Get(ctx, ns+"k")
	require.ErrorIs(t, err, context.Canceled)
	_, err = b.Scan(ctx, ns)
	require.ErrorIs(t, err, context.Canceled)
	_, err = b.CompareAndSwap(ctx, ns+"k", nil, []byte("v"))
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, b.Delete(ctx, ns+"k"), context.Canceled)
	require.ErrorIs(t, b.Push(ctx, ns+"l", []byte("v"), time.Hour), context.Canceled)
	_, err = b.Pop(ctx, ns+"l", 1, 0)
	require.ErrorIs(t, err, context.Canceled)
	_, err = b.Pop(ctx, ns+"l", 1, time.Hour)
	require.ErrorIs(t, err, context.Canceled)
	// Nothing happened.
	_, err = b.Get(t.Context(), ns+"k")
	require.ErrorIs(t, err, bus.ErrNotFound)
}

func testClose(t *testing.T, b bus.Bus, ns string) {
	ctx := t.Context()
	s := subscribe(t, b, ns+"c")
	errc := make(chan error, 1)
	go func() {
		_, err := b.Pop(context.Background(), ns+"l", 1, time.Hour)
		errc <- err
	}()
	require.NoError(t, b.Close())
	closed(t, s)
	require.NoError(t, s.Close())
	select {
	case err := <-errc:
		// A Pop in flight either ended before Close or sees the bus closed.
		if err != nil {
			require.ErrorIs(t, err, bus.ErrClosed)
		}
	case <-time.After(patience):
		t.Fatal("a waiting Pop did not end when the bus closed")
	}
	require.NoError(t, b.Close(), "Close is idempotent")

	_, err := b.Publish(ctx, ns+"c", []byte("x"))
	require.ErrorIs(t, err, bus.ErrClosed)
	_, err = b.Subscribe(ctx, ns+"c")
	require.ErrorIs(t, err, bus.ErrClosed)
	require.ErrorIs(t, b.Set(ctx, ns+"k", []byte("v"), 0), bus.ErrClosed)
	_, err = b.Get(ctx, ns+"k")
	require.ErrorIs(t, err, bus.ErrClosed)
	_, err = b.Scan(ctx, ns)
	require.ErrorIs(t, err, bus.ErrClosed)
	_, err = b.CompareAndSwap(ctx, ns+"k", nil, []byte("v"))
	require.ErrorIs(t, err, bus.ErrClosed)
	require.ErrorIs(t, b.Delete(ctx, ns+"k"), bus.ErrClosed)
	require.ErrorIs(t, b.Push(ctx, ns+"l", []byte("v"), time.Hour), bus.ErrClosed)
	_, err = b.Pop(ctx, ns+"l", 1, 0)
	require.ErrorIs(t, err, bus.ErrClosed)
}
