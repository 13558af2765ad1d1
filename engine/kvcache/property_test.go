package kvcache

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// TestPropertyPool drives the pool with random allocations (with and without prefix hits),
// caching, frees and resets, checking the invariants after every action, that an allocation
// succeeds exactly when enough blocks are free, and that a hit only ever returns blocks cached
// under the looked-up hashes.
func TestPropertyPool(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		bs := rapid.IntRange(1, 4).Draw(t, "bs")
		m, err := New(Config{NumBlocks: rapid.IntRange(2, 16).Draw(t, "numBlocks"), BlockSize: bs, PrefixCaching: true})
		if err != nil {
			t.Fatal(err)
		}
		type req struct {
			tokens []int
			hashes []BlockHash
		}
		live := map[string]*req{}
		next := 0
		// pick draws a live request deterministically (map order is random).
		pick := func(t *rapid.T) (string, bool) {
			ids := slices.Sorted(maps.Keys(live))
			if len(ids) == 0 {
				return "", false
			}
			return ids[rapid.IntRange(0, len(ids)-1).Draw(t, "which")], true
		}
		t.Repeat(map[string]func(*rapid.T){
			"alloc": func(t *rapid.T) {
				toks := rapid.SliceOfN(rapid.IntRange(0, 2), 1, 12).Draw(t, "tokens")
				ver := int64(rapid.IntRange(0, 1).Draw(t, "version"))
				hashes := ExtendHashes(nil, toks, bs, ver, "")
				hit, n := m.GetComputedBlocks(hashes, len(toks))
				for i, b := range hit {
					if h, ok := m.HashOf(b); !ok || h != hashes[i] {
						t.Fatalf("hit block %d does not carry hash %d", b, i)
					}
				}
				if n != len(hit)*bs || n >= len(toks) {
					t.Fatalf("hit %d tokens in %d blocks for %d tokens", n, len(hit), len(toks))
				}
				evictable := 0
				for _, b := range hit {
					if m.RefCount(b) == 0 {
						evictable++
					}
				}
				need := cdiv(len(toks), bs) - len(hit)
				enough := m.NumFreeBlocks()-evictable >= need
				id := fmt.Sprint(next)
				next++
				added, ok := m.AllocateSlots(id, len(toks), hit)
				if ok != enough {
					t.Fatalf("alloc ok=%v with %d free (%d evictable hits), need %d", ok, m.NumFreeBlocks(), evictable, need)
				}
				if !ok {
					return
				}
				if len(added) != cdiv(len(toks), bs) {
					t.Fatalf("added %d blocks for %d tokens", len(added), len(toks))
				}
				live[id] = &req{tokens: toks, hashes: hashes}
			},
			"cache": func(t *rapid.T) {
				if id, ok := pick(t); ok {
					r := live[id]
					m.CacheBlocks(id, r.hashes, rapid.IntRange(0, len(r.tokens)).Draw(t, "computed"))
				}
			},
			"free": func(t *rapid.T) {
				if id, ok := pick(t); ok {
					m.Free(id)
					delete(live, id)
				}
			},
			"reset": func(t *rapid.T) {
				force := rapid.Bool().Draw(t, "force")
				ok, _, reason := m.Reset(force)
				if ok != (force || len(live) == 0) {
					t.Fatalf("reset ok=%v force=%v live=%d: %s", ok, force, len(live), reason)
				}
			},
			"": func(t *rapid.T) {
				if err := m.CheckInvariants(); err != nil {
					t.Fatal(err)
				}
			},
		})
	})
}
