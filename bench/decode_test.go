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
	bytes := map[kernels.Precision]int64{}
	for _, prec := range []kernels.Precision{kernels.F32, kernels.BF16, kernels.Int8, kernels.W8A8} {
		r, err := Decode(context.Background(), pool, "tiny", prec, 32, 64, 10)
		require.NoError(t, err)
		require.Equal(t, 32, r.Tokens)
		require.Equal(t, prec.String(), r.Precision)
		require.Positive(t, r.DecodeTokensPerSec)
		require.Positive(t, r.PrefillTokensPerSec)
		require.Positive(t, r.BandwidthRatio)
		bytes[prec] = r.WeightBytes
	}
	require.Less(t, bytes[kernels.BF16], bytes[kernels.F32]*6/10, "bf16 streams about half the bytes")
	require.Less(t, bytes[kernels.Int8], bytes[kernels.BF16]*7/10, "int8 about 1.125/2 of bf16's")
	require.Less(t, bytes[kernels.W8A8], bytes[kernels.BF16]*7/10, "w8a8 int8's bytes, but for padded short blocks")
}

func BenchmarkDecode(b *testing.B) {
	pool := kernels.NewPool(2)
	defer pool.Close()
	for _, p := range []string{"stories15m", "stories110m"} {
		b.Run(p, func(b *testing.B) {
			for range b.N {
				r, err := Decode(context.Background(), pool, p, kernels.F32, 64, 64, 0)
				require.NoError(b, err)
				b.ReportMetric(r.DecodeTokensPerSec, "tok/s")
				b.ReportMetric(r.Llama2CTokensPerSec[0], "llama2c-tok/s")
			}
		})
	}
}
