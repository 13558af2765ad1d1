package kvcache

import (
	"fmt"
	"os"
	"sync"

	"github.com/rolloutkit/rollout/engine/hugepage"
)

// Layout describes the shape of the KV storage.
type Layout struct {
	NumLayers int // decoder layers
	NumBlocks int // blocks in the pool, the null block (id 0) included
	BlockSize int // tokens per block
	KVDim     int // floats per token per layer for K (and again for V): kv_heads*head_dim
}

// BlockFloats is the number of float32 values one block holds across all layers.
func (l Layout) BlockFloats() int { return l.NumLayers * 2 * l.BlockSize * l.KVDim }

// BlockBytes is the size of one block in bytes.
func (l Layout) BlockBytes() int { return l.BlockFloats() * 4 }

// Storage is the "device" KV pool: one contiguous region per block holding, for every layer,
// the block's K rows then its V rows ([block][layer][k|v][slot][kvdim]). Keeping a block
// contiguous across layers lets an offload transfer move a block with a single copy.
type Storage struct {
	Layout
	data []float32
}

// NewStorage allocates the pool.
func NewStorage(l Layout) (*Storage, error) {
	if l.NumLayers <= 0 || l.NumBlocks <= 1 || l.BlockSize <= 0 || l.KVDim <= 0 {
		return nil, fmt.Errorf("kvcache: invalid layout %+v", l)
	}
	return &Storage{Layout: l, data: make([]float32, l.NumBlocks*l.BlockFloats())}, nil
}

// Block returns the whole region of a block (all layers, K and V).
func (s *Storage) Block(block int) []float32 {
	n := s.BlockFloats()
	return s.data[block*n : (block+1)*n : (block+1)*n]
}

// KV returns the K and V regions ([slot][kvdim]) of one block for one layer.
func (s *Storage) KV(block, layer int) (k, v []float32) {
	per := s.BlockSize * s.KVDim
	off := block*s.BlockFloats() + layer*2*per
	return s.data[off : off+per : off+per], s.data[off+per : off+2*per : off+2*per]
}

// Release gives the pool's memory back to the OS and keeps the allocation, which then reads
// as zeros: a sleep that releases the KV pool frees its memory at once (not when the garbage
// collector and the runtime's scavenger get to it), and a wake-up reuses the same range, whose
// pages come back as huge pages where it was advised, instead of faulting in a new one. It
// reports false where the OS cannot; drop the Storage then. Nothing may be reading or writing
// the pool meanwhile.
func (s *Storage) Release() bool { return hugepage.Release(s.data) }

// Prefault writes every page of the pool once, split across up to workers goroutines, and
// returns when done. A fresh pool is only reserved address space: without this, the first KV
// write to each page takes a page fault inside a decode step (on a KVM guest, a sixth of a
// 64-sequence stories110m step while the pool fills), and the memory is committed only as
// requests reach it. A GPU engine's pool is committed when allocated; this makes the CPU one
// behave the same, so RSS shows the pool and an overcommitted machine fails at start, not
// mid-run. Call it before anyone else holds the storage: it writes zeros. It first asks for
// transparent huge pages (hugepage.Advise), so a fresh pool is faulted in 2 MB at a time.
func (s *Storage) Prefault(workers int) {
	hugepage.Advise(s.data)
	page := os.Getpagesize() / 4 // float32s per page
	n := len(s.data)
	workers = max(1, min(workers, n/(page*256))) // a goroutine per MiB or more
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w * n / workers; i < (w+1)*n/workers; i += page {
				s.data[i] = 0
			}
		})
	}
	wg.Wait()
}
