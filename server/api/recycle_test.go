package api

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/tokenizer"
	"github.com/rolloutkit/rollout/engine/weights"
	"github.com/rolloutkit/rollout/internal/enginetest"
)

// recycleServer is an API over a running engine of the tiny preset (seed 1, version 0), whose
// initial set it owns, served on a real listener.
type recycleServer struct {
	a   *API
	e   *engine.Engine
	w0  *model.Weights
	url string
}

func newRecycleServer(t *testing.T, spare bool) *recycleServer {
	t.Helper()
	return newRecycleServerAt(t, spare, kernels.F32)
}

// newRecycleServerAt is newRecycleServer with the engine at precision prec.
func newRecycleServerAt(t *testing.T, spare bool, prec kernels.Precision) *recycleServer {
	t.Helper()
	e, w := enginetest.Run(t, engine.Config{Precision: prec})
	a, err := New(Config{Engine: e, Tokenizer: tokenizer.NewByte(), ModelConfig: w.Config, Weights: w, NoSpareWeights: !spare, AdminToken: "adm"})
	require.NoError(t, err)
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(func() {
		srv.Close()
		<-a.spareReady // before the engine stops (its cleanup runs after this one)
	})
	return &recycleServer{a: a, e: e, w0: w, url: srv.URL}
}

// post sends a JSON body to path and returns the status and the body.
func (s *recycleServer) post(t *testing.T, path string, body any) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(http.MethodPost, s.url+path, rd)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer adm")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func (s *recycleServer) update(t *testing.T, body map[string]any) {
	t.Helper()
	code, out := s.post(t, "/update_weights", body)
	require.Equal(t, http.StatusOK, code, "%s", out)
}

// held is the memory (the embedding's address) of every set the API keeps.
func (s *recycleServer) held() map[*float32]bool {
	m := map[*float32]bool{}
	for _, w := range s.a.sets.Sets() {
		m[unsafe.SliceData(w.Embed)] = true
	}
	return m
}

// requireServing asserts the engine serves exactly want's tensors.
func (s *recycleServer) requireServing(t *testing.T, want *model.Weights) {
	t.Helper()
	got, err := s.e.Weights(t.Context())
	require.NoError(t, err)
	wt, gt := want.Tensors(), got.Tensors()
	require.Len(t, gt, len(wt))
	for i := range wt {
		require.Equal(t, *wt[i].Data, *gt[i].Data, "served tensor %s", wt[i].Name)
	}
}

// TestUpdateRecyclesRetiredSets follows the API's ownership rule through updates, stage-only
// updates that replace a staged set, failed loads and a level-2 sleep, with a real engine and
// real checkpoints: a load reuses a set only when the engine neither serves nor stages it,
// never the serving one (whose tensors stay exactly what was committed), and a failed load
// drops the set it was given.
func TestUpdateRecyclesRetiredSets(t *testing.T) {
	s := newRecycleServer(t, false)
	uri2, d2, w2 := enginetest.Checkpoint(t, 2)
	uri3, d3, w3 := enginetest.Checkpoint(t, 3)
	uri4, d4, _ := enginetest.Checkpoint(t, 4)
	uri5, d5, w5 := enginetest.Checkpoint(t, 5)
	a := unsafe.SliceData(s.w0.Embed)
	require.Equal(t, map[*float32]bool{a: true}, s.held())

	// v2: version 0's set serves, nothing is free: new memory.
	s.update(t, map[string]any{"version": 2, "source": uri2, "sha256": d2})
	s.requireServing(t, w2)
	held := s.held()
	require.Len(t, held, 2)
	require.True(t, held[a])

	// v3 stage-only: decodes into version 0's set (retired by the commit of 2), not the
	// serving one, which keeps serving exactly version 2.
	s.update(t, map[string]any{"version": 3, "source": uri3, "sha256": d3, "stage_only": true})
	s.requireServing(t, w2)
	assert.Equal(t, held, s.held(), "no new memory: version 3 lives in version 0's set")

	// v4 stage-only replaces the staged 3: 3 was staged and 2 serves when it loads, so it
	// gets new memory; v5 then reuses 3's, the replaced staged set.
	s.update(t, map[string]any{"version": 4, "source": uri4, "sha256": d4, "stage_only": true})
	s.requireServing(t, w2)
	held4 := s.held()
	require.Len(t, held4, 3)
	s.update(t, map[string]any{"version": 5, "source": uri5, "sha256": d5, "stage_only": true})
	s.requireServing(t, w2)
	assert.Equal(t, held4, s.held())
	assert.Equal(t, int64(5), s.e.StagedVersion())

	// Commit 5: it serves from version 0's original memory.
	s.update(t, map[string]any{"version": 5})
	s.requireServing(t, w5)

	// A failed load (bad digest, a NaN in the last tensor, a truncated file) takes a free set and drops it; the
	// served weights are untouched, and what the API keeps is only the serving set.
	code, out := s.post(t, "/update_weights", map[string]any{"version": 6, "source": uri2, "sha256": strings.Repeat("0", 64)})
	require.Equal(t, http.StatusUnprocessableEntity, code, "%s", out)
	s.requireServing(t, w5)
	assert.Equal(t, map[*float32]bool{a: true}, s.held(), "the other free set was forgotten, the used one dropped")
	p := filepath.Join(strings.TrimPrefix(uri2, "file://"), weights.SafetensorsFile)
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	nan := append(bytes.Clone(b[:len(b)-4]), 0, 0, 0xc0, 0x7f) // decoded after every other tensor
	require.NoError(t, os.WriteFile(p, nan, 0o644))
	code, out = s.post(t, "/update_weights", map[string]any{"version": 6, "source": uri2})
	require.Equal(t, http.StatusUnprocessableEntity, code, "%s", out)
	require.Contains(t, out, "bad_checkpoint")
	s.requireServing(t, w5)
	assert.Equal(t, map[*float32]bool{a: true}, s.held())
	require.NoError(t, os.WriteFile(p, b[:len(b)-8], 0o644))
	code, out = s.post(t, "/update_weights", map[string]any{"version": 6, "source": uri2})
	require.Equal(t, http.StatusUnprocessableEntity, code, "%s", out)
	s.requireServing(t, w5)
	assert.Equal(t, map[*float32]bool{a: true}, s.held())

	// A level-2 sleep drops the weights in the engine and here; an update while asleep
	// allocates.
	code, out = s.post(t, "/sleep?level=2", nil)
	require.Equal(t, http.StatusOK, code, "%s", out)
	assert.Empty(t, s.held())
	s.update(t, map[string]any{"version": 7, "source": uri3, "sha256": d3})
	assert.Len(t, s.held(), 1)
	code, out = s.post(t, "/wake_up", nil)
	require.Equal(t, http.StatusOK, code, "%s", out)
	s.requireServing(t, w3)
}

// TestFirstUpdateUsesTheSpare: the spare set prepared in the background takes the first
// update, so it faults no new memory in; a level-1 sleep keeps every set (the next update of
// the RL cycle decodes into the retired one), a level-2 sleep gives them back.
func TestFirstUpdateUsesTheSpare(t *testing.T) {
	s := newRecycleServer(t, true)
	<-s.a.spareReady
	held := s.held()
	require.Len(t, held, 2, "the initial set and the spare")
	uri2, d2, w2 := enginetest.Checkpoint(t, 2)
	s.update(t, map[string]any{"version": 2, "source": uri2, "sha256": d2})
	s.requireServing(t, w2)
	assert.Equal(t, held, s.held(), "version 2 decoded into the spare")

	code, out := s.post(t, "/sleep?level=1", nil)
	require.Equal(t, http.StatusOK, code, "%s", out)
	assert.Equal(t, held, s.held(), "a level-1 sleep frees the KV cache only")
	code, out = s.post(t, "/sleep?level=2", nil)
	require.Equal(t, http.StatusOK, code, "%s", out)
	assert.Empty(t, s.held(), "a level-2 sleep gives every set back (nothing staged)")
}

// TestLowPrecisionKeepsNoFloat32Sets: at bf16 and int8 the API keeps no float32 set, not the
// initial one, not the start-up spare, not a loaded update, so none outlives its packing
// (the engine keeps none either); the engine still serves, and Weights returns, the
// effective weights of every update.
func TestLowPrecisionKeepsNoFloat32Sets(t *testing.T) {
	for _, prec := range []kernels.Precision{kernels.BF16, kernels.Int8} {
		t.Run(prec.String(), func(t *testing.T) {
			s := newRecycleServerAt(t, true, prec)
			<-s.a.spareReady
			assert.Empty(t, s.held(), "neither the initial set nor the spare")
			want0, err := s.w0.Effective(prec)
			require.NoError(t, err)
			s.requireServing(t, want0)
			for v := uint64(2); v <= 3; v++ {
				uri, d, w := enginetest.Checkpoint(t, v)
				s.update(t, map[string]any{"version": v, "source": uri, "sha256": d})
				assert.Empty(t, s.held(), "version %d", v)
				want, err := w.Effective(prec)
				require.NoError(t, err)
				s.requireServing(t, want)
			}
			n, err := s.e.ResidentWeightBytes(t.Context())
			require.NoError(t, err)
			assert.Equal(t, 2*s.w0.Config.ModelBytes(prec), n, "the serving model and the retired spare")
		})
	}
}

// TestLowPrecisionUpdateOfAnotherShape: at bf16 an update loads into the engine's builder,
// which refuses a checkpoint of another shape before reading its tensors: 422
// shape_mismatch, and the old weights keep serving.
func TestLowPrecisionUpdateOfAnotherShape(t *testing.T) {
	s := newRecycleServerAt(t, false, kernels.BF16)
	w, err := model.Preset("tiny", 2)
	require.NoError(t, err)
	w.Config.NumHiddenLayers++
	w.Layers = nil
	w.Allocate()
	dir := t.TempDir()
	require.NoError(t, weights.SaveHF(dir, w, weights.BF16))
	code, out := s.post(t, "/update_weights", map[string]any{"version": 2, "source": "file://" + dir})
	require.Equal(t, http.StatusUnprocessableEntity, code, "%s", out)
	assert.Contains(t, out, "shape_mismatch")
	want, err := s.w0.Effective(kernels.BF16)
	require.NoError(t, err)
	s.requireServing(t, want)
}
