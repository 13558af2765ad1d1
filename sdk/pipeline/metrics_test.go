package pipeline_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/sdk/pipeline"
)

// TestMetricsAreDocumented: every metric the pipeline registers is listed in
// docs/metrics.md, and registering twice on one registry is an error, not a panic.
func TestMetricsAreDocumented(t *testing.T) {
	reg := prometheus.NewRegistry()
	_, err := pipeline.NewMetrics(reg)
	require.NoError(t, err)
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "metrics.md"))
	require.NoError(t, err)
	fams, err := reg.Gather()
	require.NoError(t, err)
	require.NotEmpty(t, fams)
	for _, f := range fams {
		assert.True(t, strings.Contains(string(doc), "`"+f.GetName()), "%s is not in docs/metrics.md", f.GetName())
	}
	_, err = pipeline.NewMetrics(reg)
	assert.Error(t, err)
}
