package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/internal/fleettest"
)

// TestLoopAgainstRolloutServeProcesses runs the same loop against two `rollout serve`
// processes joined over a real redis-server: the SDK dials Redis, generation goes over HTTP to
// the servers, weights come from the loop's store over HTTP, and each step's update commits on
// both.
func TestLoopAgainstRolloutServeProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test; skipped with -short")
	}
	f := fleettest.Start(t, fleettest.Options{Servers: 2, Fleet: "rl-loop", Args: []string{"--offload-cpu-bytes", "16MiB"}})
	cfg := testConfig(t)
	cfg.Redis, cfg.Fleet, cfg.Secret = f.Redis.URL(), f.Name, []byte(f.Secret)
	sum, err := run(t.Context(), cfg, devNull(t))
	require.NoError(t, err)
	require.Len(t, sum.Records, cfg.Steps)
	require.Equal(t, cfg.Steps, sum.Updates)
	require.Zero(t, sum.Violations)
	for _, p := range f.Procs {
		hb := f.Heartbeat(p.ID)
		require.NotNil(t, hb)
		require.EqualValues(t, cfg.Steps, hb.WeightVersion, "server %s serves the last version", p.ID)
	}
}
