package kvcache

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newTestManager(t *testing.T, numBlocks, bs int) *Manager {
	t.Helper()
	m, err := New(Config{NumBlocks: numBlocks, BlockSize: bs, PrefixCaching: true})
	require.NoError(t, err)
	return m
}

func seq(from, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = from + i
	}
	return out
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, cfg := range []Config{{NumBlocks: 1, BlockSize: 4}, {NumBlocks: 4, BlockSize: 0}} {
		_, err := New(cfg)
		assert.ErrorIs(t, err, ErrInvalidConfig)
	}
}

// vLLM test_prefix_caching.py::test_prefill — allocation from the queue front, the null block
// never handed out, a second request with the same prefix hits the first one's full blocks.
func TestPrefill(t *testing.T) {
	m := newTestManager(t, 11, 4)
	tokens := seq(100, 10) // 2 full blocks + 2 tokens
	hashes := ExtendHashes(nil, tokens, 4, 1, "")
	require.Len(t, hashes, 2)

	hit, n := m.GetComputedBlocks(hashes, len(tokens))
	assert.Empty(t, hit)
	assert.Zero(t, n)
	added, ok := m.AllocateSlots("a", len(tokens), hit)
	require.True(t, ok)
	assert.Equal(t, []int{1, 2, 3}, added)
	m.CacheBlocks("a", hashes, len(tokens))
	require.NoError(t, m.CheckInvariants())

	// Same 8-token prefix, different tail.
	tokens2 := append(append([]int(nil), tokens[:8]...), 7, 8, 9)
	hashes2 := ExtendHashes(nil, tokens2, 4, 1, "")
	hit, n = m.GetComputedBlocks(hashes2, len(tokens2))
	assert.Equal(t, []int{1, 2}, hit)
	assert.Equal(t, 8, n)
	added, ok = m.AllocateSlots("b", len(tokens2), hit)
	require.True(t, ok)
	assert.Equal(t, []int{1, 2, 4}, added)
	assert.Equal(t, 2, m.RefCount(1))
	assert.Equal(t, 2, m.RefCount(2))
	require.NoError(t, m.CheckInvariants())

	st := m.Stats()
	assert.Equal(t, int64(21), st.PrefixQueries)
	assert.Equal(t, int64(8), st.PrefixHits)
}

// The hit never covers the last token: a fully cached prompt still recomputes one token.
func TestHitLeavesLastToken(t *testing.T) {
	m := newTestManager(t, 5, 4)
	tokens := seq(1, 8)
	hashes := ExtendHashes(nil, tokens, 4, 0, "")
	_, ok := m.AllocateSlots("a", 8, nil)
	require.True(t, ok)
	m.CacheBlocks("a", hashes, 8)
	hit, n := m.GetComputedBlocks(hashes, 8)
	assert.Len(t, hit, 1)
	assert.Equal(t, 4, n)
}

// vLLM test_prefix_caching.py::test_evict — freed blocks go to the tail in reverse order, so a
// request's tail blocks are evicted first; uncached blocks are reused first; a prefix hit
// revives a cached free block.
func TestFreeQueueEvictionOrder(t *testing.T) {
	m := newTestManager(t, 8, 2)
	tokens := seq(10, 7) // blocks: 3 full + 1 partial
	hashes := ExtendHashes(nil, tokens, 2, 0, "")
	added, ok := m.AllocateSlots("a", 7, nil)
	require.True(t, ok)
	require.Equal(t, []int{1, 2, 3, 4}, added)
	m.CacheBlocks("a", hashes, 7)
	m.Free("a")
	// Partial block 4 (uncached) at the front; cached 3,2,1 appended behind the untouched 5,6,7.
	assert.Equal(t, []int{4, 5, 6, 7, 3, 2, 1}, m.FreeQueue())
	require.NoError(t, m.CheckInvariants())

	// A hit on the first block revives it from the middle of the queue.
	hit, n := m.GetComputedBlocks(hashes[:1], 3)
	require.Equal(t, []int{1}, hit)
	require.Equal(t, 2, n)
	added, ok = m.AllocateSlots("b", 3, hit)
	require.True(t, ok)
	assert.Equal(t, []int{1, 4}, added)
	assert.Equal(t, []int{5, 6, 7, 3, 2}, m.FreeQueue())

	// Allocating four more evicts 5,6,7 then 3 (the tail block of "a"), dropping its hash.
	added, ok = m.AllocateSlots("c", 8, nil)
	require.True(t, ok)
	assert.Equal(t, []int{5, 6, 7, 3}, added)
	_, cached := m.HashOf(3)
	assert.False(t, cached)
	_, cached = m.HashOf(2)
	assert.True(t, cached)
	require.NoError(t, m.CheckInvariants())
}

func TestAllocateFailsWithoutChange(t *testing.T) {
	m := newTestManager(t, 4, 4)
	_, ok := m.AllocateSlots("a", 8, nil)
	require.True(t, ok)
	before := m.FreeQueue()
	_, ok = m.AllocateSlots("b", 8, nil)
	assert.False(t, ok)
	assert.Equal(t, before, m.FreeQueue())
	assert.Nil(t, m.Blocks("b"))
	require.NoError(t, m.CheckInvariants())

	// Evictable hit blocks do not count as free for the same allocation.
	tokens := seq(1, 8)
	hashes := ExtendHashes(nil, tokens, 4, 0, "")
	m.CacheBlocks("a", hashes, 8)
	m.Free("a")
	hit, _ := m.GetComputedBlocks(hashes, 9)
	require.Len(t, hit, 2)
	_, ok = m.AllocateSlots("c", 13, hit) // needs 2 fresh blocks, only 1 left besides the hits
	assert.False(t, ok)
	_, ok = m.AllocateSlots("c", 12, hit)
	assert.True(t, ok)
	require.NoError(t, m.CheckInvariants())
}

func TestHashCoversVersionAndSalt(t *testing.T) {
	tokens := seq(5, 8)
	base := ExtendHashes(nil, tokens, 4, 1, "")
	assert.Equal(t, base, ExtendHashes(nil, tokens, 4, 1, ""), "deterministic")
	for name, h := range map[string][]BlockHash{
		"version": ExtendHashes(nil, tokens, 4, 2, ""),
		"salt":    ExtendHashes(nil, tokens, 4, 1, "s"),
	} {
		assert.NotEqual(t, base[0], h[0], name)
		assert.NotEqual(t, base[1], h[1], name+" (chained)")
	}
	other := append([]int{6}, tokens[1:]...)
	assert.NotEqual(t, base[1], ExtendHashes(nil, other, 4, 1, "")[1], "parent chained into child")
	assert.Len(t, ExtendHashes(nil, tokens[:7], 4, 1, ""), 1, "only full blocks")
}

func TestResetRefusedWhileInUseAndForced(t *testing.T) {
	m := newTestManager(t, 6, 2)
	tokens := seq(1, 4)
	hashes := ExtendHashes(nil, tokens, 2, 0, "")
	_, ok := m.AllocateSlots("a", 4, nil)
	require.True(t, ok)
	m.CacheBlocks("a", hashes, 4)

	ok, cleared, reason := m.Reset(false)
	assert.False(t, ok)
	assert.Zero(t, cleared)
	assert.Contains(t, reason, "2 blocks in use")
	_, cached := m.HashOf(1)
	assert.True(t, cached, "refused reset changes nothing")

	g := m.Generation(1)
	ok, cleared, reason = m.Reset(true)
	assert.True(t, ok)
	assert.Equal(t, 2, cleared)
	assert.Contains(t, reason, "forced")
	assert.Equal(t, g, m.Generation(1), "in-use block keeps its generation")
	hit, _ := m.GetComputedBlocks(hashes, 5)
	assert.Empty(t, hit)
	m.CacheBlocks("a", hashes, 4) // already considered: not re-cached
	_, cached = m.HashOf(1)
	assert.False(t, cached)
	require.NoError(t, m.CheckInvariants())

	m.Free("a")
	ok, cleared, reason = m.Reset(false)
	assert.True(t, ok)
	assert.Zero(t, cleared)
	assert.Empty(t, reason)
}

func TestGenerationChanges(t *testing.T) {
	m := newTestManager(t, 3, 2)
	tokens := seq(1, 2)
	hashes := ExtendHashes(nil, tokens, 2, 0, "")
	g0 := m.Generation(1)
	_, ok := m.AllocateSlots("a", 2, nil)
	require.True(t, ok)
	g1 := m.Generation(1)
	assert.NotEqual(t, g0, g1, "allocation")
	m.CacheBlocks("a", hashes, 2)
	m.Free("a")
	g2 := m.Generation(1)
	assert.NotEqual(t, g1, g2, "free")
	// Revival by a prefix hit keeps the content and the generation.
	hit, _ := m.GetComputedBlocks(hashes, 3)
	_, ok = m.AllocateSlots("b", 3, hit)
	require.True(t, ok)
	assert.Equal(t, g2, m.Generation(1))
	m.Free("b")
	g3 := m.Generation(1)
	ok, cleared, _ := m.Reset(false)
	require.True(t, ok)
	require.Equal(t, 1, cleared)
	assert.NotEqual(t, g3, m.Generation(1), "reset of a cached free block")
	assert.Zero(t, m.Generation(-1))
	assert.Zero(t, m.Generation(99))
}

func TestNoPrefixCaching(t *testing.T) {
	m, err := New(Config{NumBlocks: 4, BlockSize: 2})
	require.NoError(t, err)
	hashes := ExtendHashes(nil, seq(1, 4), 2, 0, "")
	_, ok := m.AllocateSlots("a", 4, nil)
	require.True(t, ok)
	m.CacheBlocks("a", hashes, 4)
	hit, _ := m.GetComputedBlocks(hashes, 5)
	assert.Empty(t, hit)
	assert.InDelta(t, 2.0/3.0, m.Usage(), 1e-9)
	m.Free("a")
	assert.Zero(t, m.Usage())
	require.NoError(t, m.CheckInvariants())
}
