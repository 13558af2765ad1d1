//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	fleetName = "e2e"
	secret    = "e2e-fleet-secret-of-at-least-32-bytes!"
)

// freePort asks the kernel for a port nobody listens on.
func freePort(t testing.TB) int { return freePorts(t, 1)[0] }

// freePorts asks the kernel for n distinct ports nobody listens on. The listeners stay open
// until all n are taken: a port freed by one pick can come back on the next.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// proc is a child process whose output goes to a log file kept with the test's output.
type proc struct {
	name    string
	cmd     *exec.Cmd
	log     string
	done    chan error
	stopped bool
}

func start(t testing.TB, name string, env []string, bin string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(logPath)
	require.NoError(t, err)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	require.NoError(t, cmd.Start(), "start %s", name)
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait(); f.Close() }()
	t.Cleanup(func() { p.stop(t) })
	return p
}

// stop interrupts the process (rollout serve flushes its spans on SIGINT) and waits for it.
func (p *proc) stop(t testing.TB) {
	if p.stopped {
		return
	}
	p.stopped = true
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	if t.Failed() {
		b, _ := os.ReadFile(p.log)
		t.Logf("--- %s log (last 4 KiB) ---\n%s", p.name, tail(b, 4096))
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// waitHTTP polls url until it answers 200 (the deadline only bounds a hang).
func waitHTTP(t testing.TB, p *proc, url string) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-p.done:
			p.done <- err
			b, _ := os.ReadFile(p.log)
			t.Fatalf("%s exited (%v) before %s answered:\n%s", p.name, err, url, tail(b, 4096))
		default:
		}
		resp, err := http.Get(url)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: %s never answered 200", p.name, url)
}

func run(t *testing.T, env []string, bin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	require.NoError(t, cmd.Run(), "%s %v: %s%s", bin, args, out.String(), errb.String())
	return out.String()
}

func jaegerConfig(otlpGRPC, otlpHTTP, query, queryGRPC int) string {
	return fmt.Sprintf(`service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    traces:
      level: none
    logs:
      level: warn
extensions:
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 10000
  jaeger_query:
    storage:
      traces: mem
    http:
      endpoint: 127.0.0.1:%d
    grpc:
      endpoint: 127.0.0.1:%d
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:%d
      http:
        endpoint: 127.0.0.1:%d
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
`, query, queryGRPC, otlpGRPC, otlpHTTP)
}

// jaegerEnv keeps Jaeger from tracing itself (its query service would export to the default
// OTLP port, which nobody serves here).
var jaegerEnv = []string{"OTEL_SDK_DISABLED=true", "OTEL_TRACES_EXPORTER=none"}

// Jaeger's /api/traces JSON, the parts the test reads.
type jTrace struct {
	TraceID   string              `json:"traceID"`
	Spans     []jSpan             `json:"spans"`
	Processes map[string]jProcess `json:"processes"`
}

type jSpan struct {
	TraceID    string `json:"traceID"`
	SpanID     string `json:"spanID"`
	Operation  string `json:"operationName"`
	References []struct {
		RefType string `json:"refType"`
		SpanID  string `json:"spanID"`
		TraceID string `json:"traceID"`
	} `json:"references"`
	StartTime int64  `json:"startTime"` // µs
	Duration  int64  `json:"duration"`  // µs
	ProcessID string `json:"processID"`
	Logs      []struct {
		Timestamp int64 `json:"timestamp"` // µs
		Fields    []struct {
			Key   string `json:"key"`
			Value any    `json:"value"`
		} `json:"fields"`
	} `json:"logs"`
	Tags []struct {
		Key   string `json:"key"`
		Value any    `json:"value"`
	} `json:"tags"`
}

type jProcess struct {
	ServiceName string `json:"serviceName"`
}

func (s *jSpan) tag(k string) string {
	for _, t := range s.Tags {
		if t.Key == k {
			return fmt.Sprint(t.Value)
		}
	}
	return ""
}

// parent is the span's parent as Jaeger's UI draws it: its CHILD_OF reference, else its first
// reference (Jaeger stores a parent that is also linked, as control.process's sender is, as
// one FOLLOWS_FROM reference).
func (s *jSpan) parent() string {
	for _, r := range s.References {
		if r.RefType == "CHILD_OF" {
			return r.SpanID
		}
	}
	if len(s.References) > 0 {
		return s.References[0].SpanID
	}
	return ""
}

func getTraces(t *testing.T, url string) []jTrace {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	var body struct {
		Data []jTrace `json:"data"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	return body.Data
}

// render draws the trace as an indented tree with each span's offset and duration.
func render(tr jTrace) string {
	kids := map[string][]*jSpan{}
	var roots []*jSpan
	ids := map[string]bool{}
	for i := range tr.Spans {
		ids[tr.Spans[i].SpanID] = true
	}
	for i := range tr.Spans {
		s := &tr.Spans[i]
		if p := s.parent(); p != "" && ids[p] {
			kids[p] = append(kids[p], s)
		} else {
			roots = append(roots, s)
		}
	}
	byStart := func(ss []*jSpan) {
		sort.Slice(ss, func(i, j int) bool {
			if ss[i].StartTime != ss[j].StartTime {
				return ss[i].StartTime < ss[j].StartTime
			}
			return ss[i].tag("rollout.server_id") < ss[j].tag("rollout.server_id")
		})
	}
	byStart(roots)
	t0 := roots[0].StartTime
	var b strings.Builder
	var walk func(s *jSpan, prefix string, last bool, depth int)
	walk = func(s *jSpan, prefix string, last bool, depth int) {
		branch, next := "├─ ", "│  "
		if last {
			branch, next = "└─ ", "   "
		}
		if depth == 0 {
			branch, next = "", ""
		}
		label := s.Operation
		var extra []string
		for _, k := range []string{"rollout.server_id", "rollout.command", "offload.jobs_flushed", "offload.resets_merged", "offload.step", "offload.jobs"} {
			if v := s.tag(k); v != "" {
				extra = append(extra, strings.TrimPrefix(strings.TrimPrefix(k, "rollout."), "offload.")+"="+v)
			}
		}
		if len(extra) > 0 {
			label += " [" + strings.Join(extra, " ") + "]"
		}
		svc := tr.Processes[s.ProcessID].ServiceName
		fmt.Fprintf(&b, "%-72s %-14s +%8.2fms %9.2fms\n", prefix+branch+label, svc, float64(s.StartTime-t0)/1e3, float64(s.Duration)/1e3)
		for _, l := range s.Logs {
			for _, f := range l.Fields {
				if f.Key == "event" {
					fmt.Fprintf(&b, "%-72s %-14s +%8.2fms\n", prefix+next+"· "+fmt.Sprint(f.Value), "(event)", float64(l.Timestamp-t0)/1e3)
				}
			}
		}
		ks := kids[s.SpanID]
		byStart(ks)
		for i, k := range ks {
			walk(k, prefix+next, i == len(ks)-1, depth+1)
		}
	}
	for _, r := range roots {
		walk(r, "", true, 0)
	}
	return b.String()
}

// TestFleetUpdateTraceInJaeger is the real-backend check of the reset trace.
func TestFleetUpdateTraceInJaeger(t *testing.T) {
	rollout, jaeger := os.Getenv("ROLLOUT_BIN"), os.Getenv("JAEGER_BIN")
	if rollout == "" || jaeger == "" {
		t.Fatal("ROLLOUT_BIN and JAEGER_BIN must name the binaries (make e2e sets them)")
	}
	redisBin, err := exec.LookPath("redis-server")
	require.NoError(t, err, "redis-server is needed")

	dir := t.TempDir()
	ports := freePorts(t, 7) // Jaeger's four, Redis, two servers
	otlpGRPC, otlpHTTP, query, queryGRPC := ports[0], ports[1], ports[2], ports[3]
	cfg := filepath.Join(dir, "jaeger.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte(jaegerConfig(otlpGRPC, otlpHTTP, query, queryGRPC)), 0o600))
	j := start(t, "jaeger", jaegerEnv, jaeger, "--config", cfg)
	queryURL := "http://127.0.0.1:" + strconv.Itoa(query)
	waitHTTP(t, j, queryURL+"/api/services")

	redisPort := ports[4]
	start(t, "redis", nil, redisBin, "--port", strconv.Itoa(redisPort), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	redisURL := "redis://127.0.0.1:" + strconv.Itoa(redisPort)

	ckpt := filepath.Join(dir, "v1")
	run(t, nil, rollout, "model", "init", "--preset", "tiny", "--seed", "7", "--out", ckpt)
	sum := strings.TrimSpace(run(t, nil, rollout, "weights", "digest", ckpt))
	if f := strings.Fields(sum); len(f) > 0 {
		sum = f[0]
	}
	secretFile := filepath.Join(dir, "secret")
	require.NoError(t, os.WriteFile(secretFile, []byte(secret+"\n"), 0o600))

	otelEnv := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:" + strconv.Itoa(otlpHTTP), "OTEL_BSP_SCHEDULE_DELAY=100"}
	var servers []string
	for i := range 2 {
		port := ports[5+i]
		id := "s" + strconv.Itoa(i)
		// The generated admin token goes to dir (XDG_RUNTIME_DIR); file weight sources are
		// confined to dir, where the checkpoint is.
		p := start(t, "serve-"+id, append(otelEnv, "XDG_RUNTIME_DIR="+dir), rollout, "serve", "--addr", "127.0.0.1:"+strconv.Itoa(port), "--redis", redisURL,
			"--fleet", fleetName, "--server-id", id, "--fleet-secret-file", secretFile, "--otel", "otlp",
			"--offload-cpu-bytes", "16MiB", "--offload-delay", "5ms", "--log-level", "warn", "--weights-root", dir)
		url := "http://127.0.0.1:" + strconv.Itoa(port)
		waitHTTP(t, p, url+"/ready")
		servers = append(servers, url)
	}

	// Generation runs on both servers while the update happens, so KV stores are in flight.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, url := range servers {
		for k := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				body := fmt.Sprintf(`{"prompt_token_ids":[%d,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18],"sampling":{"max_tokens":48,"ignore_eos":true}}`, k+1)
				for ctx.Err() == nil {
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/generate", strings.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
					if resp, err := http.DefaultClient.Do(req); err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				}
			}()
		}
	}
	began := time.Now()
	out := run(t, append(otelEnv, "OTEL_TRACES_EXPORTER=otlp"), rollout, "fleet", "update", "--redis", redisURL, "--fleet", fleetName,
		"--fleet-secret-file", secretFile, "--version", "1", "--source", "file://"+ckpt, "--sha256", sum, "--json")
	took := time.Since(began)
	cancel()
	wg.Wait()
	t.Logf("rollout fleet update took %s", took)
	require.Contains(t, out, `"committed"`, out)

	// Find the update's trace: the CLI exported its SDK span; the servers export theirs with
	// a batch delay, so poll until every expected span has arrived.
	want := func(tr jTrace) []string {
		var missing []string
		count := map[string]int{}
		for _, s := range tr.Spans {
			key := s.Operation
			if id := s.tag("rollout.server_id"); id != "" && (s.Operation == "control.process") {
				key += "@" + id + "/" + s.tag("rollout.command")
			}
			count[key]++
		}
		for _, k := range []string{"sdk.update_weights", "control.process@s0/commit", "control.process@s1/commit",
			"control.process@s0/stage", "control.process@s1/stage"} {
			if count[k] != 1 {
				missing = append(missing, fmt.Sprintf("%s x%d", k, count[k]))
			}
		}
		for _, k := range []string{"offload.reset_cache", "offload.flush.delivered", "offload.flush.wait"} {
			if count[k] < 4 {
				missing = append(missing, fmt.Sprintf("%s x%d (want 2 per server)", k, count[k]))
			}
		}
		return missing
	}
	var tr jTrace
	var missing []string
	deadline := time.Now().Add(60 * time.Second)
	for {
		for _, c := range getTraces(t, queryURL+"/api/traces?service=rollout-fleet&operation=sdk.update_weights&limit=5&lookback=1h") {
			full := getTraces(t, queryURL+"/api/traces/"+c.TraceID)
			if len(full) == 1 {
				tr = full[0]
			}
		}
		if missing = want(tr); len(missing) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	require.Empty(t, missing, "the update's trace in Jaeger lacks spans")
	picture := render(tr)
	t.Logf("trace %s (%d spans):\n%s", tr.TraceID, len(tr.Spans), picture)
	if p := os.Getenv("E2E_TRACE_OUT"); p != "" {
		require.NoError(t, os.WriteFile(p, []byte(picture), 0o644))
	}

	byID := map[string]*jSpan{}
	for i := range tr.Spans {
		byID[tr.Spans[i].SpanID] = &tr.Spans[i]
	}
	services := map[string]bool{}
	for _, p := range tr.Processes {
		services[p.ServiceName] = true
	}
	assert.True(t, services["rollout-fleet"] && services["rollout-serve"], "the CLI's and the servers' spans in one trace: %v", services)
	var root *jSpan
	for i := range tr.Spans {
		if tr.Spans[i].Operation == "sdk.update_weights" {
			root = &tr.Spans[i]
		}
	}
	require.NotNil(t, root)
	assert.Empty(t, root.parent(), "the SDK call is the root")
	// ancestor walks up to the nearest span named op.
	ancestor := func(s *jSpan, op string) *jSpan {
		for p := byID[s.parent()]; p != nil; p = byID[p.parent()] {
			if p.Operation == op {
				return p
			}
		}
		return nil
	}
	for _, id := range []string{"s0", "s1"} {
		var proc *jSpan
		for i := range tr.Spans {
			s := &tr.Spans[i]
			if s.Operation == "control.process" && s.tag("rollout.server_id") == id && s.tag("rollout.command") == "commit" {
				proc = s
			}
		}
		require.NotNil(t, proc, id)
		assert.Equal(t, root, ancestor(proc, "sdk.update_weights"), "%s: control.process descends from the SDK span", id)
		assert.GreaterOrEqual(t, proc.StartTime, root.StartTime)
		// Its resets, each followed by the step that delivered its flush and the wait on it.
		var resets []*jSpan
		for i := range tr.Spans {
			s := &tr.Spans[i]
			if s.Operation == "offload.reset_cache" && ancestor(s, "control.process") == proc {
				resets = append(resets, s)
			}
		}
		require.Len(t, resets, 2, "%s: pause and sleep each reset the cache", id)
		for _, r := range resets {
			assert.GreaterOrEqual(t, r.StartTime, proc.StartTime, id)
			child := func(parent *jSpan, op string) *jSpan {
				for i := range tr.Spans {
					if s := &tr.Spans[i]; s.Operation == op && s.parent() == parent.SpanID {
						return s
					}
				}
				return nil
			}
			del := child(r, "offload.flush.delivered")
			require.NotNil(t, del, "%s: the reset's flush delivery", id)
			wait := child(del, "offload.flush.wait")
			require.NotNil(t, wait, "%s: the workers' wait on the flush", id)
			assert.GreaterOrEqual(t, del.StartTime, r.StartTime+r.Duration, "%s: delivered after the reset", id)
			assert.GreaterOrEqual(t, wait.StartTime, del.StartTime, "%s: the wait within the delivery", id)
		}
	}

	stepTrace(t, queryURL, otelEnv, redisURL, secretFile, dir)
}

// stepTrace checks issue 27's "one trace per training step": examples/rl-loop run against
// the same fleet (over Redis, exporting to the same Jaeger) makes each step one trace, with
// the step's update and every server's commit, resets and flushes under its rl.step span.
func stepTrace(t *testing.T, queryURL string, otelEnv []string, redisURL, secretFile, dir string) {
	loopBin := os.Getenv("RL_LOOP_BIN")
	require.NotEmpty(t, loopBin, "RL_LOOP_BIN must name the rl-loop binary (make e2e sets it)")
	out := filepath.Join(dir, "loop")
	run(t, append(otelEnv, "OTEL_TRACES_EXPORTER=otlp"), loopBin, "--redis", redisURL, "--fleet", fleetName, "--fleet-secret-file", secretFile,
		"--otel", "otlp", "--steps", "2", "--prompts", "2", "--group", "2", "--warmup-steps", "0", "--eval-every", "0",
		"--out", out, "--store-url", "file://"+filepath.Join(out, "weights"), "--fleet-start", "reset", "--sync", "--log-level", "warn")
	want := func(tr jTrace) []string {
		count := map[string]int{}
		for _, s := range tr.Spans {
			key := s.Operation
			if s.Operation == "control.process" {
				key += "@" + s.tag("rollout.server_id") + "/" + s.tag("rollout.command")
			}
			count[key]++
		}
		var missing []string
		for _, k := range []string{"rl.step", "sdk.update_weights", "control.process@s0/commit", "control.process@s1/commit"} {
			if count[k] < 1 {
				missing = append(missing, k)
			}
		}
		if count["offload.flush.delivered"] < 2 {
			missing = append(missing, fmt.Sprintf("offload.flush.delivered x%d (want one per server at least)", count["offload.flush.delivered"]))
		}
		return missing
	}
	var missing []string
	deadline := time.Now().Add(60 * time.Second)
	for {
		missing = []string{"no rl.step trace"}
		for _, c := range getTraces(t, queryURL+"/api/traces?service=rl-loop&operation=rl.step&limit=10&lookback=1h") {
			full := getTraces(t, queryURL+"/api/traces/"+c.TraceID)
			if len(full) != 1 {
				continue
			}
			if m := want(full[0]); len(m) == 0 {
				t.Logf("step trace %s (%d spans):\n%s", full[0].TraceID, len(full[0].Spans), render(full[0]))
				return
			} else if len(m) < len(missing) {
				missing = m
			}
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("no training step's trace in Jaeger holds its update and the servers' commits and flushes; closest lacks %v", missing)
}
