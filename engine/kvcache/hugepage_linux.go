//go:build linux

package kvcache

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// hugePage is the transparent huge page size of x86-64 and of arm64 with 4 KB base pages.
const hugePage = 2 << 20

// adviseHugePages asks Linux to back the whole 2 MB pages inside x with transparent huge pages
// (MADV_HUGEPAGE), before x is first written. Decode streams the packed weights and the KV pool
// every step; in 4 KB pages each step walks the page tables for tens of thousands of TLB
// misses (batch-1 stories110m ran about an eighth faster with huge pages on the AVX-512 EPYC).
// Under the common THP setting "madvise" nothing gets huge pages without this call. A hint:
// where THP is off or the call fails, nothing changes.
func adviseHugePages[T any](x []T) {
	size := len(x) * int(unsafe.Sizeof(*new(T)))
	if size < 2*hugePage {
		return
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), size)
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	lo := int((start+hugePage-1)&^(hugePage-1) - start)
	hi := lo + (len(b)-lo)&^(hugePage-1)
	_ = unix.Madvise(b[lo:hi], unix.MADV_HUGEPAGE)
}
