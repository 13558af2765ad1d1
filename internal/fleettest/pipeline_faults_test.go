package fleettest_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/internal/fleettest"
	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/sdk/pipeline"
)

// pipeStep is one step of an asynchronous training run's history: a batch consumed, an
// update's attempt, or a fault.
type pipeStep struct {
	kind    string // "batch", "update", "fault"
	trainer int64  // batch: the trainer version it was taken at; update: the version made
	groups  []consumedGroup
	outcome sdk.Outcome
	err     error
	note    string
}

type consumedGroup struct {
	id       uint64
	indexes  []int
	versions [][]int64
}

// pipeHistory is appended to by the trainer loop and its updates' goroutines.
type pipeHistory struct {
	mu    sync.Mutex
	steps []pipeStep
}

func (h *pipeHistory) add(s pipeStep) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.steps = append(h.steps, s)
}

func (h *pipeHistory) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var b strings.Builder
	for i, s := range h.steps {
		switch s.kind {
		case "batch":
			fmt.Fprintf(&b, "%2d batch  at %d:", i, s.trainer)
			for _, g := range s.groups {
				fmt.Fprintf(&b, " g%d%v", g.id, g.versions)
			}
			b.WriteByte('\n')
		case "update":
			fmt.Fprintf(&b, "%2d update to %d: %s %v\n", i, s.trainer, s.outcome, s.err)
		default:
			fmt.Fprintf(&b, "%2d fault  %s\n", i, s.note)
		}
	}
	return b.String()
}

// check reads the history: every consumed group within the staleness bound K of the batch's
// trainer version and not newer than it, no group or sample consumed twice, every group
// whole.
func (h *pipeHistory) check(t *testing.T, k int64, groupSize int) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := map[uint64]int64{}
	batches := 0
	for i, s := range h.steps {
		if s.kind != "batch" {
			continue
		}
		batches++
		for _, g := range s.groups {
			if at, ok := seen[g.id]; ok {
				t.Errorf("step %d: group %d consumed again (first at trainer version %d)", i, g.id, at)
			}
			seen[g.id] = s.trainer
			idx := map[int]bool{}
			for _, x := range g.indexes {
				assert.False(t, idx[x], "step %d: group %d's sample %d twice", i, g.id, x)
				idx[x] = true
			}
			assert.Len(t, idx, groupSize, "step %d: group %d is whole", i, g.id)
			for _, vs := range g.versions {
				require.NotEmpty(t, vs, "step %d: group %d has an empty sample", i, g.id)
				for _, v := range vs {
					assert.GreaterOrEqual(t, v, s.trainer-k, "step %d: group %d has a token of version %d at trainer version %d", i, g.id, v, s.trainer)
					assert.LessOrEqual(t, v, s.trainer, "step %d: group %d has a token newer than the trainer", i, g.id)
				}
			}
		}
	}
	assert.Positive(t, batches)
}

// TestPipelineUnderServerKillAndRedisRestart runs an asynchronous trainer loop (K=1, each
// update running while the next batch generates) on three `rollout serve` processes while a
// server is SIGKILLed during an update, redis-server is restarted empty during another and
// the killed server comes back. The loop keeps producing: every batch arrives, each update
// commits on a quorum (retried when a fault aborted it), and the history of consumed groups
// keeps the staleness bound with no group or sample consumed twice. Close ends every
// goroutine (fleettest.Main's goleak checks).
func TestPipelineUnderServerKillAndRedisRestart(t *testing.T) {
	skipShort(t)
	f := fleettest.Start(t, fleettest.Options{Servers: 3, Fleet: "pipeline-faults"})
	c := dial(t, f)
	const k, steps, groupSize = 1, 6, 3
	refs := make([]sdk.WeightsRef, steps+1)
	for v := 1; v <= steps; v++ {
		refs[v] = fileRef(t, int64(v), uint64(20+v))
	}
	var mu sync.Mutex
	verify := pipeline.VerifierFunc(func(_ context.Context, _ pipeline.Prompt, tr pipeline.Trajectory) (float64, error) {
		return float64(tr.Completion[0] % 2), nil
	})
	next := 0
	src := func(context.Context) (pipeline.Prompt, error) {
		mu.Lock()
		defer mu.Unlock()
		next++
		return pipeline.Prompt{TokenIDs: []int{1, 40 + next%50, 41 + next%37}}, nil
	}
	p, err := pipeline.Start(t.Context(), pipeline.Config{GroupSize: groupSize, BatchGroups: 2, MaxStaleness: k,
		Generator: pipeline.Fleet{Call: c.Generate, PerSample: true, Sampling: sdk.SamplingParams{MaxTokens: 12, IgnoreEOS: true}},
		Verifier:  verify, Source: src, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	h := &pipeHistory{}
	defer func() {
		if t.Failed() {
			t.Logf("history:\n%s", h)
		}
	}()
	victim := f.Procs[2]
	var landed chan struct{}
	for T := int64(0); T < steps; T++ {
		// The deadline only turns a hang into a failure with the history.
		ctx, cancel := context.WithTimeout(t.Context(), fleettest.StartTimeout)
		b, err := p.Next(ctx, T)
		cancel()
		require.NoError(t, err, "batch %d", T)
		st := pipeStep{kind: "batch", trainer: T}
		for _, g := range b.Groups {
			cg := consumedGroup{id: g.ID}
			for _, s := range g.Samples {
				cg.indexes = append(cg.indexes, s.Index)
				cg.versions = append(cg.versions, s.Versions)
			}
			st.groups = append(st.groups, cg)
		}
		h.add(st)
		if landed != nil {
			<-landed
		}
		done := make(chan struct{})
		landed = done
		go func() {
			defer close(done)
			for attempt := 0; ; attempt++ {
				res, err := c.UpdateWeights(context.WithoutCancel(t.Context()), refs[T+1], sdk.Plan{Policy: sdk.Quorum(2),
					// A dead server's heartbeat lingers in its TTL: the quorum commits without it
					// once staging times out, well after the live ones staged a tiny checkpoint.
					StageTimeout: 20 * time.Second})
				us := pipeStep{kind: "update", trainer: T + 1, err: err}
				if res != nil {
					us.outcome = res.Outcome
				}
				h.add(us)
				if err == nil && (res.Outcome == sdk.OutcomeCommitted || res.Outcome == sdk.OutcomeDegraded) {
					p.SetVersion(T + 1)
					return
				}
				if attempt == 4 {
					return // the history shows the attempts; the version check below fails
				}
				// As a trainer would: retry once the fleet is visible again (after a Redis
				// restart the servers' heartbeats come back within an interval).
				waitHeartbeats(f)
			}
		}()
		switch T {
		case 1:
			victim.Kill()
			h.add(pipeStep{kind: "fault", note: "SIGKILL " + victim.ID + " as update 2 starts"})
		case 3:
			f.Redis.Restart()
			h.add(pipeStep{kind: "fault", note: "redis-server restarted empty as update 4 starts"})
		case 4:
			victim.Start()
			h.add(pipeStep{kind: "fault", note: "restarted " + victim.ID})
		}
	}
	<-landed
	require.NoError(t, p.Close())
	_, err = p.Next(t.Context(), steps)
	assert.ErrorIs(t, err, pipeline.ErrClosed)
	h.check(t, k, groupSize)
	assert.Equal(t, int64(steps), p.Stats().Version, "every update committed")
	assert.Zero(t, p.Stats().Stale)
	f.WaitInRotation(victim)
}

// waitHeartbeats waits (for at most StartTimeout) until every running server of f has a
// heartbeat in Redis. It decides nothing: the caller's retry does.
func waitHeartbeats(f *fleettest.Fleet) {
	deadline := time.Now().Add(fleettest.StartTimeout)
	for time.Now().Before(deadline) {
		all := true
		for _, p := range f.Procs {
			if p.Running() && f.Heartbeat(p.ID) == nil {
				all = false
			}
		}
		if all {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
