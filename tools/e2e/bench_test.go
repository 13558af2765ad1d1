//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// decodeRun serves model with the given --otel setting, then has `concurrency` clients send
// `requests` /generate calls of maxTokens each (EOS ignored, so every call generates exactly
// maxTokens), and returns generated tokens per second of wall time.
func decodeRun(b *testing.B, rollout, model, otel string, env []string, concurrency, requests, maxTokens int) float64 {
	b.Helper()
	port := freePort(b)
	args := []string{"serve", "--model", model, "--addr", "127.0.0.1:" + strconv.Itoa(port), "--otel", otel, "--log-level", "warn",
		"--max-num-seqs", strconv.Itoa(concurrency)}
	p := start(b, "serve-"+otel, env, rollout, args...)
	defer p.stop(b)
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	waitHTTP(b, p, url+"/ready")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: concurrency}, Timeout: 5 * time.Minute}
	defer client.CloseIdleConnections()
	call := func(i, n int) int {
		body := fmt.Sprintf(`{"prompt_token_ids":[%d,17,33,49,65,81,97,113],"sampling":{"max_tokens":%d,"ignore_eos":true,"temperature":1,"seed":%d}}`, 1+i%200, n, i)
		resp, err := client.Post(url+"/generate", "application/json", strings.NewReader(body))
		if err != nil {
			b.Errorf("generate: %v", err)
			return 0
		}
		defer resp.Body.Close()
		var out struct {
			Outputs []struct {
				TokenIDs []int `json:"token_ids"`
			} `json:"outputs"`
		}
		if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&out) != nil || len(out.Outputs) != 1 {
			b.Errorf("generate: status %d", resp.StatusCode)
			return 0
		}
		return len(out.Outputs[0].TokenIDs)
	}
	// Warm up: one batch at full concurrency, not measured.
	var wg sync.WaitGroup
	for i := range concurrency {
		wg.Add(1)
		go func() { defer wg.Done(); call(i, 8) }()
	}
	wg.Wait()
	next := make(chan int)
	var mu sync.Mutex
	tokens := 0
	start := time.Now()
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				n := call(i, maxTokens)
				mu.Lock()
				tokens += n
				mu.Unlock()
			}
		}()
	}
	for i := range requests {
		next <- i
	}
	close(next)
	wg.Wait()
	return float64(tokens) / time.Since(start).Seconds()
}

// BenchmarkDecodeOTLPvsNone measures decode throughput of `rollout serve` exporting every span
// over OTLP to a real Jaeger against the same server with --otel none, at 32 concurrent
// requests, for builtin:tiny and builtin:stories15m; runs alternate (none, otlp, none, otlp, ...; medians)
// so drift on a shared machine hits both alike. Run it with
// `go -C tools test -tags e2e -run '^$' -bench DecodeOTLP -benchtime 1x ./e2e/` and
// ROLLOUT_BIN, JAEGER_BIN set as for make e2e.
func BenchmarkDecodeOTLPvsNone(b *testing.B) {
	rollout, jaeger := os.Getenv("ROLLOUT_BIN"), os.Getenv("JAEGER_BIN")
	if rollout == "" || jaeger == "" {
		b.Fatal("ROLLOUT_BIN and JAEGER_BIN must name the binaries")
	}
	dir := b.TempDir()
	ports := freePorts(b, 4)
	otlpGRPC, otlpHTTP, query, queryGRPC := ports[0], ports[1], ports[2], ports[3]
	cfg := filepath.Join(dir, "jaeger.yaml")
	if err := os.WriteFile(cfg, []byte(jaegerConfig(otlpGRPC, otlpHTTP, query, queryGRPC)), 0o600); err != nil {
		b.Fatal(err)
	}
	j := start(b, "jaeger", jaegerEnv, jaeger, "--config", cfg)
	defer j.stop(b)
	waitHTTP(b, j, "http://127.0.0.1:"+strconv.Itoa(query)+"/api/services")
	env := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:" + strconv.Itoa(otlpHTTP)}
	const concurrency = 32
	rounds := 3 // E2E_BENCH_ROUNDS overrides: more rounds, steadier medians on a busy machine
	if v, err := strconv.Atoi(os.Getenv("E2E_BENCH_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	for range b.N {
		for _, m := range []struct {
			model               string
			requests, maxTokens int
		}{{"builtin:tiny", 256, 64}, {"builtin:stories15m", 128, 64}} {
			var none, otlp []float64
			for range rounds {
				none = append(none, decodeRun(b, rollout, m.model, "none", nil, concurrency, m.requests, m.maxTokens))
				otlp = append(otlp, decodeRun(b, rollout, m.model, "otlp", env, concurrency, m.requests, m.maxTokens))
			}
			// Each round's two runs are adjacent in time, so their ratio cancels most of the
			// machine's drift; the median of those ratios is the figure.
			ratios := make([]float64, len(none))
			for i := range none {
				ratios[i] = otlp[i] / none[i]
			}
			n, o, r := median(none), median(otlp), median(ratios)
			name := strings.TrimPrefix(m.model, "builtin:")
			b.ReportMetric(n, name+"_none_tok/s")
			b.ReportMetric(o, name+"_otlp_tok/s")
			b.ReportMetric(r, name+"_otlp/none")
			b.Logf("%s, %d concurrent: none %.0f tok/s, otlp %.0f tok/s (medians); per-round otlp/none %.3f, median %.3fx", m.model, concurrency, n, o, ratios, r)
		}
	}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}
