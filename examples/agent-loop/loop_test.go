package main

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/internal/fleettest"
	"github.com/rolloutkit/rollout/sdk/pipeline"
)

// TestMain checks for leaked goroutines after the tests and removes the rollout binary the
// multi-process test builds.
func TestMain(m *testing.M) {
	os.Exit(fleettest.Main(m))
}

func testConfig(t *testing.T) config {
	cfg, err := parseFlags([]string{"--steps", "4", "--groups", "3", "--group", "4", "--eval-every", "2",
		"--warmup-steps", "30", "--out", t.TempDir(), "--log-level", "error"})
	require.NoError(t, err)
	return cfg
}

func TestTaskScoring(t *testing.T) {
	tk := newTask(256, 257)
	require.Len(t, tk.HeldOut, heldOut)
	require.Len(t, tk.Train, numKeys-heldOut)
	for _, p := range tk.HeldOut {
		assert.False(t, slices.ContainsFunc(tk.Train, func(q problem) bool { return q.Key == p.Key }), "key %d is held out", p.Key)
	}
	p := tk.Train[0]
	call := []int{'@', '0' + p.Key/10, '0' + p.Key%10, 257}
	answer := []int{'0' + p.Value, 257}
	o := tk.score(p, call, answer)
	assert.True(t, o.Called && o.Success)
	assert.Equal(t, 2, o.KeyDigits)
	assert.InDelta(t, 1.0, o.reward(), 1e-12)

	// The right answer at once, without the tool: success without the call's credit.
	o = tk.score(p, answer, nil)
	assert.True(t, o.Success)
	assert.False(t, o.Called)
	assert.InDelta(t, rewardSuccess, o.reward(), 1e-12)

	// Malformed calls are answers, and wrong ones.
	for _, bad := range [][]int{{'@', '1', 257}, {'@', '1', '2', '3', 257}, {'@', 'x', '2', 257}, {'@', '1', '2'}, {}} {
		_, ok := tk.parseCall(bad)
		assert.False(t, ok, "%v", bad)
		assert.False(t, tk.score(p, bad, nil).Success)
	}
	// A call of the wrong key gets the other key's value: right only by chance.
	wrong := (p.Key + 11) % numKeys
	o = tk.score(p, []int{'@', '0' + wrong/10, '0' + wrong%10, 257}, answer)
	assert.Zero(t, o.KeyDigits)
}

func TestModelTurnsSplitByTheLossMask(t *testing.T) {
	tr := pipeline.Trajectory{Completion: []int{'@', '4', '7', 257, '=', '3', '\n', '3', 257},
		LossMask: []uint8{1, 1, 1, 1, 0, 0, 0, 1, 1}}
	assert.Equal(t, [][]int{{'@', '4', '7', 257}, {'3', 257}}, modelTurns(tr))
	assert.Equal(t, [][]int{{'5', 257}}, modelTurns(pipeline.Trajectory{Completion: []int{'5', 257}}))
}

// TestLoopEmbedded runs the loop on an embedded two-server fleet: the warm-started policy
// calls the tool in some episodes, every trajectory the trainer sees masks exactly the tool's
// tokens, batches stay within the staleness bound, and the outputs exist.
func TestLoopEmbedded(t *testing.T) {
	cfg := testConfig(t)
	sum, err := run(t.Context(), cfg, io.Discard)
	require.NoError(t, err)
	require.Len(t, sum.Records, cfg.Steps)
	toolUsed := 0.0
	for i, r := range sum.Records {
		assert.Equal(t, i+1, r.Step)
		assert.Equal(t, int64(cfg.WarmupSteps+i+1), r.Version)
		assert.LessOrEqual(t, r.MaxStaleness, cfg.Staleness, "step %d", r.Step)
		assert.Zero(t, r.Failed)
		toolUsed += r.ToolUse
		if r.ToolUse > 0 {
			assert.Positive(t, r.EnvTokens, "tool results are environment tokens")
		}
	}
	assert.Positive(t, toolUsed, "the warm-started policy calls the tool")
	require.NotNil(t, sum.Before)
	require.NotNil(t, sum.After)

	// eval.jsonl: a call's result is exactly the masked tokens, everything else the model's.
	f, err := os.Open(sum.EvalPath)
	require.NoError(t, err)
	defer f.Close()
	tk := newTask(256, 257)
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		var it evalItem
		require.NoError(t, json.Unmarshal(sc.Bytes(), &it))
		require.Len(t, it.LossMask, len(it.TranscriptTokenIDs))
		var env []int
		for j, m := range it.LossMask {
			if m == 0 {
				env = append(env, it.TranscriptTokenIDs[j])
			}
		}
		if it.Called {
			key, ok := tk.parseCall(it.TranscriptTokenIDs[:4])
			require.True(t, ok)
			assert.Equal(t, tk.toolResult(key), env)
		} else {
			assert.Empty(t, env)
		}
		n++
	}
	assert.Equal(t, heldOut, n)
	for _, path := range []string{sum.Checkpoint, sum.PlotPath, sum.LogPath} {
		_, err = os.Stat(path)
		assert.NoError(t, err, path)
	}
}

// TestLoopAgainstRolloutServeProcesses runs the loop against two `rollout serve` processes
// joined over a real redis-server.
func TestLoopAgainstRolloutServeProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test; skipped with -short")
	}
	f := fleettest.Start(t, fleettest.Options{Servers: 2, Fleet: "agent-loop"})
	cfg := testConfig(t)
	cfg.Steps = 2
	cfg.Redis, cfg.Fleet, cfg.Secret = f.Redis.URL(), f.Name, []byte(f.Secret)
	sum, err := run(t.Context(), cfg, io.Discard)
	require.NoError(t, err)
	require.Len(t, sum.Records, 2)
	for _, p := range f.Procs {
		hb := f.Heartbeat(p.ID)
		require.NotNil(t, hb)
		assert.EqualValues(t, cfg.WarmupSteps+cfg.Steps, hb.WeightVersion, "server %s serves the last version", p.ID)
	}
}

func TestBadConfig(t *testing.T) {
	for name, mut := range map[string]func(*config){
		"group of one":    func(c *config) { c.Group = 1 },
		"no groups":       func(c *config) { c.Groups = 0 },
		"negative bound":  func(c *config) { c.Staleness = -1 },
		"zero lr":         func(c *config) { c.LR = 0 },
		"redis, no fleet": func(c *config) { c.Redis = "redis://127.0.0.1:1" },
	} {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig(t)
			mut(&cfg)
			_, err := run(t.Context(), cfg, io.Discard)
			assert.Error(t, err)
		})
	}
}
