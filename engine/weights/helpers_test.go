package weights

import (
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/model"
)

// smallConfig is a model small enough to build many corrupted copies of: GQA (2 query heads
// share 1 KV head) and untied, so every tensor kind appears.
func smallConfig() model.Config {
	return model.Config{HiddenSize: 8, IntermediateSize: 12, NumHiddenLayers: 2, NumAttentionHeads: 2,
		NumKeyValueHeads: 1, VocabSize: 10, MaxPositionEmbeddings: 16, RopeTheta: 10000, RMSNormEps: 1e-5,
		TieWordEmbeddings: false, BOSTokenID: 1, EOSTokenID: 2, ModelType: "llama",
		Architectures: []string{"LlamaForCausalLM"}, TorchDtype: "float32"}
}

func randomWeights(t testing.TB, c model.Config, seed uint64) *model.Weights {
	t.Helper()
	w, err := model.Random(c, seed)
	require.NoError(t, err)
	// Random sets norms to exactly 1; perturb them so that a swapped or misplaced norm tensor
	// cannot go unnoticed.
	for _, tn := range w.Tensors() {
		if len(tn.Shape) == 1 {
			for i := range *tn.Data {
				(*tn.Data)[i] = 1 + float32(i%7)/16 + float32(seed%5)/64
			}
		}
	}
	return w
}

// requireSameWeights asserts bitwise-identical tensors (and equal configs).
func requireSameWeights(t *testing.T, want, got *model.Weights) {
	t.Helper()
	require.Equal(t, want.Config, got.Config)
	wt, gt := want.Tensors(), got.Tensors()
	require.Len(t, gt, len(wt))
	for i := range wt {
		require.Equal(t, wt[i].Name, gt[i].Name)
		require.Equal(t, *wt[i].Data, *gt[i].Data, "tensor %s", wt[i].Name)
	}
}

// splitST returns the parsed JSON header and the data section of a safetensors file.
func splitST(t *testing.T, file []byte) (map[string]any, []byte) {
	t.Helper()
	n := binary.LittleEndian.Uint64(file)
	var hdr map[string]any
	require.NoError(t, json.Unmarshal(file[8:8+n], &hdr))
	return hdr, file[8+n:]
}

// joinST builds a safetensors file from a header value and a data section.
func joinST(t testing.TB, hdr any, data []byte) []byte {
	t.Helper()
	js, err := json.Marshal(hdr)
	require.NoError(t, err)
	return joinRawST(js, data)
}

func joinRawST(js, data []byte) []byte {
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(js)))
	out = append(out, js...)
	return append(out, data...)
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, b, 0o644))
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

func osReadFile(path string) ([]byte, error) { return os.ReadFile(path) }
