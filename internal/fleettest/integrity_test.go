package fleettest_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/internal/fleettest"
	"github.com/rolloutkit/rollout/internal/redistest"
	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/bus/redisconf"
	"github.com/rolloutkit/rollout/sdk/protocol"
)

// staleFleet starts three servers whose --weights-root make "ckpt" one checkpoint on s1 and
// s2 and another on s3, commits version 1 under quorum:2 (s3's digest check fails, so it
// stays on version 0, out of rotation) and returns the fleet and the trainer's client.
func staleFleet(t *testing.T, name string, extra func(i int) []string) (*fleettest.Fleet, *sdk.Client) {
	t.Helper()
	good, bad := t.TempDir(), t.TempDir()
	sum := checkpoint(t, filepath.Join(good, "ckpt"), 61)
	checkpoint(t, filepath.Join(bad, "ckpt"), 62)
	f := fleettest.Start(t, fleettest.Options{Servers: 3, Fleet: name, ServerArgs: func(i int) []string {
		root := good
		if i == 2 {
			root = bad
		}
		args := []string{"--weights-root", root}
		if extra != nil {
			args = append(args, extra(i)...)
		}
		return args
	}})
	c := dial(t, f)
	res, err := c.UpdateWeights(t.Context(), sdk.WeightsRef{Version: 1, URI: "ckpt", SHA256: sum}, sdk.Plan{Policy: sdk.Quorum(2)})
	require.NoError(t, err)
	require.Equal(t, sdk.OutcomeDegraded, res.Outcome)
	f.WaitFor(f.Procs[2], 10*time.Second, "out of rotation on version 0", func(hb *protocol.Heartbeat) bool {
		return hb != nil && hb.WeightVersion == 0 && !hb.InRotation
	})
	return f, c
}

// generateAll runs n single-sample requests through c and returns every token's version.
func generateAll(t *testing.T, c *sdk.Client, n int) []int64 {
	t.Helper()
	var versions []int64
	for i := range n {
		res, err := c.Generate(t.Context(), sdk.GenerateRequest{PromptTokenIDs: []int{1, 2, 3 + i%5}, Sampling: sdk.SamplingParams{MaxTokens: 4}})
		require.NoError(t, err)
		for _, s := range res.Samples {
			versions = append(versions, s.WeightVersions()...)
		}
	}
	return versions
}

// TestRedisRestartsEmptyStaleServerStaysOut (issue 25, case 3): after Redis restarts empty,
// the servers keep the fleet's desired state and write it back; the server still on
// version 0 stays out of rotation, and a client that dials afterwards gets only tokens of
// the committed version.
func TestRedisRestartsEmptyStaleServerStaysOut(t *testing.T) {
	skipShort(t)
	f, _ := staleFleet(t, "restart-empty", nil)
	f.Redis.Restart()
	// The servers write the desired state back by themselves (nobody else writes it here).
	require.Eventually(t, func() bool {
		hb := f.Heartbeat("s1")
		return hb != nil && hb.InRotation
	}, 20*time.Second, 20*time.Millisecond, "the servers heartbeat again")
	c := dial(t, f)
	d, err := c.DesiredState(t.Context())
	require.NoError(t, err)
	require.NotNil(t, d, "the servers wrote the desired state back")
	require.NotNil(t, d.Weights)
	assert.EqualValues(t, 1, d.Weights.Version)
	var hb *protocol.Heartbeat
	f.WaitFor(f.Procs[2], 10*time.Second, "heartbeating again", func(h *protocol.Heartbeat) bool { hb = h; return h != nil })
	assert.False(t, hb.InRotation, "the stale server stays out")
	assert.Contains(t, hb.Error, "out of rotation", "and says why")
	for _, v := range generateAll(t, c, 20) {
		require.EqualValues(t, 1, v, "no token from version 0 after the fleet committed version 1")
	}
}

// TestRestartedServerWithStateDirStaysOut (issue 25, cases 2 and 3): a stale server killed
// and restarted while Redis is empty knows the fleet's version from its state directory and
// stays out of rotation; the trainer's long-lived client routes nothing to it, and requests
// carry the floor, so no token below version 1 is generated.
func TestRestartedServerWithStateDirStaysOut(t *testing.T) {
	skipShort(t)
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	f, c := staleFleet(t, "state-dir", func(i int) []string { return []string{"--state-dir", dirs[i]} })
	s3 := f.Procs[2]
	s3.Kill()
	f.Redis.Restart()
	s3.Start()
	f.WaitFor(s3, 20*time.Second, "heartbeating, out of rotation", func(hb *protocol.Heartbeat) bool {
		return hb != nil && hb.WeightVersion == 0 && !hb.InRotation && hb.DesiredEpoch > 0
	})
	for _, v := range generateAll(t, c, 30) {
		require.EqualValues(t, 1, v)
	}
}

// TestPauseThenResumeQuicklyConverges (issue 25, case 4): a fleet pause (keep, clear cache)
// followed by a resume half a second later leaves every server running and in rotation,
// whatever each agent had read of the desired state in between.
func TestPauseThenResumeQuicklyConverges(t *testing.T) {
	skipShort(t)
	f := fleettest.Start(t, fleettest.Options{Servers: 2, Fleet: "pause-resume", Args: offloadArgs})
	c := dial(t, f)
	for range 5 {
		require.NoError(t, errOf(c.Pause(t.Context(), sdk.PauseOptions{Mode: sdk.PauseKeep, ClearCache: true})))
		time.Sleep(500 * time.Millisecond) // the reported race window, not a result-deciding wait
		require.NoError(t, errOf(c.Resume(t.Context(), sdk.ResumeOptions{})))
	}
	for _, p := range f.Procs {
		f.WaitFor(p, 10*time.Second, "running in rotation", func(hb *protocol.Heartbeat) bool {
			return hb != nil && hb.State == protocol.StateRunning && hb.InRotation
		})
	}
	res, err := c.Generate(t.Context(), sdk.GenerateRequest{PromptTokenIDs: []int{1, 2}, Sampling: sdk.SamplingParams{MaxTokens: 2}})
	require.NoError(t, err)
	require.Len(t, res.Samples, 1)
}

// TestLostResumeConverges (issue 25, case 4): a fleet resume the servers never hear (the
// desired state is cleared, the message is lost) still resumes them, from the record.
func TestLostResumeConverges(t *testing.T) {
	skipShort(t)
	f := fleettest.Start(t, fleettest.Options{Servers: 2, Fleet: "lost-resume", Args: offloadArgs})
	c := dial(t, f)
	require.NoError(t, errOf(c.Pause(t.Context(), sdk.PauseOptions{})))
	for _, p := range f.Procs {
		f.WaitFor(p, 10*time.Second, "paused", func(hb *protocol.Heartbeat) bool { return hb != nil && hb.State == protocol.StatePaused })
	}
	// The resume's record without its message: write the desired state as Resume would.
	d, err := c.DesiredState(t.Context())
	require.NoError(t, err)
	next := *d
	next.Paused, next.PauseMode, next.Epoch, next.Sig = false, "", d.Epoch+1, ""
	next.Sign([]byte(f.Secret))
	raw, err := next.Encode()
	require.NoError(t, err)
	require.NoError(t, f.SetKey(protocol.Names{Fleet: f.Name}.Desired(), raw))
	for _, p := range f.Procs {
		f.WaitFor(p, 10*time.Second, "running in rotation", func(hb *protocol.Heartbeat) bool {
			return hb != nil && hb.State == protocol.StateRunning && hb.InRotation
		})
	}
}

// TestSecondTrainerWaitsForASilentServerAfterRedisLosesTheRecord: a version names one
// checkpoint even when Redis loses the record that bound it. Trainer A commits version 2
// on s2 alone (s1 is cut off from Redis, so it keeps the version-1 record); then s2 stops,
// Redis restarts empty and s1, back, writes its older record into the empty key. Trainer
// B, whose last word from s2 predates all this, updates version 2 with its own checkpoint:
// it must not build on the key while a server it counts as live has not been heard since,
// for that server may hold a newer record. B gives up (ErrConflict); once s2 is back it
// writes its record over s1's, and every server converges to A's checkpoint. Before the
// client waited for its live servers' heartbeats, B committed its version 2 on s1 while s2
// served A's: one number, two checkpoints.
func TestSecondTrainerWaitsForASilentServerAfterRedisLosesTheRecord(t *testing.T) {
	skipShort(t)
	root := t.TempDir()
	sum1, sumA, sumB := raceCheckpoints(t, root, 71)
	r := redistest.Start(t)
	proxies := []*redistest.Proxy{redistest.NewProxy(t, r.Addr()), redistest.NewProxy(t, r.Addr())}
	f := fleettest.Start(t, fleettest.Options{Servers: 2, Fleet: "lost-record", Redis: r,
		RedisURL:   func(i int) string { return proxies[i].URL() },
		ServerArgs: func(int) []string { return []string{"--weights-root", root} }})
	s1, s2 := f.Procs[0], f.Procs[1]
	a := dial(t, f)
	// B hears the fleet only at dial and when it writes: it never sees s2's later heartbeats
	// (as a client between two refreshes would not), and counts s2 live for a minute.
	b, err := sdk.Dial(t.Context(), sdk.Options{Redis: redisconf.Config{URL: f.Redis.URL()}, Fleet: f.Name, Secret: []byte(f.Secret),
		Logger: slog.New(slog.DiscardHandler), RefreshInterval: time.Hour, HeartbeatTTL: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })

	_, err = a.UpdateWeights(t.Context(), sdk.WeightsRef{Version: 1, URI: "v1", SHA256: sum1}, sdk.Plan{Policy: sdk.AllOrNothing})
	require.NoError(t, err)
	proxies[0].Partition()
	res, err := a.UpdateWeights(t.Context(), sdk.WeightsRef{Version: 2, URI: "a2", SHA256: sumA},
		sdk.Plan{Policy: sdk.Quorum(1), StageTimeout: time.Second, CommitTimeout: 5 * time.Second})
	require.NoError(t, err)
	require.Equal(t, sdk.OutcomeDegraded, res.Outcome, "committed on s2 alone")
	f.WaitFor(s2, 10*time.Second, "serving A's version 2", func(hb *protocol.Heartbeat) bool {
		return hb != nil && hb.WeightVersion == 2 && hb.WeightSHA256 == sumA
	})

	s2.Suspend()
	r.Restart()
	proxies[0].Heal()
	waitKeyVersion(t, dialBus(t, f), f, 1, "s1 writes its version-1 record back into the empty key")

	_, err = b.UpdateWeights(t.Context(), sdk.WeightsRef{Version: 2, URI: "b2", SHA256: sumB},
		sdk.Plan{Policy: sdk.Quorum(1), StageTimeout: time.Second, CommitTimeout: 5 * time.Second})
	require.ErrorIs(t, err, sdk.ErrConflict, "B must not bind version 2 while s2, which may hold it, is unheard")
	hb := f.Heartbeat(s1.ID)
	require.NotNil(t, hb)
	require.False(t, hb.WeightVersion == 2 && hb.WeightSHA256 == sumB, "s1 serves B's version 2 while s2 serves A's")

	s2.Resume()
	for _, p := range f.Procs {
		f.WaitFor(p, 30*time.Second, "in rotation on A's version 2", func(hb *protocol.Heartbeat) bool {
			return hb != nil && hb.InRotation && hb.WeightVersion == 2 && hb.WeightSHA256 == sumA
		})
	}
}

// raceCheckpoints writes under root the checkpoints of a two-trainer race, from seeds seed
// on: "v1" (version 1), and "a2" and "b2", trainer A's and trainer B's version 2.
func raceCheckpoints(t *testing.T, root string, seed uint64) (sum1, sumA, sumB string) {
	t.Helper()
	return checkpoint(t, filepath.Join(root, "v1"), seed), checkpoint(t, filepath.Join(root, "a2"), seed+1),
		checkpoint(t, filepath.Join(root, "b2"), seed+2)
}

// casGate is a trainer's bus that stops the trainer right after its compare-and-swap writes a
// desired state naming weights version 2 with digest sha, until release is closed: the
// moment between an update's commit point and its commit command.
type casGate struct {
	bus.Bus
	key, sha string
	hit      chan struct{}
	release  chan struct{}
	once     sync.Once
}

func (g *casGate) CompareAndSwap(ctx context.Context, key string, old, val []byte) (bool, error) {
	ok, err := g.Bus.CompareAndSwap(ctx, key, old, val)
	if d, derr := protocol.DecodeDesiredState(val); ok && key == g.key && derr == nil && d.Weights != nil &&
		d.Weights.Version == 2 && d.Weights.SHA256 == g.sha {
		g.once.Do(func() {
			close(g.hit)
			<-g.release
		})
	}
	return ok, err
}

// TestNoCommitOverARecordRedisLost: trainer A writes version 2 (its checkpoint) into the
// desired state; before its commit command goes out, Redis restarts empty, the server writes
// its version-1 record back, and trainer B binds version 2 to another checkpoint and commits
// it. A's commit would carry a record the key no longer holds: A must see B's record and stop
// with ErrConflict, publishing no commit, and the server keep serving B's version 2.
func TestNoCommitOverARecordRedisLost(t *testing.T) {
	skipShort(t)
	root := t.TempDir()
	sum1, sumA, sumB := raceCheckpoints(t, root, 81)
	r := redistest.Start(t)
	f := fleettest.Start(t, fleettest.Options{Servers: 1, Fleet: "lost-before-commit", Redis: r,
		ServerArgs: func(int) []string { return []string{"--weights-root", root} }})
	s1 := f.Procs[0]
	gate := &casGate{Bus: dialBus(t, f), key: protocol.Names{Fleet: f.Name}.Desired(), sha: sumA,
		hit: make(chan struct{}), release: make(chan struct{})}
	a, err := sdk.Dial(t.Context(), sdk.Options{Bus: gate, Fleet: f.Name, Secret: []byte(f.Secret), Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	// B reads the desired state only when it calls, never A's record in the moment it lived.
	b, err := sdk.Dial(t.Context(), sdk.Options{Redis: redisconf.Config{URL: f.Redis.URL()}, Fleet: f.Name, Secret: []byte(f.Secret),
		Logger: slog.New(slog.DiscardHandler), RefreshInterval: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })

	_, err = a.UpdateWeights(t.Context(), sdk.WeightsRef{Version: 1, URI: "v1", SHA256: sum1}, sdk.Plan{Policy: sdk.AllOrNothing})
	require.NoError(t, err)
	type result struct {
		res *sdk.UpdateResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := a.UpdateWeights(t.Context(), sdk.WeightsRef{Version: 2, URI: "a2", SHA256: sumA},
			sdk.Plan{Policy: sdk.AllOrNothing, CommitTimeout: 5 * time.Second})
		done <- result{res, err}
	}()
	<-gate.hit
	r.Restart()
	waitKeyVersion(t, gate.Bus, f, 1, "s1 writes its version-1 record back into the empty key")
	f.WaitFor(s1, 10*time.Second, "heartbeating into the new Redis", func(hb *protocol.Heartbeat) bool { return hb != nil })
	_, err = b.UpdateWeights(t.Context(), sdk.WeightsRef{Version: 2, URI: "b2", SHA256: sumB}, sdk.Plan{Policy: sdk.AllOrNothing})
	require.NoError(t, err, "A's record is gone and no server holds it: B may bind version 2")
	close(gate.release)

	got := <-done
	require.ErrorIs(t, got.err, sdk.ErrConflict, "A must see B's version 2 instead of committing its own")
	require.Equal(t, sdk.OutcomeAborted, got.res.Outcome, got.res.Reason)
	for _, su := range got.res.Servers {
		assert.Nil(t, su.Commit, "A published no commit to %s", su.ServerID)
	}
	f.WaitFor(s1, 10*time.Second, "serving B's version 2", func(hb *protocol.Heartbeat) bool {
		return hb != nil && hb.InRotation && hb.WeightVersion == 2 && hb.WeightSHA256 == sumB
	})
	d, err := b.DesiredState(t.Context())
	require.NoError(t, err)
	assert.Equal(t, sumB, d.Weights.SHA256, "the desired state still binds version 2 to B's checkpoint")
}
