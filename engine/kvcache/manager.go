package kvcache

import (
	"errors"
	"fmt"
	"sync/atomic"
)

// NullBlock is the id of the placeholder block: never allocated, never freed, never cached.
const NullBlock = 0

// ErrInvalidConfig is returned by New for a pool that cannot work.
var ErrInvalidConfig = errors.New("kvcache: invalid config")

// Config sizes the block pool.
type Config struct {
	NumBlocks     int  // blocks in the pool, the null block (id 0) included; at least 2
	BlockSize     int  // tokens per block
	PrefixCaching bool // enable prefix caching (lookups, caching of full blocks)
}

// Stats are cumulative counters of the manager.
type Stats struct {
	PrefixQueries  int64 // tokens looked up in the prefix cache
	PrefixHits     int64 // of those, tokens found cached
	PrefixRequests int64 // lookups performed
	Resets         int64 // successful (or forced) prefix-cache resets
	BlocksCleared  int64 // cached blocks dropped by resets
}

type block struct {
	ref        int
	hash       BlockHash
	hashed     bool
	inFree     bool
	prev, next int // free-queue links; -1 for none
}

type reqBlocks struct {
	blocks    []int
	numCached int // leading blocks already considered for caching
}

// Manager is the KV block pool with ref counts, an LRU free queue and the prefix cache, plus the
// per-request block tables (vLLM's BlockPool and KVCacheManager in one). It is not safe for
// concurrent use, except Generation, which may be read from any goroutine.
type Manager struct {
	cfg     Config
	blocks  []block
	gen     []atomic.Uint64
	head    int // front of the free queue (evicted first); -1 when empty
	tail    int
	numFree int
	cached  map[BlockHash]int
	reqs    map[string]*reqBlocks
	stats   Stats
}

// Validate reports the first field New would refuse, as "kvcache: invalid config: Field:
// reason" (errors.Is ErrInvalidConfig).
func (cfg Config) Validate() error {
	switch {
	case cfg.NumBlocks < 2:
		return fmt.Errorf("%w: NumBlocks: %d, need >= 2 (the null block and one more)", ErrInvalidConfig, cfg.NumBlocks)
	case cfg.BlockSize <= 0:
		return fmt.Errorf("%w: BlockSize: %d, need > 0", ErrInvalidConfig, cfg.BlockSize)
	}
	return nil
}

// New builds a pool with every block but the null block free.
func New(cfg Config) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &Manager{
		cfg:    cfg,
		blocks: make([]block, cfg.NumBlocks),
		gen:    make([]atomic.Uint64, cfg.NumBlocks),
		head:   -1,
		tail:   -1,
		cached: map[BlockHash]int{},
		reqs:   map[string]*reqBlocks{},
	}
	for i := range m.blocks {
		m.blocks[i].prev, m.blocks[i].next = -1, -1
	}
	for b := 1; b < cfg.NumBlocks; b++ {
		m.pushBack(b)
	}
	return m, nil
}

// BlockSize is the number of tokens per block.
func (m *Manager) BlockSize() int { return m.cfg.BlockSize }

// NumBlocks is the pool size, the null block included.
func (m *Manager) NumBlocks() int { return m.cfg.NumBlocks }

// NumFreeBlocks counts blocks with ref count 0 (cached or not): what an allocation can take.
func (m *Manager) NumFreeBlocks() int { return m.numFree }

// PrefixCaching reports whether prefix caching is on.
func (m *Manager) PrefixCaching() bool { return m.cfg.PrefixCaching }

// Usage is the fraction of allocatable blocks in use (ref count > 0).
func (m *Manager) Usage() float64 {
	n := m.cfg.NumBlocks - 1
	return float64(n-m.numFree) / float64(n)
}

// Stats returns the cumulative counters.
func (m *Manager) Stats() Stats { return m.stats }

// Generation returns the block's generation number. It changes whenever the block is freed (ref
// count reaches 0), reallocated to a new owner, or its cached content is dropped by a reset, so a
// transfer that recorded it can detect that the block it reads or writes is no longer the one it
// started with. Safe for concurrent use; 0 for an out-of-range id.
func (m *Manager) Generation(block int) uint64 {
	if block < 0 || block >= len(m.gen) {
		return 0
	}
	return m.gen[block].Load()
}

// RefCount returns the block's ref count (0 for an out-of-range id).
func (m *Manager) RefCount(block int) int {
	if block < 0 || block >= len(m.blocks) {
		return 0
	}
	return m.blocks[block].ref
}

// HashOf returns the hash a block is cached under, if any.
func (m *Manager) HashOf(block int) (BlockHash, bool) {
	if block <= 0 || block >= len(m.blocks) || !m.blocks[block].hashed {
		return BlockHash{}, false
	}
	return m.blocks[block].hash, true
}

// Blocks returns a copy of the request's block table (nil if it holds none).
func (m *Manager) Blocks(reqID string) []int {
	rs := m.reqs[reqID]
	if rs == nil {
		return nil
	}
	return append([]int(nil), rs.blocks...)
}

// NumBlocksOf returns how many blocks the request holds.
func (m *Manager) NumBlocksOf(reqID string) int {
	if rs := m.reqs[reqID]; rs != nil {
		return len(rs.blocks)
	}
	return 0
}

// GetComputedBlocks looks up the longest cached prefix of a request with the given block hashes and
// numTokens tokens in total, and returns those blocks and the number of tokens they cover. The hit
// never covers the last token (it must be recomputed to produce logits), so at most
// (numTokens-1)/BlockSize blocks match. It does not take references: pass the blocks to
// AllocateSlots, in the same step, to claim them.
func (m *Manager) GetComputedBlocks(hashes []BlockHash, numTokens int) (blocks []int, numCachedTokens int) {
	if !m.cfg.PrefixCaching || numTokens <= 0 {
		return nil, 0
	}
	maxBlocks := min((numTokens-1)/m.cfg.BlockSize, len(hashes))
	for i := 0; i < maxBlocks; i++ {
		b, ok := m.cached[hashes[i]]
		if !ok {
			break
		}
		blocks = append(blocks, b)
	}
	n := len(blocks) * m.cfg.BlockSize
	m.stats.PrefixRequests++
	m.stats.PrefixQueries += int64(numTokens)
	m.stats.PrefixHits += int64(n)
	return blocks, n
}

// AllocateSlots makes the request's block table cover numTokens tokens: it first appends the
// prefix-hit blocks newComputed (from GetComputedBlocks, taking a reference on each and reviving
// cached free blocks), then fresh blocks from the front of the free queue (evicting their cached
// content). It returns every block added to the table (newComputed first), or ok=false with no
// state changed when not enough blocks are free.
func (m *Manager) AllocateSlots(reqID string, numTokens int, newComputed []int) (added []int, ok bool) {
	rs := m.reqs[reqID]
	held := 0
	if rs != nil {
		held = len(rs.blocks)
	}
	need := max(cdiv(numTokens, m.cfg.BlockSize)-held-len(newComputed), 0)
	evictable := 0
	for _, b := range newComputed {
		if b <= NullBlock || b >= len(m.blocks) {
			return nil, false
		}
		if m.blocks[b].ref == 0 {
			evictable++
		}
	}
	if m.numFree-evictable < need {
		return nil, false
	}
	if rs == nil {
		rs = &reqBlocks{}
		m.reqs[reqID] = rs
	}
	for _, b := range newComputed {
		if m.blocks[b].ref == 0 {
			m.remove(b)
		}
		m.blocks[b].ref++
	}
	if rs.numCached == len(rs.blocks) {
		rs.numCached += len(newComputed)
	}
	rs.blocks = append(rs.blocks, newComputed...)
	added = append(added, newComputed...)
	for range need {
		b := m.popFront()
		blk := &m.blocks[b]
		if blk.hashed {
			if m.cached[blk.hash] == b {
				delete(m.cached, blk.hash)
			}
			blk.hashed = false
		}
		blk.ref = 1
		m.gen[b].Add(1)
		rs.blocks = append(rs.blocks, b)
		added = append(added, b)
	}
	return added, true
}

// CacheBlocks registers in the prefix cache the request's full blocks among its first
// numComputedTokens tokens, under hashes[i] for block i. Call it only for tokens whose KV has
// actually been written. A block whose hash is already cached in another block stays uncached.
func (m *Manager) CacheBlocks(reqID string, hashes []BlockHash, numComputedTokens int) {
	rs := m.reqs[reqID]
	if !m.cfg.PrefixCaching || rs == nil {
		return
	}
	full := min(numComputedTokens/m.cfg.BlockSize, len(hashes), len(rs.blocks))
	for i := rs.numCached; i < full; i++ {
		b := rs.blocks[i]
		blk := &m.blocks[b]
		if blk.hashed {
			continue
		}
		if _, dup := m.cached[hashes[i]]; dup {
			continue
		}
		blk.hash, blk.hashed = hashes[i], true
		m.cached[hashes[i]] = b
	}
	rs.numCached = max(rs.numCached, full)
}

// Free drops the request's references in reverse block order. A block reaching ref count 0 goes to
// the free queue: cached blocks at the tail (LRU: the request's tail blocks are evicted first),
// uncached blocks at the front (reused first). Unknown ids are a no-op.
func (m *Manager) Free(reqID string) {
	rs := m.reqs[reqID]
	if rs == nil {
		return
	}
	for i := len(rs.blocks) - 1; i >= 0; i-- {
		b := rs.blocks[i]
		blk := &m.blocks[b]
		blk.ref--
		if blk.ref > 0 {
			continue
		}
		m.gen[b].Add(1)
		if blk.hashed {
			m.pushBack(b)
		} else {
			m.pushFront(b)
		}
	}
	delete(m.reqs, reqID)
}

// Reset drops every cached block hash. It refuses (ok=false, with the reason) while any block is in
// use, because a running request would otherwise keep reading and extending KV that a reset is
// meant to retire; force clears anyway (the caller has preempted everything it can, and what still
// holds blocks, such as a delayed free, keeps its content but is no longer reachable by a lookup).
// cleared is the number of cached blocks dropped.
func (m *Manager) Reset(force bool) (ok bool, cleared int, reason string) {
	inUse := m.cfg.NumBlocks - 1 - m.numFree
	if inUse > 0 && !force {
		return false, 0, fmt.Sprintf("%d blocks in use by %d requests", inUse, len(m.reqs))
	}
	for b := 1; b < len(m.blocks); b++ {
		blk := &m.blocks[b]
		if !blk.hashed {
			continue
		}
		blk.hashed = false
		blk.hash = BlockHash{}
		cleared++
		if blk.ref == 0 {
			m.gen[b].Add(1)
		}
	}
	clear(m.cached)
	m.stats.Resets++
	m.stats.BlocksCleared += int64(cleared)
	if inUse > 0 {
		reason = fmt.Sprintf("forced with %d blocks still in use", inUse)
	}
	return true, cleared, reason
}

// CheckInvariants verifies the pool's internal consistency; property tests call it after every step.
func (m *Manager) CheckInvariants() error {
	nb := len(m.blocks)
	null := m.blocks[NullBlock]
	if null.ref != 0 || null.inFree || null.hashed {
		return fmt.Errorf("null block touched: ref %d free %v hashed %v", null.ref, null.inFree, null.hashed)
	}
	owners := make([]int, nb)
	for id, rs := range m.reqs {
		seen := map[int]bool{}
		for _, b := range rs.blocks {
			if b <= NullBlock || b >= nb {
				return fmt.Errorf("request %q holds invalid block %d", id, b)
			}
			if seen[b] {
				return fmt.Errorf("request %q holds block %d twice", id, b)
			}
			seen[b] = true
			owners[b]++
		}
		if rs.numCached > len(rs.blocks) {
			return fmt.Errorf("request %q: numCached %d > %d blocks", id, rs.numCached, len(rs.blocks))
		}
	}
	for b := 1; b < nb; b++ {
		blk := m.blocks[b]
		if blk.ref != owners[b] {
			return fmt.Errorf("block %d: ref %d but %d owners", b, blk.ref, owners[b])
		}
		if (blk.ref == 0) != blk.inFree {
			return fmt.Errorf("block %d: ref %d but inFree=%v", b, blk.ref, blk.inFree)
		}
		if blk.hashed {
			if got, ok := m.cached[blk.hash]; !ok || got != b {
				return fmt.Errorf("block %d hashed %s but map has %d (present %v)", b, blk.hash, got, ok)
			}
		}
	}
	for h, b := range m.cached {
		if b <= NullBlock || b >= nb || !m.blocks[b].hashed || m.blocks[b].hash != h {
			return fmt.Errorf("hash %s maps to block %d which does not carry it", h, b)
		}
	}
	visited := make([]bool, nb)
	count, prev := 0, -1
	for b := m.head; b != -1; b = m.blocks[b].next {
		if b <= NullBlock || b >= nb {
			return fmt.Errorf("free queue holds invalid block %d", b)
		}
		if visited[b] {
			return fmt.Errorf("free queue holds block %d twice", b)
		}
		visited[b] = true
		if m.blocks[b].prev != prev {
			return fmt.Errorf("free queue: block %d prev %d, want %d", b, m.blocks[b].prev, prev)
		}
		if !m.blocks[b].inFree {
			return fmt.Errorf("free queue holds block %d not marked free", b)
		}
		prev = b
		count++
	}
	if prev != m.tail {
		return fmt.Errorf("free queue tail %d, last element %d", m.tail, prev)
	}
	if count != m.numFree {
		return fmt.Errorf("free queue length %d, numFree %d", count, m.numFree)
	}
	return nil
}

// FreeQueue returns the free queue from front (next evicted) to back; for tests and debugging.
func (m *Manager) FreeQueue() []int {
	out := make([]int, 0, m.numFree)
	for b := m.head; b != -1; b = m.blocks[b].next {
		out = append(out, b)
	}
	return out
}

func (m *Manager) pushBack(b int) {
	blk := &m.blocks[b]
	blk.prev, blk.next, blk.inFree = m.tail, -1, true
	if m.tail == -1 {
		m.head = b
	} else {
		m.blocks[m.tail].next = b
	}
	m.tail = b
	m.numFree++
}

func (m *Manager) pushFront(b int) {
	blk := &m.blocks[b]
	blk.prev, blk.next, blk.inFree = -1, m.head, true
	if m.head == -1 {
		m.tail = b
	} else {
		m.blocks[m.head].prev = b
	}
	m.head = b
	m.numFree++
}

func (m *Manager) remove(b int) {
	blk := &m.blocks[b]
	if blk.prev == -1 {
		m.head = blk.next
	} else {
		m.blocks[blk.prev].next = blk.next
	}
	if blk.next == -1 {
		m.tail = blk.prev
	} else {
		m.blocks[blk.next].prev = blk.prev
	}
	blk.prev, blk.next, blk.inFree = -1, -1, false
	m.numFree--
}

func (m *Manager) popFront() int {
	b := m.head
	m.remove(b)
	return b
}

func cdiv(a, b int) int { return (a + b - 1) / b }

// NumRequestsWithBlocks counts requests with a block table in the pool.
func (m *Manager) NumRequestsWithBlocks() int { return len(m.reqs) }
