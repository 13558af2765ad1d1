package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/rolloutkit/rollout/bench"
)

func TestAggregateTableShowsNoSpeedupWithoutBatch1(t *testing.T) {
	rep := &bench.EngineReport{Concurrent: []bench.ConcurrentResult{
		{Preset: "p", Precision: "f32", Concurrency: 1, TokensPerSec: 10, SpeedupVsBatch1: 1, Runs: []float64{10}},
		{Preset: "p", Precision: "f32", Concurrency: 8, TokensPerSec: 40, SpeedupVsBatch1: 4, Runs: []float64{40}},
		{Preset: "q", Precision: "f32", Concurrency: 8, TokensPerSec: 25.7, Runs: []float64{25.7}},
	}}
	var out bytes.Buffer
	printEngineFigures(&out, rep)
	lines := bytes.Split(out.Bytes(), []byte("\n"))
	var q []byte
	for _, l := range lines {
		if bytes.HasPrefix(l, []byte("q ")) {
			q = l
		}
	}
	assert.Contains(t, out.String(), "4.00x")
	assert.NotContains(t, string(q), "0.00x", "a round without concurrency 1 has no speedup to show")
	assert.Contains(t, string(q), " - ")
}
