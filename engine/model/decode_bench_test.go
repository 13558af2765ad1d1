package model

import (
	"fmt"
	"testing"

	"github.com/rolloutkit/rollout/engine/kvcache"
)

// BenchmarkDecodeBatch is one decode step of n sequences, each with 40 positions of real K/V
// behind it, on stories110m and two workers: the forward of a concurrent decode without the
// engine around it (no prefill, no sampling), so a change to the step shows alone.
func BenchmarkDecodeBatch(b *testing.B) {
	m := benchModel(b, "stories110m", 0)
	for _, n := range []int{1, 64} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			step, kv, logits := decodeStep(b, m, n, 40)
			for b.Loop() {
				if err := m.Forward(step, kv, logits); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tok/s")
		})
	}
}

// BenchmarkAttentionBatch is the attention of every layer in one decode step of 64 sequences
// with 40 positions each (as BenchmarkDecodeBatch), alone: the part of the step that reads the
// KV cache (190 MB here, far beyond the caches), whose change the matmuls around it would
// drown in noise. KV-GB/s is the K and V bytes read per second.
func BenchmarkAttentionBatch(b *testing.B) {
	m := benchModel(b, "stories110m", 0)
	c := m.Config
	const n, pos = 64, 40
	step, kv, _ := decodeStep(b, m, n, pos)
	for b.Loop() {
		for layer := range c.NumHiddenLayers {
			m.attention(step, kv, layer, n)
		}
	}
	kvBytes := float64(n*c.NumHiddenLayers*(pos+1)*c.KVDim()*2) * 4
	b.ReportMetric(kvBytes*float64(b.N)/b.Elapsed().Seconds()/1e9, "KV-GB/s")
}

// decodeStep prefills n sequences of pos tokens each into a fresh pool of 16-token blocks and
// runs their next decode step once, so that the returned step can be run again (it rewrites
// the same K/V slots) with its query vectors in the model's workspace.
func decodeStep(b *testing.B, m *Model, n, pos int) (*Batch, *kvcache.Storage, []float32) {
	b.Helper()
	c := m.Config
	const blockSize = 16
	nb := pos/blockSize + 1
	kv, err := kvcache.NewStorage(m.KVLayout(n*nb+1, blockSize))
	if err != nil {
		b.Fatal(err)
	}
	kv.Prefault(2)
	var step, prefill Batch
	for s := range n {
		table := make([]int32, nb)
		for i := range table {
			table[i] = int32(1 + s*nb + i)
		}
		step.BlockTables = append(step.BlockTables, table)
		step.Tokens = append(step.Tokens, int32((s*7919)%c.VocabSize))
		step.Positions = append(step.Positions, int32(pos))
		step.Seq = append(step.Seq, int32(s))
		step.Logits = append(step.Logits, int32(s))
		for i := range pos {
			prefill.Tokens = append(prefill.Tokens, int32((s*31+i*7919)%c.VocabSize))
			prefill.Positions = append(prefill.Positions, int32(i))
			prefill.Seq = append(prefill.Seq, int32(s))
		}
	}
	prefill.BlockTables, prefill.Logits = step.BlockTables, []int32{0}
	logits := make([]float32, n*c.VocabSize)
	for _, batch := range []*Batch{&prefill, &step} {
		if err := m.Forward(batch, kv, logits); err != nil {
			b.Fatal(err)
		}
	}
	return &step, kv, logits
}
