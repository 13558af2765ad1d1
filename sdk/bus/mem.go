package bus

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// MemOptions configure an in-process bus.
type MemOptions struct {
	// Now is the clock key TTLs are measured with (default time.Now); tests pass a fake one.
	Now func() time.Time
}

// Mem is the in-process Bus: what an embedded fleet and unit tests run on. Unlike Redis it
// never drops a message for a slow reader (each subscription queues without bound), but
// Resubscribed lets a test make subscribers resync as they would after a reconnect.
type Mem struct {
	now func() time.Time

	mu      sync.Mutex
	closed  bool
	closing chan struct{} // closed by Close, so waiting Pops end
	subs    map[string]map[*memSub]struct{}
	keys    map[string]memValue
	lists   map[string]*memList
	writes  int // since the last sweep of expired entries
}

type memValue struct {
	val     []byte
	expires time.Time // zero: never
}

type memList struct {
	items   [][]byte
	expires time.Time
	ready   chan struct{} // closed and replaced on every push
	waiters int           // Pops waiting on ready
}

// NewMem returns an empty in-process bus.
func NewMem(o MemOptions) *Mem {
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Mem{now: o.Now, closing: make(chan struct{}), subs: map[string]map[*memSub]struct{}{}, keys: map[string]memValue{}, lists: map[string]*memList{}}
}

var _ Bus = (*Mem)(nil)

func (m *Mem) lock(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	return nil
}

// Publish implements Bus.
func (m *Mem) Publish(ctx context.Context, channel string, msg []byte) (int, error) {
	if err := m.lock(ctx); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	subs := m.subs[channel]
	for s := range subs {
		s.enqueue(Event{Kind: EventMessage, Payload: bytes.Clone(msg)})
	}
	return len(subs), nil
}

// Subscribe implements Bus. The subscription is live when it returns.
func (m *Mem) Subscribe(ctx context.Context, channel string) (Subscription, error) {
	if err := m.lock(ctx); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	s := &memSub{bus: m, channel: channel, q: newEventQueue()}
	if m.subs[channel] == nil {
		m.subs[channel] = map[*memSub]struct{}{}
	}
	m.subs[channel][s] = struct{}{}
	return s, nil
}

// Resubscribed delivers EventSubscribed to every subscriber of channel, as Redis
// subscribers see after a reconnect. Tests use it to exercise resync.
func (m *Mem) Resubscribed(channel string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for s := range m.subs[channel] {
		s.enqueue(Event{Kind: EventSubscribed})
	}
}

// Set implements Bus.
func (m *Mem) Set(ctx context.Context, key string, val []byte, ttl time.Duration) error {
	if ttl < 0 {
		return fmt.Errorf("bus: negative ttl %s", ttl)
	}
	if err := m.lock(ctx); err != nil {
		return err
	}
	defer m.mu.Unlock()
	m.keys[key] = memValue{val: bytes.Clone(val), expires: m.expiry(ttl)}
	m.wrote()
	return nil
}

func (m *Mem) expiry(ttl time.Duration) time.Time {
	if ttl <= 0 {
		return time.Time{}
	}
	return m.now().Add(ttl)
}

// get returns a live key; m.mu is held.
func (m *Mem) get(key string) ([]byte, bool) {
	v, ok := m.keys[key]
	if !ok {
		return nil, false
	}
	if !v.expires.IsZero() && !m.now().Before(v.expires) {
		delete(m.keys, key)
		return nil, false
	}
	return v.val, true
}

// Get implements Bus.
func (m *Mem) Get(ctx context.Context, key string) ([]byte, error) {
	if err := m.lock(ctx); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	v, ok := m.get(key)
	if !ok {
		return nil, ErrNotFound
	}
	return bytes.Clone(v), nil
}

// Scan implements Bus.
func (m *Mem) Scan(ctx context.Context, prefix string) (map[string][]byte, error) {
	if err := m.lock(ctx); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	out := map[string][]byte{}
	for _, k := range slices.Sorted(maps.Keys(m.keys)) {
		if !strings.HasPrefix(k, prefix) {
			continue
		}
		if v, ok := m.get(k); ok {
			out[k] = bytes.Clone(v)
		}
	}
	return out, nil
}

// CompareAndSwap implements Bus.
func (m *Mem) CompareAndSwap(ctx context.Context, key string, old, val []byte) (bool, error) {
	if err := m.lock(ctx); err != nil {
		return false, err
	}
	defer m.mu.Unlock()
	cur, ok := m.get(key)
	if (old == nil) != !ok || (ok && !bytes.Equal(cur, old)) {
		return false, nil
	}
	m.keys[key] = memValue{val: bytes.Clone(val)}
	m.wrote()
	return true, nil
}

// Delete implements Bus.
func (m *Mem) Delete(ctx context.Context, keys ...string) error {
	if err := m.lock(ctx); err != nil {
		return err
	}
	defer m.mu.Unlock()
	for _, k := range keys {
		delete(m.keys, k)
		if l := m.lists[k]; l != nil {
			close(l.ready) // waiters move on to the list a later Push creates
			delete(m.lists, k)
		}
	}
	return nil
}

// list returns a live list, creating it when create is set; m.mu is held.
func (m *Mem) list(name string, create bool) *memList {
	l := m.lists[name]
	if l != nil && !l.expires.IsZero() && !m.now().Before(l.expires) {
		close(l.ready) // wake waiters of the expired list; they see the new one
		delete(m.lists, name)
		l = nil
	}
	if l == nil && create {
		l = &memList{ready: make(chan struct{})}
		m.lists[name] = l
	}
	return l
}

// Push implements Bus.
func (m *Mem) Push(ctx context.Context, list string, val []byte, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("bus: list ttl must be > 0 (got %s)", ttl)
	}
	if err := m.lock(ctx); err != nil {
		return err
	}
	defer m.mu.Unlock()
	l := m.list(list, true)
	l.items = append(l.items, bytes.Clone(val))
	l.expires = m.expiry(ttl)
	close(l.ready)
	l.ready = make(chan struct{})
	m.wrote()
	return nil
}

// Pop implements Bus.
func (m *Mem) Pop(ctx context.Context, list string, limit int, wait time.Duration) ([][]byte, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("bus: pop limit must be > 0 (got %d)", limit)
	}
	var timer <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		timer = t.C
	}
	for {
		if err := m.lock(ctx); err != nil {
			return nil, err
		}
		l := m.list(list, true)
		if n := min(limit, len(l.items)); n > 0 {
			out := slices.Clone(l.items[:n])
			l.items = slices.Delete(l.items, 0, n)
			m.tidy(list, l)
			m.mu.Unlock()
			return out, nil
		}
		if timer == nil {
			m.tidy(list, l)
			m.mu.Unlock()
			return nil, nil
		}
		l.waiters++
		ready := l.ready
		m.mu.Unlock()
		var err error
		done := true
		select {
		case <-ready:
			done = false
		case <-timer:
		case <-ctx.Done():
			err = ctx.Err()
		case <-m.closing:
			err = ErrClosed
		}
		m.mu.Lock()
		l.waiters--
		m.tidy(list, l)
		m.mu.Unlock()
		if done {
			return nil, err
		}
	}
}

// tidy drops list l (named name) once it is empty and nobody waits on it, as Redis drops an
// empty list: otherwise every command's ack list would stay in memory for good. m.mu is held.
func (m *Mem) tidy(name string, l *memList) {
	if m.lists[name] == l && len(l.items) == 0 && l.waiters == 0 {
		close(l.ready)
		delete(m.lists, name)
	}
}

// wrote counts a write and, every so many (more as the bus grows, so the cost per write stays
// constant), drops every expired key and list: Redis expires keys nobody reads again, and so
// must a long-running embedded fleet. m.mu is held.
func (m *Mem) wrote() {
	m.writes++
	if m.writes < max(256, len(m.keys)+len(m.lists)) {
		return
	}
	m.writes = 0
	now := m.now()
	for k, v := range m.keys {
		if !v.expires.IsZero() && !now.Before(v.expires) {
			delete(m.keys, k)
		}
	}
	for name, l := range m.lists {
		if !l.expires.IsZero() && !now.Before(l.expires) {
			close(l.ready) // waiters wake and see it gone
			delete(m.lists, name)
		}
	}
}

// Close implements Bus: every subscription ends.
func (m *Mem) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	close(m.closing)
	var all []*memSub
	for _, subs := range m.subs {
		for s := range subs {
			all = append(all, s)
		}
	}
	m.mu.Unlock()
	for _, s := range all {
		_ = s.Close()
	}
	return nil
}

// memSub is one subscription of a Mem bus.
type memSub struct {
	bus     *Mem
	channel string
	q       *eventQueue
	once    sync.Once
}

func (s *memSub) enqueue(ev Event) { s.q.put(ev) }

// Events implements Subscription.
func (s *memSub) Events() <-chan Event { return s.q.out }

// Close implements Subscription.
func (s *memSub) Close() error {
	s.once.Do(func() {
		s.bus.mu.Lock()
		delete(s.bus.subs[s.channel], s)
		s.bus.mu.Unlock()
		s.q.stop()
	})
	return nil
}
