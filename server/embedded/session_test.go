package embedded_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/internal/enginetest"
	"github.com/rolloutkit/rollout/internal/redistest"
	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/server"
	"github.com/rolloutkit/rollout/server/embedded"
	"github.com/rolloutkit/rollout/trainer"
)

// systemPrompt is a prompt every session of a test shares: longer than the 16 tokens prompt
// affinity hashes, so without session keys every session would go to one server.
var systemPrompt = []int{1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71}

// checkSessionAffinity runs sessions of three turns sharing systemPrompt and checks that each
// stays on one server, that together they spread over the fleet, and that turn k+1 finds the
// transcript of turn k in its server's prefix cache.
func checkSessionAffinity(t *testing.T, c *sdk.Client, sessions int) {
	t.Helper()
	homes := map[string]int{}
	for k := range sessions {
		s, err := c.NewSession(systemPrompt, sdk.SessionOptions{ID: fmt.Sprintf("episode-%d", k),
			Sampling: sdk.SamplingParams{MaxTokens: 20, IgnoreEOS: true}})
		require.NoError(t, err)
		home := ""
		for turn := range 3 {
			tr, err := s.Generate(t.Context(), sdk.TurnOptions{})
			require.NoError(t, err)
			require.Len(t, tr.Sample.Servers, 1)
			if turn == 0 {
				home = tr.Sample.Servers[0]
			} else {
				require.Equal(t, home, tr.Sample.Servers[0], "session %s moved at turn %d", s.ID(), turn)
				// Every full block of the transcript before the environment tokens (the
				// previous turn's prompt and all but its last generated token) is cached.
				prev := tr.PromptTokens - 3 - 1
				assert.GreaterOrEqual(t, tr.Sample.NumCachedTokens, prev/16*16,
					"turn %d of %s reuses the previous turn's KV", turn, s.ID())
			}
			require.NoError(t, s.Append(7, 8, 9)) // a tool result
		}
		homes[home]++
		tj := s.Trajectory()
		require.Equal(t, 60, tj.ModelTokens)
		require.Len(t, tj.Completion, 69)
	}
	assert.Greater(t, len(homes), 1, "sessions sharing a system prompt spread over the fleet: %v", homes)

	// Plain Generate calls of that prompt all go to its one home server (prompt affinity).
	plain := map[string]bool{}
	for range 4 {
		res, err := c.Generate(t.Context(), sdk.GenerateRequest{PromptTokenIDs: systemPrompt, Sampling: sdk.SamplingParams{MaxTokens: 2}})
		require.NoError(t, err)
		plain[res.Servers[0]] = true
	}
	assert.Len(t, plain, 1)
}

func TestSessionAffinityAcrossTurns(t *testing.T) {
	_, c := startFleet(t, 3, nil)
	checkSessionAffinity(t, c, 8)
}

func TestSessionsOverRedis(t *testing.T) {
	srv := redistest.Start(t)
	rb, err := bus.DialRedis(t.Context(), srv.URL(), bus.RedisOptions{Logger: quiet})
	require.NoError(t, err)
	defer rb.Close()
	f, err := embedded.Start(t.Context(), embedded.Options{Servers: 3, Secret: secret, Bus: rb, Logger: quiet,
		Fleet: "session-fleet", Server: func(_ int, c *server.Config) { c.FleetHeartbeat = 100 * time.Millisecond }})
	require.NoError(t, err)
	defer func() { require.NoError(t, f.Close()) }()
	c, err := sdk.Dial(t.Context(), sdk.Options{RedisURL: srv.URL(), Fleet: "session-fleet", Secret: secret, Logger: quiet})
	require.NoError(t, err)
	defer c.Close()
	checkSessionAffinity(t, c, 8)
}

// TestSessionWeightUpdateMidEpisode updates the weights while a turn is being generated: the
// turn is continued on the new weights, every token records the version that sampled it, the
// episode goes on, and the trajectory trains on the reference trainer with its loss mask,
// the new version's tokens matching the trainer's logprobs of the same transcript.
func TestSessionWeightUpdateMidEpisode(t *testing.T) {
	g := &enginetest.Gate{}
	f, c := startFleet(t, 1, func(_ int, cfg *server.Config) { cfg.BeforeForward = g.Hook })
	g.Bind(f.Servers()[0].Engine())
	t.Cleanup(g.Open)
	const long = 1500
	s, err := c.NewSession(systemPrompt, sdk.SessionOptions{Sampling: sdk.SamplingParams{MaxTokens: 8, IgnoreEOS: true}})
	require.NoError(t, err)
	t0, err := s.Generate(t.Context(), sdk.TurnOptions{})
	require.NoError(t, err)
	require.NoError(t, s.Append(3, 4, 5))

	// Turn 1 is long; hold the loop once it is under way, then let the update's stage in,
	// hold again once the weights are staged (the turn still running), and let the commit's
	// pause in: the pause lands mid-turn however fast the machine is.
	g.HoldAfterTokens(g.Tokens() + 10)
	type result struct {
		turn *sdk.Turn
		err  error
	}
	turnDone := make(chan result, 1)
	go func() {
		p := sdk.SamplingParams{MaxTokens: long, IgnoreEOS: true}
		tr, err := s.Generate(t.Context(), sdk.TurnOptions{Sampling: &p})
		turnDone <- result{tr, err}
	}()
	g.WaitHeld(t)
	ref := fileRef(t, 1, 77)
	updDone := make(chan error, 1)
	go func() {
		_, err := c.UpdateWeights(t.Context(), ref, sdk.Plan{})
		updDone <- err
	}()
	g.WaitUntil(t, "the stage call queued", func(m engine.MetricsSnapshot) bool { return m.InputQueued > 0 })
	g.HoldWhen(func(m engine.MetricsSnapshot) bool { return m.StagedVersion >= 1 && m.Running > 0 })
	g.WaitUntil(t, "the commit's pause queued", func(m engine.MetricsSnapshot) bool { return m.InputQueued > 0 })
	g.Open()
	require.NoError(t, <-updDone)
	r := <-turnDone
	require.NoError(t, r.err)
	t1 := r.turn
	require.Len(t, t1.Sample.Tokens, long)
	assert.Equal(t, sdk.FinishLength, t1.Sample.FinishReason)
	assert.Positive(t, t1.Sample.Continuations, "the update aborted the turn and it was continued")
	vs := t1.Sample.WeightVersions()
	assert.Equal(t, int64(0), vs[0])
	assert.Equal(t, int64(1), vs[len(vs)-1])
	for i := 1; i < len(vs); i++ {
		require.GreaterOrEqual(t, vs[i], vs[i-1], "versions never go back within a turn")
	}
	require.NoError(t, s.Append(6))
	t2, err := s.Generate(t.Context(), sdk.TurnOptions{})
	require.NoError(t, err)
	for _, v := range t2.Sample.WeightVersions() {
		require.Equal(t, int64(1), v)
	}

	// The trajectory: versions per token, the mask over the environment tokens.
	tj := s.Trajectory()
	require.Equal(t, len(t0.Sample.Tokens)+len(t1.Sample.Tokens)+len(t2.Sample.Tokens), tj.ModelTokens)
	require.Len(t, tj.Completion, tj.ModelTokens+4)
	off := len(t0.Sample.Tokens)
	assert.Equal(t, []uint8{0, 0, 0}, tj.LossMask[off:off+3])
	assert.Equal(t, vs, tj.Versions[off+3:off+3+long])
	for i, v := range tj.Versions[:off] {
		require.Equal(t, int64(0), v, "turn 0 token %d", i)
	}

	// Train on it: the trainer holds the new weights (version 1). Its logprobs of the
	// version-1 tokens, recomputed on the token-id transcript, match the servers' (nothing was
	// re-tokenized); the version-0 tokens are off-policy.
	w, err := model.Preset("tiny", 77)
	require.NoError(t, err)
	tr, err := trainer.New(w, trainer.Config{Workers: 1, Version: 1})
	require.NoError(t, err)
	defer tr.Close()
	sample := func(reward float64) trainer.Sample {
		return trainer.Sample{Prompt: tj.Prompt, Completion: tj.Completion, Logprobs: tj.Logprobs, Versions: tj.Versions,
			LossMask: tj.LossMask, Reward: reward}
	}
	st, err := tr.Step(t.Context(), []trainer.Sample{sample(1), sample(0)})
	require.NoError(t, err)
	assert.Equal(t, 2*tj.ModelTokens, st.Tokens)
	stale := 0
	for _, v := range tj.Versions {
		if v == 0 {
			stale++
		}
	}
	stale -= 4 // the environment tokens' zero versions are not tokens trained on
	assert.Equal(t, 2*stale, st.StaleTokens)
	assert.Positive(t, st.OnPolicyTokens)
	assert.Less(t, st.MismatchMax, 1e-3, "the servers' logprobs of the transcript are the trainer's")
	for _, lp := range tj.Logprobs {
		require.False(t, math.IsNaN(float64(lp)))
	}
}
