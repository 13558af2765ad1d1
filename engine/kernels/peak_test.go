package kernels

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestPeakFMAIsPlausible(t *testing.T) {
	pool := NewPool(2)
	defer pool.Close()
	g := PeakFMA(pool, time.Millisecond)
	t.Logf("%.1f GFLOP/s (kernel %s)", g, KernelSummary())
	assert.False(t, math.IsNaN(g) || math.IsInf(g, 0))
	assert.Positive(t, g, "a measurement, whatever the load")
	assert.Positive(t, PeakFMA(nil, 0), "nil pool is one worker, a zero duration one call")
}

func TestFMAPeakGenericSumsEveryChain(t *testing.T) {
	// Each of the eight chains adds 1·0.5 per step, exactly.
	assert.Equal(t, float32(8*500), fmaPeakGeneric(1000))
}
