package model

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// BenchmarkPack packs stories110m's weights (the stage of a weight update) into new memory
// (the first update) and into a retired model's (every later one), on one goroutine and on
// GOMAXPROCS; MB/s counts the packed bytes.
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
				for b.Loop() {
					reuse := retired
					if fresh {
						reuse = nil
					}
					m, err := NewReusing(w, nil, reuse)
					require.NoError(b, err)
					retired = m
				}
			})
		}
	}
}
