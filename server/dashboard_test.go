package server_test

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/server"
)

// TestDashboardQueriesExportedMetrics: every metric the provisioned Grafana dashboard queries
// is one a server with offloading exports, so a renamed metric cannot leave a panel empty.
func TestDashboardQueriesExportedMetrics(t *testing.T) {
	raw, err := os.ReadFile("../deploy/grafana/dashboards/rollout.json")
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	require.NotEmpty(t, dash.Panels)

	m := start(t, func(c *server.Config) { c.OffloadCPUBytes = 64 << 20 }).metrics(t)
	name := regexp.MustCompile(`rollout_[a-z0-9_]+`)
	for _, p := range dash.Panels {
		require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
		for _, tg := range p.Targets {
			for _, metric := range name.FindAllString(tg.Expr, -1) {
				for _, suffix := range []string{"_bucket", "_count", "_sum"} {
					metric = strings.TrimSuffix(metric, suffix)
				}
				assert.True(t, strings.Contains(m, "\n# TYPE "+metric+" "), "panel %q queries %s, which the server does not export", p.Title, metric)
			}
		}
	}
}
