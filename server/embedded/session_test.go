package embedded_test

import (
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/weights"
	"github.com/rolloutkit/rollout/internal/enginetest"
	"github.com/rolloutkit/rollout/internal/redistest"
	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/bus/redisconf"
	"github.com/rolloutkit/rollout/sdk/toolcall"
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
	c, err := sdk.Dial(t.Context(), sdk.Options{Redis: redisconf.Config{URL: srv.URL()}, Fleet: "session-fleet", Secret: secret, Logger: quiet})
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
	assert.Less(t, st.MismatchMax, 1e-4, "the servers' logprobs of the transcript are the trainer's")
	for _, lp := range tj.Logprobs {
		require.False(t, math.IsNaN(float64(lp)))
	}
}

// The tool episode the tests teach the tiny model: a malformed call, an error message from
// the environment, a well-formed call, the tool's result, the answer.
const (
	episodeQuestion  = "What is 2+3?"
	episodeBadCall   = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2,</tool_call>"
	episodeCallError = "\n<|im_start|>user\n<tool_response>\nerror: malformed call\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
	episodeCall      = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}\n</tool_call>"
	episodeResult    = "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
	episodeAnswer    = "The answer is 5."
)

func episodeTools() []sdk.Tool {
	return []sdk.Tool{{Type: "function", Function: sdk.ToolFunction{Name: "add", Description: "Add two integers.",
		Parameters: json.RawMessage(`{"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}`)}}}
}

// byteTurn is a model turn's ids in the tiny model's byte vocabulary, EOS included.
func byteTurn(s string) []int {
	out := make([]int, len(s))
	for i := range len(s) {
		out[i] = int(s[i])
	}
	return append(out, model.TinyEOS)
}

// teachEpisode fine-tunes the served model (builtin:tiny, seed 1) on the episode, with the
// prompt and environment tokens the fleet itself renders, and returns a ref to the result.
func teachEpisode(t *testing.T, c *sdk.Client) (sdk.WeightsRef, *trainer.Trainer) {
	t.Helper()
	ctx := t.Context()
	prompt, err := c.Tokenize(ctx, sdk.TokenizeRequest{Messages: []sdk.ChatMessage{{Role: "user", Content: episodeQuestion}}, Tools: episodeTools()})
	require.NoError(t, err)
	env := func(s string) []int {
		if s == "" {
			return nil
		}
		ids, err := c.Tokenize(ctx, sdk.TokenizeRequest{Text: s, NoSpecialTokens: true})
		require.NoError(t, err)
		return ids
	}
	transcript := slices.Clone(prompt)
	var ex []trainer.Example
	for _, step := range [][2]string{{episodeBadCall, episodeCallError}, {episodeCall, episodeResult}, {episodeAnswer, ""}} {
		ex = append(ex, trainer.Example{Prompt: slices.Clone(transcript), Completion: byteTurn(step[0])})
		transcript = append(append(transcript, byteTurn(step[0])...), env(step[1])...)
	}
	w, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	tr, err := trainer.New(w, trainer.Config{LR: 3e-3, Workers: 2, MaxGradNorm: 1})
	require.NoError(t, err)
	t.Cleanup(tr.Close)
	for step := 0; ; step++ {
		st, err := tr.SupervisedStep(ctx, ex)
		require.NoError(t, err)
		// The summed NLL below 0.3 puts every target token above probability 0.74: greedy
		// decoding then emits exactly the targets.
		if st.Loss*float64(st.Tokens) < 0.3 {
			break
		}
		require.Less(t, step, 1500, "the tiny model did not learn the episode (loss %.4f)", st.Loss)
	}
	dir := filepath.Join(t.TempDir(), "taught")
	require.NoError(t, weights.SaveHF(dir, tr.Weights(), weights.F32))
	d, err := weights.Digest(ctx, dir)
	require.NoError(t, err)
	return sdk.WeightsRef{Version: tr.Version(), URI: "file://" + dir, SHA256: d}, tr
}

// runEpisode moves the fleet to the taught weights and plays the episode as a session: the
// first prompt rendered by the fleet from messages and tools, each turn's calls parsed through
// the fleet's detokenizer (the malformed one as an ErrMalformed error), environment text
// appended as tokens of its own, every turn on one server reusing the previous turn's KV, and
// a trajectory that trains with its loss mask over exactly the model's tokens.
func runEpisode(t *testing.T, c *sdk.Client, ref sdk.WeightsRef, tr *trainer.Trainer) {
	t.Helper()
	ctx := t.Context()
	_, err := c.UpdateWeights(ctx, ref, sdk.Plan{})
	require.NoError(t, err)
	prompt, err := c.Tokenize(ctx, sdk.TokenizeRequest{Messages: []sdk.ChatMessage{{Role: "user", Content: episodeQuestion}}, Tools: episodeTools()})
	require.NoError(t, err)
	// Greedy turns, with raw logprobs (a greedy token's processed logprob is 0): the
	// trainer's zero Sampling recomputes raw ones.
	s, err := c.NewSession(prompt, sdk.SessionOptions{Sampling: sdk.SamplingParams{Greedy: true, MaxTokens: 120, LogprobMode: sdk.LogprobRaw},
		MinVersion: ref.Version, Decode: c.Detokenize, ToolFormat: toolcall.Hermes})
	require.NoError(t, err)

	bad, err := s.Generate(ctx, sdk.TurnOptions{})
	require.NoError(t, err)
	require.Equal(t, episodeBadCall, bad.Text)
	require.ErrorIs(t, bad.ToolCallError, toolcall.ErrMalformed)
	assert.Empty(t, bad.ToolCalls)
	assert.Equal(t, episodeBadCall, bad.Content)
	require.NoError(t, s.AppendText(ctx, episodeCallError))

	good, err := s.Generate(ctx, sdk.TurnOptions{})
	require.NoError(t, err)
	require.NoError(t, good.ToolCallError)
	require.Len(t, good.ToolCalls, 1, "turn text %q", good.Text)
	assert.Equal(t, "add", good.ToolCalls[0].Name)
	assert.JSONEq(t, `{"a": 2, "b": 3}`, string(good.ToolCalls[0].Arguments))
	assert.Equal(t, sdk.FinishStop, good.Sample.FinishReason)
	require.NoError(t, s.AppendText(ctx, episodeResult))

	last, err := s.Generate(ctx, sdk.TurnOptions{})
	require.NoError(t, err)
	assert.Equal(t, episodeAnswer, last.Text)
	assert.Empty(t, last.ToolCalls)
	for env, turn := range map[string]*sdk.Turn{episodeCallError: good, episodeResult: last} {
		assert.Equal(t, bad.Sample.Servers, turn.Sample.Servers, "every turn on the session's server")
		// Every full block before the environment text (all but the previous turn's last
		// token, whose KV was never computed) is cached.
		assert.GreaterOrEqual(t, turn.Sample.NumCachedTokens, (turn.PromptTokens-len(env)-1)/16*16, "turn %d reuses the KV before it", turn.Index)
	}

	tj := s.Trajectory()
	require.Equal(t, prompt, tj.Prompt)
	var mask []uint8
	for _, step := range [][2]string{{episodeBadCall, episodeCallError}, {episodeCall, episodeResult}, {episodeAnswer, ""}} {
		mask = append(append(mask, ones(len(step[0])+1)...), make([]uint8, len(step[1]))...)
	}
	require.Equal(t, mask, tj.LossMask, "model tokens 1, environment tokens 0")
	for i, m := range tj.LossMask {
		if m == 1 {
			require.Equal(t, ref.Version, tj.Versions[i])
		}
	}
	sample := func(r float64) trainer.Sample {
		return trainer.Sample{Prompt: tj.Prompt, Completion: tj.Completion, Logprobs: tj.Logprobs, Versions: tj.Versions, LossMask: tj.LossMask, Reward: r}
	}
	probe, err := trainer.New(tr.Weights(), trainer.Config{Workers: 1, Version: tr.Version()})
	require.NoError(t, err)
	defer probe.Close()
	st, err := probe.Step(ctx, []trainer.Sample{sample(1), sample(0)})
	require.NoError(t, err)
	assert.Equal(t, 2*tj.ModelTokens, st.Tokens)
	assert.Equal(t, 2*tj.ModelTokens, st.OnPolicyTokens)
	assert.Less(t, st.MismatchMax, 1e-4, "the fleet's logprobs of the transcript are the trainer's")
}

// TestSessionToolEpisode plays a taught tool-using episode (malformed call included) as a
// session on an in-process fleet and on one whose bus is a real redis-server.
func TestSessionToolEpisode(t *testing.T) {
	_, c := startFleet(t, 2, nil)
	ref, tr := teachEpisode(t, c)
	t.Run("memory bus", func(t *testing.T) { runEpisode(t, c, ref, tr) })
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		rb, err := bus.DialRedis(t.Context(), srv.URL(), bus.RedisOptions{Logger: quiet})
		require.NoError(t, err)
		defer rb.Close()
		f, err := embedded.Start(t.Context(), embedded.Options{Servers: 2, Secret: secret, Bus: rb, Logger: quiet,
			Fleet: "episode-fleet", Server: func(_ int, c *server.Config) { c.FleetHeartbeat = 100 * time.Millisecond }})
		require.NoError(t, err)
		defer func() { require.NoError(t, f.Close()) }()
		rc, err := sdk.Dial(t.Context(), sdk.Options{Redis: redisconf.Config{URL: srv.URL()}, Fleet: "episode-fleet", Secret: secret, Logger: quiet})
		require.NoError(t, err)
		defer rc.Close()
		runEpisode(t, rc, ref, tr)
	})
}

func ones(n int) []uint8 {
	out := make([]uint8, n)
	for i := range out {
		out[i] = 1
	}
	return out
}

// TestSessionsAcrossAnUpdate: twelve concurrent episodes on three servers while the fleet moves
// to new weights. Every episode runs two turns on version 0, a third while the update is in
// flight (its tokens on version 0 then 1, never back), and a fourth after it, all on version
// 1. Every turn of an episode runs on its home server (a server being committed to keeps
// taking its sessions' turns), and no episode fails.
func TestSessionsAcrossAnUpdate(t *testing.T) {
	_, c := startFleet(t, 3, nil)
	const episodes = 12
	type episode struct {
		s     *sdk.Session
		turns []*sdk.Turn
		err   error
	}
	eps := make([]*episode, episodes)
	for i := range eps {
		s, err := c.NewSession(systemPrompt, sdk.SessionOptions{ID: fmt.Sprintf("update-ep-%d", i),
			Sampling: sdk.SamplingParams{MaxTokens: 48, IgnoreEOS: true}})
		require.NoError(t, err)
		eps[i] = &episode{s: s}
	}
	turn := func(e *episode) bool {
		tr, err := e.s.Generate(t.Context(), sdk.TurnOptions{})
		if err != nil {
			e.err = err
			return false
		}
		e.turns = append(e.turns, tr)
		return e.s.Append(7, 8, 9) == nil
	}
	phase := func(n int) {
		var wg sync.WaitGroup
		for _, e := range eps {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range n {
					if e.err != nil || !turn(e) {
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	phase(2) // on version 0
	updated := make(chan error, 1)
	go func() {
		_, err := c.UpdateWeights(t.Context(), fileRef(t, 1, 33), sdk.Plan{})
		updated <- err
	}()
	phase(1) // while the update is in flight
	require.NoError(t, <-updated)
	phase(1) // after it

	mixed, continued := 0, 0
	for _, e := range eps {
		if len(e.turns) > 2 {
			vs := e.turns[2].Sample.WeightVersions()
			if vs[0] != vs[len(vs)-1] {
				mixed++
			}
			continued += e.turns[2].Sample.Continuations
		}
	}
	t.Logf("turns during the update: %d of %d span both versions, %d continuations", mixed, episodes, continued)
	for i, e := range eps {
		require.NoError(t, e.err, "episode %d", i)
		require.Len(t, e.turns, 4)
		home := e.turns[0].Sample.Servers
		require.Len(t, home, 1)
		for k, tr := range e.turns {
			assert.Equal(t, home, tr.Sample.Servers, "episode %d turn %d left its server", i, k)
			vs := tr.Sample.WeightVersions()
			require.Len(t, vs, 48)
			for j := range vs {
				switch {
				case k < 2:
					require.Equal(t, int64(0), vs[j], "episode %d turn %d", i, k)
				case k == 3:
					require.Equal(t, int64(1), vs[j], "episode %d turn %d", i, k)
				case j > 0:
					require.GreaterOrEqual(t, vs[j], vs[j-1], "episode %d turn %d goes back a version", i, k)
				}
			}
		}
		tj := e.s.Trajectory()
		require.Equal(t, 4*48, tj.ModelTokens)
		prev := int64(0)
		for j, m := range tj.LossMask {
			if m == 1 {
				require.GreaterOrEqual(t, tj.Versions[j], prev, "episode %d's versions never go back", i)
				prev = tj.Versions[j]
			}
		}
		require.Equal(t, int64(1), prev)
	}
}
