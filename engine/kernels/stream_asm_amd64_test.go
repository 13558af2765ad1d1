//go:build amd64 && !goexperiment.simd && !purego

package kernels

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

func TestStreamReadVectorLoopsSumEveryLane(t *testing.T) {
	for _, blocks := range []int{1, 2, 7} {
		buf := make([]uint64, blocks*streamBlock/8)
		for i := range buf {
			buf[i] = uint64(i)*0x9e3779b97f4a7c15 + 0xdeadbeef
		}
		words := unsafe.Slice((*uint32)(unsafe.Pointer(&buf[0])), len(buf)*2)
		lanes := func(width int) [16]uint32 {
			var want [16]uint32
			for i, w := range words {
				want[i%width] += w
			}
			return want
		}
		p := unsafe.Pointer(&buf[0])
		if hasAVX512 {
			var got [16]uint32
			streamRead512(p, blocks, &got)
			require.Equal(t, lanes(16), got, "avx512, %d blocks", blocks)
		}
		if hasAVX2FMA {
			var got [16]uint32
			streamRead256(p, blocks, &got)
			require.Equal(t, lanes(8), got, "avx2, %d blocks", blocks)
		}
	}
}
