package server_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/weights"
	"github.com/rolloutkit/rollout/server"
)

// TestBF16CheckpointServedAtBF16: a server at --precision bf16 loads a bf16 checkpoint
// directory into its packed model tensor by tensor (load.OpenAs) and generates what a
// float32 server of the same checkpoint does: bf16 values are exact at bf16, so the two
// precisions serve the same policy.
func TestBF16CheckpointServedAtBF16(t *testing.T) {
	w, err := model.Preset("tiny", 6)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, weights.SaveHF(dir, w, weights.BF16))
	prompt := []int{5, 17, 99, 3, 42}
	var got [][]int
	for _, prec := range []kernels.Precision{kernels.F32, kernels.BF16} {
		ts := start(t, func(c *server.Config) { c.Model, c.Precision = dir, prec })
		var g genResp
		ts.doJSON(t, http.MethodPost, "/generate", greedyGen(prompt, 12), http.StatusOK, &g)
		require.Len(t, g.Outputs, 1)
		require.Len(t, g.Outputs[0].TokenIDs, 12)
		got = append(got, g.Outputs[0].TokenIDs)
	}
	assert.Equal(t, got[0], got[1])
}
