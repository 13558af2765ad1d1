package weights

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/model"
)

// BenchmarkLoad loads a stories15m-shaped checkpoint (15M parameters, 9M of them the
// 32000-token embedding) in each format, SHA-256 included; MB/s counts tensor bytes.
func BenchmarkLoad(b *testing.B) {
	w, err := model.Preset("stories15m", 1)
	require.NoError(b, err)
	dir := b.TempDir()
	bin := filepath.Join(dir, "m.bin")
	require.NoError(b, SaveLlama2C(bin, w))
	for _, d := range []DType{F32, BF16} {
		p := filepath.Join(dir, d.String())
		require.NoError(b, SaveHF(p, w, d))
		b.Run("hf-"+d.String(), func(b *testing.B) {
			b.SetBytes(w.Config.NumParams() * int64(d.Size()))
			for b.Loop() {
				_, err := LoadHF(p)
				require.NoError(b, err)
			}
		})
	}
	b.Run("llama2c", func(b *testing.B) {
		b.SetBytes(w.Config.NumParams() * 4)
		for b.Loop() {
			_, err := LoadLlama2C(bin)
			require.NoError(b, err)
		}
	})
}
