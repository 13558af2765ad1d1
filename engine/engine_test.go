package engine

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/sample"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testEngine starts an engine on the tiny preset and stops it at cleanup.
func testEngine(t *testing.T, mut func(*Config)) (*Engine, *model.Weights) {
	t.Helper()
	w, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	cfg := Config{Weights: w, WeightVersion: 1, NumBlocks: 256, Workers: 2}
	if mut != nil {
		mut(&cfg)
	}
	e, err := New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return e, w
}

func greedy(n int) sample.Params {
	p := sample.Defaults()
	p.Temperature = 0
	p.MaxTokens = n
	p.IgnoreEOS = true
	return p
}

func prompt(n, salt int) []int {
	ids := make([]int, n)
	for i := range ids {
		ids[i] = (i*31 + salt*17 + 5) % 256
	}
	return ids
}

// referenceGreedy is the greedy continuation computed by the reference forward.
func referenceGreedy(t *testing.T, w *model.Weights, p []int, n int) []int {
	t.Helper()
	out, err := model.ReferenceGreedy(w, p, n)
	require.NoError(t, err)
	return out
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestGreedyMatchesReferenceUnderConcurrency(t *testing.T) {
	e, w := testEngine(t, func(c *Config) { c.MaxBatchedTokens = 24; c.MaxNumSeqs = 4 })
	ctx := ctxT(t)
	type job struct {
		p []int
		s *Stream
	}
	var jobs []job
	for i := range 6 {
		p := prompt(5+i*7, i)
		s, err := e.Add(ctx, Request{ID: string(rune('a' + i)), PromptTokenIDs: p, Sampling: greedy(12)})
		require.NoError(t, err)
		jobs = append(jobs, job{p, s})
	}
	for _, j := range jobs {
		res, err := j.s.Collect(ctx)
		require.NoError(t, err)
		assert.Equal(t, FinishLength, res.FinishReason)
		assert.Equal(t, referenceGreedy(t, w, j.p, 12), res.TokenIDs())
		for _, tok := range res.Tokens {
			assert.EqualValues(t, 1, tok.WeightVersion)
			assert.LessOrEqual(t, tok.Logprob, float32(0))
		}
	}
	st, err := e.Stats(ctx)
	require.NoError(t, err)
	assert.Zero(t, st.KVBlocksUsed, "finished requests hold no blocks (cached ones are free)")
}

func TestPauseAbortFinishesEverything(t *testing.T) {
	g := newForwardGate(2) // two running, two waiting, at least one step done
	e, _ := testEngine(t, func(c *Config) { c.MaxNumSeqs = 2; g.install(c) })
	ctx := ctxT(t)
	_, err := e.Pause(ctx, PauseKeep, false) // queue all four before a step runs (an Add waits for the loop)
	require.NoError(t, err)
	var streams []*Stream
	for i := range 4 {
		s, err := e.Add(ctx, Request{ID: string(rune('a' + i)), PromptTokenIDs: prompt(10, i), Sampling: greedy(long)})
		require.NoError(t, err)
		streams = append(streams, s)
	}
	require.NoError(t, e.Resume(ctx))
	require.NoError(t, g.during(t, e, func() error { _, err := e.Pause(ctx, PauseAbort, false); return err }))
	for _, s := range streams {
		res, err := s.Collect(ctx)
		require.NoError(t, err)
		assert.Equal(t, FinishAbort, res.FinishReason)
	}
	paused, err := e.IsPaused(ctx)
	require.NoError(t, err)
	assert.True(t, paused)
	st, err := e.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, StatePaused, st.State)
	assert.Zero(t, st.Running+st.Waiting)
}

func TestPauseWaitLetsRunningFinish(t *testing.T) {
	e, _ := testEngine(t, nil)
	ctx := ctxT(t)
	s, err := e.Add(ctx, Request{ID: "a", PromptTokenIDs: prompt(8, 1), Sampling: greedy(20)})
	require.NoError(t, err)
	_, err = s.Recv(ctx)
	require.NoError(t, err)
	_, err = e.Pause(ctx, PauseWait, false)
	require.NoError(t, err)
	// Pause(wait) returned, so the running request already finished normally.
	res, err := s.Collect(ctx)
	require.NoError(t, err)
	assert.Equal(t, FinishLength, res.FinishReason)
	// A request added while paused waits until Resume.
	s2, err := e.Add(ctx, Request{ID: "b", PromptTokenIDs: prompt(8, 2), Sampling: greedy(3)})
	require.NoError(t, err)
	requireParked(t, e, 1)
	require.NoError(t, e.Resume(ctx))
	res2, err := s2.Collect(ctx)
	require.NoError(t, err)
	assert.Len(t, res2.Tokens, 3)
}

// DrainSteps counts exactly the steps a Pause(wait) ran for: the test holds the loop inside a
// forward pass until the pause is queued, so the request still has tokens to make when the
// engine takes the pause, and every later step is one the caller waited for.
func TestDrainStepsCountsWhatAPauseWaitedFor(t *testing.T) {
	const n = 12
	g := newForwardGate(2) // the first decode step, after the prefill made token 1
	e, _ := testEngine(t, g.install)
	ctx := ctxT(t)
	s, err := e.Add(ctx, Request{ID: "a", PromptTokenIDs: prompt(8, 1), Sampling: greedy(n)})
	require.NoError(t, err)
	var drain0, steps0 int64
	require.NoError(t, g.during(t, e, func() error {
		drain0, steps0 = e.Metrics().DrainSteps, e.Metrics().Steps
		_, err := e.Pause(ctx, PauseWait, false)
		return err
	}))
	res, err := s.Collect(ctx)
	require.NoError(t, err)
	assert.Equal(t, FinishLength, res.FinishReason)
	assert.Len(t, res.Tokens, n)
	// The held step (token 2) ran before the engine took the pause; tokens 3..n each took a
	// step the caller waited for, and one more step delivered the finished request.
	assert.Equal(t, int64(n), e.Metrics().Steps-steps0)
	assert.Equal(t, int64(n-1), e.Metrics().DrainSteps-drain0)
}

// long is a request that cannot finish while a test pokes at it: it is aborted once the test
// has read what it checks.
const long = 1500

// recvAtLeast reads from s until it holds n tokens (or the stream ends).
func recvAtLeast(t *testing.T, ctx context.Context, s *Stream, have []Token, n int) []Token {
	t.Helper()
	for len(have) < n {
		out, err := s.Recv(ctx)
		require.NoError(t, err)
		have = append(have, out.Tokens...)
		if out.Finished {
			break
		}
	}
	return have
}

func tokenIDs(toks []Token) []int {
	ids := make([]int, len(toks))
	for i, tok := range toks {
		ids[i] = tok.ID
	}
	return ids
}

func TestPauseKeepFreezesAndResumeContinues(t *testing.T) {
	g := newForwardGate(2)
	e, w := testEngine(t, g.install)
	ctx := ctxT(t)
	p := prompt(9, 3)
	s, err := e.Add(ctx, Request{ID: "a", PromptTokenIDs: p, Sampling: greedy(long)})
	require.NoError(t, err)
	var drain int64
	require.NoError(t, g.during(t, e, func() error {
		drain = e.Metrics().DrainSteps
		_, err := e.Pause(ctx, PauseKeep, false)
		return err
	}))
	assert.Equal(t, drain, e.Metrics().DrainSteps, "keep completes where the engine takes it, without a step")
	toks := recvAtLeast(t, ctx, s, nil, 1)
	st, err := e.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, st.Running, "keep leaves the request running, frozen")
	assert.False(t, e.testHasWork(t), "a paused engine does not step")
	require.NoError(t, e.Resume(ctx))
	toks = recvAtLeast(t, ctx, s, toks, 40)
	s.Abort()
	assert.Equal(t, referenceGreedy(t, w, p, 40), tokenIDs(toks[:40]))
}

func TestPauseKeepClearCachePreemptsAndRecomputes(t *testing.T) {
	g := newForwardGate(2)
	e, w := testEngine(t, g.install)
	ctx := ctxT(t)
	p := prompt(20, 4)
	s, err := e.Add(ctx, Request{ID: "a", PromptTokenIDs: p, Sampling: greedy(long)})
	require.NoError(t, err)
	var r ResetResult
	require.NoError(t, g.during(t, e, func() (err error) { r, err = e.Pause(ctx, PauseKeep, true); return err }))
	toks := recvAtLeast(t, ctx, s, nil, 1)
	assert.True(t, r.Success, r.Reason)
	assert.Equal(t, 1, r.Preempted)
	st, err := e.Stats(ctx)
	require.NoError(t, err)
	assert.Zero(t, st.KVBlocksUsed, "clear_cache preempted the frozen request: no KV kept")
	require.NoError(t, e.Resume(ctx))
	toks = recvAtLeast(t, ctx, s, toks, 40)
	s.Abort()
	// Recompute is exact: the output equals the uninterrupted greedy continuation.
	assert.Equal(t, referenceGreedy(t, w, p, 40), tokenIDs(toks[:40]))
}

// TestBackToBackUtilityCalls queues a pause with clear_cache and a sleep so that the loop
// handles both with no step between them (vLLM's bug 2 scenario), then wakes and resumes.
func TestBackToBackUtilityCalls(t *testing.T) {
	e, _ := testEngine(t, nil)
	ctx := ctxT(t)
	s, err := e.Add(ctx, Request{ID: "a", PromptTokenIDs: prompt(8, 1), Sampling: greedy(5)})
	require.NoError(t, err)
	_, err = s.Collect(ctx)
	require.NoError(t, err)

	steps, errPause, errSleep := backToBack(t, e,
		func() error { _, err := e.Pause(ctx, PauseAbort, true); return err },
		func() error { return e.Sleep(ctx, 1, PauseAbort) })
	require.NoError(t, errPause)
	require.NoError(t, errSleep)
	assert.Zero(t, steps, "no step was needed between or after the two calls")
	sleeping, err := e.IsSleeping(ctx)
	require.NoError(t, err)
	assert.True(t, sleeping)
	require.NoError(t, e.WakeUp(ctx, nil))
	require.NoError(t, e.Resume(ctx))
	s, err = e.Add(ctx, Request{ID: "b", PromptTokenIDs: prompt(8, 1), Sampling: greedy(5)})
	require.NoError(t, err)
	res, err := s.Collect(ctx)
	require.NoError(t, err)
	assert.Len(t, res.Tokens, 5)
}

func TestResetPrefixCacheNeverClaimsFalseSuccess(t *testing.T) {
	g := newForwardGate(2)
	e, _ := testEngine(t, g.install)
	ctx := ctxT(t)
	s, err := e.Add(ctx, Request{ID: "a", PromptTokenIDs: prompt(40, 1), Sampling: greedy(long)})
	require.NoError(t, err)
	var r ResetResult
	require.NoError(t, g.during(t, e, func() (err error) { r, err = e.ResetPrefixCache(ctx, false, false); return err }))
	assert.False(t, r.Success, "a running request holds blocks")
	assert.NotEmpty(t, r.Reason)
	assert.Zero(t, r.BlocksCleared)
	r, err = e.ResetPrefixCache(ctx, true, false)
	require.NoError(t, err)
	assert.True(t, r.Success, r.Reason)
	assert.Equal(t, 1, r.Preempted)
	s.Abort()
	res, err := s.Collect(ctx)
	require.NoError(t, err)
	assert.Equal(t, FinishAbort, res.FinishReason)
	// Now idle with cached blocks from the finished request: reset clears them.
	s2, err := e.Add(ctx, Request{ID: "b", PromptTokenIDs: prompt(40, 2), Sampling: greedy(2)})
	require.NoError(t, err)
	_, err = s2.Collect(ctx)
	require.NoError(t, err)
	r, err = e.ResetPrefixCache(ctx, false, false)
	require.NoError(t, err)
	assert.True(t, r.Success, r.Reason)
	assert.Positive(t, r.BlocksCleared)
}

func TestSleepLevel1ReleasesKVAndQueuesGeneration(t *testing.T) {
	e, w := testEngine(t, nil)
	ctx := ctxT(t)
	require.NoError(t, e.Sleep(ctx, 1, PauseAbort))
	st, err := e.Stats(ctx)
	require.NoError(t, err)
	assert.True(t, st.KVReleased)
	assert.Equal(t, StateSleeping, st.State)
	p := prompt(12, 9)
	s, err := e.Add(ctx, Request{ID: "a", PromptTokenIDs: p, Sampling: greedy(6)})
	require.NoError(t, err, "generation while asleep queues")
	requireParked(t, e, 1)
	require.ErrorIs(t, e.Resume(ctx), ErrAsleep)
	require.NoError(t, e.WakeUp(ctx, []string{TagKVCache}))
	// The sleep paused the engine itself, so a full wake resumes it.
	res, err := s.Collect(ctx)
	require.NoError(t, err)
	assert.Equal(t, referenceGreedy(t, w, p, 6), res.TokenIDs())
}

func TestSleepLevel2NeedsNewWeights(t *testing.T) {
	e, _ := testEngine(t, nil)
	ctx := ctxT(t)
	_, err := e.Pause(ctx, PauseAbort, true)
	require.NoError(t, err)
	require.NoError(t, e.Sleep(ctx, 2, PauseAbort))
	require.ErrorIs(t, e.WakeUp(ctx, []string{TagWeights}), ErrNoWeights)
	w2, err := model.Preset("tiny", 2)
	require.NoError(t, err)
	v, err := e.UpdateWeights(ctx, w2, 2, false)
	require.NoError(t, err)
	assert.EqualValues(t, 2, v)
	require.NoError(t, e.WakeUp(ctx, nil))
	paused, err := e.IsPaused(ctx)
	require.NoError(t, err)
	assert.True(t, paused, "the explicit pause before the sleep stays until Resume")
	require.NoError(t, e.Resume(ctx))
	p := prompt(7, 1)
	s, err := e.Add(ctx, Request{ID: "a", PromptTokenIDs: p, Sampling: greedy(4)})
	require.NoError(t, err)
	res, err := s.Collect(ctx)
	require.NoError(t, err)
	assert.Equal(t, referenceGreedy(t, w2, p, 4), res.TokenIDs())
	for _, tok := range res.Tokens {
		assert.EqualValues(t, 2, tok.WeightVersion)
	}
}

func TestWeightSwapNeverReusesOldKV(t *testing.T) {
	e, _ := testEngine(t, nil)
	ctx := ctxT(t)
	p := prompt(64, 5)
	run := func(id string) Result {
		s, err := e.Add(ctx, Request{ID: id, PromptTokenIDs: p, Sampling: greedy(2)})
		require.NoError(t, err)
		res, err := s.Collect(ctx)
		require.NoError(t, err)
		return res
	}
	assert.Zero(t, run("a").NumCachedTokens)
	assert.Equal(t, 48, run("b").NumCachedTokens, "same prompt, same version: full blocks reused (last token recomputed)")
	w2, err := model.Preset("tiny", 2)
	require.NoError(t, err)
	_, err = e.UpdateWeights(ctx, w2, 2, false)
	require.NoError(t, err)
	assert.Zero(t, run("c").NumCachedTokens, "a new version never reuses KV of the old one")
	assert.Equal(t, 48, run("d").NumCachedTokens)
	// Salt isolates too.
	s, err := e.Add(ctx, Request{ID: "e", PromptTokenIDs: p, Sampling: greedy(2), CacheSalt: "x"})
	require.NoError(t, err)
	res, err := s.Collect(ctx)
	require.NoError(t, err)
	assert.Zero(t, res.NumCachedTokens)
}

// TestWeightUpdatesReuseTheRetiredSet: from the second update on, staging packs into the set
// the previous commit retired, and every version still generates exactly its own greedy
// continuation; a level-1 sleep keeps the retired set, a level-2 sleep gives it back.
func TestWeightUpdatesReuseTheRetiredSet(t *testing.T) {
	e, w1 := testEngine(t, nil)
	ctx := ctxT(t)
	p := prompt(12, 9)
	check := func(id string, w *model.Weights) {
		t.Helper()
		s, err := e.Add(ctx, Request{ID: id, PromptTokenIDs: p, Sampling: greedy(6)})
		require.NoError(t, err)
		res, err := s.Collect(ctx)
		require.NoError(t, err)
		require.Equal(t, referenceGreedy(t, w, p, 6), tokenIDs(res.Tokens), "request %s", id)
	}
	check("v1", w1)
	assert.Nil(t, e.spare.Load(), "nothing retired yet")
	for v := int64(2); v <= 4; v++ {
		w, err := model.Preset("tiny", uint64(v))
		require.NoError(t, err)
		retired := e.spare.Load()
		require.NoError(t, e.StageWeights(ctx, w, v))
		if v > 2 {
			require.NotNil(t, retired)
			assert.Nil(t, e.spare.Load(), "version %d packed into the retired set", v)
		}
		_, err = e.CommitWeights(ctx, v)
		require.NoError(t, err)
		assert.NotNil(t, e.spare.Load(), "the commit retired version %d", v-1)
		check("v"+strconv.FormatInt(v, 10), w)
	}
	kept := e.spare.Load()
	require.NoError(t, e.Sleep(ctx, 1, PauseAbort))
	assert.Same(t, kept, e.spare.Load(), "a level-1 sleep frees the KV only: the next update packs into the retired set")
	require.NoError(t, e.Sleep(ctx, 2, PauseAbort))
	assert.Nil(t, e.spare.Load(), "a level-2 sleep gives the retired set back")
}

func TestPerTokenVersionsAcrossSwapDuringKeep(t *testing.T) {
	g := newForwardGate(2)
	e, w1 := testEngine(t, g.install)
	ctx := ctxT(t)
	p := prompt(10, 6)
	s, err := e.Add(ctx, Request{ID: "a", PromptTokenIDs: p, Sampling: greedy(long)})
	require.NoError(t, err)
	require.NoError(t, g.during(t, e, func() error { _, err := e.Pause(ctx, PauseKeep, true); return err }))
	toks := recvAtLeast(t, ctx, s, nil, 1)
	w2, err := model.Preset("tiny", 2)
	require.NoError(t, err)
	_, err = e.UpdateWeights(ctx, w2, 2, false)
	require.NoError(t, err)
	require.NoError(t, e.Resume(ctx))
	// Read until 20 tokens past the swap.
	const n = 20
	for {
		cut := slices.IndexFunc(toks, func(tok Token) bool { return tok.WeightVersion == 2 })
		if cut >= 0 && len(toks) >= cut+n {
			break
		}
		toks = recvAtLeast(t, ctx, s, toks, len(toks)+1)
	}
	s.Abort()
	// Tokens before the pause carry v1; every token after carries v2 and is v2's greedy
	// continuation of everything before it (clear_cache made it recompute under v2).
	cut := slices.IndexFunc(toks, func(tok Token) bool { return tok.WeightVersion == 2 })
	require.Positive(t, cut)
	for i, tok := range toks {
		want := int64(1)
		if i >= cut {
			want = 2
		}
		assert.Equal(t, want, tok.WeightVersion, "token %d", i)
	}
	ids := tokenIDs(toks)
	assert.Equal(t, referenceGreedy(t, w1, p, cut), ids[:cut])
	assert.Equal(t, referenceGreedy(t, w2, append(slices.Clone(p), ids[:cut]...), n), ids[cut:cut+n])
}

func TestStagedWeightsFailuresLeaveOldServing(t *testing.T) {
	e, _ := testEngine(t, nil)
	ctx := ctxT(t)
	_, err := e.CommitWeights(ctx, 2)
	require.ErrorIs(t, err, ErrNothingStaged)
	w, err := model.Preset("tiny", 3)
	require.NoError(t, err)
	require.ErrorIs(t, e.StageWeights(ctx, w, 1), ErrStaleVersion)
	big, err := model.Preset("stories15m", 1)
	require.NoError(t, err)
	require.ErrorIs(t, e.StageWeights(ctx, big, 5), ErrInvalidArgument)
	assert.EqualValues(t, 1, e.Version())
	require.NoError(t, e.StageWeights(ctx, w, 3))
	st, err := e.Stats(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 3, st.StagedVersion)
	assert.EqualValues(t, 1, st.WeightVersion)
	// A stage must not be older than the staged version, the same version replaces the
	// staged set (another checkpoint of it), and a commit names what it commits.
	require.ErrorIs(t, e.StageWeights(ctx, w, 2), ErrStaleVersion)
	require.NoError(t, e.StageWeights(ctx, w, 3))
	_, err = e.CommitWeights(ctx, 2)
	require.ErrorIs(t, err, ErrNotStaged)
	v, err := e.CommitWeights(ctx, 3)
	require.NoError(t, err)
	assert.EqualValues(t, 3, v)
	assert.EqualValues(t, 3, e.Version())
}

func TestBadInput(t *testing.T) {
	e, w := testEngine(t, func(c *Config) { c.MaxQueued = 2 })
	ctx := ctxT(t)
	ctxLen := w.Config.MaxPositionEmbeddings
	bad := map[string]Request{
		"empty prompt":   {ID: "x", Sampling: greedy(1)},
		"empty id":       {PromptTokenIDs: []int{1}, Sampling: greedy(1)},
		"too long":       {ID: "x", PromptTokenIDs: make([]int, ctxLen), Sampling: greedy(1)},
		"token range":    {ID: "x", PromptTokenIDs: []int{w.Config.VocabSize}, Sampling: greedy(1)},
		"negative token": {ID: "x", PromptTokenIDs: []int{-1}, Sampling: greedy(1)},
		"max tokens 0":   {ID: "x", PromptTokenIDs: []int{1}, Sampling: func() sample.Params { p := greedy(1); p.MaxTokens = -1; return p }()},
		"temperature":    {ID: "x", PromptTokenIDs: []int{1}, Sampling: func() sample.Params { p := greedy(1); p.Temperature = -1; return p }()},
		"top_p":          {ID: "x", PromptTokenIDs: []int{1}, Sampling: func() sample.Params { p := greedy(1); p.TopP = 1.5; return p }()},
	}
	for name, r := range bad {
		_, err := e.Add(ctx, r)
		assert.ErrorIs(t, err, ErrInvalidRequest, name)
	}
	// Paused (keep), "d" cannot finish before its duplicate arrives, however the test goroutine
	// is scheduled.
	_, err := e.Pause(ctx, PauseKeep, false)
	require.NoError(t, err)
	s, err := e.Add(ctx, Request{ID: "d", PromptTokenIDs: prompt(4, 1), Sampling: greedy(300)})
	require.NoError(t, err)
	_, err = e.Add(ctx, Request{ID: "d", PromptTokenIDs: prompt(4, 1), Sampling: greedy(5)})
	require.ErrorIs(t, err, ErrDuplicateID)
	e.Abort("no-such-request")
	require.NoError(t, e.Resume(ctx))
	res, err := s.Collect(ctx)
	require.NoError(t, err)
	assert.Len(t, res.Tokens, 300, "bad requests and unknown aborts disturb nobody")

	_, err = e.Pause(ctx, PauseWait, false)
	require.NoError(t, err)
	for i := range 2 {
		_, err := e.Add(ctx, Request{ID: string(rune('p' + i)), PromptTokenIDs: prompt(4, i), Sampling: greedy(1)})
		require.NoError(t, err)
	}
	_, err = e.Add(ctx, Request{ID: "overflow", PromptTokenIDs: prompt(4, 1), Sampling: greedy(1)})
	require.ErrorIs(t, err, ErrQueueFull)
	_, err = e.Pause(ctx, PauseMode("nap"), false)
	require.ErrorIs(t, err, ErrInvalidArgument)
	require.ErrorIs(t, e.Sleep(ctx, 3, ""), ErrInvalidArgument)
	require.ErrorIs(t, e.WakeUp(ctx, []string{"brain"}), ErrInvalidArgument)
}

func TestCallsAfterShutdown(t *testing.T) {
	w, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	e, err := New(Config{Weights: w, NumBlocks: 64})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	// Paused, the engine queues the request and runs none of it, so the shutdown finds it
	// unfinished however long this goroutine waits to cancel.
	_, err = e.Pause(context.Background(), PauseKeep, false)
	require.NoError(t, err)
	s, err := e.Add(context.Background(), Request{ID: "a", PromptTokenIDs: prompt(4, 1), Sampling: greedy(1000)})
	require.NoError(t, err)
	cancel()
	require.NoError(t, <-done)
	res, err := s.Collect(context.Background())
	require.NoError(t, err)
	assert.Equal(t, FinishAbort, res.FinishReason, "shutdown aborts what is left")
	_, err = e.Add(context.Background(), Request{ID: "b", PromptTokenIDs: prompt(4, 1), Sampling: greedy(1)})
	require.ErrorIs(t, err, ErrClosed)
	_, err = e.Pause(context.Background(), PauseAbort, false)
	require.ErrorIs(t, err, ErrClosed)
	require.Error(t, e.Run(context.Background()))
}

func TestIdleEngineDoesNotStep(t *testing.T) {
	e, _ := testEngine(t, nil)
	ctx := ctxT(t)
	s, err := e.Add(ctx, Request{ID: "a", PromptTokenIDs: prompt(4, 1), Sampling: greedy(3)})
	require.NoError(t, err)
	_, err = s.Collect(ctx)
	require.NoError(t, err)
	// The loop blocks on its input when it has no work (it would step otherwise).
	assert.False(t, e.testHasWork(t))
}

// testHasWork reads the loop's busy predicate between steps.
func (e *Engine) testHasWork(t *testing.T) bool {
	t.Helper()
	v, err := call(context.Background(), e, "test_has_work", func(_ context.Context, done func(bool, error)) { done(e.hasWork(), nil) })
	require.NoError(t, err)
	return v
}

// requireParked checks, between steps, that n requests wait (none runs) and that the loop
// has no work, i.e. they wait for a Resume or WakeUp rather than for their turn.
func requireParked(t *testing.T, e *Engine, n int) {
	t.Helper()
	st, err := e.Stats(context.Background())
	require.NoError(t, err)
	assert.Equal(t, n, st.Waiting)
	assert.Zero(t, st.Running)
	assert.False(t, e.testHasWork(t), "queued, not scheduled")
}

// block parks the engine loop inside a utility call until release is called, so tests can
// queue several messages that the loop then handles back to back.
func (e *Engine) block(t *testing.T) (release func()) {
	t.Helper()
	entered := make(chan struct{})
	gate := make(chan struct{})
	go func() {
		_, _ = call(context.Background(), e, "test_block", func(_ context.Context, done func(struct{}, error)) {
			close(entered)
			<-gate
			done(struct{}{}, nil)
		})
	}()
	<-entered
	var once sync.Once
	return func() { once.Do(func() { close(gate) }) }
}

// backToBack queues first and then second while the loop is parked, so that the loop handles
// them with no step between (vLLM's bug-2 shape). It returns the number of engine steps taken
// from their handling until both returned, and their errors.
func backToBack(t *testing.T, e *Engine, first, second func() error) (steps int64, err1, err2 error) {
	t.Helper()
	release := e.block(t)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); errs[0] = first() }()
	waitQueued(t, e, 1)
	go func() { defer wg.Done(); errs[1] = second() }()
	waitQueued(t, e, 2)
	before := e.Metrics().Steps
	release()
	wg.Wait()
	return e.Metrics().Steps - before, errs[0], errs[1]
}

// waitQueued waits until n messages sit in the engine's input queue.
func waitQueued(t *testing.T, e *Engine, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return len(e.in) >= n }, 5*time.Second, time.Millisecond)
}

// TestReleaseWithOwnedBlockIsAViolation: releasing the KV pool while a request owns blocks is
// an invariant violation, counted (the sleep path gives every block up first, so this counter
// stays 0 in every other test).
func TestReleaseWithOwnedBlockIsAViolation(t *testing.T) {
	w, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	e, err := New(Config{Weights: w, NumBlocks: 16, Workers: 1})
	require.NoError(t, err)
	defer e.kpool.Close()
	_, ok := e.blocks.AllocateSlots("x", 20, nil)
	require.True(t, ok)
	e.releaseKV()
	assert.EqualValues(t, 1, e.Metrics().InvariantViolations)
	e.blocks.Free("x")
	require.NoError(t, e.allocKV())
	e.releaseKV()
	assert.EqualValues(t, 1, e.Metrics().InvariantViolations, "a release with every block free is fine")
}

// TestConcurrentUpdateWeightsIsAtomic: two UpdateWeights calls queued back to back (a newer
// version first) must each stage and commit in one step of the loop: the newer version serves,
// its caller hears so, and the older one is refused as stale. With stage and commit as two
// loop calls the older stage replaced the newer one, the newer caller was told it committed
// the older version and the other caller heard "no staged weights".
func TestConcurrentUpdateWeightsIsAtomic(t *testing.T) {
	e, _ := testEngine(t, nil)
	ctx := ctxT(t)
	w2, err := model.Preset("tiny", 2)
	require.NoError(t, err)
	w3, err := model.Preset("tiny", 3)
	require.NoError(t, err)
	var v3, v2 int64
	_, err3, err2 := backToBack(t, e,
		func() (err error) { v3, err = e.UpdateWeights(ctx, w3, 3, false); return err },
		func() (err error) { v2, err = e.UpdateWeights(ctx, w2, 2, false); return err })
	require.NoError(t, err3)
	assert.EqualValues(t, 3, v3)
	require.ErrorIs(t, err2, ErrStaleVersion)
	assert.Zero(t, v2)
	assert.EqualValues(t, 3, e.Version())
	st, err := e.Stats(ctx)
	require.NoError(t, err)
	assert.Zero(t, st.StagedVersion, "nothing left staged")
}

// TestCloseReleasesEverything: Close releases an engine that never ran and stops a running
// one; it is idempotent, waits for the goroutines New and Run started, and later calls fail
// with ErrClosed.
func TestCloseReleasesEverything(t *testing.T) {
	w, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	t.Run("never run", func(t *testing.T) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		e, err := New(Config{Weights: w, NumBlocks: 64, Workers: 4})
		require.NoError(t, err)
		require.NoError(t, e.Close())
		require.NoError(t, e.Close())
		require.ErrorIs(t, e.Run(context.Background()), ErrClosed)
		_, err = e.Add(context.Background(), Request{ID: "a", PromptTokenIDs: prompt(4, 1), Sampling: greedy(1)})
		require.ErrorIs(t, err, ErrClosed)
	})
	t.Run("running", func(t *testing.T) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		e, err := New(Config{Weights: w, NumBlocks: 64, Workers: 4})
		require.NoError(t, err)
		ran := make(chan error, 1)
		go func() { ran <- e.Run(context.Background()) }()
		ctx := ctxT(t)
		s, err := e.Add(ctx, Request{ID: "a", PromptTokenIDs: prompt(4, 1), Sampling: greedy(long)})
		require.NoError(t, err)
		_, err = s.Recv(ctx)
		require.NoError(t, err)
		var wg sync.WaitGroup
		for range 2 {
			wg.Add(1)
			go func() { defer wg.Done(); assert.NoError(t, e.Close()) }()
		}
		wg.Wait()
		require.NoError(t, <-ran)
		res, err := s.Collect(ctx)
		require.NoError(t, err)
		assert.Equal(t, FinishAbort, res.FinishReason)
		_, err = e.Stats(ctx)
		require.ErrorIs(t, err, ErrClosed)
	})
}

// TestFailedStepAbortsItsRequests: an injected forward error aborts exactly the requests the
// step scheduled (rolled back first: nothing of the step is cached), the scheduler's invariants
// hold, and a request that was only waiting, and later ones, generate the reference output.
func TestFailedStepAbortsItsRequests(t *testing.T) {
	var fail sync.Once
	armed := make(chan struct{})
	e, w := testEngine(t, func(c *Config) {
		c.MaxNumSeqs = 2
		c.Hooks.BeforeForward = func(uint64) error {
			select {
			case <-armed:
			default:
				return nil
			}
			err := error(nil)
			fail.Do(func() { err = errors.New("injected forward error") })
			return err
		}
	})
	ctx := ctxT(t)
	_, err := e.Pause(ctx, PauseKeep, false) // all three are queued before anything runs
	require.NoError(t, err)
	var streams []*Stream
	for i := range 3 {
		s, err := e.Add(ctx, Request{ID: string(rune('a' + i)), PromptTokenIDs: prompt(20, i), Sampling: greedy(5)})
		require.NoError(t, err)
		streams = append(streams, s)
	}
	close(armed)
	require.NoError(t, e.Resume(ctx))
	for i, s := range streams {
		res, err := s.Collect(ctx)
		require.NoError(t, err)
		if i < 2 {
			assert.Equal(t, FinishAbort, res.FinishReason, "request %d ran in the failed step", i)
			assert.Empty(t, res.Tokens)
			continue
		}
		assert.Equal(t, referenceGreedy(t, w, prompt(20, i), 5), res.TokenIDs(), "the waiting request is unaffected")
	}
	assert.EqualValues(t, 1, e.Metrics().StepErrors)
	st, err := e.CheckInvariants(ctx)
	require.NoError(t, err)
	assert.Zero(t, st.KVBlocksUsed)
	s, err := e.Add(ctx, Request{ID: "d", PromptTokenIDs: prompt(20, 0), Sampling: greedy(5)})
	require.NoError(t, err)
	res, err := s.Collect(ctx)
	require.NoError(t, err)
	assert.Equal(t, referenceGreedy(t, w, prompt(20, 0), 5), res.TokenIDs())
	assert.Zero(t, res.NumCachedTokens, "the failed step cached nothing")
}

// TestSleep2ReleasesEveryWeightSet: after a level-2 sleep no weight set the engine served or
// retired is reachable, the initial one included (the config used to keep it for the engine's
// lifetime). Cleanups on the sets and their embedding arrays prove it.
func TestSleep2ReleasesEveryWeightSet(t *testing.T) {
	freed := make(chan string, 4)
	watch := func(w *model.Weights, name string) {
		runtime.AddCleanup(w, func(s string) { freed <- s }, name)
		runtime.AddCleanup(&w.Embed[0], func(s string) { freed <- s }, name+" embedding")
	}
	e, ctx := func() (*Engine, context.Context) {
		w1, err := model.Preset("tiny", 1)
		require.NoError(t, err)
		watch(w1, "initial")
		e, err := New(Config{Weights: w1, WeightVersion: 1, NumBlocks: 64, Workers: 2})
		require.NoError(t, err)
		go func() { _ = e.Run(context.Background()) }()
		t.Cleanup(func() { require.NoError(t, e.Close()) })
		ctx := ctxT(t)
		w2, err := model.Preset("tiny", 2)
		require.NoError(t, err)
		watch(w2, "committed")
		_, err = e.UpdateWeights(ctx, w2, 2, false) // w1 becomes the retired spare
		require.NoError(t, err)
		return e, ctx
	}()
	require.NoError(t, e.Sleep(ctx, 2, PauseAbort))
	got := map[string]bool{}
	deadline := time.Now().Add(20 * time.Second)
	for len(got) < 4 && time.Now().Before(deadline) {
		runtime.GC()
		select {
		case s := <-freed:
			got[s] = true
		case <-time.After(10 * time.Millisecond):
		}
	}
	assert.Equal(t, map[string]bool{"initial": true, "initial embedding": true, "committed": true, "committed embedding": true}, got)
	w3, err := model.Preset("tiny", 3)
	require.NoError(t, err)
	_, err = e.UpdateWeights(ctx, w3, 3, false)
	require.NoError(t, err)
	require.NoError(t, e.WakeUp(ctx, nil))
}

// TestWeightsIsACopy: writing to what Weights returns changes nothing that is served.
func TestWeightsIsACopy(t *testing.T) {
	e, _ := testEngine(t, nil)
	w, err := model.Preset("tiny", 1) // the same set, not shared with the engine
	require.NoError(t, err)
	ctx := ctxT(t)
	p := prompt(12, 3)
	got, err := e.Weights(ctx)
	require.NoError(t, err)
	assert.Equal(t, w, got)
	for i := range got.Embed {
		got.Embed[i] = 0
	}
	for i := range got.FinalNorm {
		got.FinalNorm[i] = 0
	}
	s, err := e.Add(ctx, Request{ID: "a", PromptTokenIDs: p, Sampling: greedy(6)})
	require.NoError(t, err)
	res, err := s.Collect(ctx)
	require.NoError(t, err)
	assert.Equal(t, referenceGreedy(t, w, p, 6), res.TokenIDs(), "the served model is unchanged")
	again, err := e.Weights(ctx)
	require.NoError(t, err)
	assert.Equal(t, w, again)
}

// TestResumeDuringPauseWaitDrain: a Resume queued while a Pause(wait) drains lets the drain
// finish: the running request ends normally (the Pause, handled first, completes first) and a
// request queued meanwhile starts only after the running one finished.
func TestResumeDuringPauseWaitDrain(t *testing.T) {
	e, w := testEngine(t, nil)
	ctx := ctxT(t)
	pa, pb := prompt(8, 1), prompt(8, 2)
	a, err := e.Add(ctx, Request{ID: "a", PromptTokenIDs: pa, Sampling: greedy(16)})
	require.NoError(t, err)
	first, err := a.Recv(ctx) // a is running
	require.NoError(t, err)
	var b *Stream
	release := e.block(t)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _, err := e.Pause(ctx, PauseWait, false); assert.NoError(t, err) }()
	waitQueued(t, e, 1)
	go func() { defer wg.Done(); assert.NoError(t, e.Resume(ctx)) }()
	waitQueued(t, e, 2)
	added := make(chan *Stream, 1)
	go func() {
		s, err := e.Add(ctx, Request{ID: "b", PromptTokenIDs: pb, Sampling: greedy(3)})
		assert.NoError(t, err)
		added <- s
	}()
	waitQueued(t, e, 3)
	release()
	wg.Wait()
	b = <-added
	paused, err := e.IsPaused(ctx)
	require.NoError(t, err)
	assert.False(t, paused)
	resA, err := a.Collect(ctx)
	require.NoError(t, err)
	assert.Equal(t, FinishLength, resA.FinishReason, "the drain was not cut short")
	assert.Equal(t, referenceGreedy(t, w, pa, 16), tokenIDs(append(first.Tokens, resA.Tokens...)))
	require.NotNil(t, b)
	resB, err := b.Collect(ctx)
	require.NoError(t, err)
	assert.Equal(t, referenceGreedy(t, w, pb, 3), resB.TokenIDs())
	assert.False(t, resB.Timings.FirstToken.Before(resA.Timings.Finish), "b started after a finished")
}

// TestQueueCappedWhileRunning: the waiting queue is capped while the engine runs too, not
// only while it is paused or asleep. One sequence runs (MaxNumSeqs 1) for the whole test: it
// needs about 2000 steps, and the adds below are channel round trips.
func TestQueueCappedWhileRunning(t *testing.T) {
	e, w := testEngine(t, func(c *Config) { c.MaxNumSeqs, c.MaxQueued = 1, 1 })
	ctx := ctxT(t)
	long, err := e.Add(ctx, Request{ID: "long", PromptTokenIDs: prompt(4, 1), Sampling: greedy(w.Config.MaxPositionEmbeddings - 8)})
	require.NoError(t, err)
	_, err = long.Recv(ctx) // it runs: the waiting queue is empty again
	require.NoError(t, err)
	_, err = e.Add(ctx, Request{ID: "waits", PromptTokenIDs: prompt(4, 2), Sampling: greedy(1)})
	require.NoError(t, err)
	_, err = e.Add(ctx, Request{ID: "refused", PromptTokenIDs: prompt(4, 3), Sampling: greedy(1)})
	require.ErrorIs(t, err, ErrQueueFull)
	e.Abort("long", "waits")
}

// TestPrepareSpare: a spare packed from a zero set becomes the retired set the first stage
// packs into, generation is exactly the staged version's, and a sleeping engine keeps none.
func TestPrepareSpare(t *testing.T) {
	e, w1 := testEngine(t, nil)
	ctx := ctxT(t)
	zero, err := model.Random(w1.Config, 1)
	require.NoError(t, err)
	for _, tn := range zero.Tensors() {
		clear(*tn.Data)
	}
	bad := w1.Config
	bad.HiddenSize *= 2
	require.ErrorIs(t, e.PrepareSpare(ctx, &model.Weights{Config: bad}), ErrInvalidArgument)
	require.Nil(t, e.spare.Load())
	require.NoError(t, e.PrepareSpare(ctx, zero))
	spare := e.spare.Load()
	require.NotNil(t, spare)
	require.NoError(t, e.PrepareSpare(ctx, zero))
	assert.Same(t, spare, e.spare.Load(), "an existing spare stays")

	w2, err := model.Preset("tiny", 2)
	require.NoError(t, err)
	require.NoError(t, e.StageWeights(ctx, w2, 2))
	assert.Nil(t, e.spare.Load(), "the first stage packed into the prepared spare")
	_, err = e.CommitWeights(ctx, 2)
	require.NoError(t, err)
	p := prompt(12, 9)
	s, err := e.Add(ctx, Request{ID: "v2", PromptTokenIDs: p, Sampling: greedy(6)})
	require.NoError(t, err)
	res, err := s.Collect(ctx)
	require.NoError(t, err)
	require.Equal(t, referenceGreedy(t, w2, p, 6), tokenIDs(res.Tokens))

	require.NoError(t, e.Sleep(ctx, 2, PauseAbort))
	require.NoError(t, e.PrepareSpare(ctx, zero))
	assert.Nil(t, e.spare.Load(), "a sleeping engine gives memory back, it takes none")
}

// TestVersionsInUse: the staged and the serving version, and only those.
func TestVersionsInUse(t *testing.T) {
	e, _ := testEngine(t, nil)
	ctx := ctxT(t)
	v0 := e.Version()
	assert.Equal(t, []int64{v0}, e.VersionsInUse())
	w2, err := model.Preset("tiny", 2)
	require.NoError(t, err)
	require.NoError(t, e.StageWeights(ctx, w2, v0+1))
	assert.Equal(t, []int64{v0 + 1, v0}, e.VersionsInUse())
	assert.Equal(t, v0+1, e.StagedVersion())
	require.NoError(t, e.StageWeights(ctx, w2, v0+2))
	assert.Equal(t, []int64{v0 + 2, v0}, e.VersionsInUse(), "a replaced staged set is free")
	_, err = e.CommitWeights(ctx, v0+2)
	require.NoError(t, err)
	assert.Equal(t, []int64{v0 + 2}, e.VersionsInUse())
	assert.Zero(t, e.StagedVersion())
}
