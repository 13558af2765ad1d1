package kernels

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestStreamReadBandwidthIsPlausible(t *testing.T) {
	pool := NewPool(2)
	defer pool.Close()
	gbs := StreamReadBandwidth(pool, 8<<20)
	t.Logf("%.1f GB/s over 8 MiB (kernel %s)", gbs, KernelName())
	assert.False(t, math.IsNaN(gbs) || math.IsInf(gbs, 0))
	assert.Positive(t, gbs, "a measurement, whatever the load")
	assert.Positive(t, StreamReadBandwidth(nil, 0), "tiny sizes are clamped, nil pool is one worker")
}

func TestStreamReadChecksum(t *testing.T) {
	// streamRead must read every word: its checksum changes with any word.
	for _, blocks := range []int{1, 2, 5} {
		buf := make([]uint64, blocks*streamBlock/8)
		for i := range buf {
			buf[i] = uint64(i)*0x9e3779b97f4a7c15 + 1
		}
		base := streamRead(buf)
		for i := range buf {
			buf[i] += 1 << 7
			assert.NotEqual(t, base, streamRead(buf), "%d blocks: word %d not read", blocks, i)
			buf[i] -= 1 << 7
		}
	}
}
