package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestProgressPlainLines(t *testing.T) {
	var b bytes.Buffer
	p := newProgress(&b, "bench x", 2)
	require.Nil(t, p.bar, "no bar when the writer is not a terminal")
	p.step("first %d", 1)
	p.step("second")
	p.done()
	assert.Equal(t, "bench x [1/2]: first 1\nbench x [2/2]: second\n", b.String())
}

// TestBenchEngineProgress runs a small full bench engine: stderr says each step once, in a
// count that ends at the total (so engineSteps matches the step calls), and stdout holds
// only the JSON report.
func TestBenchEngineProgress(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a small benchmark (seconds)")
	}
	for _, quick := range []bool{true, false} {
		args := []string{"bench", "engine", "--json", "--presets", "stories15m", "--tokens", "4", "--repeats", "2",
			"--bandwidth-bytes", "1048576", "--matmul-batch", "4", "--concurrency", "1,2", "--concurrent-tokens", "2", "--idle", "10ms", "--precision", "f32,int8-dot"}
		if quick {
			args = append(args, "--quick")
		}
		var out, errb bytes.Buffer
		require.Equal(t, 0, run(t.Context(), args, &out, &errb), errb.String())
		var rep map[string]any
		require.NoError(t, json.Unmarshal(out.Bytes(), &rep), "stdout is the JSON report alone")
		lines := strings.Split(strings.TrimSpace(errb.String()), "\n")
		total := engineSteps(1, 2, 2, quick, true)
		require.Len(t, lines, total, errb.String())
		for i, l := range lines {
			assert.True(t, strings.HasPrefix(l, fmt.Sprintf("bench engine [%d/%d]: ", i+1, total)), l)
		}
		assert.Contains(t, lines[len(lines)-1], map[bool]string{true: "batch-1 decode", false: "idle engine CPU"}[quick])
		var precs []string
		for _, d := range rep["decode"].([]any) {
			precs = append(precs, d.(map[string]any)["precision"].(string))
		}
		assert.Equal(t, []string{"f32", "w8a8"}, precs, "one decode figure per precision (int8-dot is w8a8)")
	}
}
