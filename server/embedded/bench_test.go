package embedded_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/internal/redistest"
	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/server"
	"github.com/rolloutkit/rollout/server/embedded"
)

var quiet = slog.New(slog.DiscardHandler)

// small keeps many servers in one process cheap: a small KV pool and one kernel worker each.
func small(_ int, c *server.Config) {
	c.KVBlocks = 256
	c.Workers = 1
}

func benchFleet(b *testing.B, n int, bs bus.Bus, tweak func(int, *server.Config)) (*embedded.Fleet, *sdk.Client) {
	b.Helper()
	f, err := embedded.Start(b.Context(), embedded.Options{Servers: n, Secret: secret, Bus: bs, Logger: quiet, Server: tweak})
	require.NoError(b, err)
	b.Cleanup(func() { _ = f.Close() })
	o := f.DialOptions()
	o.Logger = quiet
	c, err := sdk.Dial(b.Context(), o)
	require.NoError(b, err)
	b.Cleanup(func() { _ = c.Close() })
	return f, c
}

// reportLatency reports the median and 99th percentile of lat in milliseconds.
func reportLatency(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2])/1e6, "p50-ms")
	b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)])/1e6, "p99-ms")
}

// BenchmarkControlRoundTrip measures one SDK control call, publish to every ack, on a fleet
// of real servers: a Resume of running servers (a no-op on each engine) with explicit
// targets, so nothing but the command travels. Beside it, in the same run and on the same
// bus, the floor: a bare publish that n subscribers answer with a push, read back by the
// publisher (no signing, no decoding, no agent).
func BenchmarkControlRoundTrip(b *testing.B) {
	for _, transport := range []string{"mem", "redis"} {
		for _, n := range []int{1, 8, 32} {
			b.Run(fmt.Sprintf("%s/servers=%d", transport, n), func(b *testing.B) {
				var bs bus.Bus
				if transport == "redis" {
					srv := redistest.Start(b)
					rb, err := bus.DialRedis(b.Context(), srv.URL(), bus.RedisOptions{Logger: quiet})
					require.NoError(b, err)
					b.Cleanup(func() { _ = rb.Close() })
					bs = rb
				}
				f, c := benchFleet(b, n, bs, small)
				ids := f.IDs()
				b.Run("sdk", func(b *testing.B) {
					lat := make([]time.Duration, 0, 1024)
					for b.Loop() {
						t0 := time.Now()
						if _, err := c.Resume(b.Context(), sdk.ResumeOptions{Call: sdk.Call{Targets: ids}}); err != nil {
							b.Fatal(err)
						}
						lat = append(lat, time.Since(t0))
					}
					reportLatency(b, lat)
				})
				b.Run("floor", func(b *testing.B) { floor(b, f.Bus(), n) })
			})
		}
	}
}

// floor is the bare round trip: publish, n subscribers push an ack each, pop all n.
func floor(b *testing.B, bs bus.Bus, n int) {
	ctx := b.Context()
	const ch = "floor:{bench}:control"
	var wg sync.WaitGroup
	subs := make([]bus.Subscription, n)
	for i := range n {
		sub, err := bs.Subscribe(ctx, ch)
		require.NoError(b, err)
		subs[i] = sub
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ev := range sub.Events() {
				if ev.Kind == bus.EventMessage {
					_ = bs.Push(context.Background(), "floor:{bench}:ack:"+string(ev.Payload), []byte(strconv.Itoa(i)), time.Minute)
				}
			}
		}()
	}
	defer func() {
		for _, s := range subs {
			_ = s.Close()
		}
		wg.Wait()
	}()
	lat := make([]time.Duration, 0, 1024)
	seq := 0
	for b.Loop() {
		seq++
		id := strconv.Itoa(seq)
		t0 := time.Now()
		if _, err := bs.Publish(ctx, ch, []byte(id)); err != nil {
			b.Fatal(err)
		}
		for got := 0; got < n; {
			vals, err := bs.Pop(ctx, "floor:{bench}:ack:"+id, n, 10*time.Second)
			if err != nil || len(vals) == 0 {
				b.Fatalf("floor: %d of %d acks: %v", got, n, err)
			}
			got += len(vals)
		}
		lat = append(lat, time.Since(t0))
	}
	reportLatency(b, lat)
}

// BenchmarkUpdateWeightsBubble runs one UpdateWeights (all-or-nothing, pause abort, cache
// cleared, sleep level 1) per iteration on two tiny servers under generation load, and
// reports each server's generation bubble (last token before the pause to first token after
// the resume, as the servers measured it), the stage time and the commit time.
func BenchmarkUpdateWeightsBubble(b *testing.B) {
	_, c := benchFleet(b, 2, nil, nil)
	dir := filepath.Join(b.TempDir(), "ckpt")
	digest := writeCheckpoint(b, dir, 9)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_, _ = c.Generate(context.Background(), sdk.GenerateRequest{PromptTokenIDs: []int{w, i % 256, 3, 4}, N: 2,
					Sampling: sdk.SamplingParams{MaxTokens: 64, Temperature: 1, IgnoreEOS: true}})
			}
		}()
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	var bubbles, stages, commits []time.Duration
	measured, total := 0, 0
	v := int64(0)
	for b.Loop() {
		v++
		res, err := c.UpdateWeights(b.Context(), sdk.WeightsRef{Version: v, URI: "file://" + dir, SHA256: digest}, sdk.Plan{})
		if err != nil {
			b.Fatal(err)
		}
		for _, su := range res.Servers {
			bubbles = append(bubbles, su.Bubble)
			total++
			if su.BubbleMeasured {
				measured++
			}
		}
		stages = append(stages, res.StageTime)
		commits = append(commits, res.CommitTime)
	}
	med := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2]) / 1e6
	}
	b.ReportMetric(med(bubbles), "bubble-p50-ms")
	b.ReportMetric(float64(slices.Max(bubbles))/1e6, "bubble-max-ms")
	b.ReportMetric(med(stages), "stage-p50-ms")
	b.ReportMetric(med(commits), "commit-p50-ms")
	b.ReportMetric(float64(measured)/float64(total), "measured-frac")
}

// BenchmarkGenerate64 sends the same requests at 64 concurrent through the SDK and straight
// to the one server's /generate, and reports aggregate generated tokens per second.
func BenchmarkGenerate64(b *testing.B) {
	const workers, maxTokens = 64, 32
	f, c := benchFleet(b, 1, nil, nil)
	url := f.Servers()[0].URL() + "/generate"
	prompt := func(i int) []int {
		p := make([]int, 16)
		for j := range p {
			p[j] = (i*31 + j*7) % 256
		}
		return p
	}
	run := func(b *testing.B, one func(i int) (int, error)) {
		var next, tokens atomic.Int64
		total := int64(b.N)
		b.ResetTimer()
		t0 := time.Now()
		var wg sync.WaitGroup
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := next.Add(1)
					if i > total {
						return
					}
					n, err := one(int(i))
					if err != nil {
						b.Error(err)
						return
					}
					tokens.Add(int64(n))
				}
			}()
		}
		wg.Wait()
		b.ReportMetric(float64(tokens.Load())/time.Since(t0).Seconds(), "tok/s")
	}
	b.Run("sdk", func(b *testing.B) {
		run(b, func(i int) (int, error) {
			res, err := c.Generate(b.Context(), sdk.GenerateRequest{PromptTokenIDs: prompt(i),
				Sampling: sdk.SamplingParams{MaxTokens: maxTokens, Temperature: 1, IgnoreEOS: true}})
			if err != nil {
				return 0, err
			}
			return len(res.Samples[0].Tokens), nil
		})
	})
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	defer hc.CloseIdleConnections()
	b.Run("direct", func(b *testing.B) {
		run(b, func(i int) (int, error) {
			body, _ := json.Marshal(map[string]any{"prompt_token_ids": prompt(i), "n": 1,
				"sampling": map[string]any{"max_tokens": maxTokens, "temperature": 1, "ignore_eos": true, "top_p": 1}})
			resp, err := hc.Post(url, "application/json", bytes.NewReader(body))
			if err != nil {
				return 0, err
			}
			defer resp.Body.Close()
			data, err := io.ReadAll(resp.Body)
			if err != nil {
				return 0, err
			}
			var out struct {
				Outputs []struct {
					TokenIDs []int `json:"token_ids"`
				} `json:"outputs"`
			}
			if err := json.Unmarshal(data, &out); err != nil {
				return 0, fmt.Errorf("direct: %s: %w", data, err)
			}
			if len(out.Outputs) != 1 {
				return 0, fmt.Errorf("direct: %s", data)
			}
			return len(out.Outputs[0].TokenIDs), nil
		})
	})
}
