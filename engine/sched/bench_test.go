package sched

import (
	"fmt"
	"testing"

	"github.com/rolloutkit/rollout/engine/kvcache"
)

// BenchmarkDecodeStep measures one Schedule+UpdateFromOutput round for 64 decoding requests
// (scheduler overhead only; no model).
func BenchmarkDecodeStep(b *testing.B) {
	const n, bs = 64, 16
	pool, err := kvcache.New(kvcache.Config{NumBlocks: 16384, BlockSize: bs, PrefixCaching: true})
	if err != nil {
		b.Fatal(err)
	}
	s, err := New(Config{MaxNumBatchedTokens: 8192, MaxNumSeqs: n, MaxModelLen: 4096}, pool, nil)
	if err != nil {
		b.Fatal(err)
	}
	add := func(i int) {
		if err := s.Add(&Request{ID: fmt.Sprint("r", i), PromptTokenIDs: tokens(i*1000, 100), Params: Params{MaxTokens: 1 << 20}}); err != nil {
			b.Fatal(err)
		}
	}
	for i := range n {
		add(i)
	}
	mo := &ModelOutput{Sampled: map[string]Sample{}}
	step := func() {
		so, err := s.Schedule()
		if err != nil {
			b.Fatal(err)
		}
		clear(mo.Sampled)
		mo.Step = so.Step
		for _, sr := range so.Scheduled {
			if sr.Sample {
				mo.Sampled[sr.ReqID] = Sample{TokenID: 5}
			}
		}
		if _, err := s.UpdateFromOutput(so, mo); err != nil {
			b.Fatal(err)
		}
	}
	step() // prefill
	b.ResetTimer()
	for range b.N {
		step()
		if s.NumRunning() != n {
			b.Fatalf("%d running", s.NumRunning())
		}
	}
}
