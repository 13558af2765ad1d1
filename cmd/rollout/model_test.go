package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"testing"

	parser "github.com/gpustack/gguf-parser-go"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/bench"
)

// TestModelGGUF: `model init --format gguf` and `model export` write files an independent
// GGUF reader accepts, with the architecture, type and vocabulary asked for.
func TestModelGGUF(t *testing.T) {
	dir := t.TempDir()
	runOK(t, "model", "init", "--preset", "tiny", "--format", "gguf", "--type", "q8_0", "--out", dir)
	gf, err := parser.ParseGGUFFile(filepath.Join(dir, GGUFFile))
	require.NoError(t, err)
	require.Equal(t, "llama", gf.Architecture().Architecture)
	ft, ok := gf.Header.MetadataKV.Get("general.file_type")
	require.True(t, ok)
	require.EqualValues(t, 7, ft.ValueUint32(), "MOSTLY_Q8_0")
	require.EqualValues(t, 259, gf.Tokenizer().TokensLength)

	// A trained checkpoint is an HF directory: export reads it with its tokenizer.json.
	hf := filepath.Join(dir, "hf")
	runOK(t, "model", "init", "--preset", "stories15m", "--out", hf)
	out := filepath.Join(dir, "s.gguf")
	runOK(t, "model", "export", "--model", hf, "--type", "f16", "--out", out)
	gf, err = parser.ParseGGUFFile(out)
	require.NoError(t, err)
	require.EqualValues(t, 6, gf.Architecture().BlockCount)
	require.Equal(t, "gpt2", gf.Tokenizer().Model)
	require.EqualValues(t, 32000, gf.Tokenizer().TokensLength)

	for _, args := range [][]string{
		{"model", "export", "--model", hf, "--type", "q4_0", "--out", out},
		{"model", "export", "--model", hf, "--format", "onnx", "--out", out},
		{"model", "export", "--model", hf},
		{"model", "export", "--model", filepath.Join(dir, "missing"), "--out", out},
		{"model", "init", "--preset", "tiny", "--format", "gguf", "--type", "int4", "--out", dir},
	} {
		var o, e bytes.Buffer
		require.NotEqual(t, 0, run(t.Context(), args, &o, &e), "%v", args)
		require.NotEmpty(t, e.String(), "%v", args)
	}
}

// TestBenchPeerRefusals: a peer that is not installed, or not known, fails the command with
// a message naming what to do, before any figure is measured with it.
func TestBenchPeerRefusals(t *testing.T) {
	base := []string{"bench", "engine", "--quick", "--presets", "tiny", "--tokens", "4", "--repeats", "1", "--bandwidth-bytes", "1048576"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--peer", "llamacpp", "--peer-module", filepath.Join(t.TempDir(), "none")}, "npm install"},
		{[]string{"--peer", "vllm"}, "want llamacpp"},
		{[]string{"--peer", "llamacpp", "--peer-types", "q4_k"}, "q4_k"},
	} {
		var o, e bytes.Buffer
		require.NotEqual(t, 0, run(t.Context(), append(base, c.args...), &o, &e), "%v", c.args)
		require.Contains(t, e.String(), c.want, "%v", c.args)
	}
}

// TestBenchDecodePairsBandwidth: each batch-1 repeat is measured beside a bandwidth probe of its
// own, and the row's ratio is the median of the runs' ratios, not the median rate over the
// report's one probe.
func TestBenchDecodePairsBandwidth(t *testing.T) {
	args := []string{"bench", "engine", "--quick", "--presets", "tiny", "--tokens", "4", "--repeats", "3", "--bandwidth-bytes", "1048576", "--json"}
	var o, e bytes.Buffer
	require.Equal(t, 0, run(t.Context(), args, &o, &e), "%s", e.String())
	var rep bench.EngineReport
	require.NoError(t, json.Unmarshal(o.Bytes(), &rep))
	require.Len(t, rep.Decode, 1)
	d := rep.Decode[0]
	require.Len(t, d.Runs, 3)
	require.Len(t, d.BandwidthRuns, 3)
	ratios := make([]float64, 3)
	for i, bw := range d.BandwidthRuns {
		require.Positive(t, bw)
		ratios[i] = d.Runs[i] * float64(d.WeightBytes) / 1e9 / bw
	}
	require.InDelta(t, bench.Median(ratios), d.BandwidthRatio, 1e-12*bench.Median(ratios))
}
