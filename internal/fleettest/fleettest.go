package fleettest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rolloutkit/rollout/internal/redistest"
	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/protocol"
)

// StartTimeout bounds how long a server may take to heartbeat in rotation after it starts.
const StartTimeout = 60 * time.Second

// build holds the one binary of a test binary's run.
var build struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// Binary builds cmd/rollout with `go build` the first time it is called in a test binary and
// returns its path; later calls reuse it. Main removes it at the end. $FLEETTEST_BIN, when
// set, is used instead of a build.
func Binary(t testing.TB) string {
	t.Helper()
	build.once.Do(func() {
		root, err := moduleRoot()
		if err != nil {
			build.err = err
			return
		}
		// Not t.TempDir: the binary outlives the test that built it; Main removes it.
		if build.dir, err = os.MkdirTemp("", "rollout-fleettest-"); err != nil { //nolint:usetesting // shared by every test of the binary
			build.err = err
			return
		}
		build.path = filepath.Join(build.dir, "rollout")
		if bin := os.Getenv("FLEETTEST_BIN"); bin != "" {
			// A binary built elsewhere (e.g. from an older commit, to see a test fail on it).
			build.path = bin
			return
		}
		cmd := exec.Command("go", "build", "-o", build.path, "./cmd/rollout")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			build.err = fmt.Errorf("go build ./cmd/rollout: %w\n%s", err, out)
		}
	})
	if build.err != nil {
		t.Fatalf("fleettest: %v", build.err)
	}
	return build.path
}

// Main runs the tests, removes the binary Binary built and, when they passed, fails the run
// on goroutines left running (goleak). Call it from TestMain: os.Exit(fleettest.Main(m)).
func Main(m *testing.M) int {
	code := m.Run()
	if build.dir != "" {
		_ = os.RemoveAll(build.dir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the module")
	}
	return filepath.Dir(mod), nil
}

// Options configure Start.
type Options struct {
	// Servers is how many `rollout serve` processes to start (default 1).
	Servers int
	// Fleet is the fleet name (default "test").
	Fleet string
	// Secret is the fleet secret, passed through --fleet-secret-file (default: a fixed
	// 32-byte test secret; "-" starts an unsigned fleet).
	Secret string
	// IssuedKeys gives each server its own issued key (--fleet-key-file, issued under
	// Secret) instead of the fleet secret: the separated-authority setup.
	IssuedKeys bool
	// Redis is the redis-server to use (default: a new one).
	Redis *redistest.Server
	// Args are extra `rollout serve` flags for every server (a model, --offload-cpu-bytes).
	Args []string
	// RedisURL, when set, gives server i its Redis URL (e.g. through a redistest.Proxy).
	RedisURL func(i int) string
	// ServerArgs, when set, adds flags for server i only (e.g. its own --weights-root).
	ServerArgs func(i int) []string
	// Env are extra environment variables (KEY=VALUE) of every server, e.g. ROLLOUT_<FLAG>
	// settings, which a binary without that flag ignores.
	Env []string
}

// DefaultSecret is the secret of a fleet started without Options.Secret.
const DefaultSecret = "fleettest-secret-0123456789abcdef-0123456789"

// Fleet is a running fleet of rollout processes.
type Fleet struct {
	t      testing.TB
	Name   string
	Secret string // "" for an unsigned fleet
	Redis  *redistest.Server
	Procs  []*Proc
	bus    bus.Bus // reads heartbeats; go-redis redials after a redis restart
}

// Proc is one `rollout serve` process. Kill and Start stop and restart it on the same port
// with the same flags.
type Proc struct {
	t    testing.TB
	bin  string
	ID   string
	Addr string
	args []string
	// StateDir is the process's $XDG_RUNTIME_DIR: it writes its generated admin token in
	// StateDir/rollout.
	StateDir string
	env      []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	logs *lockedBuffer
	runs int
	// stopped: SIGSTOPped (Suspend) and not yet continued.
	stopped bool
}

// URL is the server's base URL.
func (p *Proc) URL() string { return "http://" + p.Addr }

// Start starts a fleet and waits until every server heartbeats in rotation.
func Start(t testing.TB, o Options) *Fleet {
	t.Helper()
	bin := Binary(t)
	if o.Servers <= 0 {
		o.Servers = 1
	}
	if o.Fleet == "" {
		o.Fleet = "test"
	}
	if o.Secret == "" {
		o.Secret = DefaultSecret
	}
	if o.Redis == nil {
		o.Redis = redistest.Start(t)
	}
	f := &Fleet{t: t, Name: o.Fleet, Secret: o.Secret, Redis: o.Redis}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	b, err := bus.DialRedis(ctx, o.Redis.URL(), bus.RedisOptions{})
	cancel()
	if err != nil {
		t.Fatalf("fleettest: %v", err)
	}
	f.bus = b
	t.Cleanup(func() { _ = b.Close() })
	if o.Secret == "-" {
		f.Secret = ""
	}
	secretArgs := []string{"--insecure-unsigned-fleet"}
	if f.Secret != "" {
		path := filepath.Join(t.TempDir(), "fleet-secret")
		if err := os.WriteFile(path, []byte(f.Secret+"\n"), 0o600); err != nil {
			t.Fatalf("fleettest: %v", err)
		}
		secretArgs = []string{"--fleet-secret-file", path}
	}
	addrs := freeAddrs(t, o.Servers)
	for i := range o.Servers {
		url := o.Redis.URL()
		if o.RedisURL != nil {
			url = o.RedisURL(i)
		}
		p := newProc(t, bin, fmt.Sprintf("s%d", i+1), addrs[i], o.Env)
		args := secretArgs
		if o.IssuedKeys && f.Secret != "" {
			args = []string{"--fleet-key-file", f.issueKey(p.ID)}
		}
		// File weight sources anywhere unless Args or ServerArgs give a --weights-root (the
		// last one given wins).
		p.args = append([]string{"serve", "--addr", p.Addr, "--advertise-url", p.URL(), "--server-id", p.ID,
			"--redis", url, "--fleet", o.Fleet, "--shutdown-grace", "1s", "--log-level", "info",
			"--weights-root", "/"}, args...)
		p.args = append(p.args, o.Args...)
		if o.ServerArgs != nil {
			p.args = append(p.args, o.ServerArgs(i)...)
		}
		f.Procs = append(f.Procs, p)
		t.Cleanup(func() {
			p.Stop()
			if t.Failed() {
				t.Logf("=== output of server %s (%s)\n%s", p.ID, p.Addr, p.Logs())
			}
		})
		p.Start()
	}
	for _, p := range f.Procs {
		f.WaitInRotation(p)
	}
	return f
}

// newProc is a process on loopback address addr with a state directory of its own.
func newProc(t testing.TB, bin, id, addr string, env []string) *Proc {
	p := &Proc{t: t, bin: bin, ID: id, Addr: addr, logs: &lockedBuffer{}, StateDir: t.TempDir()}
	p.env = append([]string{"XDG_RUNTIME_DIR=" + p.StateDir}, env...)
	return p
}

// Serve starts one `rollout serve` process outside any fleet, on a free loopback port with
// its own state directory, the extra environment (KEY=VALUE) and args, and waits until it
// answers /health.
func Serve(t testing.TB, env []string, args ...string) *Proc {
	t.Helper()
	p := newProc(t, Binary(t), "serve", freeAddrs(t, 1)[0], env)
	p.args = append([]string{"serve", "--addr", p.Addr, "--shutdown-grace", "1s", "--log-level", "info"}, args...)
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("=== output of rollout serve (%s)\n%s", p.Addr, p.Logs())
		}
	})
	p.Start()
	deadline := time.Now().Add(StartTimeout)
	for p.Status("/health") != http.StatusOK {
		if !p.Running() {
			t.Fatalf("fleettest: rollout serve exited:\n%s", p.Logs())
		}
		if time.Now().After(deadline) {
			t.Fatalf("fleettest: rollout serve not up after %s:\n%s", StartTimeout, p.Logs())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return p
}

// AdminToken is the admin token the process generated, read from the file it wrote in
// StateDir/rollout (admin-token-PORT); "" when there is none.
func (p *Proc) AdminToken() string {
	_, port, _ := net.SplitHostPort(p.Addr)
	b, err := os.ReadFile(filepath.Join(p.StateDir, "rollout", "admin-token-"+port))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Pid is the process id of the running process (0 when it is not running).
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Do sends method path with body (JSON, or none when empty) to base (the server's URL when
// empty), with the bearer token when one is given, and returns the status and the answer.
func (p *Proc) Do(base, method, path, token, body string) (int, string, error) {
	if base == "" {
		base = p.URL()
	}
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		return 0, "", err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// Proc returns the server with the id.
func (f *Fleet) Proc(id string) *Proc {
	for _, p := range f.Procs {
		if p.ID == id {
			return p
		}
	}
	f.t.Fatalf("fleettest: no server %q", id)
	return nil
}

// Start (re)starts the process with its flags and returns without waiting for it.
func (p *Proc) Start() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		p.t.Fatalf("fleettest: server %s is already running", p.ID)
	}
	p.runs++
	fmt.Fprintf(p.logs, "--- start %d: rollout %s\n", p.runs, strings.Join(p.args, " "))
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = p.logs, p.logs
	cmd.Env = append(append(os.Environ(), "GIN_MODE=release"), p.env...)
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("fleettest: start server %s: %v", p.ID, err)
	}
	done := make(chan struct{})
	go func() {
		err := cmd.Wait()
		fmt.Fprintf(p.logs, "--- exited: %v\n", err)
		close(done)
	}()
	p.cmd, p.done, p.stopped = cmd, done, false
}

// Suspend SIGSTOPs the process: it keeps its sockets and its state but does nothing (no
// heartbeat, no answer) until Resume, as a process stuck in a long GC pause or a frozen VM.
// A no-op when it is not running.
func (p *Proc) Suspend() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && !p.stopped {
		_ = p.cmd.Process.Signal(syscall.SIGSTOP)
		p.stopped = true
	}
}

// Resume SIGCONTs a process Suspend stopped.
func (p *Proc) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && p.stopped {
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		p.stopped = false
	}
}

// Suspended reports whether the process is stopped by Suspend.
func (p *Proc) Suspended() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil && p.stopped
}

// Kill SIGKILLs the process and waits until it is gone: no shutdown, its heartbeat key
// lingers until its TTL runs out.
func (p *Proc) Kill() { p.signal(syscall.SIGKILL, 0) }

// Stop asks the process to shut down (SIGTERM) and kills it if it has not exited in 15 s.
func (p *Proc) Stop() { p.signal(syscall.SIGTERM, 15*time.Second) }

func (p *Proc) signal(sig syscall.Signal, grace time.Duration) {
	p.mu.Lock()
	cmd, done, stopped := p.cmd, p.done, p.stopped
	p.cmd, p.stopped = nil, false
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	if stopped {
		_ = cmd.Process.Signal(syscall.SIGCONT) // a stopped process acts on SIGTERM only once continued
	}
	if grace > 0 {
		select {
		case <-done:
			return
		case <-time.After(grace):
			_ = cmd.Process.Signal(syscall.SIGKILL)
		}
	}
	<-done
}

// Running reports whether the process is running.
func (p *Proc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Logs is everything the process wrote so far (over all its runs).
func (p *Proc) Logs() string { return p.logs.String() }

// Heartbeat reads the server's current heartbeat (nil when its key is absent).
func (f *Fleet) Heartbeat(id string) *protocol.Heartbeat {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	raw, err := f.bus.Get(ctx, protocol.Names{Fleet: f.Name}.Heartbeat(id))
	if err != nil {
		return nil // absent, or redis restarting: no heartbeat to read right now
	}
	hb, err := protocol.DecodeHeartbeat(raw)
	if err != nil {
		f.t.Fatalf("fleettest: heartbeat of %s: %v", id, err)
	}
	return hb
}

// issueKey writes server id's issued key file and returns its path.
func (f *Fleet) issueKey(id string) string {
	a, err := protocol.NewAuth([]byte(f.Secret))
	if err != nil {
		f.t.Fatalf("fleettest: %v", err)
	}
	b, err := a.IssueServerKey(f.Name, id)
	if err != nil {
		f.t.Fatalf("fleettest: %v", err)
	}
	path := filepath.Join(f.t.TempDir(), id+".key")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		f.t.Fatalf("fleettest: %v", err)
	}
	return path
}

// KeyFile is the issued key file server id was started with ("" without IssuedKeys).
func (p *Proc) KeyFile() string {
	for i, a := range p.args {
		if a == "--fleet-key-file" && i+1 < len(p.args) {
			return p.args[i+1]
		}
	}
	return ""
}

// SetKey writes a raw value under key in the fleet's Redis (a test acting as another
// writer: a lost message's record, a replay, garbage).
func (f *Fleet) SetKey(key string, raw []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return f.bus.Set(ctx, key, raw, 0)
}

// WaitInRotation waits until p heartbeats in rotation and answers /ready with 200, failing
// the test (with the process's output) when it does not within StartTimeout or exits.
func (f *Fleet) WaitInRotation(p *Proc) {
	f.t.Helper()
	f.WaitFor(p, StartTimeout, "in rotation and ready", func(hb *protocol.Heartbeat) bool {
		return hb != nil && hb.InRotation && p.Status("/ready") == http.StatusOK
	})
}

// WaitFor polls until cond holds for p's heartbeat, failing the test when p exits or the
// time runs out. It only waits for a condition that must become true; it decides nothing.
func (f *Fleet) WaitFor(p *Proc, timeout time.Duration, what string, cond func(*protocol.Heartbeat) bool) {
	f.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if cond(f.Heartbeat(p.ID)) {
			return
		}
		if !p.Running() {
			f.t.Fatalf("fleettest: server %s exited before it was %s:\n%s", p.ID, what, p.Logs())
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("fleettest: server %s not %s after %s; last heartbeat %+v\n%s", p.ID, what, timeout, f.Heartbeat(p.ID), p.Logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Status is the HTTP status of GET path on the server (0 when it does not answer).
func (p *Proc) Status(path string) int {
	resp, err := http.Get(p.URL() + path)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// Ready is GET /ready: its status and the weight version it reports (-1 when not ready).
func (p *Proc) Ready() (int, int64) {
	resp, err := http.Get(p.URL() + "/ready")
	if err != nil {
		return 0, -1
	}
	defer resp.Body.Close()
	var body struct {
		WeightVersion int64 `json:"weight_version"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&body) != nil {
		return resp.StatusCode, -1
	}
	return resp.StatusCode, body.WeightVersion
}

// Metric sums the samples of the Prometheus metric name on the server's /metrics whose labels
// include every pair of labels ("k", "v", ...).
func (p *Proc) Metric(name string, labels ...string) (float64, error) {
	resp, err := http.Get(p.URL() + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return SumMetric(resp.Body, name, labels...)
}

// SumMetric sums the samples of metric name in Prometheus text whose labels include every
// ("k", "v") pair given.
func SumMetric(r io.Reader, name string, labels ...string) (float64, error) {
	if len(labels)%2 != 0 {
		return 0, errors.New("fleettest: labels come in pairs")
	}
	var want []string
	for i := 0; i < len(labels); i += 2 {
		want = append(want, labels[i]+"="+strconv.Quote(labels[i+1]))
	}
	var sum float64
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		var lbls string
		if strings.HasPrefix(rest, "{") {
			end := strings.LastIndex(rest, "}")
			if end < 0 {
				continue
			}
			lbls, rest = rest[1:end], rest[end+1:]
		}
		match := true
		for _, w := range want {
			if !containsLabel(lbls, w) {
				match = false
				break
			}
		}
		if !match {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return 0, fmt.Errorf("fleettest: metric line %q: %w", line, err)
		}
		sum += v
	}
	return sum, sc.Err()
}

func containsLabel(lbls, pair string) bool {
	for _, l := range strings.Split(lbls, ",") {
		if strings.TrimSpace(l) == pair {
			return true
		}
	}
	return false
}

// freeAddrs returns n distinct free loopback addresses. Their listeners stay open until all
// n are taken: a server started between two picks had not bound its port yet, and a second
// pick handed two servers of one fleet the same port.
func freeAddrs(t testing.TB, n int) []string {
	t.Helper()
	addrs := make([]string, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("fleettest: %v", err)
		}
		defer l.Close()
		addrs = append(addrs, l.Addr().String())
	}
	return addrs
}

// lockedBuffer is a bytes.Buffer the process's stdout and stderr share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
