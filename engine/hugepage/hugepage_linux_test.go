//go:build linux && amd64

package hugepage

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestAdviseBacksFreshMemory advises a fresh anonymous mapping, writes it, and reads its
// AnonHugePages from /proc/self/smaps: with THP available ("always" or "madvise"), the advice
// must give it huge pages (under "madvise" nothing else would). amd64 only: qemu-user, which
// runs arm64 tests on amd64 machines, does not pass the advice on.
func TestAdviseBacksFreshMemory(t *testing.T) {
	mode, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil || bytes.Contains(mode, []byte("[never]")) {
		t.Skipf("transparent huge pages unavailable: %q %v", mode, err)
	}
	const size = 8 << 20
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	x := unsafe.Slice((*float32)(unsafe.Pointer(&mem[0])), size/4)
	Advise(x)
	for i := range x {
		x[i] = 1
	}
	kb := anonHugeKB(t, uintptr(unsafe.Pointer(&mem[0])))
	// 8 MB holds at least three whole aligned 2 MB pages.
	if kb < 2048 {
		t.Fatalf("AnonHugePages of the advised mapping: %d kB, want at least one 2 MB page (THP %q)", kb, strings.TrimSpace(string(mode)))
	}
}

// anonHugeKB returns the AnonHugePages of the mapping of /proc/self/smaps that contains addr.
func anonHugeKB(t *testing.T, addr uintptr) int {
	var kb int
	if n, _ := fmt.Sscanf(smapsField(t, addr, "AnonHugePages:"), "%d kB", &kb); n != 1 {
		t.Fatalf("AnonHugePages of the mapping holding %#x: not a size", addr)
	}
	return kb
}

// smapsField returns the value of the field named key (with its colon) of the mapping of
// /proc/self/smaps that contains addr.
func smapsField(t *testing.T, addr uintptr, key string) string {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		var lo, hi uintptr
		if n, _ := fmt.Sscanf(line, "%x-%x", &lo, &hi); n == 2 && strings.Contains(line, " ") {
			in = lo <= addr && addr < hi
			continue
		}
		if v, ok := strings.CutPrefix(line, key); ok && in {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no mapping holds %#x with %s", addr, key)
	return ""
}

// TestMakeAdvisesHeapMemory checks that Make's slice of the Go heap carries the advice: the
// mapping holding its middle has the "hg" (MADV_HUGEPAGE) flag in /proc/self/smaps. Whether the
// kernel then finds free 2 MB pages depends on the machine's fragmentation, so that is not
// asserted here (TestAdviseBacksFreshMemory checks it on a fresh mapping).
func TestMakeAdvisesHeapMemory(t *testing.T) {
	const n = 16 << 20 / 4 // 16 MB: at least seven whole aligned 2 MB pages
	x := Make[float32](n)
	if len(x) != n {
		t.Fatalf("len %d, want %d", len(x), n)
	}
	for i := range x {
		if x[i] != 0 {
			t.Fatalf("x[%d] = %v, want a zeroed slice", i, x[i])
		}
	}
	flags := smapsField(t, uintptr(unsafe.Pointer(&x[n/2])), "VmFlags:")
	if !slices.Contains(strings.Fields(flags), "hg") {
		t.Fatalf("VmFlags of the mapping holding Make's slice: %q, want hg (MADV_HUGEPAGE)", flags)
	}
}

// TestReleaseGivesMemoryBack: after Release a buffer reads as zeros, its whole pages are no
// longer resident (mincore), and it stays usable: a write faults a page back in.
func TestReleaseGivesMemoryBack(t *testing.T) {
	x := make([]float32, (8<<20)/4+3) // a tail that is not a whole page
	for i := range x {
		x[i] = 1
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), len(x)*4)
	if got := residentPages(t, b); got == 0 {
		t.Fatal("the written buffer is not resident")
	}
	if !Release(x) {
		t.Fatal("Release refused")
	}
	for i, v := range x {
		if v != 0 {
			t.Fatalf("x[%d] = %v after Release, want 0", i, v)
		}
	}
	// The reads above may have mapped pages again (the kernel's zero page counts as resident):
	// release once more and check before anything reads.
	x[0] = 2
	if !Release(x) {
		t.Fatal("Release refused")
	}
	if got := residentPages(t, b); got > 2 {
		t.Fatalf("%d pages resident after Release, want at most the partial head and tail", got)
	}
	x[len(x)/2] = 3
	if x[len(x)/2] != 3 || x[0] != 0 {
		t.Fatal("the released buffer is not usable")
	}
}

// residentPages counts the resident pages of b's whole pages (mincore(2)).
func residentPages(t *testing.T, b []byte) int {
	t.Helper()
	page := unix.Getpagesize()
	_, lo, hi := wholePages(b, page)
	vec := make([]byte, (hi-lo)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[lo])), uintptr(hi-lo), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}
