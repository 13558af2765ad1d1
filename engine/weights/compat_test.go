package weights

import (
	"encoding/binary"
	"math"
	"path/filepath"
	"testing"

	"github.com/nlpodyssey/safetensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWrittenFileParsesWithReferenceRules reads SaveHF's output with nlpodyssey/safetensors,
// a port of the reference Rust validation (contiguous offsets, exact buffer length), so the
// files are not only readable by our own loader.
func TestWrittenFileParsesWithReferenceRules(t *testing.T) {
	w := randomWeights(t, smallConfig(), 6)
	for _, d := range []DType{F32, F16, BF16} {
		dir := t.TempDir()
		require.NoError(t, SaveHF(dir, w, d))
		b := readFile(t, filepath.Join(dir, SafetensorsFile))
		n := binary.LittleEndian.Uint64(b)
		assert.Zero(t, (8+n)%8, "data section is 8-byte aligned")
		assert.Equal(t, byte('{'), b[8])
		st, err := safetensors.Deserialize(b)
		require.NoError(t, err)
		assert.Equal(t, map[string]string{"format": "pt"}, mustMeta(t, b).Metadata())
		require.Equal(t, len(w.Tensors()), st.Len())
		for _, tn := range w.Tensors() {
			v, ok := st.Tensor(tn.Name)
			require.True(t, ok, tn.Name)
			assert.Equal(t, d.String(), v.DType().String())
			shape := make([]int, len(v.Shape()))
			for i, s := range v.Shape() {
				shape[i] = int(s)
			}
			assert.Equal(t, tn.Shape, shape)
			got := make([]float32, len(*tn.Data))
			decode(got, v.Data(), d)
			for i, x := range *tn.Data {
				if d == F32 {
					require.Equal(t, x, got[i])
				} else {
					require.InDelta(t, x, got[i], math.Abs(float64(x))/100+1e-4, "%s[%d]", tn.Name, i)
				}
			}
		}
	}
}

func mustMeta(t *testing.T, b []byte) safetensors.Metadata {
	t.Helper()
	_, md, err := safetensors.ReadMetadata(b)
	require.NoError(t, err)
	return md
}
