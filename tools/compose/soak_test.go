package compose

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"
)

// soakEnv sets the soak's length (a Go duration); make compose-soak sets 10m.
const soakEnv = "ROLLOUT_COMPOSE_SOAK"

// defaultSoak is the length in make test: every disruption happens once, then it runs on.
const defaultSoak = time.Minute

// waitLimit bounds each wait for a condition of the soak: past it the stack is broken, not slow.
const waitLimit = 3 * time.Minute

// svc is one compose service run as a process with the file's command and arguments, under
// a supervisor that does what `restart: unless-stopped` does: a process that exits, or that
// the test kills as a crash, starts again; a stopped service stays down until started.
type svc struct {
	name string
	argv []string
	env  []string
	log  string // the path its output is appended to
	// mayEnd: exiting 0 is the service's normal end (the loop's --steps), not a failure.
	mayEnd bool

	mu       sync.Mutex
	cmd      *exec.Cmd
	stopped  bool
	starts   int
	killed   int      // exits the test caused
	ends     int      // normal ends (mayEnd)
	failures []string // exits it did not cause
	exited   chan struct{}
	done     chan struct{} // closed when the supervisor returns
}

// run supervises the service until stopped.
func (s *svc) run(t *testing.T) {
	defer close(s.done)
	for {
		s.mu.Lock()
		if s.stopped {
			s.mu.Unlock()
			return
		}
		logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			s.failures = append(s.failures, err.Error())
			s.mu.Unlock()
			return
		}
		cmd := exec.Command(s.argv[0], s.argv[1:]...)
		cmd.Env = append(os.Environ(), s.env...)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			s.failures = append(s.failures, err.Error())
			s.mu.Unlock()
			_ = logf.Close()
			return
		}
		s.cmd, s.exited = cmd, make(chan struct{})
		s.starts++
		fmt.Fprintf(logf, "\n=== soak: start %d of %s\n", s.starts, s.name)
		s.mu.Unlock()

		began := time.Now()
		err = cmd.Wait()
		_ = logf.Close()
		s.mu.Lock()
		switch {
		case s.killed > 0 && killedBySignal(err):
			s.killed--
		case err == nil && s.mayEnd:
			s.ends++ // a run that ended (the loop's --steps): compose restarts it, so does this
		default:
			s.failures = append(s.failures, fmt.Sprintf("start %d exited on its own: %v", s.starts, err))
		}
		close(s.exited)
		s.mu.Unlock()
		if time.Since(began) < time.Second {
			time.Sleep(time.Second) // compose backs off a crash loop too; this only paces it
		}
	}
}

func killedBySignal(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// crash kills the running process as a crash would; the supervisor restarts it. It returns
// once the old process has exited.
func (s *svc) crash() {
	s.mu.Lock()
	s.killed++
	cmd, exited := s.cmd, s.exited
	s.mu.Unlock()
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-exited
}

// stop is `docker compose stop`: kill, and no restart until start.
func (s *svc) stop() {
	s.mu.Lock()
	s.stopped = true
	s.killed++
	cmd, exited := s.cmd, s.exited
	s.mu.Unlock()
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-exited
	<-s.done
}

// start is `docker compose start` after stop.
func (s *svc) start(t *testing.T) {
	s.mu.Lock()
	s.stopped = false
	s.done = make(chan struct{})
	s.mu.Unlock()
	go s.run(t)
}

func (s *svc) report() (starts, ends int, failures []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.starts, s.ends, append([]string(nil), s.failures...)
}

// soakStack is the compose stack without Docker: its services as processes on this machine.
type soakStack struct {
	t        *testing.T
	bin      string // directory with rollout and rl-loop
	secrets  string // the volume `secrets`
	run      string // the volume `rl-run`
	logs     string
	replace  []string // old, new pairs applied to every argument and environment value
	services map[string]*svc
	order    []*svc
}

// freePorts asks the kernel for n distinct ports nobody listens on. The listeners stay open
// until all n are taken: a port freed by one pick can come back on the next.
func freePorts(t *testing.T, n int) []string {
	t.Helper()
	ports := make([]string, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer ln.Close()
		_, port, err := net.SplitHostPort(ln.Addr().String())
		require.NoError(t, err)
		ports = append(ports, port)
	}
	return ports
}

// rewrite applies the stack's substitutions to one argument or environment value.
func (st *soakStack) rewrite(s string) string {
	return strings.NewReplacer(st.replace...).Replace(s)
}

// composeLeftovers are what an argument must not name once rewritten: compose's service
// host names and the containers' mount points. A rewrite that misses one fails the test,
// so a change of docker-compose.yml cannot go untested here.
var composeLeftovers = []string{"//redis:", "//rollout-1:", "//rollout-2:", "//jaeger:", "/run/secrets", "/data/", "0.0.0.0:"}

// add turns the compose service name into a supervised process with the file's command:
// after the service's entrypoint (a binary of bin), or after the image's, entrypoint (the
// rollout image's is rollout); with no entrypoint at all (redis), the command's first word
// is the program, found as entrypoint.
func (st *soakStack) add(p *types.Project, name, entrypoint string, extra ...string) *svc {
	t := st.t
	c, ok := p.Services[name]
	require.True(t, ok, "docker-compose.yml has no service %s", name)
	command := []string(c.Command)
	var argv []string
	switch {
	case len(c.Entrypoint) > 0:
		argv = []string{filepath.Join(st.bin, c.Entrypoint[0])}
		argv = append(argv, []string(c.Entrypoint[1:])...)
	case entrypoint != "" && filepath.Base(entrypoint) == command[0]:
		argv, command = []string{entrypoint}, command[1:]
	default:
		argv = []string{entrypoint}
	}
	for _, a := range command {
		argv = append(argv, st.rewrite(a))
	}
	argv = append(argv, extra...)
	var env []string
	for k, v := range c.Environment {
		if v != nil {
			env = append(env, k+"="+st.rewrite(*v))
		}
	}
	for _, a := range append(argv[1:], env...) {
		for _, bad := range composeLeftovers {
			require.NotContains(t, a, bad, "%s: an argument the soak does not map to this machine", name)
		}
	}
	s := &svc{name: name, argv: argv, env: env, log: filepath.Join(st.logs, name+".log"), done: make(chan struct{})}
	st.services[name] = s
	st.order = append(st.order, s)
	return s
}

// tails prints the end of every service's log, for a failure.
func (st *soakStack) tails() string {
	var b strings.Builder
	for _, s := range st.order {
		data, _ := os.ReadFile(s.log)
		if len(data) > 3000 {
			data = data[len(data)-3000:]
		}
		fmt.Fprintf(&b, "\n----- %s (%s)\n%s", s.name, s.log, data)
	}
	return b.String()
}

// waitFor polls cond until it holds; waitLimit past, the test fails with every log's tail.
func (st *soakStack) waitFor(what string, cond func() bool) {
	st.t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		for _, s := range st.order {
			if _, _, failures := s.report(); len(failures) > 0 {
				st.t.Fatalf("soak: %s: %s exited when nothing killed it: %v%s", what, s.name, failures, st.tails())
			}
		}
		if time.Now().After(deadline) {
			st.t.Fatalf("soak: %s: not within %s%s", what, waitLimit, st.tails())
		}
		time.Sleep(200 * time.Millisecond)
	}
	st.t.Logf("soak: %s", what)
}

func httpOK(url string) bool {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// fleetView is the part of `rollout fleet status --json` the soak reads.
type fleetView struct {
	Desired *struct {
		Weights struct {
			Version int64 `json:"version"`
		} `json:"weights"`
	} `json:"desired"`
	Servers []struct {
		ID            string `json:"id"`
		InRotation    bool   `json:"in_rotation"`
		WeightVersion int64  `json:"weight_version"`
	} `json:"servers"`
}

// status asks the fleet through the real CLI, with the loop's Redis and secret files.
func (st *soakStack) status(redisURL string) (fleetView, error) {
	out, err := exec.Command(filepath.Join(st.bin, "rollout"), "fleet", "status", "--json", "--redis", redisURL,
		"--redis-password-file", filepath.Join(st.secrets, "redis_password"), "--fleet", "demo",
		"--fleet-secret-file", filepath.Join(st.secrets, "fleet_secret")).Output()
	if err != nil {
		return fleetView{}, err
	}
	var v fleetView
	return v, json.Unmarshal(out, &v)
}

// steps reads the loop's training records from log.jsonl, in the order written; each run of
// the loop appends to it.
func (st *soakStack) steps() []int {
	f, err := os.Open(filepath.Join(st.run, "log.jsonl"))
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []int
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var r struct {
			Step  int    `json:"step"`
			Phase string `json:"phase"` // "initial": the evaluation before a run's first step
		}
		if json.Unmarshal(sc.Bytes(), &r) == nil && r.Phase == "" {
			out = append(out, r.Step)
		}
	}
	return out
}

func last(xs []int) int {
	if len(xs) == 0 {
		return 0
	}
	return xs[len(xs)-1]
}

// TestComposeSoak runs docker-compose.yml's Redis, servers and loop without Docker: the same
// binaries (built from this checkout, as the Dockerfile builds them) with the file's
// commands, arguments and environment, the secrets made by the init service's script, the
// volumes as directories, and every host:port mapped to a free port on 127.0.0.1 (listed in
// the log). Jaeger, Prometheus and Grafana are not started: traces go to a closed port, and
// nothing scrapes. Under restart-unless-stopped supervision it then:
//
//  1. waits for the loop to train;
//  2. crashes rollout-2, which must come back in rotation on the fleet's version;
//  3. crashes the loop, which must resume from its checkpoint (not from step 1);
//  4. stops the loop and crashes rollout-1, which must re-sync from the weight store in the
//     run volume with no loop running, then starts the loop again;
//  5. keeps the stack going to the soak's length and checks that training went on, that no
//     process exited except when the test killed it or the loop ended a --steps run, and
//     that the fleet ends on one version.
//
// Each step starts no earlier than its share of the length, so the 10-minute run
// (make compose-soak) spreads them out; the default is one minute.
func TestComposeSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server, two rollout serve and the loop")
	}
	length := defaultSoak
	if v := os.Getenv(soakEnv); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err, soakEnv)
		length = d
	}
	redisBin, err := exec.LookPath("redis-server")
	require.NoError(t, err, "the soak needs redis-server")

	tmp := t.TempDir()
	st := &soakStack{t: t, bin: filepath.Join(tmp, "bin"), secrets: filepath.Join(tmp, "secrets"),
		run: filepath.Join(tmp, "rl-run"), logs: filepath.Join(tmp, "logs"), services: map[string]*svc{}}
	for _, d := range []string{st.bin, st.run, st.logs} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}
	for _, b := range []struct{ out, pkg string }{{"rollout", "./cmd/rollout"}, {"rl-loop", "./examples/rl-loop"}} {
		build := exec.Command("go", "build", "-o", filepath.Join(st.bin, b.out), b.pkg)
		build.Dir = root(t)
		out, err := build.CombinedOutput()
		require.NoError(t, err, "go build %s: %s", b.pkg, out)
	}
	// The init service: `sh /init/secrets.sh /secrets /rl-run`.
	out, err := exec.Command("sh", filepath.Join(root(t), "deploy", "init", "secrets.sh"), st.secrets, st.run).CombinedOutput()
	require.NoError(t, err, "secrets.sh: %s", out)

	ports := freePorts(t, 5)
	redisPort, p1, p2, storePort, otlpPort := ports[0], ports[1], ports[2], ports[3], ports[4]
	common := []string{
		"redis://redis:6379", "redis://127.0.0.1:" + redisPort,
		"http://rollout-1:8000", "http://127.0.0.1:" + p1,
		"http://rollout-2:8000", "http://127.0.0.1:" + p2,
		"http://jaeger:4318", "http://127.0.0.1:" + otlpPort,
		"/run/secrets/", st.secrets + "/",
		"/data/run", st.run,
	}
	p := load(t)
	serverAddr := func(port string) []string {
		return append(append([]string(nil), common...), "0.0.0.0:8000", "127.0.0.1:"+port)
	}
	st.replace = common
	// compose runs redis-server from its image on its own network; these two flags only
	// move it onto this machine's free port.
	redis := st.add(p, "redis", redisBin, "--port", redisPort, "--bind", "127.0.0.1")
	st.replace = serverAddr(p1)
	r1 := st.add(p, "rollout-1", filepath.Join(st.bin, "rollout"))
	st.replace = serverAddr(p2)
	r2 := st.add(p, "rollout-2", filepath.Join(st.bin, "rollout"))
	st.replace = append(append([]string(nil), common...), "0.0.0.0:8100", "127.0.0.1:"+storePort)
	loop := st.add(p, "rl-loop", filepath.Join(st.bin, "rl-loop"))
	loop.mayEnd = true
	t.Logf("soak: %s; ports: redis %s, rollout-1 %s, rollout-2 %s, store %s; logs in %s", length, redisPort, p1, p2, storePort, st.logs)
	for _, s := range st.order {
		t.Logf("soak: %s: %s", s.name, strings.Join(s.argv, " "))
	}
	t.Cleanup(func() {
		for i := len(st.order) - 1; i >= 0; i-- {
			s := st.order[i]
			s.mu.Lock()
			running := !s.stopped && s.cmd != nil
			s.mu.Unlock()
			if running {
				s.stop()
			}
		}
	})

	start := time.Now()
	notBefore := func(k int) {
		if d := time.Until(start.Add(length * time.Duration(k) / 5)); d > 0 {
			t.Logf("soak: running on for %s", d.Round(time.Second))
			time.Sleep(d)
		}
	}
	redisURL := "redis://127.0.0.1:" + redisPort
	// depends_on: redis healthy, then the servers healthy, then the loop.
	go redis.run(t)
	st.waitFor("redis up", func() bool {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+redisPort, time.Second)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	})
	go r1.run(t)
	go r2.run(t)
	st.waitFor("both servers healthy", func() bool {
		return httpOK("http://127.0.0.1:"+p1+"/health") && httpOK("http://127.0.0.1:"+p2+"/health")
	})
	go loop.run(t)

	// 1. Training.
	st.waitFor("the loop trains", func() bool { return len(st.steps()) >= 3 })

	// inSync: the server is in rotation on at least version v.
	inSync := func(id string, v int64) func() bool {
		return func() bool {
			fv, err := st.status(redisURL)
			if err != nil {
				return false
			}
			for _, s := range fv.Servers {
				if s.ID == id {
					return s.InRotation && s.WeightVersion >= v
				}
			}
			return false
		}
	}
	desired := func() int64 {
		fv, err := st.status(redisURL)
		require.NoError(t, err)
		require.NotNil(t, fv.Desired, "the fleet has a desired state once the loop trains")
		return fv.Desired.Weights.Version
	}

	// 2. A server crashes while the loop trains.
	notBefore(1)
	v := desired()
	before := last(st.steps())
	r2.crash()
	st.waitFor(fmt.Sprintf("rollout-2 back in rotation at version >= %d", v), inSync("rollout-2", v))
	st.waitFor("the loop trains on after the server's crash", func() bool { return last(st.steps()) >= before+2 })

	// 3. The loop crashes: compose restarts it with --resume.
	notBefore(2)
	loop.crash()
	logged := st.steps() // read after the kill: the killed run writes no more
	seen, before := len(logged), last(logged)
	st.waitFor("the restarted loop trains", func() bool { return len(st.steps()) > seen })
	resumed := st.steps()[seen]
	require.Greater(t, resumed, 1, "the restarted loop started from step 1, not from its checkpoint")
	// The checkpoint is saved before the step's log line, so a kill between the two resumes
	// one step past the last logged one.
	require.LessOrEqual(t, resumed, before+2, "the restarted loop skipped steps")

	// 4. A server restarts while no loop runs: the weight store outlives the loop.
	notBefore(3)
	loop.stop()
	v = desired()
	r1.crash()
	st.waitFor(fmt.Sprintf("rollout-1 re-synced to version %d with the loop down", v), inSync("rollout-1", v))
	before = last(st.steps())
	loop.start(t)
	st.waitFor("the loop trains after its restart", func() bool { return last(st.steps()) >= before+2 })

	// 5. On to the end.
	notBefore(5)
	total := st.steps()
	require.Greater(t, last(total), before+1)
	fv, err := st.status(redisURL)
	require.NoError(t, err)
	require.Len(t, fv.Servers, 2)
	for _, s := range fv.Servers {
		require.True(t, s.InRotation, "%s out of rotation at the end", s.ID)
	}
	for _, s := range st.order {
		starts, ends, failures := s.report()
		require.Empty(t, failures, "%s exited when nothing killed it%s", s.name, st.tails())
		t.Logf("soak: %s started %d times, ended %d runs by itself", s.name, starts, ends)
	}
	t.Logf("soak: %s: %d training steps logged, last step %d, desired version %d",
		time.Since(start).Round(time.Second), len(total), last(total), desired())
}
