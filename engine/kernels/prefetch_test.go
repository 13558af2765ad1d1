package kernels

import "testing"

// TestPrefetchAnyRange hints ranges of every length up to a few lines, at the end of their
// allocation too: a prefetch never faults and never changes memory.
func TestPrefetchAnyRange(t *testing.T) {
	buf := make([]float32, 64)
	for i := range buf {
		buf[i] = float32(i)
	}
	for lo := range len(buf) {
		for hi := lo; hi <= len(buf); hi++ {
			Prefetch(buf[lo:hi])
		}
	}
	for i, v := range buf {
		if v != float32(i) {
			t.Fatalf("buf[%d] = %v after Prefetch", i, v)
		}
	}
}
