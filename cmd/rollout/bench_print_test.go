package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/rolloutkit/rollout/bench"
	"github.com/rolloutkit/rollout/engine/kernels"
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

func TestPeerTableShowsRatiosToSameBytes(t *testing.T) {
	rep := &bench.EngineReport{Peers: []bench.PeerResult{
		{Preset: "p", Engine: "rollout", Precision: "w8a8", Batch1TokensPerSec: 30, AggregateTokensPerSec: 300, GreedyMatch: 8, GreedyTokens: 8,
			VsPeer: 1.5, VsPeerAggregate: 10, VsPeerType: "q8_0"},
		{Preset: "p", Engine: "rollout", Precision: "bf16", Batch1TokensPerSec: 25, AggregateTokensPerSec: 250, GreedyMatch: 8, GreedyTokens: 8},
		{Preset: "p", Engine: "llama.cpp", Precision: "q8_0", Batch1TokensPerSec: 20, AggregateTokensPerSec: 30, GreedyMatch: 8, GreedyTokens: 8},
	}}
	var out bytes.Buffer
	printPeerFigures(&out, rep, peerFlags{tokens: 8, seqs: 4}, kernels.F32, 3)
	s := out.String()
	assert.Contains(t, s, "medians of 3 rounds")
	assert.Regexp(t, `w8a8\s+30\.0\s+1\.50x q8_0\s+300\.0\s+10\.00x q8_0\s+8/8`, s)
	assert.Regexp(t, `bf16\s+25\.0\s+-\s+250\.0\s+-\s+8/8`, s, "no bf16 peer row: no ratio")
	assert.Regexp(t, `llama\.cpp\s+q8_0\s+20\.0\s+-\s+30\.0\s+-`, s)

	out.Reset()
	printPeerFigures(&out, rep, peerFlags{tokens: 8}, kernels.F32, 1)
	assert.NotContains(t, out.String(), "seqs tok/s", "batch 1 only")
	assert.Regexp(t, `w8a8\s+30\.0\s+1\.50x q8_0\s+8/8`, out.String())
}
