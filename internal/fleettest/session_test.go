package fleettest_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/internal/fleettest"
	"github.com/rolloutkit/rollout/sdk"
)

// TestSessionsAcrossProcesses: three `rollout serve` processes over redis-server. Sessions
// sharing a system prompt spread over the servers and keep one server per session, each turn
// finding the previous turns' KV in that server's prefix cache; a weight update between two
// turns moves the episode to the new version on the same server, every token recording its
// version, and the trajectory's loss mask covers only the model's tokens.
func TestSessionsAcrossProcesses(t *testing.T) {
	skipShort(t)
	f := fleettest.Start(t, fleettest.Options{Servers: 3, Fleet: "sessions"})
	c := dial(t, f)
	system := make([]int, 40)
	for i := range system {
		system[i] = 10 + i
	}
	const turns = 3
	var sessions []*sdk.Session
	homes := map[string]string{}
	spread := map[string]int{}
	run := func(s *sdk.Session, version int64) {
		tr, err := s.Generate(t.Context(), sdk.TurnOptions{})
		require.NoError(t, err)
		require.Len(t, tr.Sample.Servers, 1)
		if home, ok := homes[s.ID()]; ok {
			require.Equal(t, home, tr.Sample.Servers[0], "session %s moved at turn %d", s.ID(), tr.Index)
			if version == 0 {
				// (An update clears the cache: the old weights' KV is not the new ones'.)
				// Every full block of the previous turn's transcript (its prompt and all but
				// its last generated token) is cached.
				assert.GreaterOrEqual(t, tr.Sample.NumCachedTokens, (tr.PromptTokens-3-1)/16*16, "turn %d of %s", tr.Index, s.ID())
			}
		}
		homes[s.ID()] = tr.Sample.Servers[0]
		for _, v := range tr.Sample.WeightVersions() {
			require.Equal(t, version, v)
		}
		require.NoError(t, s.Append(1, 2, 3))
	}
	for k := range 9 {
		s, err := c.NewSession(system, sdk.SessionOptions{ID: fmt.Sprintf("ep-%d", k), Sampling: sdk.SamplingParams{MaxTokens: 12, IgnoreEOS: true}})
		require.NoError(t, err)
		sessions = append(sessions, s)
		for range turns - 1 {
			run(s, 0)
		}
		spread[homes[s.ID()]]++
	}
	assert.Greater(t, len(spread), 1, "sessions spread over the fleet: %v", spread)

	res, err := c.UpdateWeights(t.Context(), fileRef(t, 1, 21), sdk.Plan{})
	require.NoError(t, err)
	require.Equal(t, sdk.OutcomeCommitted, res.Outcome)
	waitVersion(t, f, 1)
	for _, s := range sessions {
		run(s, 1)
		tj := s.Trajectory()
		require.Equal(t, turns*12, tj.ModelTokens)
		require.Len(t, tj.Completion, turns*15)
		for i, m := range tj.LossMask {
			turnPos := i % 15
			if turnPos >= 12 {
				require.Zero(t, m, "environment token %d", i)
				continue
			}
			require.Equal(t, uint8(1), m, "model token %d", i)
			require.Equal(t, int64(i/15/(turns-1)), tj.Versions[i], "token %d's version", i)
		}
	}
}
