package offload_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/kvcache"
	"github.com/rolloutkit/rollout/engine/kvconnector"
	"github.com/rolloutkit/rollout/offload"
	"github.com/rolloutkit/rollout/offload/cpu"
)

// splitRig is the worker side alone on a real pool and storage, driven step by step as the
// engine drives it, to move chosen transfers.
type splitRig struct {
	t       testing.TB
	layout  kvcache.Layout
	pool    *kvcache.Manager
	storage *kvcache.Storage
	conn    *offload.Connector
	w       kvconnector.TypedWorker[*offload.Payload, *offload.WorkerMeta]
	ids     []int
	nextID  int64
}

func newSplitRig(t testing.TB, l kvcache.Layout, bpc, threads int, split int64) *splitRig {
	t.Helper()
	pool, err := kvcache.New(kvcache.Config{NumBlocks: l.NumBlocks, BlockSize: l.BlockSize, PrefixCaching: true})
	require.NoError(t, err)
	st, err := kvcache.NewStorage(l)
	require.NoError(t, err)
	conn, err := offload.New(offload.Config{CPUBytes: int64(l.NumBlocks) * int64(l.BlockBytes()), BlockSize: l.BlockSize,
		BlocksPerChunk: bpc, CopyThreads: threads, SplitBytes: split, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	conn.Scheduler().(kvconnector.PoolBinder).BindBlockPool(pool)
	require.NoError(t, conn.Worker().(kvconnector.StorageBinder).BindKVStorage(st))
	r := &splitRig{t: t, layout: l, pool: pool, storage: st, conn: conn}
	_, r.w = conn.TypedSides()
	var ok bool
	r.ids, ok = pool.AllocateSlots("r", (l.NumBlocks-1)*l.BlockSize, nil)
	require.True(t, ok)
	for i, b := range r.ids {
		blk := st.Block(b)
		for j := range blk {
			blk[j] = float32((i*7919+j)%65521)*0.25 - 3
		}
	}
	t.Cleanup(func() { _ = r.w.WaitIdle(context.Background()) })
	return r
}

// job builds one transfer of chunks [lo, hi) of bpc blocks each; a load skips offset blocks
// of every chunk.
func (r *splitRig) job(store bool, lo, hi, bpc, offset int) *offload.Transfer {
	t := &offload.Transfer{ID: r.nextID, Store: store}
	r.nextID++
	for c := lo; c < hi; c++ {
		ct := offload.ChunkTransfer{Index: c, Slot: cpu.Slot{ID: c, Gen: uint64(c + 1)}}
		if !store {
			ct.Offset = offset
		}
		for _, b := range r.ids[c*bpc+ct.Offset : (c+1)*bpc] {
			ct.Blocks = append(ct.Blocks, b)
			ct.Gens = append(ct.Gens, r.pool.Generation(b))
		}
		t.Chunks = append(t.Chunks, ct)
	}
	return t
}

// step runs one engine step carrying p and waits for its transfers; it returns their results.
func (r *splitRig) step(p *offload.Payload) map[int64]bool {
	r.t.Helper()
	ctx := context.Background()
	var flush []int64
	for _, s := range p.Stores {
		flush = append(flush, s.ID)
	}
	r.w.BindMetadata(kvconnector.TypedMetadata[*offload.Payload]{FlushJobIDs: flush, Payload: p})
	require.NoError(r.t, r.w.HandlePreemptions(ctx))
	require.NoError(r.t, r.w.StartLoadKV(ctx))
	require.NoError(r.t, r.w.WaitIdle(ctx))
	_, _ = r.w.GetFinished(nil)
	wm := r.w.BuildWorkerMeta()
	r.w.ClearMetadata()
	require.NotNil(r.t, wm)
	return wm.Completed
}

func (r *splitRig) snapshot() [][]float32 {
	out := make([][]float32, len(r.ids))
	for i, b := range r.ids {
		out[i] = append([]float32(nil), r.storage.Block(b)...)
	}
	return out
}

// TestSplitTransfersRoundTrip: stores and loads split across copy helpers move exactly the
// bytes they would on one goroutine, for block sizes that are not multiples of the checksum's
// 192-byte step (odd float counts, blocks under one step), one block, a few and many blocks per
// transfer, chunks of several blocks and loads that skip leading blocks, small blocks and
// blocks of tens of KB, and on one thread (no split) as the reference.
func TestSplitTransfersRoundTrip(t *testing.T) {
	layouts := []kvcache.Layout{
		{NumLayers: 1, BlockSize: 3, KVDim: 7},    // 42 floats: all in the checksum's tail
		{NumLayers: 2, BlockSize: 5, KVDim: 13},   // 260 floats: one 64-byte line per part plus a tail
		{NumLayers: 2, BlockSize: 16, KVDim: 577}, // 36,928 floats (144 KB, odd KV dim)
	}
	for _, l := range layouts {
		for _, bpc := range []int{1, 3} {
			for _, threads := range []int{1, 2, 4} {
				for _, chunks := range []int{1, 2, 16} {
					name := fmt.Sprintf("floats=%d/bpc=%d/threads=%d/chunks=%d", l.BlockFloats(), bpc, threads, chunks)
					t.Run(name, func(t *testing.T) {
						l.NumBlocks = chunks*bpc + 1
						r := newSplitRig(t, l, bpc, threads, 1)
						want := r.snapshot()
						res := r.step(&offload.Payload{Stores: []*offload.Transfer{r.job(true, 0, chunks, bpc, 0)}})
						require.Equal(t, map[int64]bool{0: true}, res)
						offset := min(1, bpc-1)
						for _, b := range r.ids {
							clear(r.storage.Block(b))
						}
						res = r.step(&offload.Payload{Loads: []*offload.Transfer{r.job(false, 0, chunks, bpc, offset)}})
						require.Equal(t, map[int64]bool{1: true}, res)
						got := r.snapshot()
						for i := range got {
							if i%bpc < offset {
								require.Equal(t, make([]float32, len(want[i])), got[i], "skipped block %d written", i)
								continue
							}
							require.Equal(t, want[i], got[i], "block %d", i)
						}
						require.Zero(t, r.conn.Violations())
						if threads > 1 && chunks*bpc > 1 {
							require.Positive(t, r.conn.SharedCopies(), "the copy was never offered to a helper")
						} else {
							require.Zero(t, r.conn.SharedCopies())
						}
					})
				}
			}
		}
	}
}

// TestSplitLoadDetectsChecksumMismatch: one changed float anywhere in a split load's slots,
// the first, a middle or the last of any block (including a block the load only checksums),
// fails that chunk's load as a checksum violation and no other chunk.
func TestSplitLoadDetectsChecksumMismatch(t *testing.T) {
	l := kvcache.Layout{NumLayers: 2, BlockSize: 5, KVDim: 13}
	const bpc, chunks = 2, 8
	bf := l.BlockFloats()
	for _, at := range []int{0, bf / 3, bf/3*2 + 1, bf - 1, bf, 5*bf + bf/2, chunks*bpc*bf - 1} {
		t.Run(fmt.Sprint(at), func(t *testing.T) {
			l.NumBlocks = chunks*bpc + 1
			r := newSplitRig(t, l, bpc, 3, 1)
			require.Equal(t, map[int64]bool{0: true}, r.step(&offload.Payload{Stores: []*offload.Transfer{r.job(true, 0, chunks, bpc, 0)}}))
			r.conn.CorruptCPUFloat(at)
			res := r.step(&offload.Payload{Loads: []*offload.Transfer{r.job(false, 0, chunks, bpc, 1)}})
			require.Equal(t, map[int64]bool{1: false}, res)
			require.Equal(t, int64(1), r.conn.Violations())
			require.Equal(t, float64(1), r.conn.Stats()["offload_checksum_failures_total"])
			require.Equal(t, float64((chunks-1)*(bpc-1)*l.BlockBytes()), r.conn.Stats()["offload_loaded_bytes_total"],
				"every other chunk loads")
		})
	}
}

// TestSplitTransferRepeatedSlotIsSequential: a store transfer that names one slot twice
// copies the chunks one after the other (the second overwrites the first) with no violation,
// as it did before copies were split.
func TestSplitTransferRepeatedSlotIsSequential(t *testing.T) {
	l := kvcache.Layout{NumLayers: 1, BlockSize: 4, KVDim: 64, NumBlocks: 5}
	r := newSplitRig(t, l, 1, 4, 1)
	st := r.job(true, 0, 3, 1, 0)
	st.Chunks[2].Slot = st.Chunks[0].Slot
	require.Equal(t, map[int64]bool{0: true}, r.step(&offload.Payload{Stores: []*offload.Transfer{st}}))
	require.Zero(t, r.conn.Violations())
	want := append([]float32(nil), r.storage.Block(r.ids[2])...)
	// Load slot 0 (holding chunk 2's block now) into block 0.
	ld := r.job(false, 0, 1, 1, 0)
	require.Equal(t, map[int64]bool{1: true}, r.step(&offload.Payload{Loads: []*offload.Transfer{ld}}))
	require.Equal(t, want, r.storage.Block(r.ids[0]))
}

// BenchmarkSplitTransfer stores and loads 256 stories15m-shaped blocks (56 MB, past the
// caches) in jobs of 16 one-block chunks, on one copy thread and split across two and
// GOMAXPROCS: MB/s counts the bytes stored plus the bytes loaded.
func BenchmarkSplitTransfer(b *testing.B) {
	l := kvcache.Layout{NumLayers: 6, BlockSize: 16, KVDim: 288, NumBlocks: 257}
	for _, threads := range []int{1, 2, 0} {
		b.Run(fmt.Sprintf("threads=%d", threads), func(b *testing.B) {
			r := newSplitRig(b, l, 1, threads, 0)
			b.SetBytes(2 * 256 * int64(l.BlockBytes()))
			for b.Loop() {
				var st, ld []*offload.Transfer
				for c := 0; c < 256; c += 16 {
					st = append(st, r.job(true, c, c+16, 1, 0))
				}
				r.step(&offload.Payload{Stores: st})
				for c := 0; c < 256; c += 16 {
					ld = append(ld, r.job(false, c, c+16, 1, 0))
				}
				r.step(&offload.Payload{Loads: ld})
			}
		})
	}
}
