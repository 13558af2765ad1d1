package model

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/rolloutkit/rollout/engine/kernels"
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

// config1B is the 1B shape of issue 30's figures (llama2.c-style: dim 2048, FFN 8192, 16
// layers, 32 query and 8 KV heads, a 32,000-token vocabulary, untied classifier).
var config1B = Config{HiddenSize: 2048, IntermediateSize: 8192, NumHiddenLayers: 16, NumAttentionHeads: 32,
	NumKeyValueHeads: 8, VocabSize: 32000, MaxPositionEmbeddings: 256, RopeTheta: 10000, RMSNormEps: 1e-5,
	BOSTokenID: 1, EOSTokenID: 2}

// BenchmarkDecode1B is one decode step of 1 and of 64 sequences (40 positions of K/V behind
// each) on the 1B shape with random weights, at each weight precision, on GOMAXPROCS workers.
// W-GB/s is the stored weight bytes a step streams (Model.WeightBytes) per second, and
// of-bandwidth that over the machine's read bandwidth (kernels.StreamReadBandwidth, probed
// once at the start over 1 GiB): at batch 1 the share of the memory's speed decode reaches. One
// precision's model is packed at a time; f32 needs about 9 GB (the float32 checkpoint and its
// packed copy).
func BenchmarkDecode1B(b *testing.B) {
	w, err := Random(config1B, 1)
	if err != nil {
		b.Fatal(err)
	}
	pool := kernels.NewPool(runtime.GOMAXPROCS(0))
	defer pool.Close()
	bw := kernels.StreamReadBandwidth(pool, 1<<30)
	b.Logf("read bandwidth %.1f GB/s", bw)
	for _, prec := range allPrecisions {
		b.Run(prec.String(), func(b *testing.B) {
			m, err := NewAs(w, pool, nil, prec)
			if err != nil {
				b.Fatal(err)
			}
			for _, n := range []int{1, 64} {
				b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
					step, kv, logits := decodeStep(b, m, n, 40)
					for b.Loop() {
						if err := m.Forward(step, kv, logits); err != nil {
							b.Fatal(err)
						}
					}
					s := b.Elapsed().Seconds()
					b.ReportMetric(float64(n)*float64(b.N)/s, "tok/s")
					wgbs := float64(m.WeightBytes()) * float64(b.N) / s / 1e9
					b.ReportMetric(wgbs, "W-GB/s")
					b.ReportMetric(wgbs/bw, "of-bandwidth")
				})
			}
		})
		runtime.GC() // the packed model is dropped before the next one is packed
	}
}
