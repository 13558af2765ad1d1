package kernels

import (
	"testing"
	"time"
	"runtime"
)

func TestTmpWho(t *testing.T) {
	pool := NewPool(2)
	defer pool.Close()
	for rep := 0; rep < 5; rep++ {
		var who [16]int
		start := time.Now()
		pool.ParallelChunks(16, 4, func(lo, hi int) {
			var buf [64]byte
			n := runtime.Stack(buf[:], false)
			id := 0
			for _, c := range buf[10:n] {
				if c < '0' || c > '9' { break }
				id = id*10 + int(c-'0')
			}
			for i := lo; i < hi; i++ {
				who[i] = id
				spinWork(20000)
			}
		})
		t.Log(time.Since(start), who)
	}
}
