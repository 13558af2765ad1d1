package bench

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/kernels"
)

func TestDecodeTiny(t *testing.T) {
	pool := kernels.NewPool(2)
	defer pool.Close()
	r, err := Decode(context.Background(), pool, "tiny", 32, 64, 10)
	require.NoError(t, err)
	require.Equal(t, 32, r.Tokens)
	require.Positive(t, r.DecodeTokensPerSec)
	require.Positive(t, r.PrefillTokensPerSec)
	require.Positive(t, r.BandwidthRatio)
}

func BenchmarkDecode(b *testing.B) {
	pool := kernels.NewPool(2)
	defer pool.Close()
	for _, p := range []string{"stories15m", "stories110m"} {
		b.Run(p, func(b *testing.B) {
			for range b.N {
				r, err := Decode(context.Background(), pool, p, 64, 64, 0)
				require.NoError(b, err)
				b.ReportMetric(r.DecodeTokensPerSec, "tok/s")
				b.ReportMetric(r.Llama2CTokensPerSec[0], "llama2c-tok/s")
			}
		})
	}
}
