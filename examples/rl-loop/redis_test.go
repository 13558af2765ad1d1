package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/internal/fleettest"
	"github.com/rolloutkit/rollout/sdk/protocol"
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
	cfg.Redis.URL, cfg.Fleet, cfg.Secret = f.Redis.URL(), f.Name, []byte(f.Secret)
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

// TestLoopLikeCompose runs the loop as docker-compose.yml does: the servers require an API
// key, take weights only from file:// sources under --weights-root (the loop's run directory,
// which compose shares with them read-only) and have no peer route, so no fetch needs a
// private address; the loop reads the key and the fleet secret from files and publishes
// file:// refs. A second run with --resume continues the fleet's versions (compose restarts
// the loop when a run ends), and a server restarted while no loop runs converges to the
// fleet's version from the files on its own.
func TestLoopLikeCompose(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test; skipped with -short")
	}
	out, secrets := t.TempDir(), t.TempDir()
	keyFile := filepath.Join(secrets, "api_key")
	require.NoError(t, os.WriteFile(keyFile, []byte("compose-test-api-key\n"), 0o600))
	f := fleettest.Start(t, fleettest.Options{Servers: 2, Fleet: "rl-loop-compose", Args: []string{"--offload-cpu-bytes", "16MiB",
		"--api-key-file", keyFile, "--weights-root", filepath.Join(out, "weights"), "--no-peers"}})
	secretFile := filepath.Join(secrets, "fleet_secret")
	require.NoError(t, os.WriteFile(secretFile, []byte(f.Secret), 0o600))
	args := []string{"--steps", "2", "--prompts", "2", "--group", "4", "--max-tokens", "6", "--warmup-steps", "0", "--out", out, "--log-level", "error",
		"--redis", f.Redis.URL(), "--fleet", f.Name, "--fleet-secret-file", secretFile, "--api-key-file", keyFile,
		"--store-url", "file://" + filepath.Join(out, "weights"), "--resume"}

	for pass, firstStep := range []int{1, 3} {
		cfg, err := parseFlags(args)
		require.NoError(t, err)
		sum, err := run(t.Context(), cfg, devNull(t))
		require.NoError(t, err, "run %d", pass+1)
		require.Len(t, sum.Records, 2)
		require.Equal(t, firstStep, sum.Records[0].Step, "run %d starts where the checkpoint left off", pass+1)
		require.Equal(t, 2, sum.Updates)
		require.Zero(t, sum.Violations)
	}
	for _, p := range f.Procs {
		require.EqualValues(t, 4, f.Heartbeat(p.ID).WeightVersion, "server %s", p.ID)
	}

	p := f.Procs[0]
	p.Kill()
	p.Start()
	f.WaitFor(p, 60*time.Second, "back on version 4 and in rotation", func(hb *protocol.Heartbeat) bool {
		return hb != nil && hb.WeightVersion == 4 && hb.InRotation
	})
}

// TestAPIKeyFile: the key is read from the file without its newline, and an empty file is
// refused rather than sending requests the servers would refuse.
func TestAPIKeyFile(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "key")
	require.NoError(t, os.WriteFile(key, []byte("k-123\n"), 0o600))
	cfg, err := parseFlags([]string{"--api-key-file", key})
	require.NoError(t, err)
	require.Equal(t, "k-123", cfg.APIKey)

	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, []byte("\n"), 0o600))
	_, err = parseFlags([]string{"--api-key-file", empty})
	require.ErrorContains(t, err, "empty")
	_, err = parseFlags([]string{"--api-key-file", filepath.Join(dir, "missing")})
	require.Error(t, err)
}

// TestSecondRunOnARunningFleet (issue 25, case 12): a fresh run on a fleet another run left
// at version N stops with a message naming the choices; with --fleet-start reset it publishes
// its own weights as N+1 and trains from there; with --fleet-start adopt it trains on from
// the fleet's checkpoint at N.
func TestSecondRunOnARunningFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test; skipped with -short")
	}
	// Each run's --out is under one directory the servers read file:// weights from, so a
	// run's checkpoints stay fetchable after it ends (adopt loads the fleet's from there).
	root := t.TempDir()
	f := fleettest.Start(t, fleettest.Options{Servers: 2, Fleet: "rl-loop-second",
		Args: []string{"--offload-cpu-bytes", "16MiB", "--weights-root", root}})
	cfg := func(name, start string) config {
		c := testConfig(t)
		c.Redis.URL, c.Fleet, c.Secret = f.Redis.URL(), f.Name, []byte(f.Secret)
		c.Out = filepath.Join(root, name)
		c.StoreURL = "file://" + filepath.Join(c.Out, "weights")
		c.FleetStart = start
		return c
	}
	versions := func() []int64 {
		var vs []int64
		for _, p := range f.Procs {
			vs = append(vs, f.Heartbeat(p.ID).WeightVersion)
		}
		return vs
	}
	first := cfg("first", FleetStartFail)
	_, err := run(t.Context(), first, devNull(t))
	require.NoError(t, err)
	n := int64(first.Steps)

	_, err = run(t.Context(), cfg("second", FleetStartFail), devNull(t))
	require.Error(t, err, "a fresh run does not silently fight the fleet's versions")
	require.Contains(t, err.Error(), "--fleet-start reset")
	require.Contains(t, err.Error(), "--fleet-start adopt")

	second := cfg("second", FleetStartReset)
	sum, err := run(t.Context(), second, devNull(t))
	require.NoError(t, err)
	require.Zero(t, sum.Violations)
	afterReset := n + 1 + int64(second.Steps)
	require.Equal(t, []int64{afterReset, afterReset}, versions(), "reset: its weights as version %d, then its steps", n+1)

	third := cfg("third", FleetStartAdopt)
	sum, err = run(t.Context(), third, devNull(t))
	require.NoError(t, err)
	require.Zero(t, sum.Violations)
	require.Equal(t, []int64{afterReset + int64(third.Steps), afterReset + int64(third.Steps)}, versions(), "adopt: on from the fleet's version")
}
