package api

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The list encoder must produce exactly what per-element encoding produced before it.
func TestLogprobListMatchesElementEncoding(t *testing.T) {
	vals := []logprob{0, -0.5, -1e-7, -3.4028235e38, logprob(math.Inf(-1)), logprob(math.NaN()), -12.345678, 1.5e-45}
	for _, in := range [][]logprob{nil, {}, vals[:1], vals} {
		got, err := json.Marshal(struct {
			L logprobList `json:"l"`
		}{logprobList(in)})
		require.NoError(t, err)
		want, err := json.Marshal(struct {
			L []logprob `json:"l"`
		}{in})
		require.NoError(t, err)
		assert.JSONEq(t, string(want), string(got))
		assert.Equal(t, string(want), string(got))
	}
}

func BenchmarkLogprobEncoding(b *testing.B) {
	l := make([]logprob, 256)
	for i := range l {
		l[i] = logprob(-float32(i) / 7)
	}
	b.Run("list", func(b *testing.B) {
		for b.Loop() {
			_, _ = json.Marshal(logprobList(l))
		}
	})
	b.Run("per-element", func(b *testing.B) {
		for b.Loop() {
			_, _ = json.Marshal(l)
		}
	})
}
