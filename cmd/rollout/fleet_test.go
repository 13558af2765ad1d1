package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/internal/redistest"
	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/protocol"
	"github.com/rolloutkit/rollout/server"
	"github.com/rolloutkit/rollout/server/embedded"
)

const cliSecret = "cli-fleet-secret-of-at-least-32-bytes!!"

// cliFleet is an embedded fleet of two servers on a real redis-server, which the fleet
// commands reach through --redis like any remote fleet.
type cliFleet struct {
	redis string
	f     *embedded.Fleet
	flags []string // --redis, --fleet, --fleet-secret-file
}

func startCLIFleet(t *testing.T) *cliFleet {
	t.Helper()
	gin.SetMode(gin.ReleaseMode) // as serve does; debug mode prints every route of every server
	rs := redistest.Start(t)
	b, err := bus.DialRedis(t.Context(), rs.URL(), bus.RedisOptions{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	f, err := embedded.Start(t.Context(), embedded.Options{Servers: 2, Fleet: "cli", Secret: []byte(cliSecret), Bus: b,
		Logger: slog.New(slog.DiscardHandler), Server: func(_ int, c *server.Config) { c.KVBlocks = 256; c.Workers = 1 }})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = f.Close()
		_ = b.Close()
	})
	secretFile := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(secretFile, []byte(cliSecret+"\n"), 0o600))
	return &cliFleet{redis: rs.URL(), f: f, flags: []string{"--redis", rs.URL(), "--fleet", "cli", "--fleet-secret-file", secretFile}}
}

// cli runs `rollout fleet ARGS... FLAGS...` and returns stdout, stderr and the exit code.
func (c *cliFleet) cli(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(t.Context(), append(append([]string{"fleet"}, args...), c.flags...), &out, &errb)
	return out.String(), errb.String(), code
}

func (c *cliFleet) ok(t *testing.T, args ...string) string {
	t.Helper()
	out, errb, code := c.cli(t, args...)
	require.Equal(t, 0, code, "fleet %v: %s\n%s", args, errb, out)
	return out
}

func (c *cliFleet) status(t *testing.T) statusView {
	t.Helper()
	var v statusView
	require.NoError(t, json.Unmarshal([]byte(c.ok(t, "status", "--json")), &v))
	return v
}

// TestFleetCommands drives a two-server fleet through every fleet subcommand, in text and
// JSON, and checks what the servers say afterwards.
func TestFleetCommands(t *testing.T) {
	c := startCLIFleet(t)

	out := c.ok(t, "status")
	assert.Contains(t, out, "fleet cli: desired")
	assert.Regexp(t, `(?m)^s0\s+running\s+true\s+0\s`, out)
	assert.Regexp(t, `(?m)^s1\s+running\s+true\s+0\s`, out)
	st := c.status(t)
	require.Len(t, st.Servers, 2)
	assert.True(t, st.Desired.Signed)

	// Every one-command subcommand, text then JSON: one row per server, all ok.
	for _, args := range [][]string{
		{"pause", "--mode", "keep", "--clear-cache"},
		{"resume"},
		{"sleep", "--level", "1"},
		{"wake", "--tags", "weights,kv_cache"},
		{"resume"},
		{"reset", "--reset-external=true"},
		{"pause", "--mode", "wait", "--targets", "s1"},
		{"resume", "--targets", "s1"},
	} {
		out := c.ok(t, args...)
		assert.Regexp(t, `(?m)^SERVER\s+RESULT`, out, args)
		want := 2
		if strings.Contains(strings.Join(args, " "), "--targets") {
			want = 1
		}
		assert.Equal(t, want, strings.Count(out, " ok "), "%v:\n%s", args, out)

		var v controlView
		require.NoError(t, json.Unmarshal([]byte(c.ok(t, append(args, "--json")...)), &v), args)
		assert.True(t, v.OK, args)
		assert.Equal(t, args[0], v.Command)
		require.Len(t, v.Servers, want, args)
		for _, s := range v.Servers {
			assert.EqualValues(t, "ok", s.Result, "%v %s", args, s.ServerID)
			assert.Positive(t, s.Latency, "sdk.ServerResult's latency: %v %s", args, s.ServerID)
		}
	}
	for _, s := range c.status(t).Servers {
		assert.EqualValues(t, "running", s.State, s.ID)
		assert.True(t, s.InRotation, s.ID)
	}

	// An update with the digest `weights digest` prints; then one whose digest is wrong on
	// every server: exit 1, a table saying why, and the fleet stays on version 1, serving.
	ckpt := filepath.Join(t.TempDir(), "v1")
	runOK(t, "model", "init", "--preset", "tiny", "--seed", "7", "--out", ckpt)
	sum := strings.TrimSpace(runOK(t, "weights", "digest", ckpt))
	var uv updateView
	require.NoError(t, json.Unmarshal([]byte(c.ok(t, "update", "--version", "1", "--source", "file://"+ckpt, "--sha256", sum, "--json")), &uv))
	assert.EqualValues(t, "committed", uv.Outcome)
	assert.EqualValues(t, "all", uv.Policy)
	assert.Equal(t, "cli", uv.Fleet)
	assert.Positive(t, uv.Duration, "sdk.UpdateResult's duration")
	assert.GreaterOrEqual(t, uv.Duration, uv.StageTime)
	require.Len(t, uv.Servers, 2)
	for _, s := range uv.Servers {
		assert.True(t, s.Committed, s.ServerID)
		assert.Equal(t, int64(1), s.WeightVersion, s.ServerID)
		var names []string
		for _, p := range s.Phases {
			names = append(names, p.Name)
		}
		assert.Contains(t, names, "stage", s.ServerID)
		assert.Contains(t, names, "sleep", s.ServerID, "the default cut sleeps at level 1")
		assert.Contains(t, names, "swap", s.ServerID)
	}
	// Heartbeats carry the new version from the servers' next beat on.
	require.Eventually(t, func() bool {
		st := c.status(t)
		return len(st.Servers) == 2 && st.Servers[0].WeightVersion == 1 && st.Servers[1].WeightVersion == 1 &&
			st.Servers[0].InRotation && st.Servers[1].InRotation
	}, 20*time.Second, 20*time.Millisecond)
	assert.Equal(t, int64(1), c.status(t).Desired.Weights.Version)

	bad := strings.Repeat("0", 64)
	out, errb, code := c.cli(t, "update", "--version", "2", "--source", "file://"+ckpt, "--sha256", bad, "--policy", "all")
	assert.Equal(t, 1, code, out)
	assert.Equal(t, 1, strings.Count(errb, "\n"), errb)
	assert.Contains(t, errb, "rollout: fleet update:")
	assert.Regexp(t, `(?m)^s0\s+false\s+false\s+(1|-)\s`, out)
	assert.Regexp(t, `(?m)^s1\s+false\s+false\s+(1|-)\s`, out)
	assert.Contains(t, out, "digest_mismatch")
	assert.Contains(t, out, "version 2, policy all: aborted")
	for _, s := range c.status(t).Servers {
		assert.Equal(t, int64(1), s.WeightVersion, s.ID)
		assert.True(t, s.InRotation, s.ID)
	}

	// quorum:2 with one target only: K larger than the fleet, refused before anything is sent.
	_, errb, code = c.cli(t, "update", "--version", "2", "--source", "file://"+ckpt, "--sha256", sum, "--policy", "quorum:2", "--targets", "s0")
	assert.Equal(t, 1, code)
	assert.Contains(t, errb, "K=2")

	// --sleep-level 0 skips the sleep (the SDK's Plan.NoSleep; its SleepLevel 0 is level 1).
	uv = updateView{}
	require.NoError(t, json.Unmarshal([]byte(c.ok(t, "update", "--version", "2", "--source", "file://"+ckpt, "--sha256", sum,
		"--sleep-level", "0", "--clear-cache=false", "--json")), &uv))
	assert.EqualValues(t, "committed", uv.Outcome)
	require.Len(t, uv.Servers, 2)
	for _, s := range uv.Servers {
		var names []string
		for _, p := range s.Phases {
			names = append(names, p.Name)
		}
		assert.Contains(t, names, "swap", s.ServerID)
		assert.NotContains(t, names, "sleep", s.ServerID)
	}
}

// TestGenerateOnFleet: `generate --redis --fleet` gives the tokens `generate --server` gives
// on one of the fleet's servers, and reports every token's weight version.
func TestGenerateOnFleet(t *testing.T) {
	c := startCLIFleet(t)
	gen := func(args ...string) generateResult {
		var out, errb bytes.Buffer
		code := run(t.Context(), append([]string{"generate", "--json", "--max-tokens", "12", "--seed", "5", "--temperature", "0.8"}, args...), &out, &errb)
		require.Equal(t, 0, code, errb.String())
		var r generateResult
		require.NoError(t, json.Unmarshal(out.Bytes(), &r), out.String())
		return r
	}
	direct := gen("--server", c.f.Servers()[0].URL(), "Once upon a time")
	fleet := gen(append(c.flags, "Once upon a time")...)
	assert.Equal(t, "fleet:cli", fleet.Model)
	require.Len(t, direct.Samples, 1)
	require.Len(t, fleet.Samples, 1)
	ds, fs := direct.Samples[0], fleet.Samples[0]
	assert.Equal(t, direct.PromptTokenIDs, fleet.PromptTokenIDs)
	assert.Equal(t, ds.TokenIDs(), fs.TokenIDs())
	assert.Equal(t, direct.Text, fleet.Text)
	assert.InDeltaSlice(t, ds.Logprobs(), fs.Logprobs(), 1e-4)
	assert.Equal(t, ds.FinishReason, fs.FinishReason)
	assert.Equal(t, make([]int64, len(fs.Tokens)), fs.WeightVersions())
	assert.Equal(t, []string{fleet.Servers[0]}, fs.Servers, "the SDK's own fields are printed as Generate returned them")

	var out, errb bytes.Buffer
	require.Equal(t, 0, run(t.Context(), append(append([]string{"generate", "--max-tokens", "4"}, c.flags...), "hi"), &out, &errb), errb.String())
	assert.Contains(t, out.String(), "[4 tokens")
}

// TestGenerateOnFleetWithAPIKey: `generate --redis --fleet --api-key` sends the key on every
// call to the servers (tokenize, generate, detokenize), and without it the servers refuse.
func TestGenerateOnFleetWithAPIKey(t *testing.T) {
	gin.SetMode(gin.ReleaseMode)
	rs := redistest.Start(t)
	b, err := bus.DialRedis(t.Context(), rs.URL(), bus.RedisOptions{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	f, err := embedded.Start(t.Context(), embedded.Options{Servers: 1, Fleet: "keyed", Secret: []byte(cliSecret), Bus: b,
		Logger: slog.New(slog.DiscardHandler), Server: func(_ int, c *server.Config) { c.KVBlocks = 64; c.Workers = 1; c.APIKey = "generation-key" }})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = f.Close()
		_ = b.Close()
	})
	args := []string{"generate", "--json", "--max-tokens", "3", "--redis", rs.URL(), "--fleet", "keyed", "--fleet-secret", cliSecret}
	var out, errb bytes.Buffer
	require.Equal(t, 1, run(t.Context(), append(args, "hi"), &out, &errb))
	assert.Contains(t, errb.String(), "tokenizing the prompt")
	out.Reset()
	errb.Reset()
	require.Equal(t, 0, run(t.Context(), append(args, "--api-key", "generation-key", "hi"), &out, &errb), errb.String())
	var r generateResult
	require.NoError(t, json.Unmarshal(out.Bytes(), &r), out.String())
	require.Len(t, r.Samples, 1)
	assert.Len(t, r.Samples[0].Tokens, 3)
}

// TestFleetBadInput: every mistake is one line on stderr and exit 1, before or without
// touching the fleet.
func TestFleetBadInput(t *testing.T) {
	c := startCLIFleet(t)
	short := filepath.Join(t.TempDir(), "short")
	require.NoError(t, os.WriteFile(short, []byte("short\n"), 0o600))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"fleet", "status", "--fleet", "cli"}, "--redis is required"},
		{[]string{"fleet", "status", "--redis", c.redis}, "--fleet is required"},
		{[]string{"fleet", "status", "--redis", "redis://127.0.0.1:1", "--fleet", "cli", "--fleet-secret", cliSecret}, "fleet \"cli\""},
		{[]string{"fleet", "status", "--redis", c.redis, "--fleet", "cli", "--fleet-secret", "another-secret-of-at-least-32-bytes!!"}, "secret"},
		{[]string{"fleet", "status", "--redis", c.redis, "--fleet", "cli"}, "secret"},
		{[]string{"fleet", "status", "--redis", c.redis, "--fleet", "cli", "--fleet-secret-file", short}, "32 bytes"},
		{[]string{"fleet", "status", "--redis", c.redis, "--fleet", "cli", "--fleet-secret", cliSecret, "--fleet-secret-file", short}, "exclusive"},
		{append([]string{"fleet", "pause", "--mode", "later"}, c.flags...), "--mode"},
		{append([]string{"fleet", "sleep", "--level", "3"}, c.flags...), "--level"},
		{append([]string{"fleet", "wake", "--tags", "gpu"}, c.flags...), "--tags"},
		{append([]string{"fleet", "resume", "--targets", "nobody"}, c.flags...), "nobody"},
		{append([]string{"fleet", "update", "--source", "file:///x"}, c.flags...), "--version is required"},
		{append([]string{"fleet", "update", "--version", "3"}, c.flags...), "--source is required"},
		{append([]string{"fleet", "update", "--version", "3", "--source", "file:///x", "--sha256", "abc"}, c.flags...), "sha256"},
		{append([]string{"fleet", "update", "--version", "3", "--source", "file:///x", "--policy", "most"}, c.flags...), "--policy"},
		{append([]string{"fleet", "update", "--version", "3", "--source", "file:///x", "--policy", "rolling:0"}, c.flags...), "--policy"},
		{append([]string{"fleet", "update", "--version", "3", "--source", "file:///x", "--sleep-level", "-1"}, c.flags...), "--sleep-level"},
		{append([]string{"fleet", "update", "--version", "0", "--source", "file:///x"}, c.flags...), "version"},
		{append([]string{"generate", "--model", "builtin:tiny", "hi"}, c.flags...), "exclusive"},
	} {
		var out, errb bytes.Buffer
		assert.Equal(t, 1, run(t.Context(), tc.args, &out, &errb), tc.args)
		assert.Contains(t, errb.String(), tc.want, tc.args)
		assert.Equal(t, 1, strings.Count(errb.String(), "\n"), "%v: %q", tc.args, errb.String())
	}
	// Nothing above changed the fleet.
	for _, s := range c.status(t).Servers {
		assert.EqualValues(t, "running", s.State, s.ID)
		assert.Equal(t, int64(0), s.WeightVersion, s.ID)
	}
	// The environment sets the connection like the flags do.
	t.Setenv("ROLLOUT_REDIS", c.redis)
	t.Setenv("ROLLOUT_FLEET", "cli")
	t.Setenv("ROLLOUT_FLEET_SECRET", cliSecret)
	var out, errb bytes.Buffer
	require.Equal(t, 0, run(t.Context(), []string{"fleet", "status"}, &out, &errb), errb.String())
	assert.Contains(t, out.String(), fmt.Sprintf("fleet %s:", "cli"))
}

// TestPhaseMark: a stage the policy decided without is not shown as a failure.
func TestPhaseMark(t *testing.T) {
	notWaited := sdk.ServerUpdate{Stage: &sdk.ServerResult{Err: fmt.Errorf("%w: not waited for", sdk.ErrAborted)}}
	noAck := sdk.ServerUpdate{Stage: &sdk.ServerResult{Err: fmt.Errorf("%w: no ack", sdk.ErrTimeout)}}
	failed := sdk.ServerUpdate{Stage: &sdk.ServerResult{Err: sdk.ErrFailed, Ack: &protocol.Ack{}}}
	stage := sdk.PhaseResult{Name: "stage"}
	assert.Equal(t, "", phaseMark(failed, sdk.PhaseResult{Name: "stage", OK: true}))
	assert.Equal(t, " (not waited for)", phaseMark(notWaited, stage))
	assert.Equal(t, " NO ACK", phaseMark(noAck, stage))
	assert.Equal(t, " FAILED", phaseMark(failed, stage))
	assert.Equal(t, " FAILED", phaseMark(failed, sdk.PhaseResult{Name: "pause"}))
}
