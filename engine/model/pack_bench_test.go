package model

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// BenchmarkPack packs stories110m's weights (the stage of a weight update) into new memory
// (the first update) and into a retired model's (every later one), on one goroutine and on
// GOMAXPROCS; MB/s counts the packed bytes, and cpu-ms/op the process's CPU time (user and
// system, page faults included), which a busy machine distorts far less than the wall time.
func BenchmarkPack(b *testing.B) {
	w, err := Preset("stories110m", 1)
	require.NoError(b, err)
	retired, err := New(w, nil)
	require.NoError(b, err)
	for _, procs := range []int{1, runtime.GOMAXPROCS(0)} {
		for _, fresh := range []bool{true, false} {
			b.Run(fmt.Sprintf("procs=%d/fresh=%v", procs, fresh), func(b *testing.B) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
				b.SetBytes(retired.WeightBytes())
				cpu0 := cpuTime()
				for b.Loop() {
					reuse := retired
					if fresh {
						reuse = nil
					}
					m, err := NewReusing(w, nil, reuse)
					require.NoError(b, err)
					retired = m
				}
				b.ReportMetric(float64((cpuTime()-cpu0).Milliseconds())/float64(b.N), "cpu-ms/op")
			})
		}
	}
}
