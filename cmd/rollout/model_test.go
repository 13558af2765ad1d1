package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
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

// TestBenchDecodePairsBandwidth: batch-1 decode runs in rounds of every precision, each run
// beside a bandwidth probe of its own; a row's ratio is the median of its runs' ratios (not the
// median rate over the report's one probe), and "vs f32" the median of each round's ratio to
// that round's f32 run.
func TestBenchDecodePairsBandwidth(t *testing.T) {
	args := []string{"bench", "engine", "--quick", "--presets", "tiny", "--precision", "f32,bf16", "--tokens", "4", "--repeats", "3",
		"--bandwidth-bytes", "1048576", "--json"}
	var o, e bytes.Buffer
	require.Equal(t, 0, run(t.Context(), args, &o, &e), "%s", e.String())
	var rep bench.EngineReport
	require.NoError(t, json.Unmarshal(o.Bytes(), &rep))
	require.Len(t, rep.Decode, 2)
	for _, d := range rep.Decode {
		require.Len(t, d.Runs, 3)
		require.Len(t, d.BandwidthRuns, 3)
		ratios := make([]float64, 3)
		for i, bw := range d.BandwidthRuns {
			require.Positive(t, bw)
			ratios[i] = d.Runs[i] * float64(d.WeightBytes) / 1e9 / bw
		}
		require.InDelta(t, bench.Median(ratios), d.BandwidthRatio, 1e-12*bench.Median(ratios))
	}
	f32, bf16 := rep.Decode[0], rep.Decode[1]
	require.Equal(t, "f32", f32.Precision)
	require.InDelta(t, 1, f32.VsF32, 1e-12)
	want := bench.Median([]float64{bf16.Runs[0] / f32.Runs[0], bf16.Runs[1] / f32.Runs[1], bf16.Runs[2] / f32.Runs[2]})
	require.InDelta(t, want, bf16.VsF32, 1e-12*want)
	// The progress lines: f32 and bf16 alternate, round by round.
	var order []string
	for _, l := range strings.Split(e.String(), "\n") {
		if i := strings.Index(l, "batch-1 decode, tiny at "); i >= 0 {
			order = append(order, strings.Fields(l[i+len("batch-1 decode, tiny at "):])[0])
		}
	}
	require.Equal(t, []string{"f32,", "bf16,", "f32,", "bf16,", "f32,", "bf16,"}, order, "%s", e.String())
}
