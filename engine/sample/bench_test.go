package sample

import (
	"math/rand/v2"
	"testing"
)

// benchRows are vocab-32000 logit rows shaped like a language model's: Gaussian noise plus a
// handful of strong candidates.
func benchRows(n int) [][]float32 {
	r := rand.New(rand.NewPCG(1, 1))
	rows := make([][]float32, n)
	for i := range rows {
		row := randLogits(r, 32000)
		for range 8 {
			row[r.IntN(len(row))] += 12
		}
		rows[i] = row
	}
	return rows
}

func benchSample(b *testing.B, p Params, rows [][]float32) {
	s := New(p, 1)
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		s.Sample(rows[i%len(rows)])
		i++
	}
}

func BenchmarkSample32k(b *testing.B) {
	rows := benchRows(8)
	flat := benchRows(1)
	for i := range flat[0] {
		flat[0][i] *= 0.01 // near-uniform: the cutoff keeps almost every token
	}
	cases := []struct {
		name string
		p    Params
		rows [][]float32
	}{
		{"greedy", Params{}, rows},
		{"greedy_processed", Params{LogprobMode: LogprobProcessed}, rows},
		{"temp1", Params{Temperature: 1}, rows},
		{"temp1_topp0.9", Params{Temperature: 1, TopP: 0.9}, rows},
		{"temp0.7_topp0.9", Params{Temperature: 0.7, TopP: 0.9}, rows},
		{"temp1_topp0.9_flat", Params{Temperature: 1, TopP: 0.9}, flat},
		{"topk40", Params{Temperature: 1, TopK: 40}, rows},
		{"topk40_processed", Params{Temperature: 1, TopK: 40, LogprobMode: LogprobProcessed}, rows},
		{"topk40_topp0.9_minp0.05", Params{Temperature: 0.8, TopK: 40, TopP: 0.9, MinP: 0.05}, rows},
		{"temp1_topp0.9_logprobs20", Params{Temperature: 1, TopP: 0.9, Logprobs: 20}, rows},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) { benchSample(b, tc.p, tc.rows) })
	}
}
