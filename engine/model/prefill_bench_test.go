package model

import (
	"testing"

	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/kvcache"
)

// BenchmarkPrefill1K is one forward over a 1032-token prompt on stories15m's shape (context
// raised to 2048), all tokens in one batch, on two workers: long-prompt prefill, where attention
// (quadratic in the prompt) dominates.
func BenchmarkPrefill1K(b *testing.B) {
	m := benchModel(b, "stories15m", 2048)
	c := m.Config
	const n, blockSize = 1032, 16
	nb := (n + blockSize - 1) / blockSize
	kv, err := kvcache.NewStorage(m.KVLayout(nb+1, blockSize))
	if err != nil {
		b.Fatal(err)
	}
	batch := Batch{BlockTables: [][]int32{make([]int32, nb)}, Logits: []int32{n - 1}}
	for i := range nb {
		batch.BlockTables[0][i] = int32(i + 1)
	}
	for i := range n {
		batch.Tokens = append(batch.Tokens, int32((i*7919)%c.VocabSize))
		batch.Positions = append(batch.Positions, int32(i))
		batch.Seq = append(batch.Seq, 0)
	}
	logits := make([]float32, c.VocabSize)
	for b.Loop() {
		if err := m.Forward(&batch, kv, logits); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tok/s")
}

// benchModel is a random model of preset's shape (its context set to maxPos when positive) on a
// pool of two workers, closed when b ends.
func benchModel(b *testing.B, preset string, maxPos int) *Model {
	b.Helper()
	c, err := PresetConfig(preset)
	if err != nil {
		b.Fatal(err)
	}
	if maxPos > 0 {
		c.MaxPositionEmbeddings = maxPos
	}
	w, err := Random(c, 1)
	if err != nil {
		b.Fatal(err)
	}
	pool := kernels.NewPool(2)
	b.Cleanup(pool.Close)
	m, err := New(w, pool)
	if err != nil {
		b.Fatal(err)
	}
	return m
}
