//go:build linux

package hugepage

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// hugePage is the transparent huge page size of x86-64 and of arm64 with 4 KB base pages.
const hugePage = 2 << 20

// Advise asks Linux to back the whole 2 MB pages inside x with transparent huge pages
// (MADV_HUGEPAGE). Call it before x is first written: only pages faulted in after the advice
// come as huge pages. A hint: where THP is off or the call fails, nothing changes.
func Advise[T any](x []T) {
	b, lo, hi := wholePages(x, hugePage)
	if len(b) < 2*hugePage {
		return
	}
	_ = unix.Madvise(b[lo:hi], unix.MADV_HUGEPAGE)
}

// Release gives x's memory back to the kernel and keeps x valid: afterwards x reads as zeros,
// and the whole pages are faulted in again (as huge pages where x was advised) when next
// touched. It reports false, having changed nothing, where the kernel refuses; the caller
// then drops x instead. Only for memory that holds no pointers.
func Release[T any](x []T) bool {
	b, lo, hi := wholePages(x, unix.Getpagesize())
	if lo == hi {
		clear(b)
		return true
	}
	if err := unix.Madvise(b[lo:hi], unix.MADV_DONTNEED); err != nil {
		return false
	}
	clear(b[:lo])
	clear(b[hi:])
	return true
}

// wholePages returns x's bytes and the bounds [lo, hi) of the whole pages of size page (a
// power of two) inside them; lo == hi when there are none.
func wholePages[T any](x []T, page int) (b []byte, lo, hi int) {
	b = unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), len(x)*int(unsafe.Sizeof(*new(T))))
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	lo = min(len(b), int((start+uintptr(page)-1)&^uintptr(page-1)-start))
	hi = lo + (len(b)-lo)&^(page-1)
	return b, lo, hi
}
