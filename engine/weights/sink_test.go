package weights

import (
	"context"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/model"
)

// allocated is the heap bytes fn allocates (cumulative, so an upper bound of its peak).
func allocated(fn func()) uint64 {
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	fn()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// TestSinkLoadsBF16WithoutAFloat32Set: a bf16 checkpoint loaded into a model.Builder at bf16
// (and int8) gives the model a whole load and NewAs give, bit for bit, with the same
// digest; and the load allocates no float32 set: at most the packed model, the builder's
// scratch (the embedding's float32 values) and the loader's buffers, where the whole load
// allocates the float32 set first.
func TestSinkLoadsBF16WithoutAFloat32Set(t *testing.T) {
	w, err := model.Preset("stories15m", 2)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, SaveHF(dir, w, BF16))
	ctx := context.Background()
	ref := Ref{Version: 1, URI: dir}
	var whole *model.Weights
	var info Info
	wholeBytes := allocated(func() { whole, info, err = LoadWithInfo(ctx, ref, Options{}) })
	require.NoError(t, err)
	c := whole.Config
	set := int64(0)
	for _, t := range whole.Tensors() {
		set += int64(t.Len()) * 4
	}
	for _, prec := range []kernels.Precision{kernels.BF16, kernels.Int8} {
		want, err := model.NewAs(whole, nil, nil, prec)
		require.NoError(t, err)
		b, err := model.NewBuilder(c, prec, nil)
		require.NoError(t, err)
		var got *model.Model
		var sinkInfo Info
		sinkBytes := allocated(func() {
			var w *model.Weights
			w, sinkInfo, err = LoadWithInfo(ctx, ref, Options{Sink: b})
			require.NoError(t, err)
			require.Nil(t, w, "the tensors went to the sink")
			got, err = b.Model(nil)
		})
		require.NoError(t, err)
		require.Equal(t, info.Digest, sinkInfo.Digest)
		require.Equal(t, want.Weights(), got.Weights(), "%s", prec)
		bound := c.ModelBytes(prec) + b.ScratchPeak() + 16<<20
		t.Logf("%s: the load into the builder allocated %.1f MiB (packed model %.1f, scratch peak %.1f); a whole load %.1f MiB (float32 set %.1f)",
			prec, float64(sinkBytes)/(1<<20), float64(c.ModelBytes(prec))/(1<<20), float64(b.ScratchPeak())/(1<<20),
			float64(wholeBytes)/(1<<20), float64(set)/(1<<20))
		require.LessOrEqual(t, int64(sinkBytes), bound, "%s: no float32 set", prec)
		require.GreaterOrEqual(t, int64(wholeBytes), set)
	}
}

// TestSinkRefusesAnotherShape: a checkpoint of another shape fails before any tensor is
// read, with ErrBadCheckpoint and model.ErrShape.
func TestSinkRefusesAnotherShape(t *testing.T) {
	w, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, SaveHF(dir, w, BF16))
	c := w.Config
	c.NumHiddenLayers++
	b, err := model.NewBuilder(c, kernels.BF16, nil)
	require.NoError(t, err)
	_, err = Load(context.Background(), Ref{Version: 1, URI: dir}, Options{Sink: b})
	require.ErrorIs(t, err, ErrBadCheckpoint)
	require.ErrorIs(t, err, model.ErrShape)
}

// BenchmarkLoadAndPackBF16 loads a bf16 checkpoint of the stories110m shape and packs it at
// bf16, the two ways a server can: whole (LoadHF, then model.NewAs on every core) and one
// tensor at a time into a model.Builder (LoadHFInto, packing on the loading goroutine as the
// file is read). MB/s counts the file's tensor bytes; peak-scratch-MiB is the float32 memory
// beside the packed model (the whole float32 set for the first).
func BenchmarkLoadAndPackBF16(b *testing.B) {
	w, err := model.Preset("stories110m", 1)
	require.NoError(b, err)
	dir := b.TempDir()
	require.NoError(b, SaveHF(dir, w, BF16))
	c := w.Config
	w = nil
	pool := kernels.NewPool(runtime.GOMAXPROCS(0))
	defer pool.Close()
	b.Run("whole", func(b *testing.B) {
		b.SetBytes(c.NumParams() * 2)
		for b.Loop() {
			ws, err := LoadHF(dir)
			require.NoError(b, err)
			_, err = model.NewAs(ws, pool, nil, kernels.BF16)
			require.NoError(b, err)
		}
		b.ReportMetric(float64(c.NumParams()*4)/(1<<20), "peak-scratch-MiB")
	})
	b.Run("builder", func(b *testing.B) {
		b.SetBytes(c.NumParams() * 2)
		var peak int64
		for b.Loop() {
			bl, err := model.NewBuilder(c, kernels.BF16, nil)
			require.NoError(b, err)
			require.NoError(b, LoadHFInto(dir, bl))
			_, err = bl.Model(pool)
			require.NoError(b, err)
			peak = bl.ScratchPeak()
		}
		b.ReportMetric(float64(peak)/(1<<20), "peak-scratch-MiB")
	})
}
