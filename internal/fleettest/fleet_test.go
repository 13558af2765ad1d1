package fleettest_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/weights"
	"github.com/rolloutkit/rollout/internal/fleettest"
	"github.com/rolloutkit/rollout/internal/redistest"
	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/sdk/bus/redisconf"
	"github.com/rolloutkit/rollout/sdk/protocol"
)

// offloadArgs give every server a KV offloading connector, so each update's two cache resets
// (the pause's clear_cache and the sleep) reach it and are counted.
var offloadArgs = []string{"--offload-cpu-bytes", "64MiB", "--kv-blocks", "512"}

// skipShort skips a multi-process test under -short and runs it in parallel with the others
// otherwise: they spend most of their time waiting for heartbeats.
func skipShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("multi-process fleet test")
	}
	t.Parallel()
}

// checkpoint writes the tiny preset with seed as an HF checkpoint in dir and returns its digest.
func checkpoint(t *testing.T, dir string, seed uint64) string {
	t.Helper()
	w, err := model.Preset("tiny", seed)
	require.NoError(t, err)
	require.NoError(t, weights.SaveHF(dir, w, weights.F32))
	d, err := weights.Digest(t.Context(), dir)
	require.NoError(t, err)
	return d
}

func fileRef(t *testing.T, v int64, seed uint64) sdk.WeightsRef {
	t.Helper()
	dir := filepath.Join(t.TempDir(), fmt.Sprintf("v%d", v))
	return sdk.WeightsRef{Version: v, URI: "file://" + dir, SHA256: checkpoint(t, dir, seed)}
}

func dial(t *testing.T, f *fleettest.Fleet) *sdk.Client {
	t.Helper()
	c, err := sdk.Dial(t.Context(), sdk.Options{Redis: redisconf.Config{URL: f.Redis.URL()}, Fleet: f.Name, Secret: []byte(f.Secret),
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// sampleRecord is one finished sample and when its request was sent.
type sampleRecord struct {
	sent   time.Time
	sample sdk.Sample
}

// load keeps workers calling Generate until stopped, as a trainer's rollout workers would.
type load struct {
	stop chan struct{}
	wg   sync.WaitGroup
	done atomic.Int64

	mu      sync.Mutex
	samples []sampleRecord
	errs    []error
}

func startLoad(t *testing.T, c *sdk.Client, workers int) *load {
	t.Helper()
	l := &load{stop: make(chan struct{})}
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				sent := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
				res, err := c.Generate(ctx, sdk.GenerateRequest{PromptTokenIDs: []int{1, 2 + w, 3 + i%50, 4}, N: 2,
					Sampling: sdk.SamplingParams{MaxTokens: 48, Temperature: 1, IgnoreEOS: true}})
				cancel()
				if err != nil {
					// No server to route to (e.g. Redis restarting): back off a little rather
					// than spin; the error is recorded for the test to judge.
					select {
					case <-l.stop:
					case <-time.After(10 * time.Millisecond):
					}
				}
				l.mu.Lock()
				if err != nil {
					l.errs = append(l.errs, err)
				} else {
					for _, s := range res.Samples {
						l.samples = append(l.samples, sampleRecord{sent: sent, sample: s})
					}
				}
				l.mu.Unlock()
				l.done.Add(1)
			}
		}()
	}
	t.Cleanup(l.halt)
	return l
}

func (l *load) halt() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

// waitProgress waits until n more requests have finished: generation goes on.
func (l *load) waitProgress(t *testing.T, n int64) {
	t.Helper()
	want := l.done.Load() + n
	require.Eventually(t, func() bool { return l.done.Load() >= want }, 60*time.Second, 10*time.Millisecond,
		"generation stalled at %d requests", l.done.Load())
}

// check stops the load and checks every sample: whole (48 tokens), each token's version not
// below the one before it, and a request sent after version v was everywhere committed
// (since[v]) has no token of an older version.
func (l *load) check(t *testing.T, since map[int64]time.Time) (n int) {
	t.Helper()
	l.halt()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.samples {
		vs := r.sample.WeightVersions()
		require.Len(t, vs, 48, "a sample came back cut short")
		for i := 1; i < len(vs); i++ {
			require.GreaterOrEqual(t, vs[i], vs[i-1], "a sample's versions went backwards: %v (servers %v)", vs, r.sample.Servers)
		}
		for v, at := range since {
			if r.sent.After(at) {
				require.GreaterOrEqual(t, vs[0], v, "a request sent after version %d was committed got an older token: %v", v, vs)
			}
		}
	}
	return len(l.samples)
}

func (l *load) errors() []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.errs)
}

func metric(t *testing.T, p *fleettest.Proc, name string, labels ...string) float64 {
	t.Helper()
	v, err := p.Metric(name, labels...)
	require.NoError(t, err)
	return v
}

func waitVersion(t *testing.T, f *fleettest.Fleet, v int64, procs ...*fleettest.Proc) {
	t.Helper()
	if len(procs) == 0 {
		procs = f.Procs
	}
	for _, p := range procs {
		f.WaitFor(p, 60*time.Second, fmt.Sprintf("in rotation at version %d", v), func(hb *protocol.Heartbeat) bool {
			return hb != nil && hb.InRotation && hb.WeightVersion == v
		})
	}
}

// TestUpdateWeightsUnderEachPolicy: three rollout serve processes and one redis-server, with
// generation running throughout, move to versions 1, 2, 3 under all, quorum:2 and rolling:1.
// Every server ends on each new version; no sample's versions go backwards and no request
// sent after a commit gets an old token; each server counts two connector resets per update
// and no safety violation.
func TestUpdateWeightsUnderEachPolicy(t *testing.T) {
	skipShort(t)
	f := fleettest.Start(t, fleettest.Options{Servers: 3, Fleet: "policies", Args: offloadArgs})
	c := dial(t, f)
	l := startLoad(t, c, 6)
	l.waitProgress(t, 6)

	since := map[int64]time.Time{}
	for i, policy := range []sdk.Policy{sdk.AllOrNothing, sdk.Quorum(2), sdk.Rolling(1)} {
		v := int64(i + 1)
		ref := fileRef(t, v, uint64(10+v))
		res, err := c.UpdateWeights(t.Context(), ref, sdk.Plan{Policy: policy})
		require.NoError(t, err, "update to %d under %s", v, policy)
		since[v] = time.Now()
		assert.Equal(t, sdk.OutcomeCommitted, res.Outcome, policy)
		require.Len(t, res.Servers, 3)
		for _, s := range res.Servers {
			assert.True(t, s.Committed, "%s under %s", s.ServerID, policy)
			assert.Equal(t, v, s.WeightVersion, "%s under %s", s.ServerID, policy)
		}
		t.Logf("%s: stage %s, commit %s, max bubble %s", policy, res.StageTime, res.CommitTime, res.MaxBubble)
		waitVersion(t, f, v)
		for _, p := range f.Procs {
			assert.Equal(t, float64(2*v), metric(t, p, "rollout_offload_resets_total"), "%s after update %d", p.ID, v)
		}
		l.waitProgress(t, 6) // generation on the new version before the next update
	}
	require.Empty(t, l.errors())
	n := l.check(t, since)
	t.Logf("%d samples checked", n)
	for _, p := range f.Procs {
		assert.Zero(t, metric(t, p, "rollout_safety_violations_total"), p.ID)
		assert.Zero(t, metric(t, p, "rollout_control_rejected_total"), p.ID)
		assert.Equal(t, float64(3), metric(t, p, "rollout_control_commands_total", "kind", "commit", "result", "ok"), p.ID)
	}
}

// TestKillServerMidCommit SIGKILLs s3 the moment the desired state moves to the new version
// (the commit point), while its commit is running or about to (its offload transfers are
// slowed, so its pause waits on them). The quorum proceeds on the other two; s3, restarted,
// converges to the desired version before its /ready says 200.
func TestKillServerMidCommit(t *testing.T) {
	skipShort(t)
	f := fleettest.Start(t, fleettest.Options{Servers: 3, Fleet: "kill", Args: offloadArgs,
		ServerArgs: func(i int) []string {
			if i == 2 {
				return []string{"--offload-delay", "300ms"}
			}
			return nil
		}})
	c := dial(t, f)
	l := startLoad(t, c, 6)
	l.waitProgress(t, 6)
	s3 := f.Proc("s3")
	ref := fileRef(t, 1, 21)

	killed := make(chan struct{})
	go func() {
		defer close(killed)
		for {
			d, err := c.DesiredState(context.Background())
			if err == nil && d != nil && d.Weights != nil && d.Weights.Version == 1 {
				s3.Kill()
				return
			}
			select {
			case <-l.stop:
				return
			default:
			}
		}
	}()
	res, err := c.UpdateWeights(t.Context(), ref, sdk.Plan{Policy: sdk.Quorum(2), CommitTimeout: 5 * time.Second})
	<-killed
	require.NotNil(t, res, "update: %v", err)
	committed := 0
	for _, s := range res.Servers {
		if s.Committed {
			committed++
		}
	}
	require.GreaterOrEqual(t, committed, 2, "outcome %s (%s): %v", res.Outcome, res.Reason, err)
	if s := res.Server("s3"); !s.Committed {
		assert.Equal(t, sdk.OutcomeDegraded, res.Outcome)
		assert.Contains(t, res.Stale, "s3")
		require.NoError(t, err, "a met quorum is not an error")
	} else {
		t.Log("s3 acked its commit before the kill landed")
	}
	waitVersion(t, f, 1, f.Proc("s1"), f.Proc("s2"))
	l.waitProgress(t, 6) // the two others generate on

	s3.Start()
	deadline := time.Now().Add(fleettest.StartTimeout)
	for {
		code, v := s3.Ready()
		if code == http.StatusOK {
			require.Equal(t, int64(1), v, "s3 was ready before it served the desired version")
			break
		}
		require.True(t, time.Now().Before(deadline), "s3 never became ready:\n%s", s3.Logs())
		time.Sleep(5 * time.Millisecond)
	}
	waitVersion(t, f, 1)
	l.waitProgress(t, 6)
	require.Empty(t, l.errors(), "Generate moves off a killed server")
	l.check(t, map[int64]time.Time{})
	for _, p := range f.Procs {
		assert.Zero(t, metric(t, p, "rollout_safety_violations_total"), p.ID)
	}
}

// gatedDir serves a checkpoint directory over HTTP, holding every request for the safetensors
// file until the test opens the gate, so a weight update can be caught while it stages.
type gatedDir struct {
	dir     string
	arrived chan struct{}
	gate    chan struct{}
}

func (g *gatedDir) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasSuffix(r.URL.Path, ".safetensors") {
		g.arrived <- struct{}{}
		<-g.gate
	}
	http.FileServer(http.Dir(g.dir)).ServeHTTP(w, r)
}

// TestRedisRestartMidTransaction restarts redis-server (empty: nothing persisted) while every
// server is fetching the new version. The SDK and the agents reconnect; the transaction
// either completes or fails with a clear error, and either way nobody is left paused and the
// whole fleet serves one version.
func TestRedisRestartMidTransaction(t *testing.T) {
	skipShort(t)
	f := fleettest.Start(t, fleettest.Options{Servers: 3, Fleet: "restart", Args: offloadArgs})
	c := dial(t, f)
	l := startLoad(t, c, 4)
	l.waitProgress(t, 4)

	dir := filepath.Join(t.TempDir(), "v1")
	sum := checkpoint(t, dir, 31)
	g := &gatedDir{dir: dir, arrived: make(chan struct{}, 3), gate: make(chan struct{})}
	srv := httptestServer(t, g)

	type outcome struct {
		res *sdk.UpdateResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := c.UpdateWeights(context.Background(), sdk.WeightsRef{Version: 1, URI: srv + "/", SHA256: sum},
			// No peers: every server fetches from the gated origin, so all three are caught
			// mid-stage.
			sdk.Plan{Policy: sdk.AllOrNothing, StageTimeout: 30 * time.Second, CommitTimeout: 15 * time.Second, PeerFanOut: -1})
		done <- outcome{res, err}
	}()
	for range 3 {
		<-g.arrived // every server is fetching: the transaction is in its stage phase
	}
	f.Redis.Restart()
	close(g.gate)
	o := <-done
	if o.err != nil {
		t.Logf("update failed after the restart (allowed, if clearly): %v", o.err)
		assert.NotContains(t, o.err.Error(), "%!", "a malformed error message")
	} else {
		t.Logf("update completed across the restart: %s", o.res.Outcome)
	}
	// Everyone reconnects and heartbeats again, in rotation (nobody paused), on one version:
	// the new one when the update says it committed.
	if o.err == nil {
		waitVersion(t, f, 1)
	} else {
		require.Eventually(t, func() bool {
			version := int64(-1)
			for _, p := range f.Procs {
				hb := f.Heartbeat(p.ID)
				if hb == nil || !hb.InRotation || hb.State != protocol.StateRunning || (version >= 0 && hb.WeightVersion != version) {
					return false
				}
				version = hb.WeightVersion
			}
			return true
		}, 60*time.Second, 20*time.Millisecond, "the fleet did not settle, in rotation on one version")
	}
	for _, p := range f.Procs {
		assert.Equal(t, "running", stateOf(t, p).State, p.ID)
	}
	// The SDK reconnected too: generation and control calls work again.
	l.waitProgress(t, 4)
	require.NoError(t, errOf(c.Resume(t.Context(), sdk.ResumeOptions{})))
	if errs := l.errors(); len(errs) > 0 {
		t.Logf("%d Generate calls failed while Redis was down, e.g. %v", len(errs), errs[0])
	}
	l.check(t, map[int64]time.Time{})
}

// TestPartitionedServerCatchesUp cuts s3 off from Redis (a TCP proxy in between), updates the
// fleet under quorum:2 (s3 cannot stage and is left stale), heals the partition and waits for
// s3 to converge to the new version by itself.
func TestPartitionedServerCatchesUp(t *testing.T) {
	skipShort(t)
	rs := redistest.Start(t)
	proxy := redistest.NewProxy(t, rs.Addr())
	f := fleettest.Start(t, fleettest.Options{Servers: 3, Fleet: "partition", Redis: rs, Args: offloadArgs,
		RedisURL: func(i int) string {
			if i == 2 {
				return proxy.URL()
			}
			return rs.URL()
		}})
	c := dial(t, f)
	l := startLoad(t, c, 4)
	l.waitProgress(t, 4)
	s3 := f.Proc("s3")

	proxy.Partition()
	ref := fileRef(t, 1, 41)
	res, err := c.UpdateWeights(t.Context(), ref, sdk.Plan{Policy: sdk.Quorum(2), StageTimeout: 3 * time.Second})
	require.NoError(t, err)
	assert.Equal(t, sdk.OutcomeDegraded, res.Outcome)
	assert.Contains(t, res.Stale, "s3")
	waitVersion(t, f, 1, f.Proc("s1"), f.Proc("s2"))
	assert.Equal(t, int64(0), stateOf(t, s3).WeightVersion, "s3 heard nothing")
	l.waitProgress(t, 4)

	proxy.Heal()
	waitVersion(t, f, 1, s3)
	assert.Equal(t, float64(2), metric(t, s3, "rollout_offload_resets_total"), "s3 converged with the plan's cut")
	l.waitProgress(t, 4)
	require.Empty(t, l.errors())
	l.check(t, map[int64]time.Time{})
}

// TestBadDigestOnOneServerAllOrNothing: the source is a relative path each server resolves in
// its own --weights-root, and s3's holds other bytes, so only s3's digest check fails. Under
// all-or-nothing nobody swaps: the whole fleet stays on version 0, serving throughout.
func TestBadDigestOnOneServerAllOrNothing(t *testing.T) {
	skipShort(t)
	good, bad := t.TempDir(), t.TempDir()
	sum := checkpoint(t, filepath.Join(good, "ckpt"), 51)
	other := checkpoint(t, filepath.Join(bad, "ckpt"), 52)
	require.NotEqual(t, sum, other)
	f := fleettest.Start(t, fleettest.Options{Servers: 3, Fleet: "digest", Args: offloadArgs,
		ServerArgs: func(i int) []string {
			if i == 2 {
				return []string{"--weights-root", bad}
			}
			return []string{"--weights-root", good}
		}})
	c := dial(t, f)
	l := startLoad(t, c, 4)
	l.waitProgress(t, 4)

	res, err := c.UpdateWeights(t.Context(), sdk.WeightsRef{Version: 1, URI: "ckpt", SHA256: sum}, sdk.Plan{Policy: sdk.AllOrNothing})
	require.Error(t, err)
	assert.ErrorIs(t, err, sdk.ErrAborted)
	require.NotNil(t, res)
	assert.Equal(t, sdk.OutcomeAborted, res.Outcome)
	s3 := res.Server("s3")
	require.NotNil(t, s3)
	require.Error(t, s3.Err)
	assert.Contains(t, s3.Err.Error(), "digest")
	for _, s := range res.Servers {
		assert.False(t, s.Committed, s.ServerID)
	}
	d, err := c.DesiredState(t.Context())
	require.NoError(t, err)
	assert.True(t, d == nil || d.Weights == nil, "the desired state did not move")
	l.waitProgress(t, 4)
	for _, p := range f.Procs {
		assert.Equal(t, int64(0), stateOf(t, p).WeightVersion, p.ID)
		assert.Equal(t, http.StatusOK, p.Status("/ready"), p.ID)
		assert.Zero(t, metric(t, p, "rollout_offload_resets_total"), "%s was paused for an update that never happened", p.ID)
	}
	require.Empty(t, l.errors())
	l.check(t, map[int64]time.Time{})
}

// httptestServer serves h on a free port until the test ends and returns its URL.
func httptestServer(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	ln, err := netListen()
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.Logf("weights server shutdown: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

func netListen() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }
