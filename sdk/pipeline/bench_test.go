package pipeline_test

import (
	"context"
	"flag"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/load"
	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/sdk/pipeline"
	"github.com/rolloutkit/rollout/server"
	"github.com/rolloutkit/rollout/server/embedded"
	"github.com/rolloutkit/rollout/trainer"
	"github.com/rolloutkit/rollout/weightstore"
)

var (
	benchModel  = flag.String("pipeline.model", "builtin:stories15m", "model of the pipeline benchmarks")
	benchSteps  = flag.Int("pipeline.steps", 6, "training steps per run of BenchmarkAsyncVsSync")
	benchTokens = flag.Int("pipeline.max-tokens", 160, "completion length of the pipeline benchmarks")
)

// benchSetup is one embedded fleet serving the benchmark model, and a client.
func benchSetup(b *testing.B, servers int) *sdk.Client {
	b.Helper()
	f, err := embedded.Start(b.Context(), embedded.Options{Servers: servers, Model: *benchModel, Secret: secret, Logger: quiet,
		Server: func(_ int, c *server.Config) { c.Workers = 1 }})
	require.NoError(b, err)
	b.Cleanup(func() { _ = f.Close() })
	o := f.DialOptions()
	o.Logger = quiet
	c, err := sdk.Dial(b.Context(), o)
	require.NoError(b, err)
	b.Cleanup(func() { _ = c.Close() })
	return c
}

// evenReward is the share of even token ids: a reward a policy can learn from any start.
func evenReward() pipeline.Verifier {
	return pipeline.VerifierFunc(func(_ context.Context, _ pipeline.Prompt, t pipeline.Trajectory) (float64, error) {
		n := 0
		for _, id := range t.Completion {
			if id%2 == 0 {
				n++
			}
		}
		return float64(n) / float64(max(len(t.Completion), 1)), nil
	})
}

// runResult is one training run's figures.
type runResult struct {
	wall, trainerWait, bubble time.Duration
	tokens                    int
	rewards                   []float64 // mean reward per step
}

// trainRun trains steps GRPO steps through a pipeline of staleness k on c: each batch is
// trained on by a real trainer, published to a weight store and pushed to the fleet with
// UpdateWeights, which runs while the next batch generates (with k = 0 the pipeline admits
// nothing until it commits: the synchronous loop).
func trainRun(b *testing.B, c *sdk.Client, k int64, steps int) runResult {
	b.Helper()
	ctx := b.Context()
	m, err := load.Open(*benchModel, "")
	require.NoError(b, err)
	st, err := c.Status(ctx)
	require.NoError(b, err)
	v0 := st[0].WeightVersion
	tr, err := trainer.New(m.Weights, trainer.Config{LR: 1e-4, Version: v0, DrGRPO: true, Workers: 1})
	require.NoError(b, err)
	defer tr.Close()
	store, err := weightstore.Open(ctx, b.TempDir())
	require.NoError(b, err)
	ws, err := weightstore.Serve("127.0.0.1:0", store)
	require.NoError(b, err)
	defer func() { _ = ws.Close(context.WithoutCancel(ctx)) }()

	const groups, group = 4, 4
	p, err := pipeline.Start(ctx, pipeline.Config{GroupSize: group, BatchGroups: groups, MaxStaleness: k, Version: v0,
		Generator: pipeline.Fleet{Call: c.Generate, Sampling: sdk.SamplingParams{MaxTokens: *benchTokens, IgnoreEOS: true}},
		Verifier:  evenReward(), Source: prompts(), Logger: quiet})
	require.NoError(b, err)
	defer func() { _ = p.Close() }()

	var r runResult
	var pending chan error
	var mu sync.Mutex
	start := time.Now()
	for range steps {
		batch, err := p.Next(ctx, tr.Version())
		require.NoError(b, err)
		r.trainerWait += batch.Wait
		var samples []trainer.Sample
		sum := 0.0
		for gi, g := range batch.Groups {
			for _, s := range g.Samples {
				samples = append(samples, trainerSample(g, s, gi))
				r.tokens += len(s.Completion)
				sum += s.Reward
			}
		}
		r.rewards = append(r.rewards, sum/float64(len(samples)))
		b.Logf("K=%d step %d: %.2f s, reward %.3f", k, len(r.rewards), time.Since(start).Seconds(), r.rewards[len(r.rewards)-1])
		stats, err := tr.Step(ctx, samples)
		require.NoError(b, err)
		if pending != nil {
			require.NoError(b, <-pending)
		}
		_, err = store.Publish(ctx, stats.Version, tr.Weights())
		require.NoError(b, err)
		ref, err := ws.Ref(stats.Version)
		require.NoError(b, err)
		_ = store.Prune(2)
		pending = make(chan error, 1)
		go func(ch chan error, v int64) {
			res, err := c.UpdateWeights(ctx, ref, sdk.Plan{Policy: sdk.AllOrNothing})
			if err == nil {
				mu.Lock()
				r.bubble += res.MaxBubble
				mu.Unlock()
				p.SetVersion(v)
			}
			ch <- err
		}(pending, stats.Version)
		if k == 0 {
			require.NoError(b, <-pending) // the synchronous loop waits for its update
			pending = nil
		}
	}
	if pending != nil {
		require.NoError(b, <-pending)
	}
	r.wall = time.Since(start)
	return r
}

func trainerSample(g *pipeline.Group, s pipeline.Sample, gi int) trainer.Sample {
	lps := make([]float32, len(s.Logprobs))
	for j, lp := range s.Logprobs {
		lps[j] = float32(lp)
	}
	return trainer.Sample{Prompt: g.Prompt.TokenIDs, Completion: s.Completion, Logprobs: lps, Versions: s.Versions,
		Reward: s.Reward, Group: gi}
}

func prompts() pipeline.Source {
	i := 0
	return func(context.Context) (pipeline.Prompt, error) {
		i++
		return pipeline.Prompt{TokenIDs: []int{1, 10 + i%200, 20 + i%97, 30 + i%53}}, nil
	}
}

// BenchmarkAsyncVsSync trains the same GRPO run (stories15m by default, 4 groups of 4
// samples of 160 tokens a step, a real trainer, a weight store and UpdateWeights every step)
// through the synchronous loop (K=0: each batch generates after the update before it) and
// the asynchronous pipeline (K=1: the next batch generates while the trainer trains and the
// update stages and commits), on one fleet each, in the same run. It reports generated
// tokens per second, the trainer's wait for batches and the update bubble as shares of the
// wall clock, and the mean reward of the first and last step (reward against wall clock is
// steps/s times the reward curve; -v logs each step's wall clock and reward). Run with
// -benchtime=1x.
func BenchmarkAsyncVsSync(b *testing.B) {
	for _, mode := range []struct {
		name string
		k    int64
	}{{"sync", 0}, {"async-k1", 1}} {
		b.Run(mode.name, func(b *testing.B) {
			c := benchSetup(b, 1)
			var total runResult
			for b.Loop() {
				r := trainRun(b, c, mode.k, *benchSteps)
				total.wall += r.wall
				total.trainerWait += r.trainerWait
				total.bubble += r.bubble
				total.tokens += r.tokens
				total.rewards = r.rewards
			}
			b.ReportMetric(float64(total.tokens)/total.wall.Seconds(), "tok/s")
			b.ReportMetric(float64(*benchSteps*b.N)/total.wall.Seconds(), "steps/s")
			b.ReportMetric(total.trainerWait.Seconds()/total.wall.Seconds(), "trainer-wait-share")
			b.ReportMetric(total.bubble.Seconds()/total.wall.Seconds(), "bubble-share")
			b.ReportMetric(total.rewards[0], "reward-first")
			b.ReportMetric(total.rewards[len(total.rewards)-1], "reward-last")
		})
	}
}

// BenchmarkPipelineOverhead generates the same groups through bare SDK Generate calls (a
// fixed number in flight) and through the pipeline (the same number in flight, no weight
// updates), alternating in each iteration, and reports both throughputs and their ratio
// (pipeline over bare; the gate is >= 0.95).
func BenchmarkPipelineOverhead(b *testing.B) {
	c := benchSetup(b, 1)
	const inflight, group, groups = 4, 4, 16
	samp := sdk.SamplingParams{MaxTokens: *benchTokens, IgnoreEOS: true}
	var bareDur, pipeDur time.Duration
	var bareTok, pipeTok int
	for b.Loop() {
		// Bare: inflight workers each calling Generate until groups are done.
		start := time.Now()
		var mu sync.Mutex
		next := 0
		var wg sync.WaitGroup
		src := prompts()
		for range inflight {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					mu.Lock()
					if next == groups {
						mu.Unlock()
						return
					}
					next++
					pr, _ := src(b.Context())
					mu.Unlock()
					res, err := c.Generate(b.Context(), sdk.GenerateRequest{PromptTokenIDs: pr.TokenIDs, N: group, Sampling: samp})
					if err != nil {
						b.Error(err)
						return
					}
					mu.Lock()
					for _, s := range res.Samples {
						bareTok += len(s.Tokens)
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		bareDur += time.Since(start)

		// Pipeline: the same groups, the same number in flight, batches of inflight groups.
		start = time.Now()
		p, err := pipeline.Start(b.Context(), pipeline.Config{GroupSize: group, BatchGroups: inflight, MaxStaleness: groups,
			MaxInFlight: inflight, Generator: pipeline.Fleet{Call: c.Generate, Sampling: samp}, Verifier: evenReward(),
			Source: prompts(), Logger: quiet})
		require.NoError(b, err)
		for range groups / inflight {
			batch, err := p.Next(b.Context(), 0)
			require.NoError(b, err)
			for _, g := range batch.Groups {
				for _, s := range g.Samples {
					pipeTok += len(s.Completion)
				}
			}
		}
		pipeDur += time.Since(start)
		require.NoError(b, p.Close())
	}
	bare, pipe := float64(bareTok)/bareDur.Seconds(), float64(pipeTok)/pipeDur.Seconds()
	b.ReportMetric(bare, "bare-tok/s")
	b.ReportMetric(pipe, "pipeline-tok/s")
	b.ReportMetric(pipe/bare, "ratio")
}
