package cpu

import (
	"errors"
	"fmt"
)

// Sentinel errors callers branch on.
var (
	ErrInvalidConfig = errors.New("cpu: invalid config")
	ErrNotReady      = errors.New("cpu: key not stored or not ready")
)

// Policies accepted by New.
const (
	PolicyLRU = "lru"
	PolicyARC = "arc"
)

// LookupResult is the state of a key (vLLM LookupResult without RETRY: this tier is synchronous).
type LookupResult int

// Lookup results.
const (
	Miss       LookupResult = iota // absent
	Hit                            // stored and readable
	HitPending                     // present, store not complete
)

func (r LookupResult) String() string {
	return [...]string{"miss", "hit", "hit_pending"}[r]
}

// Slot is a CPU slot with the generation of the allocation that owns it.
type Slot struct {
	ID  int
	Gen uint64
}

// StoreOutput is PrepareStore's plan: the keys that need writing (already stored ones are
// filtered out), their slots in the same order, and the keys evicted to make room.
type StoreOutput struct {
	Keys    []Key
	Slots   []Slot
	Evicted []Key
}

// Event reports keys stored (readable) or removed.
type Event struct {
	Keys    []Key
	Removed bool
}

// Stats are the manager's counters and gauges.
type Stats struct {
	Slots             int   // capacity
	Used              int   // slots holding a key (pending writes included)
	PendingWrites     int   // keys whose store is not complete
	Pinned            int   // keys with loads in flight
	Evictions         int64 // keys evicted
	AllocFailures     int64 // PrepareStore calls that returned nil
	UnknownCompletes  int64 // complete calls for keys the manager does not hold
	DuplicateComplete int64 // complete calls for keys in the wrong state (already stored, not pinned)
	Resets            int64
}

// Manager maps chunk keys to CPU slots. Not safe for concurrent use: the connector's scheduler
// side drives it from the engine goroutine.
type Manager struct {
	numSlots  int
	allocated int   // fresh slots handed out so far
	free      []int // freed slots, reused LIFO
	gen       uint64
	pol       policy
	pending   int
	pinned    int
	events    []Event
	stats     Stats
}

// New builds a manager over numSlots slots with policy "lru" (default when empty) or "arc".
func New(numSlots int, policyName string) (*Manager, error) {
	if numSlots <= 0 {
		return nil, fmt.Errorf("%w: %d slots", ErrInvalidConfig, numSlots)
	}
	m := &Manager{numSlots: numSlots}
	switch policyName {
	case "", PolicyLRU:
		m.pol = newLRU()
	case PolicyARC:
		m.pol = newARC(numSlots)
	default:
		return nil, fmt.Errorf("%w: eviction policy %q: want %s or %s", ErrInvalidConfig, policyName, PolicyLRU, PolicyARC)
	}
	return m, nil
}

// NumSlots is the capacity.
func (m *Manager) NumSlots() int { return m.numSlots }

// Lookup returns the key's state.
func (m *Manager) Lookup(k Key) LookupResult {
	e := m.pol.get(k)
	switch {
	case e == nil:
		return Miss
	case e.ref < 0:
		return HitPending
	}
	return Hit
}

// PrepareLoad pins ready keys against eviction until CompleteLoad and returns their slots in key
// order. It fails, changing nothing, if any key is not readable.
func (m *Manager) PrepareLoad(keys []Key) ([]Slot, error) {
	for _, k := range keys {
		if e := m.pol.get(k); e == nil || e.ref < 0 {
			return nil, fmt.Errorf("%w: %s", ErrNotReady, k)
		}
	}
	out := make([]Slot, len(keys))
	for i, k := range keys {
		e := m.pol.get(k)
		if e.ref == 0 {
			m.pinned++
		}
		e.ref++
		out[i] = Slot{ID: e.slot, Gen: e.gen}
	}
	return out, nil
}

// Touch records recency for keys (also for prefixes that hit only in the engine's own cache).
func (m *Manager) Touch(keys []Key) { m.pol.touch(keys) }

// CompleteLoad unpins keys. Keys not pinned are counted and ignored.
func (m *Manager) CompleteLoad(keys []Key) {
	for _, k := range keys {
		e := m.pol.get(k)
		switch {
		case e == nil:
			m.stats.UnknownCompletes++
		case e.ref <= 0:
			m.stats.DuplicateComplete++
		default:
			e.ref--
			if e.ref == 0 {
				m.pinned--
				m.pol.loaded(k)
			}
		}
	}
}

// Remove drops readable, unpinned keys (content found bad, e.g. by a load's checksum) and
// frees their slots, emitting a removal event; other keys are left alone. It returns how many
// it removed.
func (m *Manager) Remove(keys []Key) int {
	var removed []Key
	for _, k := range keys {
		e := m.pol.get(k)
		if e == nil || e.ref != 0 {
			continue
		}
		m.pol.remove(k)
		m.free = append(m.free, e.slot)
		removed = append(removed, k)
	}
	if len(removed) > 0 {
		m.events = append(m.events, Event{Keys: removed, Removed: true})
	}
	return len(removed)
}

// PrepareStore allocates slots for the keys not yet present, evicting idle keys outside keys if
// needed, and marks them write-pending. It returns nil (changing nothing) when they cannot fit;
// an empty output when every key is present already.
func (m *Manager) PrepareStore(keys []Key) *StoreOutput {
	var fresh []Key
	seen := map[Key]bool{}
	for _, k := range keys {
		if m.pol.get(k) == nil && !seen[k] {
			fresh = append(fresh, k)
			seen[k] = true
		}
	}
	out := &StoreOutput{}
	if len(fresh) == 0 {
		return out
	}
	if need := len(fresh) - m.numFree(); need > 0 {
		if need > m.evictable() {
			m.stats.AllocFailures++
			return nil
		}
		protected := map[Key]bool{}
		for _, k := range keys {
			protected[k] = true
		}
		evicted := m.pol.evict(need, protected, func(e *entry) { m.free = append(m.free, e.slot) })
		if evicted == nil {
			m.stats.AllocFailures++
			return nil
		}
		out.Evicted = evicted
		m.stats.Evictions += int64(len(evicted))
		m.events = append(m.events, Event{Keys: out.Evicted, Removed: true})
	}
	for _, k := range fresh {
		s := m.alloc()
		m.pol.insert(k, &entry{slot: s.ID, gen: s.Gen, ref: -1})
		m.pending++
		out.Keys = append(out.Keys, k)
		out.Slots = append(out.Slots, s)
	}
	return out
}

// CompleteStore makes write-pending keys readable, or with success=false removes them and frees
// their slots. Keys already readable are left alone (counted as duplicates when success).
func (m *Manager) CompleteStore(keys []Key, success bool) {
	var stored []Key
	for _, k := range keys {
		e := m.pol.get(k)
		switch {
		case e == nil:
			m.stats.UnknownCompletes++
		case e.ref >= 0:
			if success {
				m.stats.DuplicateComplete++
			}
		case success:
			e.ref = 0
			m.pending--
			stored = append(stored, k)
		default:
			m.pending--
			m.pol.remove(k)
			m.free = append(m.free, e.slot)
		}
	}
	if len(stored) > 0 {
		m.events = append(m.events, Event{Keys: stored})
	}
}

// Reset drops every key; slot ids restart at 0. Generations keep increasing, so a slot's new
// owner never shares a generation with an old one. No events are emitted (vLLM).
func (m *Manager) Reset() {
	m.pol.clear()
	m.allocated, m.free, m.pending, m.pinned = 0, m.free[:0], 0, 0
	m.stats.Resets++
}

// TakeEvents returns the events since the previous call.
func (m *Manager) TakeEvents() []Event {
	ev := m.events
	m.events = nil
	return ev
}

// HasPendingWork is false: this tier has no asynchronous work of its own.
func (m *Manager) HasPendingWork() bool { return false }

// Stats returns the counters.
func (m *Manager) Stats() Stats {
	s := m.stats
	s.Slots, s.Used, s.PendingWrites, s.Pinned = m.numSlots, m.pol.len(), m.pending, m.pinned
	return s
}

func (m *Manager) numFree() int { return len(m.free) + m.numSlots - m.allocated }

func (m *Manager) evictable() int {
	return m.pol.len() - m.pending - m.pinned
}

func (m *Manager) alloc() Slot {
	m.gen++
	if m.allocated < m.numSlots {
		m.allocated++
		return Slot{ID: m.allocated - 1, Gen: m.gen}
	}
	s := m.free[len(m.free)-1]
	m.free = m.free[:len(m.free)-1]
	return Slot{ID: s, Gen: m.gen}
}

// CheckInvariants verifies that no slot is leaked or owned twice; for tests.
func (m *Manager) CheckInvariants() error {
	owner := map[int]bool{}
	pending, pinned := 0, 0
	var err error
	visit := func(k Key, e *entry) {
		if err != nil {
			return
		}
		if e.slot < 0 || e.slot >= m.allocated {
			err = fmt.Errorf("key %s holds slot %d outside the %d allocated", k, e.slot, m.allocated)
			return
		}
		if owner[e.slot] {
			err = fmt.Errorf("slot %d owned twice", e.slot)
			return
		}
		owner[e.slot] = true
		if e.ref < 0 {
			pending++
		} else if e.ref > 0 {
			pinned++
		}
	}
	m.eachEntry(visit)
	if err != nil {
		return err
	}
	for _, s := range m.free {
		if owner[s] {
			return fmt.Errorf("slot %d both free and owned", s)
		}
		owner[s] = true
	}
	if len(owner) != m.allocated {
		return fmt.Errorf("%d slots accounted for, %d allocated: a slot leaked", len(owner), m.allocated)
	}
	if pending != m.pending || pinned != m.pinned {
		return fmt.Errorf("pending %d/%d pinned %d/%d", pending, m.pending, pinned, m.pinned)
	}
	return nil
}

func (m *Manager) eachEntry(fn func(Key, *entry)) {
	switch p := m.pol.(type) {
	case *lru:
		for k, e := range p.blocks {
			fn(k, e)
		}
	case *arc:
		for k, e := range p.blocks {
			fn(k, e)
		}
	}
}
