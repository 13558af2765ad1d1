package sdk

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/protocol"
)

func ref(v int64) WeightsRef {
	return WeightsRef{Version: v, URI: "file:///ckpt/v", SHA256: strings.Repeat("ab", 32)}
}

func TestUpdateWeightsAllOrNothing(t *testing.T) {
	_, agents, c := newMemFleet(t, secret, 3, 0)
	agents[0].set(func(a *fakeAgent) { a.bubble = [2]time.Duration{-5 * time.Millisecond, 25 * time.Millisecond} })
	res, err := c.UpdateWeights(t.Context(), ref(1), Plan{})
	require.NoError(t, err)
	assert.Equal(t, OutcomeCommitted, res.Outcome)
	assert.Empty(t, res.Stale)
	require.Len(t, res.Servers, 3)
	for _, su := range res.Servers {
		assert.True(t, su.Staged && su.Committed, su.ServerID)
		assert.Equal(t, int64(1), su.WeightVersion)
		var names []string
		for _, p := range su.Phases {
			names = append(names, p.Name)
			assert.True(t, p.OK)
		}
		assert.Equal(t, []string{"stage", "pause", "sleep", "swap", "wake", "resume"}, names)
		assert.Positive(t, su.Bubble)
	}
	a := res.Server("a")
	assert.True(t, a.BubbleMeasured)
	assert.LessOrEqual(t, a.Bubble, 30*time.Millisecond)
	assert.False(t, res.Server("b").BubbleMeasured, "no token times: the bubble is the commit's span")
	assert.Equal(t, 5*time.Millisecond, res.Server("b").Bubble)

	d, err := c.DesiredState(t.Context())
	require.NoError(t, err)
	require.NotNil(t, d.Weights)
	assert.Equal(t, int64(1), d.Weights.Version)
	assert.Equal(t, res.Epoch, d.Epoch)
	assert.Equal(t, &protocol.Commit{Mode: "abort", ClearCache: true, SleepLevel: 1}, d.Plan)
	cmds := agents[2].got()
	require.Len(t, cmds, 2)
	cmd, err := cmds[1].Command()
	require.NoError(t, err)
	assert.Equal(t, protocol.Commit{Version: 1, Mode: "abort", ClearCache: true, SleepLevel: 1, SHA256: ref(1).SHA256}, cmd)

	// One failing stage: nobody commits, the desired state stays.
	agents[1].set(func(a *fakeAgent) { a.fail[protocol.KindStage] = "digest_mismatch" })
	res, err = c.UpdateWeights(t.Context(), ref(2), Plan{Policy: AllOrNothing, KeepCache: true, NoSleep: true})
	require.ErrorIs(t, err, ErrAborted)
	require.ErrorIs(t, err, ErrFailed)
	assert.Equal(t, OutcomeAborted, res.Outcome)
	assert.Zero(t, res.Epoch)
	d2, err := c.DesiredState(t.Context())
	require.NoError(t, err)
	assert.Equal(t, d.Epoch, d2.Epoch)
	assert.Equal(t, int64(1), d2.Weights.Version)
	for _, a := range agents {
		for _, e := range a.got() {
			if e.Kind == protocol.KindCommit {
				assert.Equal(t, int64(1), mustCommit(t, e).Version, "no commit of version 2 was sent to %s", a.id)
			}
		}
	}
	assert.False(t, res.Server("b").Staged)
	assert.Contains(t, res.Server("b").Err.Error(), "digest_mismatch")
}

// TestPlanCut: the zero Plan clears the cache and sleeps at DefaultSleepLevel; KeepCache,
// SleepLevel and NoSleep reach the commit command and the desired state's plan as given.
func TestPlanCut(t *testing.T) {
	_, agents, c := newMemFleet(t, secret, 1, 0)
	for i, tc := range []struct {
		plan  Plan
		clear bool
		level int
	}{
		{Plan{}, true, DefaultSleepLevel},
		{Plan{KeepCache: true, SleepLevel: 2}, false, 2},
		{Plan{NoSleep: true}, true, 0},
	} {
		v := int64(i + 1)
		_, err := c.UpdateWeights(t.Context(), ref(v), tc.plan)
		require.NoError(t, err, "%+v", tc.plan)
		var cmd protocol.Commit
		for _, e := range agents[0].got() {
			if e.Kind == protocol.KindCommit {
				cmd = mustCommit(t, e)
			}
		}
		assert.Equal(t, v, cmd.Version)
		assert.Equal(t, tc.clear, cmd.ClearCache, "%+v", tc.plan)
		assert.Equal(t, tc.level, cmd.SleepLevel, "%+v", tc.plan)
		d, err := c.DesiredState(t.Context())
		require.NoError(t, err)
		assert.Equal(t, &protocol.Commit{Mode: "abort", ClearCache: tc.clear, SleepLevel: tc.level}, d.Plan)
	}
}

func mustCommit(t *testing.T, e protocol.Envelope) protocol.Commit {
	cmd, err := e.Command()
	require.NoError(t, err)
	return cmd.(protocol.Commit)
}

func TestUpdateWeightsQuorum(t *testing.T) {
	_, agents, c := newMemFleet(t, secret, 3, 0)
	agents[2].set(func(a *fakeAgent) { a.fail[protocol.KindStage] = "fetch_failed" })
	res, err := c.UpdateWeights(t.Context(), ref(1), Plan{Policy: Quorum(2)})
	require.NoError(t, err, "the quorum was met")
	assert.Equal(t, OutcomeDegraded, res.Outcome)
	assert.Equal(t, []string{"c"}, res.Stale)
	assert.True(t, res.Server("c").Stale)
	assert.Nil(t, res.Server("c").Commit, "no commit is sent to a server that did not stage")
	d, err := c.DesiredState(t.Context())
	require.NoError(t, err)
	assert.Equal(t, int64(1), d.Weights.Version, "the desired state moved: c converges by itself")

	// Quorum not reached.
	agents[1].set(func(a *fakeAgent) { a.fail[protocol.KindStage] = "fetch_failed" })
	res, err = c.UpdateWeights(t.Context(), ref(2), Plan{Policy: Quorum(2)})
	require.ErrorIs(t, err, ErrAborted)
	assert.Equal(t, OutcomeAborted, res.Outcome)
}

func TestUpdateWeightsRolling(t *testing.T) {
	_, agents, c := newMemFleet(t, secret, 3, 0)
	res, err := c.UpdateWeights(t.Context(), ref(1), Plan{Policy: Rolling(1), StageTimeout: 5 * time.Second})
	require.NoError(t, err)
	assert.Equal(t, OutcomeCommitted, res.Outcome)
	// Each commit went to one server alone, a before b before c.
	var commits []string
	for _, a := range agents {
		for _, e := range a.got() {
			if e.Kind == protocol.KindCommit {
				require.Equal(t, []string{a.id}, e.Targets)
				commits = append(commits, a.id)
			}
		}
	}
	assert.Equal(t, []string{"a", "b", "c"}, commits)
}

func TestUpdateWeightsCommitTimeout(t *testing.T) {
	_, agents, c := newMemFleet(t, secret, 2, 0)
	agents[1].set(func(a *fakeAgent) { a.silent[protocol.KindCommit] = true })
	res, err := c.UpdateWeights(t.Context(), ref(1), Plan{CommitTimeout: 200 * time.Millisecond})
	require.ErrorIs(t, err, ErrPartial)
	require.ErrorIs(t, err, ErrTimeout)
	assert.Equal(t, OutcomePartial, res.Outcome)
	assert.Equal(t, []string{"b"}, res.Stale)
}

func TestUpdateWeightsBadInput(t *testing.T) {
	b, agents, c := newMemFleet(t, secret, 2, 3)
	_ = agents
	s := newSpy(t, b, "f")
	before, err := c.DesiredState(t.Context())
	require.NoError(t, err)
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	for _, tc := range []struct {
		name string
		dead bool // a cancelled context
		ref  WeightsRef
		plan Plan
		want error
		msg  string
	}{
		{"unknown policy", false, ref(4), Plan{Policy: "majority"}, ErrInvalid, "unknown policy"},
		{"quorum K above fleet", false, ref(4), Plan{Policy: Quorum(3)}, ErrInvalid, "K=3 is more than the 2"},
		{"rolling K zero", false, ref(4), Plan{Policy: "rolling:0"}, ErrInvalid, "K must be"},
		{"version not above serving", false, ref(3), Plan{}, ErrInvalid, "not above the fleet's version 3"},
		{"version zero", false, WeightsRef{URI: "file:///x"}, Plan{}, ErrInvalid, "version must be > 0"},
		{"empty uri", false, WeightsRef{Version: 9}, Plan{}, ErrInvalid, "uri is empty"},
		{"bad digest", false, WeightsRef{Version: 9, URI: "file:///x", SHA256: "zz"}, Plan{}, ErrInvalid, "sha256"},
		{"bad mode", false, ref(4), Plan{Mode: "sideways"}, ErrInvalid, "mode"},
		{"bad sleep level", false, ref(4), Plan{SleepLevel: 5}, ErrInvalid, "sleep level"},
		{"no sleep at a level", false, ref(4), Plan{SleepLevel: 2, NoSleep: true}, ErrInvalid, "NoSleep"},
		{"stage outlives commands", false, ref(4), Plan{StageTimeout: protocol.MaxCommandLifetime + time.Second}, ErrInvalid, "MaxCommandLifetime"},
		{"unknown target", false, ref(4), Plan{Targets: []string{"zz"}}, ErrNoServers, "zz"},
		{"cancelled context", true, ref(4), Plan{}, context.Canceled, "canceled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			if tc.dead {
				ctx = cancelled
			}
			res, err := c.UpdateWeights(ctx, tc.ref, tc.plan)
			require.ErrorIs(t, err, tc.want)
			assert.Contains(t, err.Error(), tc.msg)
			assert.Nil(t, res)
		})
	}
	s.nothingPublished()
	after, err := c.DesiredState(t.Context())
	require.NoError(t, err)
	assert.Equal(t, before, after, "the desired state is unchanged")

	// An empty fleet.
	for _, a := range agents {
		a.stop()
		require.NoError(t, b.Delete(t.Context(), protocol.Names{Fleet: "f"}.Heartbeat(a.id)))
	}
	_, err = c.UpdateWeights(t.Context(), ref(4), Plan{})
	require.ErrorIs(t, err, ErrNoServers)
	s.nothingPublished()
	require.NoError(t, s.sub.Close())
	// Control calls target the servers of the last refresh: the agents are gone, so nobody
	// hears the command.
	require.ErrorIs(t, errOf(c.Pause(t.Context(), PauseOptions{Call: Call{Targets: []string{"a"}}})), ErrNoServers)
	_, err = c.Status(t.Context())
	require.NoError(t, err)
	require.ErrorIs(t, errOf(c.Pause(t.Context(), PauseOptions{})), ErrNoServers)
}

func TestDesiredStateRebuiltAfterLoss(t *testing.T) {
	b, _, c := newMemFleet(t, secret, 2, 0)
	res, err := c.UpdateWeights(t.Context(), ref(1), Plan{})
	require.NoError(t, err)
	// Redis restarted empty: the desired state is gone, the servers remember its epoch.
	require.NoError(t, b.Delete(t.Context(), protocol.Names{Fleet: "f"}.Desired()))
	require.NoError(t, errOf(c.Pause(t.Context(), PauseOptions{})))
	d, err := c.DesiredState(t.Context())
	require.NoError(t, err)
	require.NotNil(t, d)
	assert.Greater(t, d.Epoch, res.Epoch, "the epoch keeps growing")
	require.NotNil(t, d.Weights)
	assert.Equal(t, int64(1), d.Weights.Version, "the weights the client last saw are kept")
	assert.True(t, d.Paused)
}

// bindElsewhere is another writer (with c's secret) replacing the desired state with the next
// epoch's record binding version 1 to checkpoint sha, with no roll in progress.
func bindElsewhere(t *testing.T, b bus.Bus, c *Client, sha string) {
	t.Helper()
	key := protocol.Names{Fleet: "f"}.Desired()
	raw, err := b.Get(t.Context(), key)
	require.NoError(t, err)
	cur, err := protocol.DecodeDesiredState(raw)
	require.NoError(t, err)
	next := *cur
	next.Rolling = nil
	next.Weights = &protocol.WeightsRef{Version: 1, URI: "file:///other", SHA256: sha}
	next.Epoch++
	next.Sig = ""
	next.SignWith(c.auth)
	enc, err := next.Encode()
	require.NoError(t, err)
	ok, err := b.CompareAndSwap(t.Context(), key, raw, enc)
	require.NoError(t, err)
	require.True(t, ok)
}

// TestRollingBatchReassertsItsClaim: between a rolling update's batches the desired state
// is replaced by another writer's record binding the same version to another checkpoint (what
// Redis losing the claim and a second trainer writing into the empty key leave). The next
// batch must not get a commit carrying the lost claim: the update stops with ErrConflict, the
// first batch's server stays the only one on its checkpoint.
func TestRollingBatchReassertsItsClaim(t *testing.T) {
	b, agents, c := newMemFleet(t, secret, 2, 0)
	other := strings.Repeat("cd", 32)
	agents[0].set(func(a *fakeAgent) {
		a.onCommit = func() {
			bindElsewhere(t, b, c, other)
		}
	})
	res, err := c.UpdateWeights(t.Context(), ref(1), Plan{Policy: Rolling(1)})
	require.ErrorIs(t, err, ErrConflict)
	require.ErrorIs(t, err, ErrPartial)
	assert.Equal(t, OutcomePartial, res.Outcome, res.Reason)
	assert.True(t, res.Server("a").Committed)
	assert.NotContains(t, agents[1].kinds(), protocol.KindCommit, "b got no commit over the lost claim")
}

// readingGate is a bus that, right after the client's compare-and-swap writes a desired state
// naming version 1, lets another writer replace the record and the client read it (as its
// refresher may) before the write returns.
type readingGate struct {
	bus.Bus
	once sync.Once
	then func()
}

func (g *readingGate) CompareAndSwap(ctx context.Context, key string, old, val []byte) (bool, error) {
	ok, err := g.Bus.CompareAndSwap(ctx, key, old, val)
	if d, derr := protocol.DecodeDesiredState(val); ok && derr == nil && d.Weights != nil && d.Weights.Version == 1 {
		g.once.Do(g.then)
	}
	return ok, err
}

// TestCacheFollowsTheKeyAcrossAConcurrentRead: a read of the desired state that runs between
// the client's compare-and-swap and the end of its write (the refresher) caches another
// writer's record; the write must not then pair that record's bytes with its own record, or
// the next read answers its own record for the other writer's bytes and the commit's
// re-assert writes over them.
func TestCacheFollowsTheKeyAcrossAConcurrentRead(t *testing.T) {
	mem, agents, _ := newMemFleet(t, secret, 1, 0)
	g := &readingGate{Bus: mem}
	c, err := Dial(t.Context(), Options{Bus: g, Fleet: "f", Secret: secret, CommandTimeout: 10 * time.Second, HeartbeatTTL: time.Nanosecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	other := strings.Repeat("cd", 32)
	g.then = func() {
		bindElsewhere(t, mem, c, other)
		_, _, err := c.readDesired(t.Context())
		require.NoError(t, err)
	}
	res, err := c.UpdateWeights(t.Context(), ref(1), Plan{})
	require.ErrorIs(t, err, ErrConflict)
	assert.Equal(t, OutcomeAborted, res.Outcome, res.Reason)
	assert.NotContains(t, agents[0].kinds(), protocol.KindCommit)
	d, err := c.DesiredState(t.Context())
	require.NoError(t, err)
	assert.Equal(t, other, d.Weights.SHA256, "the other writer's record stands")
}
