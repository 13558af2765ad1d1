//go:build (amd64 || arm64) && !purego

package kernels

import "unsafe"

// Prefetch asks the CPU to bring x into its caches without waiting for it: a hint that costs
// one instruction per 64-byte line and never faults. Memory-bound loops that know what they
// read next (attention over a sequence's KV blocks) issue it one item ahead.
func Prefetch(x []float32) {
	if len(x) == 0 {
		return
	}
	prefetchLines(unsafe.Pointer(unsafe.SliceData(x)), (len(x)*4+63)/64)
}

// prefetchLines prefetches lines 64-byte lines from p.
//
//go:noescape
func prefetchLines(p unsafe.Pointer, lines int)
