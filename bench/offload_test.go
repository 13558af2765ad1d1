package bench

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The offload figures are checked for shape and safety, not speed.
func TestOffloadFigures(t *testing.T) {
	ctx := context.Background()
	bw, err := OffloadBandwidth(ctx, 16, 4, 1)
	require.NoError(t, err)
	assert.True(t, bw.StoredVerified, "loaded bytes equal the stored ones")
	assert.Zero(t, bw.Violations)
	assert.Positive(t, bw.StoreGBs)
	tt, err := OffloadTTFT(ctx, tinyWeights(t), "tiny", 200, 2)
	require.NoError(t, err)
	assert.Equal(t, 192, tt.CachedTokens, "every complete block but the last token's comes from the CPU tier")
	assert.Zero(t, tt.Violations)
	rs, err := OffloadResetDrain(ctx, 8, 0)
	require.NoError(t, err)
	assert.Equal(t, 8, rs.StoresInFlight)
	assert.Equal(t, 8, rs.FlushedJobs, "the double reset's union, delivered once")
	assert.Zero(t, rs.Violations)
}

func BenchmarkOffloadStoreLoad(b *testing.B) {
	for b.Loop() {
		r, err := OffloadBandwidth(context.Background(), 256, 16, 3)
		require.NoError(b, err)
		b.ReportMetric(r.StoreGBs, "store_GB/s")
		b.ReportMetric(r.LoadGBs, "load_GB/s")
		b.ReportMetric(r.PlainCopyGBs, "copy_GB/s")
	}
}

func BenchmarkOffloadResetDrain(b *testing.B) {
	for b.Loop() {
		r, err := OffloadResetDrain(context.Background(), 64, 0)
		require.NoError(b, err)
		b.ReportMetric(r.FlushDeliveredMs, "flush_ms")
		b.ReportMetric(r.IdleMs, "idle_ms")
	}
}
