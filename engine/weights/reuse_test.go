package weights

import (
	"context"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/model"
)

// backing maps each tensor name of w to the address of its memory.
func backing(w *model.Weights) map[string]*float32 {
	m := map[string]*float32{}
	for _, t := range w.Tensors() {
		m[t.Name] = unsafe.SliceData(*t.Data)
	}
	return m
}

// TestLoadReuse loads every format and source kind into a reused set: the tensors are
// bit-identical to a fresh load's, the digest is the same, and every tensor lives in the
// reused set's memory.
func TestLoadReuse(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f32 := filepath.Join(f.root, "hf32")
	require.NoError(t, SaveHF(f32, randomWeights(t, smallConfig(), 9), F32))
	srv, _ := serveDir(t, f.root)
	for _, uri := range []string{f32, f.hf, f.sharded, f.bin, srv.URL + "/hf32", srv.URL + "/sharded/", srv.URL + "/m.bin"} {
		want, wantInfo, err := LoadWithInfo(ctx, Ref{URI: uri}, Options{HTTPClient: loopback})
		require.NoError(t, err, uri)
		old := randomWeights(t, smallConfig(), 3)
		addr := backing(old)
		got, info, err := LoadWithInfo(ctx, Ref{URI: uri, SHA256: wantInfo.Digest}, Options{HTTPClient: loopback, Reuse: old})
		require.NoError(t, err, uri)
		requireSameWeights(t, want, got)
		assert.Equal(t, wantInfo, info, uri)
		assert.Equal(t, addr, backing(got), "%s: every tensor decoded into the reused set", uri)
	}
}

// TestLoadReuseMismatch: tensors whose length differs from the reused set's are allocated,
// the others reused, and an aliased tensor is used once only.
func TestLoadReuseMismatch(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for _, uri := range []string{f.hf, f.bin} {
		want, err := Load(ctx, Ref{URI: uri}, Options{})
		require.NoError(t, err)
		c := smallConfig()
		c.IntermediateSize = 16 // the MLP matrices differ, everything else fits
		old := randomWeights(t, c, 3)
		old.LMHead = old.Embed // an alias: only the embedding may take it
		addr := backing(old)
		got, err := Load(ctx, Ref{URI: uri}, Options{Reuse: old})
		require.NoError(t, err)
		requireSameWeights(t, want, got)
		for name, p := range backing(got) {
			mlp := strings.Contains(name, ".mlp.")
			switch {
			case mlp || name == "lm_head.weight":
				assert.NotEqual(t, addr[name], p, "%s: %s allocated", uri, name)
			default:
				assert.Equal(t, addr[name], p, "%s: %s reused", uri, name)
			}
		}
	}
}

// TestLoadReuseFailure: a failed load into a reused set returns no weights (its contents are
// undefined; the caller drops it).
func TestLoadReuseFailure(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for _, uri := range []string{f.hf, f.sharded, f.bin} {
		w, err := Load(ctx, Ref{URI: uri, SHA256: strings.Repeat("0", 64)}, Options{Reuse: randomWeights(t, smallConfig(), 3)})
		require.ErrorIs(t, err, ErrDigestMismatch)
		assert.Nil(t, w)
	}
	// Truncated: the tensor data ends early.
	p := filepath.Join(f.hf, SafetensorsFile)
	b := readFile(t, p)
	writeFile(t, p, b[:len(b)-4])
	w, err := Load(ctx, Ref{URI: f.hf}, Options{Reuse: randomWeights(t, smallConfig(), 3)})
	require.ErrorIs(t, err, ErrBadCheckpoint)
	assert.Nil(t, w)
}

// TestLoadReuseAllocates counts the bytes a load allocates: a fresh load allocates at least
// its tensors, a load into a reused set of the same shape a small fraction of them.
func TestLoadReuseAllocates(t *testing.T) {
	c := smallConfig()
	c.HiddenSize, c.IntermediateSize, c.VocabSize, c.NumAttentionHeads, c.NumKeyValueHeads = 256, 512, 1024, 4, 2
	w := randomWeights(t, c, 5)
	var tensorBytes uint64
	for _, tn := range w.Tensors() {
		tensorBytes += 4 * uint64(len(*tn.Data))
	}
	ctx := context.Background()
	for _, d := range []DType{F32, BF16} {
		dir := filepath.Join(t.TempDir(), d.String())
		require.NoError(t, SaveHF(dir, w, d))
		bin := filepath.Join(t.TempDir(), "m.bin")
		require.NoError(t, SaveLlama2C(bin, w))
		for _, uri := range []string{dir, bin} {
			allocated := func(reuse *model.Weights) (*model.Weights, uint64) {
				var m0, m1 runtime.MemStats
				runtime.ReadMemStats(&m0)
				got, err := Load(ctx, Ref{URI: uri}, Options{Reuse: reuse})
				runtime.ReadMemStats(&m1)
				require.NoError(t, err)
				return got, m1.TotalAlloc - m0.TotalAlloc
			}
			want, fresh := allocated(nil)
			got, reused := allocated(w.Clone())
			requireSameWeights(t, want, got)
			assert.GreaterOrEqual(t, fresh, tensorBytes, uri)
			// What remains: chunk buffers, the llama2.c q/k scratch, headers, names.
			assert.Less(t, reused, tensorBytes/3, "%s: %d of %d tensor bytes allocated", uri, reused, tensorBytes)
		}
	}
}
