package cpu

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func k(i int) Key { var x Key; x[0], x[1] = byte(i), byte(i>>8); x[31] = 0xAA; return x }

func ks(ids ...int) []Key {
	out := make([]Key, len(ids))
	for i, id := range ids {
		out[i] = k(id)
	}
	return out
}

func slotIDs(s []Slot) []int {
	out := make([]int, len(s))
	for i, x := range s {
		out[i] = x.ID
	}
	return out
}

func lookups(m *Manager, ids ...int) []LookupResult {
	out := make([]LookupResult, len(ids))
	for i, id := range ids {
		out[i] = m.Lookup(k(id))
	}
	return out
}

// TestCPUManagerLRUAcceptance ports vLLM's test_cpu_manager sequence step by step.
func TestCPUManagerLRUAcceptance(t *testing.T) {
	m, err := New(4, PolicyLRU)
	require.NoError(t, err)
	check := func() { t.Helper(); require.NoError(t, m.CheckInvariants()) }

	out := m.PrepareStore(ks(1, 2))
	require.NotNil(t, out)
	assert.Equal(t, ks(1, 2), out.Keys)
	assert.Equal(t, []int{0, 1}, slotIDs(out.Slots))
	assert.Equal(t, []LookupResult{HitPending, HitPending}, lookups(m, 1, 2))
	assert.Empty(t, m.TakeEvents())
	m.CompleteStore(ks(1, 2), true)
	assert.Equal(t, []Event{{Keys: ks(1, 2)}}, m.TakeEvents())
	assert.Equal(t, []LookupResult{Hit, Hit, Miss}, lookups(m, 1, 2, 3))
	check()

	out = m.PrepareStore(ks(2, 3, 4, 5))
	require.NotNil(t, out)
	assert.Equal(t, ks(3, 4, 5), out.Keys)
	assert.Equal(t, []int{2, 3, 0}, slotIDs(out.Slots))
	assert.Equal(t, ks(1), out.Evicted)
	check()

	assert.Nil(t, m.PrepareStore(ks(1, 6)))
	m.CompleteStore(ks(3, 4, 5), true)

	slots, err := m.PrepareLoad(ks(2, 3))
	require.NoError(t, err)
	assert.Equal(t, []int{1, 2}, slotIDs(slots))
	assert.Nil(t, m.PrepareStore(ks(6, 7, 8)), "2 and 3 are pinned")
	m.CompleteLoad(ks(2, 3))
	check()

	out = m.PrepareStore(ks(6, 7, 8))
	require.NotNil(t, out)
	assert.Equal(t, []int{1, 0, 3}, slotIDs(out.Slots))
	assert.Equal(t, ks(4, 5, 2), out.Evicted)
	m.CompleteStore(ks(6, 7, 8), true)
	m.Touch(ks(3, 6, 7))

	out = m.PrepareStore(ks(9))
	require.NotNil(t, out)
	assert.Equal(t, []int{3}, slotIDs(out.Slots))
	assert.Equal(t, ks(8), out.Evicted)

	m.CompleteStore(ks(7, 9), false)
	assert.Equal(t, Hit, m.Lookup(k(7)))
	assert.Equal(t, Miss, m.Lookup(k(9)))
	check()
}

func TestAlreadyStoredKeyNotEvictedDuringPrepareStore(t *testing.T) {
	m, err := New(2, PolicyLRU)
	require.NoError(t, err)
	require.NotNil(t, m.PrepareStore(ks(1, 2)))
	m.CompleteStore(ks(1, 2), true)
	// 1 is the LRU key, but it is part of the input: only 2 may go.
	out := m.PrepareStore(ks(1, 3))
	require.NotNil(t, out)
	assert.Equal(t, ks(3), out.Keys)
	assert.Equal(t, ks(2), out.Evicted)
	assert.Equal(t, Hit, m.Lookup(k(1)))
}

func TestPrepareLoadPreservesKeyOrderAndFailsAtomically(t *testing.T) {
	m, err := New(3, PolicyLRU)
	require.NoError(t, err)
	require.NotNil(t, m.PrepareStore(ks(1, 2, 3)))
	m.CompleteStore(ks(1, 2, 3), true)
	s, err := m.PrepareLoad(ks(3, 1, 2))
	require.NoError(t, err)
	assert.Equal(t, []int{2, 0, 1}, slotIDs(s))
	m.CompleteLoad(ks(3, 1, 2))
	_, err = m.PrepareLoad(ks(1, 9))
	require.ErrorIs(t, err, ErrNotReady)
	assert.Zero(t, m.Stats().Pinned, "a failed prepare pins nothing")
}

func TestEvictionEventPrecedesStoredEvent(t *testing.T) {
	m, err := New(1, PolicyLRU)
	require.NoError(t, err)
	require.NotNil(t, m.PrepareStore(ks(1)))
	m.CompleteStore(ks(1), true)
	m.TakeEvents()
	require.NotNil(t, m.PrepareStore(ks(2)))
	m.CompleteStore(ks(2), true)
	assert.Equal(t, []Event{{Keys: ks(1), Removed: true}, {Keys: ks(2)}}, m.TakeEvents())
}

func TestDuplicateAndUnknownCompletesAreHarmlessAndCounted(t *testing.T) {
	for _, pol := range []string{PolicyLRU, PolicyARC} {
		m, err := New(2, pol)
		require.NoError(t, err)
		require.NotNil(t, m.PrepareStore(ks(1)))
		m.CompleteStore(ks(1), true)
		m.CompleteStore(ks(1), true)
		m.CompleteStore(ks(5), true)
		m.CompleteLoad(ks(1))
		m.CompleteLoad(ks(6))
		st := m.Stats()
		assert.EqualValues(t, 2, st.DuplicateComplete, pol)
		assert.EqualValues(t, 2, st.UnknownCompletes, pol)
		assert.Equal(t, Hit, m.Lookup(k(1)))
		require.NoError(t, m.CheckInvariants())
	}
}

func TestResetRestartsSlotsWithNewGenerations(t *testing.T) {
	m, err := New(2, PolicyLRU)
	require.NoError(t, err)
	a := m.PrepareStore(ks(1))
	m.Reset()
	assert.Equal(t, Miss, m.Lookup(k(1)))
	b := m.PrepareStore(ks(2))
	assert.Equal(t, 0, b.Slots[0].ID, "slot ids restart at 0")
	assert.Greater(t, b.Slots[0].Gen, a.Slots[0].Gen, "a new owner never shares a generation")
	require.NoError(t, m.CheckInvariants())
}

func TestBadConfig(t *testing.T) {
	_, err := New(0, PolicyLRU)
	require.ErrorIs(t, err, ErrInvalidConfig)
	_, err = New(4, "fifo")
	require.ErrorIs(t, err, ErrInvalidConfig)
}

func store(t *testing.T, m *Manager, ids ...int) *StoreOutput {
	t.Helper()
	out := m.PrepareStore(ks(ids...))
	require.NotNil(t, out)
	m.CompleteStore(out.Keys, true)
	return out
}

func TestARCBasicAndPromotion(t *testing.T) {
	m, err := New(4, PolicyARC)
	require.NoError(t, err)
	p := m.pol.(*arc)
	store(t, m, 1, 2)
	assert.Equal(t, 2, p.t1.len())
	m.Touch(ks(1))
	assert.Equal(t, 1, p.t1.len())
	assert.True(t, p.t2.has(k(1)), "a second access promotes T1 -> T2")
	// A pending key stays in T1.
	require.NotNil(t, m.PrepareStore(ks(3)))
	m.Touch(ks(3))
	assert.True(t, p.t1.has(k(3)))
	m.CompleteStore(ks(3), true)
	require.NoError(t, m.CheckInvariants())
}

func TestARCEvictionGhostsAndAdaptiveTarget(t *testing.T) {
	m, err := New(2, PolicyARC)
	require.NoError(t, err)
	p := m.pol.(*arc)
	store(t, m, 1, 2)
	m.Touch(ks(2)) // 2 -> T2
	out := store(t, m, 3)
	assert.Equal(t, ks(1), out.Evicted, "target 0: T1 (|T1|=1 >= 0) goes first")
	assert.True(t, p.b1.has(k(1)))
	m.Touch(ks(1)) // ghost hit in B1 grows the target
	assert.InDelta(t, 1.0, p.target, 1e-9)
	// |T1| = 1 >= int(1): evict from T1 again (3).
	out = store(t, m, 4)
	assert.Equal(t, ks(3), out.Evicted)
	// Ghost lists stay bounded by capacity.
	for i := 10; i < 20; i++ {
		store(t, m, i)
	}
	assert.LessOrEqual(t, p.b1.len(), 2)
	assert.LessOrEqual(t, p.b2.len(), 2)
	m.Touch(ks(2))
	require.NoError(t, m.CheckInvariants())
}

func TestARCBatchEvictionFailureIsAtomicAndFallsBack(t *testing.T) {
	m, err := New(3, PolicyARC)
	require.NoError(t, err)
	store(t, m, 1, 2, 3)
	m.Touch(ks(2, 3)) // T1={1}, T2={3,2}
	_, err = m.PrepareLoad(ks(2))
	require.NoError(t, err)
	// Need 3 idle keys, only 2 are idle: nothing changes.
	assert.Nil(t, m.PrepareStore(ks(7, 8, 9)))
	assert.Equal(t, []LookupResult{Hit, Hit, Hit}, lookups(m, 1, 2, 3))
	// Need 2: T1 gives 1, then falls back to T2's idle 3.
	out := store(t, m, 7, 8)
	assert.ElementsMatch(t, ks(1, 3), out.Evicted)
	assert.Equal(t, Hit, m.Lookup(k(2)), "pinned key survives")
	m.CompleteLoad(ks(2))
	require.NoError(t, m.CheckInvariants())
}

func TestARCFailedStoreRemovesKey(t *testing.T) {
	m, err := New(2, PolicyARC)
	require.NoError(t, err)
	require.NotNil(t, m.PrepareStore(ks(1)))
	m.CompleteStore(ks(1), false)
	assert.Equal(t, Miss, m.Lookup(k(1)))
	assert.Zero(t, m.Stats().Used)
	require.NoError(t, m.CheckInvariants())
}

// Remove drops readable unpinned keys only, frees their slots and reports them removed.
func TestRemove(t *testing.T) {
	for _, pol := range []string{PolicyLRU, PolicyARC} {
		m, err := New(4, pol)
		require.NoError(t, err)
		out := m.PrepareStore(ks(1, 2, 3))
		require.NotNil(t, out)
		m.CompleteStore(ks(1, 2), true) // 3 stays write-pending
		_, err = m.PrepareLoad(ks(2))
		require.NoError(t, err)
		m.TakeEvents()
		assert.Equal(t, 1, m.Remove(ks(1, 2, 3, 9)), pol)
		assert.Equal(t, Miss, m.Lookup(ks(1)[0]))
		assert.Equal(t, Hit, m.Lookup(ks(2)[0]), "pinned by a load")
		assert.Equal(t, HitPending, m.Lookup(ks(3)[0]))
		assert.Equal(t, []Event{{Keys: ks(1), Removed: true}}, m.TakeEvents())
		require.NoError(t, m.CheckInvariants())
		assert.Equal(t, 2, m.Stats().Used)
	}
}
