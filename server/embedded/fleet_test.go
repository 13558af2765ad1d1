package embedded_test

import (
	"bytes"
	"context"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/weights"
	"github.com/rolloutkit/rollout/internal/enginetest"
	"github.com/rolloutkit/rollout/internal/redistest"
	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/bus/redisconf"
	"github.com/rolloutkit/rollout/sdk/protocol"
	"github.com/rolloutkit/rollout/server"
	"github.com/rolloutkit/rollout/server/embedded"
)

func TestMain(m *testing.M) {
	if os.Getenv(quietChildEnv) == "1" {
		os.Exit(quietChild()) // TestQuietLibrary's child: a process that never touched gin
	}
	gin.SetMode(gin.ReleaseMode)
	goleak.VerifyTestMain(m)
}

var secret = bytes.Repeat([]byte("s"), 32)

// writeCheckpoint saves a random tiny checkpoint (seed picks the weights) into dir and
// returns its digest.
func writeCheckpoint(t testing.TB, dir string, seed uint64) string {
	t.Helper()
	w, err := model.Preset("tiny", seed)
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, weights.SaveHF(dir, w, weights.F32))
	d, err := weights.Digest(context.Background(), dir)
	require.NoError(t, err)
	return d
}

// fileRef writes a checkpoint for version v and returns a file:// ref to it.
func fileRef(t testing.TB, v int64, seed uint64) sdk.WeightsRef {
	dir := filepath.Join(t.TempDir(), "v")
	d := writeCheckpoint(t, dir, seed)
	return sdk.WeightsRef{Version: v, URI: "file://" + dir, SHA256: d}
}

func startFleet(t testing.TB, n int, tweak func(i int, c *server.Config)) (*embedded.Fleet, *sdk.Client) {
	t.Helper()
	f, err := embedded.Start(t.Context(), embedded.Options{Servers: n, Secret: secret, Logger: quiet, Server: func(i int, c *server.Config) {
		c.FleetHeartbeat = 100 * time.Millisecond
		c.FleetHeartbeatTTL = time.Second
		if tweak != nil {
			tweak(i, c)
		}
	}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, f.Close()) })
	o := f.DialOptions()
	o.Logger = quiet
	c, err := sdk.Dial(t.Context(), o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return f, c
}

// load keeps workers calling Generate until stopped, so an update happens under traffic.
type load struct {
	t       *testing.T
	c       *sdk.Client
	max     int
	stop    chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	results []loadResult
}

type loadResult struct {
	start time.Time
	res   *sdk.GenerateResult
	err   error
}

func startLoad(t *testing.T, c *sdk.Client, workers, maxTokens int) *load {
	l := &load{t: t, c: c, max: maxTokens, stop: make(chan struct{})}
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				prompt := make([]int, 4+rng.IntN(20))
				for i := range prompt {
					prompt[i] = rng.IntN(256)
				}
				start := time.Now()
				res, err := c.Generate(context.Background(), sdk.GenerateRequest{PromptTokenIDs: prompt, N: 2,
					Sampling: sdk.SamplingParams{MaxTokens: maxTokens, Temperature: 1, IgnoreEOS: true}})
				l.mu.Lock()
				l.results = append(l.results, loadResult{start: start, res: res, err: err})
				l.mu.Unlock()
			}
		}()
	}
	return l
}

// count is how many calls that started after since have finished.
func (l *load) count(since time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.results {
		if r.start.After(since) {
			n++
		}
	}
	return n
}

func (l *load) finish() []loadResult {
	close(l.stop)
	l.wg.Wait()
	return l.results
}

// checkVersions holds the version rules: every sample is whole; with pause mode abort every
// request (segment) ran on one version; versions never go back within a sample; every call
// that began after the update returned is entirely on the new version.
func checkVersions(t *testing.T, results []loadResult, maxTokens int, oldV, newV int64, updated time.Time) {
	t.Helper()
	before, after := 0, 0
	for _, r := range results {
		require.NoError(t, r.err)
		if r.start.After(updated) {
			after++
		} else {
			before++
		}
		for _, s := range r.res.Samples {
			require.Len(t, s.Tokens, maxTokens, "whole samples")
			i := 0
			prev := int64(math.MinInt64)
			for _, seg := range s.Segments {
				v := s.Tokens[i].WeightVersion
				for _, tok := range s.Tokens[i : i+seg.Tokens] {
					require.Equal(t, v, tok.WeightVersion, "one request, one version (server %s)", seg.Server)
					require.False(t, math.IsNaN(tok.Logprob))
				}
				require.GreaterOrEqual(t, v, prev, "a sample never goes back to an older version")
				require.True(t, v == oldV || v == newV, "version %d", v)
				if r.start.After(updated) {
					require.Equal(t, newV, v, "a call after the update is on the new version")
				}
				prev = v
				i += seg.Tokens
			}
		}
	}
	require.Positive(t, before, "generation ran before the update")
	require.Positive(t, after, "generation ran after the update")
}

func waitStatus(t *testing.T, c *sdk.Client, cond func([]sdk.ServerStatus) bool, msg string) []sdk.ServerStatus {
	t.Helper()
	var st []sdk.ServerStatus
	require.Eventually(t, func() bool {
		var err error
		st, err = c.Status(t.Context())
		return err == nil && cond(st)
	}, 30*time.Second, 10*time.Millisecond, msg)
	return st
}

func allAt(v int64) func([]sdk.ServerStatus) bool {
	return func(st []sdk.ServerStatus) bool {
		for _, s := range st {
			if s.WeightVersion != v || !s.InRotation {
				return false
			}
		}
		return len(st) > 0
	}
}

func TestStartOptions(t *testing.T) {
	_, err := embedded.Start(t.Context(), embedded.Options{Servers: -1})
	require.ErrorIs(t, err, embedded.ErrInvalid)
	_, err = embedded.Start(t.Context(), embedded.Options{Secret: []byte("short")})
	require.ErrorIs(t, err, embedded.ErrInvalid)
	_, err = embedded.Start(t.Context(), embedded.Options{Model: "no-such-model"})
	require.Error(t, err)
}

func TestStatusAndPrimitives(t *testing.T) {
	f, c := startFleet(t, 2, nil)
	st, err := c.Status(t.Context())
	require.NoError(t, err)
	require.Len(t, st, 2)
	for i, s := range st {
		assert.Equal(t, f.IDs()[i], s.ID)
		assert.True(t, s.InRotation)
		assert.Equal(t, protocol.StateRunning, s.State)
		assert.Equal(t, f.Servers()[i].URL(), s.AdvertiseURL)
	}
	ctx := t.Context()
	res, err := c.Pause(ctx, sdk.PauseOptions{Mode: sdk.PauseAbort, ClearCache: true})
	require.NoError(t, err)
	require.Len(t, res, 2)
	for _, s := range f.Servers() {
		assert.EqualValues(t, "paused", s.Engine().Metrics().State)
	}
	waitStatus(t, c, func(st []sdk.ServerStatus) bool { return !st[0].InRotation && !st[1].InRotation }, "paused servers leave rotation")
	require.NoError(t, errOf(c.Resume(ctx, sdk.ResumeOptions{})))
	for _, s := range f.Servers() {
		assert.EqualValues(t, "running", s.Engine().Metrics().State)
	}
	require.NoError(t, errOf(c.Sleep(ctx, sdk.SleepOptions{Level: 1})))
	for _, s := range f.Servers() {
		assert.EqualValues(t, "sleeping", s.Engine().Metrics().State)
	}
	require.NoError(t, errOf(c.WakeUp(ctx, sdk.WakeOptions{})))
	require.NoError(t, errOf(c.Resume(ctx, sdk.ResumeOptions{})))
	require.NoError(t, errOf(c.ResetCache(ctx, sdk.ResetOptions{ResetExternal: true})))
	require.NoError(t, errOf(c.Abort(ctx, sdk.AbortOptions{})))
	require.NoError(t, errOf(c.Pause(ctx, sdk.PauseOptions{Call: sdk.Call{Targets: f.IDs()[1:2]}})))
	assert.EqualValues(t, "running", f.Servers()[0].Engine().Metrics().State)
	assert.EqualValues(t, "paused", f.Servers()[1].Engine().Metrics().State)
	require.NoError(t, errOf(c.Resume(ctx, sdk.ResumeOptions{Call: sdk.Call{Targets: f.IDs()[1:2]}})))
	waitStatus(t, c, allAt(0), "every server back in rotation")

	out, err := c.Generate(ctx, sdk.GenerateRequest{PromptTokenIDs: []int{1, 2, 3}, N: 3, Sampling: sdk.SamplingParams{MaxTokens: 8, IgnoreEOS: true}})
	require.NoError(t, err)
	require.Len(t, out.Samples, 3)
	require.Len(t, out.Servers, 1, "a group goes to one server")
	for _, s := range out.Samples {
		assert.Len(t, s.Tokens, 8)
	}
}

func TestUpdateWeightsUnderLoad(t *testing.T) {
	for _, p := range []sdk.Policy{sdk.AllOrNothing, sdk.Quorum(2), sdk.Rolling(1)} {
		t.Run(p.String(), func(t *testing.T) {
			const maxTokens = 24
			_, c := startFleet(t, 3, nil)
			ref := fileRef(t, 1, 42)
			l := startLoad(t, c, 4, maxTokens)
			began := time.Now()
			require.Eventually(t, func() bool { return l.count(began) >= 4 }, 30*time.Second, time.Millisecond, "load running")
			res, err := c.UpdateWeights(t.Context(), ref, sdk.Plan{Policy: p})
			require.NoError(t, err)
			updated := time.Now()
			require.Eventually(t, func() bool { return l.count(updated) >= 4 }, 30*time.Second, time.Millisecond, "load after the update")
			results := l.finish()
			assert.Equal(t, sdk.OutcomeCommitted, res.Outcome)
			assert.Empty(t, res.Stale)
			for _, su := range res.Servers {
				assert.True(t, su.Staged && su.Committed, su.ServerID)
				assert.Positive(t, su.Bubble, su.ServerID)
				var names []string
				for _, ph := range su.Phases {
					names = append(names, ph.Name)
				}
				assert.Equal(t, []string{"stage", "pause", "sleep", "swap", "wake", "resume"}, names, su.ServerID)
				t.Logf("%s: bubble %s (measured %v), phases %+v", su.ServerID, su.Bubble, su.BubbleMeasured, su.Phases)
			}
			t.Logf("stage %s, commit %s, total %s, %d generate calls", res.StageTime, res.CommitTime, res.Duration, len(results))
			checkVersions(t, results, maxTokens, 0, 1, updated)
			waitStatus(t, c, allAt(1), "every server serves version 1 in rotation")
		})
	}
}

// perServerRoots gives every server its own weights root, so one relative URI resolves to a
// different file on each: the way to hand one server a bad checkpoint.
func perServerRoots(t *testing.T, n int) []string {
	roots := make([]string, n)
	for i := range roots {
		roots[i] = t.TempDir()
	}
	return roots
}

func TestAllOrNothingBadDigestKeepsOldVersion(t *testing.T) {
	roots := perServerRoots(t, 3)
	var digest string
	for i, r := range roots {
		seed := uint64(42)
		if i == 2 {
			seed = 43 // another checkpoint under the same name: its digest does not match
		}
		d := writeCheckpoint(t, filepath.Join(r, "v1"), seed)
		if i == 0 {
			digest = d
		}
	}
	f, c := startFleet(t, 3, func(i int, cfg *server.Config) { cfg.WeightsRoot = roots[i] })
	before, err := c.DesiredState(t.Context())
	require.NoError(t, err)
	l := startLoad(t, c, 3, 16)
	began := time.Now()
	require.Eventually(t, func() bool { return l.count(began) >= 3 }, 30*time.Second, time.Millisecond)
	res, err := c.UpdateWeights(t.Context(), sdk.WeightsRef{Version: 1, URI: "v1", SHA256: digest}, sdk.Plan{Policy: sdk.AllOrNothing})
	require.ErrorIs(t, err, sdk.ErrAborted)
	require.ErrorIs(t, err, sdk.ErrFailed)
	updated := time.Now()
	require.Eventually(t, func() bool { return l.count(updated) >= 3 }, 30*time.Second, time.Millisecond)
	results := l.finish()
	assert.Equal(t, sdk.OutcomeAborted, res.Outcome)
	bad := res.Server(f.IDs()[2])
	require.NotNil(t, bad)
	assert.False(t, bad.Staged)
	assert.Contains(t, bad.Err.Error(), "digest")
	for _, su := range res.Servers {
		assert.False(t, su.Committed)
		assert.Nil(t, su.Commit, "no commit was sent")
	}
	after, err := c.DesiredState(t.Context())
	require.NoError(t, err)
	assert.Equal(t, before, after, "the desired state is unchanged")
	for _, s := range f.Servers() {
		assert.Equal(t, int64(0), s.Engine().Version())
	}
	for _, r := range results {
		require.NoError(t, r.err)
		for _, s := range r.res.Samples {
			for _, tok := range s.Tokens {
				require.Equal(t, int64(0), tok.WeightVersion)
			}
		}
	}
	waitStatus(t, c, allAt(0), "the fleet keeps serving version 0")
}

func TestQuorumStaleServerConverges(t *testing.T) {
	roots := perServerRoots(t, 3)
	var digest string
	for i, r := range roots[:2] {
		d := writeCheckpoint(t, filepath.Join(r, "v1"), 42)
		if i == 0 {
			digest = d
		}
	}
	f, c := startFleet(t, 3, func(i int, cfg *server.Config) { cfg.WeightsRoot = roots[i] })
	stale := f.IDs()[2]
	res, err := c.UpdateWeights(t.Context(), sdk.WeightsRef{Version: 1, URI: "v1", SHA256: digest}, sdk.Plan{Policy: sdk.Quorum(2)})
	require.NoError(t, err)
	assert.Equal(t, sdk.OutcomeDegraded, res.Outcome)
	assert.Equal(t, []string{stale}, res.Stale)

	st := waitStatus(t, c, func(st []sdk.ServerStatus) bool { return !st[2].InRotation }, "the stale server reports itself out of rotation")
	assert.True(t, st[2].Stale)
	assert.Equal(t, int64(0), st[2].WeightVersion)
	// It gets no traffic: it cannot converge while its root lacks the checkpoint.
	for i := range 12 {
		out, err := c.Generate(t.Context(), sdk.GenerateRequest{PromptTokenIDs: []int{i, i + 1, i + 2}, N: 2,
			Sampling: sdk.SamplingParams{MaxTokens: 4, IgnoreEOS: true}})
		require.NoError(t, err)
		assert.NotContains(t, out.Servers, stale)
		for _, s := range out.Samples {
			for _, tok := range s.Tokens {
				require.Equal(t, int64(1), tok.WeightVersion)
			}
		}
	}
	// Once the checkpoint is there, it converges by itself and comes back.
	writeCheckpoint(t, filepath.Join(roots[2], "v1"), 42)
	waitStatus(t, c, allAt(1), "the stale server converges to version 1")
	assert.Equal(t, int64(1), f.Servers()[2].Engine().Version())
}

func TestGenerateContinuesAcrossPause(t *testing.T) {
	// The engine loop is held inside a forward pass once the sample has made ten tokens, until
	// the pause waits in the engine's input: the sample is caught in flight however fast the
	// machine steps. (Another call queued first would let the loop go early; then the attempt
	// may miss, and the next one runs.)
	g := &enginetest.Gate{}
	f, c := startFleet(t, 1, func(_ int, cfg *server.Config) { cfg.BeforeForward = g.Hook })
	g.Bind(f.Servers()[0].Engine())
	t.Cleanup(g.Open) // runs before the fleet's cleanup: a failed test never leaves the loop held
	const maxTokens = 1500
	for attempt := range 5 {
		type out struct {
			res *sdk.GenerateResult
			err error
		}
		g.HoldAfterTokens(g.Tokens() + 10)
		done := make(chan out, 1)
		go func() {
			res, err := c.Generate(t.Context(), sdk.GenerateRequest{PromptTokenIDs: []int{10, 20, 30}, RequestID: "long",
				Sampling: sdk.SamplingParams{MaxTokens: maxTokens, Temperature: 1, IgnoreEOS: true}})
			done <- out{res, err}
		}()
		require.NoError(t, g.CallHeld(t, func() error { return errOf(c.Pause(t.Context(), sdk.PauseOptions{Mode: sdk.PauseAbort})) }))
		require.NoError(t, errOf(c.Resume(t.Context(), sdk.ResumeOptions{})))
		o := <-done
		require.NoError(t, o.err)
		s := o.res.Samples[0]
		require.Len(t, s.Tokens, maxTokens)
		assert.Equal(t, sdk.FinishLength, s.FinishReason)
		for _, tok := range s.Tokens {
			require.False(t, math.IsInf(tok.Logprob, 0) || math.IsNaN(tok.Logprob))
			require.Equal(t, int64(0), tok.WeightVersion)
		}
		if s.Continuations == 0 {
			t.Logf("attempt %d: the sample finished before the pause; again", attempt)
			continue
		}
		assert.GreaterOrEqual(t, len(s.Segments), 2)
		return
	}
	t.Fatal("the pause never caught the sample in flight")
}

func TestBadInputTouchesNothing(t *testing.T) {
	f, c := startFleet(t, 2, nil)
	sub, err := f.Bus().Subscribe(t.Context(), protocol.Names{Fleet: "embedded"}.Control())
	require.NoError(t, err)
	defer sub.Close()
	before, err := c.DesiredState(t.Context())
	require.NoError(t, err)
	ref := fileRef(t, 1, 1)
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	for _, tc := range []struct {
		name string
		dead bool
		ref  sdk.WeightsRef
		plan sdk.Plan
		want error
	}{
		{"unknown policy", false, ref, sdk.Plan{Policy: "majority"}, sdk.ErrInvalid},
		{"K too large", false, ref, sdk.Plan{Policy: sdk.Quorum(3)}, sdk.ErrInvalid},
		{"rolling K too large", false, ref, sdk.Plan{Policy: sdk.Rolling(5)}, sdk.ErrInvalid},
		{"version not above serving", false, sdk.WeightsRef{Version: 0, URI: ref.URI}, sdk.Plan{}, sdk.ErrInvalid},
		{"no such target", false, ref, sdk.Plan{Targets: []string{"nobody"}}, sdk.ErrNoServers},
		{"cancelled context", true, ref, sdk.Plan{}, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			if tc.dead {
				ctx = cancelled
			}
			res, err := c.UpdateWeights(ctx, tc.ref, tc.plan)
			require.ErrorIs(t, err, tc.want)
			require.Nil(t, res)
		})
	}
	after, err := c.DesiredState(t.Context())
	require.NoError(t, err)
	assert.Equal(t, before, after)
	// Everything published reaches the subscription in order: a marker published now must
	// be the first message it sees.
	marker := []byte(`{"marker":true}`)
	_, err = f.Bus().Publish(t.Context(), protocol.Names{Fleet: "embedded"}.Control(), marker)
	require.NoError(t, err)
	for ev := range sub.Events() {
		if ev.Kind == bus.EventMessage {
			require.Equal(t, string(marker), string(ev.Payload), "a refused call published a command")
			break
		}
	}
	for _, s := range f.Servers() {
		assert.Equal(t, int64(0), s.Engine().Version())
	}
}

func TestGenerateMovesOffADeadServer(t *testing.T) {
	// s1 advertises an address nothing listens on: to the SDK it is a server that died
	// while its heartbeat has not expired yet.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := "http://" + ln.Addr().String()
	require.NoError(t, ln.Close())
	f, c := startFleet(t, 2, func(i int, cfg *server.Config) {
		if i == 1 {
			cfg.AdvertiseURL = dead
		}
	})
	retries := 0
	for i := range 20 {
		out, err := c.Generate(t.Context(), sdk.GenerateRequest{PromptTokenIDs: []int{i, 2 * i, 3}, N: 2,
			Sampling: sdk.SamplingParams{MaxTokens: 4, IgnoreEOS: true}})
		require.NoError(t, err)
		assert.Equal(t, []string{f.IDs()[0]}, out.Servers)
		retries += out.Retries
	}
	assert.Positive(t, retries, "some prompts' home was the dead server")
}

func TestOverRedis(t *testing.T) {
	srv := redistest.Start(t)
	rb, err := bus.DialRedis(t.Context(), srv.URL(), bus.RedisOptions{Logger: quiet})
	require.NoError(t, err)
	defer rb.Close()
	f, err := embedded.Start(t.Context(), embedded.Options{Servers: 2, Secret: secret, Bus: rb, Logger: quiet,
		Fleet: "redis-fleet", Server: func(_ int, c *server.Config) { c.FleetHeartbeat = 100 * time.Millisecond }})
	require.NoError(t, err)
	defer func() { require.NoError(t, f.Close()) }()
	// The client dials Redis itself, as a trainer would.
	c, err := sdk.Dial(t.Context(), sdk.Options{Redis: redisconf.Config{URL: srv.URL()}, Fleet: "redis-fleet", Secret: secret, Logger: quiet})
	require.NoError(t, err)
	defer c.Close()
	st, err := c.Status(t.Context())
	require.NoError(t, err)
	require.Len(t, st, 2)
	require.NoError(t, errOf(c.Pause(t.Context(), sdk.PauseOptions{Mode: sdk.PauseWait})))
	require.NoError(t, errOf(c.Resume(t.Context(), sdk.ResumeOptions{})))
	const maxTokens = 16
	l := startLoad(t, c, 2, maxTokens)
	began := time.Now()
	require.Eventually(t, func() bool { return l.count(began) >= 2 }, 30*time.Second, time.Millisecond)
	res, err := c.UpdateWeights(t.Context(), fileRef(t, 1, 5), sdk.Plan{Policy: sdk.Quorum(2)})
	require.NoError(t, err)
	updated := time.Now()
	require.Eventually(t, func() bool { return l.count(updated) >= 2 }, 30*time.Second, time.Millisecond)
	checkVersions(t, l.finish(), maxTokens, 0, 1, updated)
	assert.Equal(t, sdk.OutcomeCommitted, res.Outcome)
	waitStatus(t, c, allAt(1), "both servers on version 1")
}

// errOf drops a control call's results, for tests that check only its error.
func errOf(_ []sdk.ServerResult, err error) error { return err }
