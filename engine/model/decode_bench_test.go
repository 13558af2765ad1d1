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
	c := m.Config
	const blockSize, pos = 16, 40
	for _, n := range []int{1, 64} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
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
				step.Positions = append(step.Positions, pos)
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
			if err := m.Forward(&prefill, kv, logits); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if err := m.Forward(&step, kv, logits); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tok/s")
		})
	}
}
