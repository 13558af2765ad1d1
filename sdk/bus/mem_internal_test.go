package bus

import (
	"strconv"
	"testing"
	"time"
)

// An embedded fleet runs for days: one ack list per command and heartbeat keys that expire
// must not pile up in memory.
func TestMemDoesNotKeepDeadEntries(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	m := NewMem(MemOptions{Now: func() time.Time { return now }})
	defer m.Close()
	ctx := t.Context()
	for i := range 1000 {
		list := "ack:" + strconv.Itoa(i)
		if err := m.Push(ctx, list, []byte("a"), time.Minute); err != nil {
			t.Fatal(err)
		}
		if vals, err := m.Pop(ctx, list, 10, time.Second); err != nil || len(vals) != 1 {
			t.Fatalf("pop: %q, %v", vals, err)
		}
		if _, err := m.Pop(ctx, "never:"+strconv.Itoa(i), 1, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Pop(ctx, "waited:"+strconv.Itoa(i), 1, time.Nanosecond); err != nil {
			t.Fatal(err)
		}
	}
	m.mu.Lock()
	lists := len(m.lists)
	m.mu.Unlock()
	if lists != 0 {
		t.Fatalf("%d drained lists kept", lists)
	}

	// Expired keys and lists nobody reads again are swept by later writes.
	for i := range 500 {
		if err := m.Set(ctx, "hb:"+strconv.Itoa(i), []byte("h"), time.Second); err != nil {
			t.Fatal(err)
		}
		if err := m.Push(ctx, "unread:"+strconv.Itoa(i), []byte("a"), time.Second); err != nil {
			t.Fatal(err)
		}
	}
	now = now.Add(time.Second)
	for i := range 2000 {
		if err := m.Set(ctx, "live", []byte(strconv.Itoa(i)), 0); err != nil {
			t.Fatal(err)
		}
	}
	m.mu.Lock()
	keys, lists := len(m.keys), len(m.lists)
	m.mu.Unlock()
	if keys != 1 || lists != 0 {
		t.Fatalf("after expiry: %d keys, %d lists kept; want 1 and 0", keys, lists)
	}
}
