package pipeline_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/weights"
	"github.com/rolloutkit/rollout/internal/redistest"
	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/pipeline"
	"github.com/rolloutkit/rollout/server"
	"github.com/rolloutkit/rollout/server/embedded"
)

var (
	secret = bytes.Repeat([]byte("p"), 32)
	quiet  = slog.New(slog.DiscardHandler)
)

// startFleet starts two embedded servers of the tiny preset, over the in-process bus or a
// real redis-server, and a client.
func startFleet(t *testing.T, overRedis bool) *sdk.Client {
	t.Helper()
	o := embedded.Options{Servers: 2, Secret: secret, Logger: quiet, Server: func(_ int, c *server.Config) {
		c.FleetHeartbeat = 100 * time.Millisecond
		c.FleetHeartbeatTTL = time.Second
	}}
	redisURL := ""
	if overRedis {
		srv := redistest.Start(t)
		redisURL = srv.URL()
		rb, err := bus.DialRedis(t.Context(), srv.URL(), bus.RedisOptions{Logger: quiet})
		require.NoError(t, err)
		t.Cleanup(func() { _ = rb.Close() })
		o.Bus = rb
	}
	f, err := embedded.Start(t.Context(), o)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, f.Close()) })
	do := f.DialOptions()
	do.Logger = quiet
	if overRedis {
		do.Bus = nil
		do.Redis.URL = redisURL // the client reaches the fleet through Redis as a trainer process would
	}
	c, err := sdk.Dial(t.Context(), do)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// bothFleets runs test on an embedded fleet and on one whose control plane is a real
// redis-server.
func bothFleets(t *testing.T, test func(t *testing.T, overRedis bool)) {
	for _, overRedis := range []bool{false, true} {
		t.Run(map[bool]string{false: "embedded", true: "redis"}[overRedis], func(t *testing.T) { test(t, overRedis) })
	}
}

// checkpoint writes the tiny preset with seed as a checkpoint for version v.
func checkpoint(t *testing.T, v int64) sdk.WeightsRef {
	t.Helper()
	w, err := model.Preset("tiny", uint64(v)+100)
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), fmt.Sprintf("v%d", v))
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, weights.SaveHF(dir, w, weights.F32))
	d, err := weights.Digest(context.Background(), dir)
	require.NoError(t, err)
	return sdk.WeightsRef{Version: v, URI: "file://" + dir, SHA256: d}
}

// task is a prompt's tag, which the test verifiers branch on.
type task string

const (
	taskParity task = "parity" // reward: the first token's parity (varies within a group)
	taskFlat   task = "flat"   // reward 1 whatever the tokens (zero variance)
	taskHang   task = "hang"   // the verifier blocks until its deadline
	taskBroken task = "broken" // the verifier fails
)

func verifier() pipeline.Verifier {
	return pipeline.VerifierFunc(func(ctx context.Context, p pipeline.Prompt, tr pipeline.Trajectory) (float64, error) {
		switch p.Task.(task) {
		case taskParity:
			return float64(tr.Completion[0] % 2), nil
		case taskFlat:
			return 1, nil
		case taskHang:
			<-ctx.Done()
			return 0, ctx.Err()
		case taskBroken:
			return 0, errors.New("reference answer missing")
		}
		return 0, fmt.Errorf("unknown task %v", p.Task)
	})
}

// cycle yields prompts whose tasks cycle through tags, each with its own prompt tokens.
func cycle(tags ...task) pipeline.Source {
	var mu sync.Mutex
	i := 0
	return func(context.Context) (pipeline.Prompt, error) {
		mu.Lock()
		defer mu.Unlock()
		i++
		return pipeline.Prompt{TokenIDs: []int{1, 40 + i%50, 41 + i%37}, Task: tags[(i-1)%len(tags)]}, nil
	}
}

// finite ends src after n prompts, so that nothing is generated after the groups a test
// counts on.
func finite(n int, src pipeline.Source) pipeline.Source {
	var mu sync.Mutex
	return func(ctx context.Context) (pipeline.Prompt, error) {
		mu.Lock()
		defer mu.Unlock()
		if n == 0 {
			return pipeline.Prompt{}, io.EOF
		}
		n--
		return src(ctx)
	}
}

func fleetGen(c *sdk.Client, perSample bool) pipeline.Fleet {
	return pipeline.Fleet{Call: c.Generate, PerSample: perSample, Sampling: sdk.SamplingParams{MaxTokens: 12, IgnoreEOS: true}}
}

// TestStalenessBoundAcrossConcurrentUpdates trains for several versions with K=1 while every
// update runs concurrently with generation, and checks the whole history of consumed groups:
// no token of a group consumed at trainer version T is older than T-K or newer than T, on an
// embedded fleet and on one whose control plane is a real redis-server.
func TestStalenessBoundAcrossConcurrentUpdates(t *testing.T) {
	bothFleets(t, testStalenessBound)
}

func testStalenessBound(t *testing.T, overRedis bool) {
	c := startFleet(t, overRedis)
	const K, steps = 1, 5
	refs := make([]sdk.WeightsRef, steps+1)
	for v := 1; v <= steps; v++ {
		refs[v] = checkpoint(t, int64(v))
	}
	reg := prometheus.NewRegistry()
	m, err := pipeline.NewMetrics(reg)
	require.NoError(t, err)
	p, err := pipeline.Start(t.Context(), pipeline.Config{GroupSize: 3, BatchGroups: 2, MaxStaleness: K,
		Generator: fleetGen(c, true), Verifier: verifier(), Source: cycle(taskParity), Metrics: m, Logger: quiet})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()

	type consumed struct {
		trainer  int64
		versions [][]int64
	}
	var history []consumed
	var updates sync.WaitGroup
	updateErrs := make(chan error, steps)
	var landed chan struct{} // closed when the previous update ended
	for T := int64(0); T < steps; T++ {
		b, err := p.Next(t.Context(), T)
		require.NoError(t, err)
		require.Len(t, b.Groups, 2)
		for _, g := range b.Groups {
			h := consumed{trainer: T}
			for _, s := range g.Samples {
				h.versions = append(h.versions, s.Versions)
			}
			history = append(history, h)
		}
		// The trainer's step makes version T+1; its update runs while the next batch
		// generates, and the pipeline learns of it when it commits. One update at a
		// time, as a trainer does: the next starts once the previous one landed.
		if landed != nil {
			<-landed
		}
		done := make(chan struct{})
		landed = done
		updates.Add(1)
		go func() {
			defer updates.Done()
			defer close(done)
			res, err := c.UpdateWeights(context.WithoutCancel(t.Context()), refs[T+1], sdk.Plan{Policy: sdk.Rolling(1)})
			if err == nil && res.Outcome != sdk.OutcomeCommitted {
				err = fmt.Errorf("update to %d: %s", T+1, res.Outcome)
			}
			if err == nil {
				p.SetVersion(T + 1)
			}
			updateErrs <- err
		}()
	}
	updates.Wait()
	close(updateErrs)
	for err := range updateErrs {
		require.NoError(t, err)
	}
	newest := int64(0)
	for _, h := range history {
		for _, vs := range h.versions {
			require.NotEmpty(t, vs)
			for _, v := range vs {
				assert.GreaterOrEqual(t, v, h.trainer-K, "a token of version %d trained on at version %d", v, h.trainer)
				assert.LessOrEqual(t, v, h.trainer, "a token newer than the trainer")
				newest = max(newest, v)
			}
		}
	}
	assert.Positive(t, newest, "the batches were generated across the updates")
	st := p.Stats()
	assert.Zero(t, st.Stale, "admission kept every group within its bound")
	assert.Equal(t, 2*steps, st.Consumed)
	assert.Equal(t, float64(2*steps), counterValue(t, reg, "rollout_pipeline_groups_total", "consumed"))
}

// TestDynamicSamplingRefillsZeroVarianceGroups: half the prompts give every sample the same
// reward; with FilterZeroVariance each batch is still full, of groups with a signal only,
// and the filtered groups are counted.
func TestDynamicSamplingRefillsZeroVarianceGroups(t *testing.T) {
	bothFleets(t, testDynamicSampling)
}

func testDynamicSampling(t *testing.T, overRedis bool) {
	c := startFleet(t, overRedis)
	reg := prometheus.NewRegistry()
	m, err := pipeline.NewMetrics(reg)
	require.NoError(t, err)
	var streamed sync.Map
	p, err := pipeline.Start(t.Context(), pipeline.Config{GroupSize: 4, BatchGroups: 3, OverSample: 1, FilterZeroVariance: true,
		Generator: fleetGen(c, false), Verifier: flatOrVaried(), Source: cycle(taskFlat, taskParity), Metrics: m, Logger: quiet,
		OnGroup: func(g *pipeline.Group) { streamed.Store(g.ID, g.Filtered) }})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	b, err := p.Next(t.Context(), 0)
	require.NoError(t, err)
	require.Len(t, b.Groups, 3)
	for _, g := range b.Groups {
		assert.Equal(t, taskParity, g.Prompt.Task)
		rs := g.Rewards()
		assert.NotEqual(t, rs[0], rs[1:], "a consumed group has reward variance")
		f, ok := streamed.Load(g.ID)
		assert.True(t, ok, "OnGroup saw group %d", g.ID)
		assert.Equal(t, false, f)
	}
	assert.Positive(t, b.Filtered, "the flat groups were filtered and refilled")
	// The pipeline keeps generating (and filtering) after the batch: stop it, then compare
	// its count with the metric's, which no longer move.
	require.NoError(t, p.Close())
	assert.Equal(t, float64(p.Stats().Filtered), counterValue(t, reg, "rollout_pipeline_groups_total", "filtered"))
}

// flatOrVaried scores taskFlat 1 and taskParity by sample index, so that a parity group
// always has variance and the test does not depend on what the model samples.
func flatOrVaried() pipeline.Verifier {
	var mu sync.Mutex
	n := map[string]int{}
	return pipeline.VerifierFunc(func(_ context.Context, p pipeline.Prompt, _ pipeline.Trajectory) (float64, error) {
		if p.Task == taskFlat {
			return 1, nil
		}
		mu.Lock()
		defer mu.Unlock()
		k := fmt.Sprint(p.TokenIDs)
		n[k]++
		return float64(n[k] % 2), nil
	})
}

// TestVerifierTimeoutsAndErrorsSurface: a verifier that hangs times out and one that fails
// fails its group; both reach OnSample, the next batch's Errors, the stats and the metrics,
// and neither group is trained on. With K=0 and two groups a batch, the first two groups
// (hang, broken) fill the admission window, so the batch's groups are admitted only once
// both failed.
func TestVerifierTimeoutsAndErrorsSurface(t *testing.T) {
	bothFleets(t, testVerifierErrors)
}

func testVerifierErrors(t *testing.T, overRedis bool) {
	c := startFleet(t, overRedis)
	reg := prometheus.NewRegistry()
	m, err := pipeline.NewMetrics(reg)
	require.NoError(t, err)
	var mu sync.Mutex
	var sampleErrs []error
	p, err := pipeline.Start(t.Context(), pipeline.Config{GroupSize: 2, BatchGroups: 2, VerifyTimeout: time.Second,
		Generator: fleetGen(c, true), Verifier: verifier(), Source: finite(4, cycle(taskHang, taskBroken, taskParity, taskParity)), Metrics: m,
		Logger: quiet,
		OnSample: func(s pipeline.Sample) {
			if s.Err != nil {
				mu.Lock()
				sampleErrs = append(sampleErrs, s.Err)
				mu.Unlock()
			}
		}})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	b, err := p.Next(t.Context(), 0)
	require.NoError(t, err)
	for _, g := range b.Groups {
		assert.Equal(t, taskParity, g.Prompt.Task, "failed groups are not trained on")
	}
	var timeout, failed bool
	for _, e := range b.Errors {
		timeout = timeout || errors.Is(e, pipeline.ErrVerifierTimeout)
		failed = failed || errors.Is(e, pipeline.ErrVerifier)
	}
	assert.True(t, timeout, "a timeout is in the batch's errors: %v", b.Errors)
	assert.True(t, failed, "a verifier error is in the batch's errors: %v", b.Errors)
	assert.Equal(t, 2, b.Failed)
	st := p.Stats()
	assert.Equal(t, 2, st.VerifyTimeouts)
	assert.Equal(t, 2, st.VerifyErrors)
	assert.Equal(t, 2.0, counterValue(t, reg, "rollout_pipeline_verify_errors_total", "timeout"))
	assert.Equal(t, 2.0, counterValue(t, reg, "rollout_pipeline_verify_errors_total", "error"))
	mu.Lock()
	assert.Len(t, sampleErrs, 4, "every failed sample was streamed with its error")
	mu.Unlock()
}

// TestCloseDrainsGroupsInFlight closes a pipeline with groups generating on the fleet: Close
// returns once every goroutine ended (TestMain's goleak checks), and Next says ErrClosed.
func TestCloseDrainsGroupsInFlight(t *testing.T) {
	c := startFleet(t, false)
	started := make(chan struct{})
	var once sync.Once
	gen := fleetGen(c, true)
	gen.Sampling.MaxTokens = 64
	p, err := pipeline.Start(t.Context(), pipeline.Config{GroupSize: 4, BatchGroups: 4, MaxStaleness: 2,
		Generator: gen, Verifier: verifier(), Logger: quiet,
		Source: func(ctx context.Context) (pipeline.Prompt, error) {
			once.Do(func() { close(started) })
			return cycle(taskParity)(ctx)
		}})
	require.NoError(t, err)
	<-started
	require.NoError(t, p.Close())
	_, err = p.Next(t.Context(), 0)
	assert.ErrorIs(t, err, pipeline.ErrClosed)
}

// TestSourceEndExhausts: a finite source ends the batches with ErrExhausted.
func TestSourceEndExhausts(t *testing.T) {
	c := startFleet(t, false)
	p, err := pipeline.Start(t.Context(), pipeline.Config{GroupSize: 2, BatchGroups: 2, MaxStaleness: 3,
		Generator: fleetGen(c, false), Verifier: verifier(), Logger: quiet, Source: finite(3, cycle(taskParity))})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	_, err = p.Next(t.Context(), 0)
	require.NoError(t, err)
	_, err = p.Next(t.Context(), 0)
	assert.ErrorIs(t, err, pipeline.ErrExhausted)
}

func counterValue(t *testing.T, g prometheus.Gatherer, name, label string) float64 {
	t.Helper()
	fams, err := g.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == label {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("%s{%s} not found", name, label)
	return 0
}
