//go:build arm64 && !purego

package kernels

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestStreamReadNEONSumsEveryLane checks the NEON read loop's lane sums word for word (word i
// into lane i mod 4), so the probe reads every byte it times.
func TestStreamReadNEONSumsEveryLane(t *testing.T) {
	for _, blocks := range []int{1, 2, 7} {
		buf := make([]uint64, blocks*streamBlock/8)
		for i := range buf {
			buf[i] = uint64(i)*0x9e3779b97f4a7c15 + 0xdeadbeef
		}
		var want [4]uint32
		for i, w := range unsafe.Slice((*uint32)(unsafe.Pointer(&buf[0])), len(buf)*2) {
			want[i%4] += w
		}
		var got [4]uint32
		streamReadNEON(unsafe.Pointer(&buf[0]), blocks, &got)
		require.Equal(t, want, got, "%d blocks", blocks)
	}
}
