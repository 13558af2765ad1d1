package sdk

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var secret = bytes.Repeat([]byte("k"), 32)

func TestDialRefusesBadOptions(t *testing.T) {
	b := bus.NewMem(bus.MemOptions{})
	defer b.Close()
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	for _, tc := range []struct {
		name string
		dead bool // a cancelled context
		o    Options
		want error
	}{
		{"empty fleet", false, Options{Bus: b}, ErrInvalid},
		{"braces in fleet", false, Options{Bus: b, Fleet: "a{b}"}, ErrInvalid},
		{"short secret", false, Options{Bus: b, Fleet: "f", Secret: []byte("short")}, protocol.ErrShortSecret},
		{"no bus or url", false, Options{Fleet: "f"}, ErrInvalid},
		{"command timeout outlives commands", false, Options{Bus: b, Fleet: "f", InsecureUnsigned: true, CommandTimeout: protocol.MaxCommandLifetime + time.Second}, ErrInvalid},
		{"cancelled", true, Options{Bus: b, Fleet: "f"}, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			if tc.dead {
				ctx = cancelled
			}
			c, err := Dial(ctx, tc.o)
			require.ErrorIs(t, err, tc.want)
			require.Nil(t, c)
		})
	}
	// Nothing was written for any of them.
	kv, err := b.Scan(t.Context(), "")
	require.NoError(t, err)
	assert.Empty(t, kv)
}

func TestDialCreatesSignedDesiredState(t *testing.T) {
	b := bus.NewMem(bus.MemOptions{})
	defer b.Close()
	c, err := Dial(t.Context(), Options{Bus: b, Fleet: "f", Secret: secret})
	require.NoError(t, err)
	defer c.Close()
	d, err := c.DesiredState(t.Context())
	require.NoError(t, err)
	require.NotNil(t, d)
	assert.True(t, d.Signed)
	assert.Equal(t, int64(1), d.Epoch)
	assert.Nil(t, d.Weights)
	require.NoError(t, d.Verify(secret, "f"))

	// A second client finds it and leaves it alone.
	c2, err := Dial(t.Context(), Options{Bus: b, Fleet: "f", Secret: secret})
	require.NoError(t, err)
	defer c2.Close()
	d2, err := c2.DesiredState(t.Context())
	require.NoError(t, err)
	assert.Equal(t, d.Epoch, d2.Epoch)
}

func TestDialWrongSecret(t *testing.T) {
	b := bus.NewMem(bus.MemOptions{})
	defer b.Close()
	c, err := Dial(t.Context(), Options{Bus: b, Fleet: "f", Secret: secret})
	require.NoError(t, err)
	require.NoError(t, c.Close())

	other := bytes.Repeat([]byte("x"), 32)
	_, err = Dial(t.Context(), Options{Bus: b, Fleet: "f", Secret: other})
	require.ErrorIs(t, err, ErrBadSecret)
	// No secret for a signed fleet (with the insecure opt-in, so the signed fleet refuses it).
	_, err = Dial(t.Context(), Options{Bus: b, Fleet: "f", InsecureUnsigned: true})
	require.ErrorIs(t, err, ErrBadSecret)

	// A fleet whose desired state is fine but whose server signs with another secret.
	startFake(t, b, "g", other, "s1", 0)
	_, err = Dial(t.Context(), Options{Bus: b, Fleet: "g", Secret: secret})
	require.ErrorIs(t, err, ErrBadSecret)
}

func TestDialTamperedDesiredState(t *testing.T) {
	b := bus.NewMem(bus.MemOptions{})
	defer b.Close()
	c, err := Dial(t.Context(), Options{Bus: b, Fleet: "f", Secret: secret})
	require.NoError(t, err)
	require.NoError(t, c.Close())
	key := protocol.Names{Fleet: "f"}.Desired()
	raw, err := b.Get(t.Context(), key)
	require.NoError(t, err)
	d, err := protocol.DecodeDesiredState(raw)
	require.NoError(t, err)
	d.Paused = true // changed without re-signing
	raw, err = d.Encode()
	require.NoError(t, err)
	require.NoError(t, b.Set(t.Context(), key, raw, 0))
	_, err = Dial(t.Context(), Options{Bus: b, Fleet: "f", Secret: secret})
	require.ErrorIs(t, err, ErrBadSecret)
}

func TestStatus(t *testing.T) {
	_, agents, c := newMemFleet(t, secret, 3, 4)
	agents[1].set(func(a *fakeAgent) { a.paused = true })
	st, err := c.Status(t.Context())
	require.NoError(t, err)
	require.Len(t, st, 3)
	assert.Equal(t, []string{"a", "b", "c"}, []string{st[0].ID, st[1].ID, st[2].ID})
	assert.True(t, st[0].InRotation)
	assert.False(t, st[1].InRotation)
	assert.Equal(t, protocol.StatePaused, st[1].State)
	assert.Equal(t, int64(4), st[2].WeightVersion)
	assert.Equal(t, "http://127.0.0.1:1", st[0].AdvertiseURL)
	assert.GreaterOrEqual(t, st[0].Age, time.Duration(0))
}

func TestControlPrimitives(t *testing.T) {
	b, agents, c := newMemFleet(t, secret, 3, 0)
	ctx := t.Context()

	res, err := c.Pause(ctx, PauseOptions{Mode: PauseKeep, ClearCache: true})
	require.NoError(t, err)
	require.Len(t, res, 3)
	for _, r := range res {
		assert.True(t, r.OK(), r.ServerID)
		assert.Equal(t, protocol.ResultOK, r.Result)
	}
	d, err := c.DesiredState(ctx)
	require.NoError(t, err)
	assert.True(t, d.Paused, "a fleet pause is recorded in the desired state")
	env := agents[0].got()[0]
	cmd, err := env.Command()
	require.NoError(t, err)
	assert.Equal(t, protocol.Pause{Mode: "keep", ClearCache: true}, cmd)
	assert.Equal(t, []string{"a", "b", "c"}, env.Targets)
	require.NoError(t, env.Verify(secret, "f", time.Now()), "envelopes are signed")

	require.NoError(t, errOf(c.Resume(ctx, ResumeOptions{})))
	d, err = c.DesiredState(ctx)
	require.NoError(t, err)
	assert.False(t, d.Paused)

	require.NoError(t, errOf(c.Sleep(ctx, SleepOptions{Level: 2})))
	require.NoError(t, errOf(c.WakeUp(ctx, WakeOptions{Tags: []string{"weights"}})))
	require.NoError(t, errOf(c.ResetCache(ctx, ResetOptions{ResetExternal: true})))
	require.NoError(t, errOf(c.Abort(ctx, AbortOptions{RequestIDs: []string{"r1"}})))
	for _, a := range agents {
		assert.Equal(t, []protocol.Kind{"pause", "resume", "sleep", "wake", "reset", "abort"}, a.kinds(), a.id)
	}

	d, err = c.DesiredState(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, d.Sleep, "a fleet sleep is recorded; a partial wake leaves it")
	require.NoError(t, errOf(c.WakeUp(ctx, WakeOptions{})))
	d, err = c.DesiredState(ctx)
	require.NoError(t, err)
	assert.Zero(t, d.Sleep, "a full wake clears it")
	for _, a := range agents {
		a.mu.Lock()
		a.received = a.received[:6] // the full wake is not part of what follows
		a.mu.Unlock()
	}

	// Targets: only b hears it, and the desired state does not change.
	epoch := d.Epoch
	require.NoError(t, errOf(c.Pause(ctx, PauseOptions{Call: Call{Targets: []string{"b"}}})))
	assert.Len(t, agents[0].got(), 6)
	assert.Len(t, agents[1].got(), 7)
	d, err = c.DesiredState(ctx)
	require.NoError(t, err)
	assert.Equal(t, epoch, d.Epoch)
	assert.False(t, d.Paused)

	// Unknown target: refused before publishing.
	s := newSpy(t, b, "f")
	require.ErrorIs(t, errOf(c.Pause(ctx, PauseOptions{Call: Call{Targets: []string{"nope"}}})), ErrNoServers)
	require.ErrorIs(t, errOf(c.Pause(ctx, PauseOptions{Mode: "sideways"})), ErrInvalid)
	require.ErrorIs(t, errOf(c.Sleep(ctx, SleepOptions{Level: 3})), ErrInvalid)
	require.ErrorIs(t, errOf(c.Sleep(ctx, SleepOptions{Level: 1, PauseOnly: true})), ErrInvalid)
	require.ErrorIs(t, errOf(c.WakeUp(ctx, WakeOptions{Tags: []string{"gpu"}})), ErrInvalid)
	require.ErrorIs(t, errOf(c.Abort(ctx, AbortOptions{RequestIDs: []string{""}})), ErrInvalid)
	require.ErrorIs(t, errOf(c.Resume(ctx, ResumeOptions{Call: Call{Timeout: protocol.MaxCommandLifetime + time.Second}})), ErrInvalid)
	s.nothingPublished()
}

func TestControlFailures(t *testing.T) {
	_, agents, c := newMemFleet(t, secret, 3, 0)
	agents[1].set(func(a *fakeAgent) { a.fail[protocol.KindReset] = "not_cleared" })
	agents[2].set(func(a *fakeAgent) { a.silent[protocol.KindReset] = true })

	res, err := c.ResetCache(t.Context(), ResetOptions{Call: Call{Timeout: 200 * time.Millisecond}})
	require.ErrorIs(t, err, ErrPartial)
	require.ErrorIs(t, err, ErrFailed)
	require.ErrorIs(t, err, ErrTimeout)
	var fe *FleetError
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, []string{"b", "c"}, fe.Failed())
	require.Len(t, res, 3)
	assert.True(t, res[0].OK())
	assert.Equal(t, "not_cleared", res[1].Code)
	assert.Equal(t, protocol.ResultFailed, res[1].Result)
	assert.Empty(t, res[2].Result)
	assert.Contains(t, err.Error(), "b: ")
}

func TestControlRejected(t *testing.T) {
	b := bus.NewMem(bus.MemOptions{})
	defer b.Close()
	// An unsigned client; the server demands signed commands, so it rejects the pause.
	a := startFake(t, b, "f", nil, "a", 0)
	_, err := Dial(t.Context(), Options{Bus: b, Fleet: "f"})
	require.ErrorIs(t, err, ErrInvalid, "no secret: refused unless asked for")
	c, err := Dial(t.Context(), Options{Bus: b, Fleet: "f", InsecureUnsigned: true})
	require.NoError(t, err)
	defer c.Close()
	a.set(func(a *fakeAgent) { a.secret = secret })
	res, err := c.Pause(t.Context(), PauseOptions{Call: Call{Targets: []string{"a"}}})
	require.ErrorIs(t, err, ErrRejected)
	require.ErrorIs(t, err, ErrPartial)
	require.Len(t, res, 1)
	assert.Equal(t, protocol.ResultRejected, res[0].Result)
	assert.Equal(t, "bad_signature", res[0].Code)
}

func TestClosedClient(t *testing.T) {
	_, _, c := newMemFleet(t, nil, 1, 0)
	require.NoError(t, c.Close())
	require.NoError(t, c.Close())
	require.ErrorIs(t, errOf(c.Pause(t.Context(), PauseOptions{})), ErrClosed)
	_, err := c.Status(t.Context())
	require.ErrorIs(t, err, ErrClosed)
	_, err = c.Generate(t.Context(), GenerateRequest{PromptTokenIDs: []int{1}})
	require.ErrorIs(t, err, ErrClosed)
	_, err = c.UpdateWeights(t.Context(), WeightsRef{Version: 1, URI: "file:///x"}, Plan{})
	require.True(t, errors.Is(err, ErrClosed))
}

func TestLostHeartbeatKeysKeepServersLive(t *testing.T) {
	b := bus.NewMem(bus.MemOptions{})
	defer b.Close()
	startFake(t, b, "f", secret, "a", 0)
	c, err := Dial(t.Context(), Options{Bus: b, Fleet: "f", Secret: secret})
	require.NoError(t, err)
	defer c.Close()
	// Redis restarted empty: the heartbeat was written moments ago, so the server still
	// counts as live until it would have expired.
	require.NoError(t, b.Delete(t.Context(), protocol.Names{Fleet: "f"}.Heartbeat("a")))
	st, err := c.Status(t.Context())
	require.NoError(t, err)
	require.Len(t, st, 1)
	assert.Equal(t, "a", st[0].ID)
}

// errOf drops a control call's results, for tests that check only its error.
func errOf(_ []ServerResult, err error) error { return err }

// TestSleepLevels: a zero SleepOptions.Level is DefaultSleepLevel, as Plan.SleepLevel is, and
// the level-0 sleep (pause, release nothing) is asked for with PauseOnly.
func TestSleepLevels(t *testing.T) {
	_, agents, c := newMemFleet(t, secret, 1, 0)
	ctx := t.Context()
	one := Call{Targets: []string{"a"}}
	for _, o := range []SleepOptions{{Call: one}, {Call: one, Level: 2}, {Call: one, PauseOnly: true}} {
		require.NoError(t, errOf(c.Sleep(ctx, o)))
		require.NoError(t, errOf(c.WakeUp(ctx, WakeOptions{Call: one})))
	}
	var levels []int
	for _, e := range agents[0].got() {
		if e.Kind == protocol.KindSleep {
			cmd, err := e.Command()
			require.NoError(t, err)
			levels = append(levels, cmd.(protocol.Sleep).Level)
		}
	}
	assert.Equal(t, []int{DefaultSleepLevel, 2, 0}, levels)
}
