package kernels

import (
	"fmt"
	"sync/atomic"
	"testing"
)

var sinkTmp uint64

func spinWork(iters int) uint64 {
	x := uint64(1)
	for i := 0; i < iters; i++ {
		x = x*6364136223846793005 + 1442695040888963407
	}
	return x
}

func BenchmarkTmpCompute(b *testing.B) {
	for _, iters := range []int{2000, 20000} {
		for _, chunk := range []int{0, 4} {
			b.Run(fmt.Sprintf("%d/chunk%d", iters, chunk), func(b *testing.B) {
				pool := NewPool(2)
				defer pool.Close()
				var s [16]uint64
				var calls [2]atomic.Int64
				for b.Loop() {
					pool.ParallelChunks(16, chunk, func(lo, hi int) {
						for i := lo; i < hi; i++ {
							s[i] += spinWork(iters)
						}
					})
				}
				_ = calls
				sinkTmp = s[0] + s[1]
			})
		}
	}
}
