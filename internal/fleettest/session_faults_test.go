package fleettest_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/internal/fleettest"
	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/sdk/bus/redisconf"
)

// The tests in this file put multi-turn sessions through the faults a fleet sees mid-episode
// (a server SIGKILLed during a turn, a server restarted under its id, a Redis restart) on
// `rollout serve` processes over a real redis-server, record every step of the episode in a
// history and check the history, not just the transcript at the end:
//   - the transcript is exactly the prompt, then each successful step's tokens in order:
//     nothing lost, nothing duplicated, a failed turn leaves nothing behind;
//   - every model token keeps the weight version the server reported for it, and no turn
//     starts below the fleet's committed version;
//   - a turn that moved to another server re-pins the session there: later turns follow it
//     while it is routable, even once the old server is back (it lost the KV anyway).

// sessionStep is one step of an episode's history.
type sessionStep struct {
	kind   string // "append", "turn", "fault"
	env    []int  // append: the environment tokens
	turn   *sdk.Turn
	err    error
	floor  int64  // turn: the fleet's committed version when the turn started
	server string // turn: the server of its last segment
	note   string // fault: what was done
}

// episode is a session and its history.
type episode struct {
	t       *testing.T
	s       *sdk.Session
	prompt  []int
	history []sessionStep
}

func (e *episode) fault(format string, args ...any) {
	e.history = append(e.history, sessionStep{kind: "fault", note: fmt.Sprintf(format, args...)})
}

func (e *episode) append(ids ...int) {
	require.NoError(e.t, e.s.Append(ids...))
	e.history = append(e.history, sessionStep{kind: "append", env: ids})
}

// turn runs one turn and records it; floor is the version committed when it starts.
func (e *episode) turn(floor int64) sessionStep {
	tr, err := e.s.Generate(e.t.Context(), sdk.TurnOptions{})
	return e.record(tr, err, floor)
}

// record adds a turn that ran (possibly on another goroutine) to the history.
func (e *episode) record(tr *sdk.Turn, err error, floor int64) sessionStep {
	st := sessionStep{kind: "turn", turn: tr, err: err, floor: floor}
	if err == nil && len(tr.Sample.Servers) > 0 {
		st.server = tr.Sample.Servers[len(tr.Sample.Servers)-1]
	}
	e.history = append(e.history, st)
	return st
}

// check reads the history against the session's transcript and tokens.
func (e *episode) check() {
	t := e.t
	t.Helper()
	want := slices.Clone(e.prompt)
	var toks []sdk.SessionToken
	turns := 0
	for i, h := range e.history {
		switch h.kind {
		case "append":
			want = append(want, h.env...)
			for _, id := range h.env {
				toks = append(toks, sdk.SessionToken{ID: id, Source: sdk.SourceEnv, Turn: turns})
			}
		case "turn":
			if h.err != nil {
				continue // a failed turn leaves the transcript as it was
			}
			require.Equal(t, turns, h.turn.Index, "step %d: turn numbers run without gaps", i)
			require.Equal(t, len(want), h.turn.PromptTokens, "step %d: the turn saw the whole transcript", i)
			for _, tok := range h.turn.Sample.Tokens {
				assert.GreaterOrEqual(t, tok.WeightVersion, h.floor, "step %d: a token below the committed version", i)
				want = append(want, tok.ID)
				toks = append(toks, sdk.SessionToken{ID: tok.ID, Source: sdk.SourceModel, Logprob: tok.Logprob,
					WeightVersion: tok.WeightVersion, Turn: turns})
			}
			turns++
		}
	}
	require.Equal(t, want, e.s.Transcript(), "the transcript is the history's steps, each once")
	require.Equal(t, toks, e.s.Tokens(), "every token keeps its source, logprob and version")
	require.Equal(t, turns, e.s.Turns())
	tj := e.s.Trajectory()
	for i, tk := range toks {
		require.Equal(t, tk.WeightVersion, tj.Versions[i], "trajectory token %d's version", i)
		require.Equal(t, uint8(tk.Source), tj.LossMask[i], "trajectory token %d's mask", i)
	}
}

func (e *episode) String() string {
	var b strings.Builder
	for i, h := range e.history {
		switch h.kind {
		case "fault":
			fmt.Fprintf(&b, "%2d fault  %s\n", i, h.note)
		case "append":
			fmt.Fprintf(&b, "%2d append %v\n", i, h.env)
		case "turn":
			if h.err != nil {
				fmt.Fprintf(&b, "%2d turn   error: %v\n", i, h.err)
				continue
			}
			fmt.Fprintf(&b, "%2d turn   %d on %v, versions %v, segments %v\n", i, h.turn.Index, h.turn.Sample.Servers,
				h.turn.Sample.WeightVersions(), len(h.turn.Sample.Segments))
		}
	}
	return b.String()
}

// gateTransport reports each /generate request to the server it is sent to before sending it.
type gateTransport struct {
	base http.RoundTripper
	mu   sync.Mutex
	// watch, when set, receives the host of the next /generate request to it.
	watch     string
	requested chan string
}

func (g *gateTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	g.mu.Lock()
	if g.watch != "" && r.URL.Host == g.watch && r.URL.Path == "/generate" {
		g.watch = ""
		g.requested <- r.URL.Host
	}
	g.mu.Unlock()
	return g.base.RoundTrip(r)
}

// expect arms the gate for the next /generate request to addr.
func (g *gateTransport) expect(addr string) <-chan string {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.watch, g.requested = addr, make(chan string, 1)
	return g.requested
}

func dialGated(t *testing.T, f *fleettest.Fleet) (*sdk.Client, *gateTransport) {
	t.Helper()
	g := &gateTransport{base: http.DefaultTransport.(*http.Transport).Clone()}
	c, err := sdk.Dial(t.Context(), sdk.Options{Redis: redisconf.Config{URL: f.Redis.URL()}, Fleet: f.Name, Secret: []byte(f.Secret),
		Logger: slog.New(slog.DiscardHandler), HTTPClient: &http.Client{Transport: g}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c, g
}

func newEpisode(t *testing.T, c *sdk.Client, id string) *episode {
	t.Helper()
	prompt := []int{5, 6, 7, 8, 9, 10, 11, 12}
	s, err := c.NewSession(prompt, sdk.SessionOptions{ID: id, Sampling: sdk.SamplingParams{MaxTokens: 12, IgnoreEOS: true}})
	require.NoError(t, err)
	e := &episode{t: t, s: s, prompt: prompt}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("history of %s:\n%s", id, e)
		}
	})
	return e
}

// TestSessionServerKilledMidTurn: the session's server is SIGKILLed while a turn's request is
// on its way to it. The turn moves to another server and succeeds (the transcript is held
// client-side as token ids, so any server can continue it; only the KV cache is lost); later
// turns stay on the new server, also once the killed one is back in rotation; a second kill,
// between turns, moves it once more.
func TestSessionServerKilledMidTurn(t *testing.T) {
	skipShort(t)
	f := fleettest.Start(t, fleettest.Options{Servers: 3, Fleet: "session-kill"})
	c, gate := dialGated(t, f)
	e := newEpisode(t, c, "kill-ep")

	first := e.turn(0)
	require.NoError(t, first.err)
	home := f.Proc(first.server)
	e.append(1, 2, 3)
	second := e.turn(0)
	require.NoError(t, second.err)
	require.Equal(t, home.ID, second.server, "the session stays on its server")
	e.append(4)

	// The home server freezes, the turn's request leaves for it, then the server dies.
	home.Suspend()
	sent := gate.expect(home.Addr)
	type result struct {
		tr  *sdk.Turn
		err error
	}
	done := make(chan result, 1)
	go func() {
		tr, err := e.s.Generate(t.Context(), sdk.TurnOptions{})
		done <- result{tr, err}
	}()
	<-sent
	home.Kill()
	e.fault("SIGKILL %s during turn 2", home.ID)
	r := <-done
	moved := e.record(r.tr, r.err, 0)
	require.NoError(t, moved.err, "the turn moves to a live server")
	require.NotEqual(t, home.ID, moved.server)
	require.NotEmpty(t, moved.turn.Sample.Servers)
	e.append(5, 6)
	next := e.turn(0)
	require.NoError(t, next.err)
	assert.Equal(t, moved.server, next.server, "the session re-pinned to the server that took the turn")

	home.Start()
	f.WaitInRotation(home)
	waitAffinityHome(t, c, e.s.AffinityKey(), home.ID)
	e.fault("restarted %s", home.ID)
	back := e.turn(0)
	require.NoError(t, back.err)
	assert.Equal(t, moved.server, back.server, "the session stays where its KV is, not on its old home")
	newHome := f.Proc(back.server)
	newHome.Kill()
	e.fault("SIGKILL %s between turns", newHome.ID)
	last := e.turn(0)
	require.NoError(t, last.err)
	assert.NotEqual(t, newHome.ID, last.server)
	e.check()
	assert.Equal(t, 6, e.s.Turns())
}

// waitAffinityHome waits until this client routes a plain request with the affinity key to
// server id again (it saw the server back in rotation), so that where the next turn goes is
// the session's choice, not the client's view lagging.
func waitAffinityHome(t *testing.T, c *sdk.Client, key, id string) {
	t.Helper()
	deadline := time.Now().Add(fleettest.StartTimeout)
	for {
		res, err := c.Generate(t.Context(), sdk.GenerateRequest{PromptTokenIDs: []int{1}, AffinityKey: key,
			Sampling: sdk.SamplingParams{MaxTokens: 1}})
		require.NoError(t, err)
		if slices.Contains(res.Servers, id) {
			return
		}
		require.True(t, time.Now().Before(deadline), "key %s never routed back to %s", key, id)
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSessionServerRestartedAndRedisRestarted: mid-episode, a weight update commits, the
// session's server is SIGKILLed and restarted under its id, and redis-server is restarted
// empty, once between turns and once while a turn's request is on a server. Every turn
// succeeds; none runs below the committed version (the restarted server takes turns only
// once it serves it); the old tokens keep version 0.
func TestSessionServerRestartedAndRedisRestarted(t *testing.T) {
	skipShort(t)
	f := fleettest.Start(t, fleettest.Options{Servers: 2, Fleet: "session-restart"})
	c, gate := dialGated(t, f)
	e := newEpisode(t, c, "restart-ep")
	first := e.turn(0)
	require.NoError(t, first.err)
	e.append(1, 2)

	res, err := c.UpdateWeights(t.Context(), fileRef(t, 1, 21), sdk.Plan{})
	require.NoError(t, err)
	require.Equal(t, sdk.OutcomeCommitted, res.Outcome)
	e.fault("update to version 1 committed")
	waitVersion(t, f, 1)
	st := e.turn(1)
	require.NoError(t, st.err)
	assert.Equal(t, first.server, st.server, "an update does not move the session")

	home := f.Proc(st.server)
	home.Kill()
	home.Start()
	e.fault("SIGKILL and restart %s under its id", home.ID)
	st = e.turn(1) // the restarted server may still be loading version 1: it must not take the turn before
	require.NoError(t, st.err)
	e.append(3)
	waitVersion(t, f, 1, home)

	f.Redis.Restart()
	e.fault("redis-server restarted empty between turns")
	st = e.turn(1)
	require.NoError(t, st.err, "a turn needs no Redis round trip while the client's view holds")
	e.append(4, 5)

	// A long turn on its server while Redis restarts again.
	pinned := f.Proc(st.server)
	sent := gate.expect(pinned.Addr)
	long := sdk.SamplingParams{MaxTokens: 200, IgnoreEOS: true}
	done := make(chan struct {
		tr  *sdk.Turn
		err error
	}, 1)
	go func() {
		tr, err := e.s.Generate(t.Context(), sdk.TurnOptions{Sampling: &long})
		done <- struct {
			tr  *sdk.Turn
			err error
		}{tr, err}
	}()
	<-sent
	f.Redis.Restart()
	e.fault("redis-server restarted empty during a turn on %s", pinned.ID)
	r := <-done
	st = e.record(r.tr, r.err, 1)
	require.NoError(t, st.err)
	assert.Len(t, st.turn.Sample.Tokens, 200)
	assert.Equal(t, pinned.ID, st.server, "the turn stayed on its server")
	for _, p := range f.Procs {
		f.WaitInRotation(p)
	}
	st = e.turn(1)
	require.NoError(t, st.err)
	e.check()
	tj := e.s.Trajectory()
	for i, v := range tj.Versions[:12] {
		assert.Zero(t, v, "turn 0's token %d keeps version 0", i)
	}
}
