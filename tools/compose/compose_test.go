package compose

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"
)

func load(t *testing.T) *types.Project {
	t.Helper()
	path, err := filepath.Abs(filepath.Join("..", "..", "docker-compose.yml"))
	require.NoError(t, err)
	opts, err := cli.NewProjectOptions([]string{path}, cli.WithWorkingDirectory(filepath.Dir(path)), cli.WithName("rollout"))
	require.NoError(t, err)
	p, err := opts.LoadProject(context.Background())
	require.NoError(t, err, "compose rejects docker-compose.yml")
	return p
}

func TestComposeServices(t *testing.T) {
	p := load(t)
	want := []string{"redis", "jaeger", "rollout-1", "rollout-2", "rl-loop", "prometheus", "grafana"}
	got := p.ServiceNames()
	for _, s := range want {
		require.Contains(t, got, s)
	}
	published := map[string][]string{}
	for _, name := range got {
		svc := p.Services[name]
		for _, port := range svc.Ports {
			published[name] = append(published[name], port.Published)
		}
	}
	require.Contains(t, published["jaeger"], "16686", "the Jaeger UI")
	require.Contains(t, published["grafana"], "3000")
	require.Contains(t, published["prometheus"], "9090")
	require.Contains(t, published["redis"], "6379")

	for _, name := range []string{"redis", "rollout-1", "rollout-2", "rl-loop", "prometheus", "grafana"} {
		hc := p.Services[name].HealthCheck
		require.NotNil(t, hc, "%s has no health check", name)
		require.NotEmpty(t, hc.Test, "%s", name)
	}
	for _, name := range []string{"rollout-1", "rollout-2"} {
		svc := p.Services[name]
		require.NotNil(t, svc.Build, "%s is built from the Dockerfile", name)
		require.Contains(t, svc.DependsOn, "redis")
		require.Equal(t, types.ServiceConditionHealthy, svc.DependsOn["redis"].Condition)
		cmd := []string(svc.Command)
		for _, flag := range []string{"--redis", "--fleet", "--fleet-secret-file", "--otel", "--advertise-url"} {
			require.True(t, slices.Contains(cmd, flag), "%s: command lacks %s: %v", name, flag, cmd)
		}
		require.Equal(t, "http://jaeger:4318", *svc.Environment["OTEL_EXPORTER_OTLP_ENDPOINT"])
	}
	loop := p.Services["rl-loop"]
	require.Equal(t, types.ServiceConditionHealthy, loop.DependsOn["rollout-1"].Condition)
	require.Equal(t, types.ServiceConditionHealthy, loop.DependsOn["rollout-2"].Condition)
}
