package redistest

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// startTimeout bounds how long a starting redis-server may take to answer PING.
const startTimeout = 20 * time.Second

// Server is one redis-server process owned by a test.
type Server struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	opts Options
	tls  *TLSFiles   // with Options.TLS
	ping *tls.Config // how the readiness PING dials (nil: plain TCP)

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
	logs *bytes.Buffer
}

// Start launches redis-server on a free 127.0.0.1 port without persistence, waits until it
// answers PING and kills it when the test ends. Without redis-server on PATH the test is
// skipped.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartWith(t, Options{})
}

// Options vary the server Start runs.
type Options struct {
	// Args are extra redis-server arguments, e.g. "--requirepass", "pw" or an ACL
	// "--user", "alice on >pw ~* &* +@all".
	Args []string
	// TLS makes the server speak TLS only (--port 0, --tls-port) with a certificate for
	// 127.0.0.1 and localhost signed by a fresh test CA (Server.TLS has the files).
	TLS bool
	// TLSClientAuth, with TLS, requires a client certificate signed by the same CA.
	TLSClientAuth bool
	// conf is a config file to start from (sentinels need one they can rewrite).
	conf func(port int) string
	// extra is extra arguments that depend on the port (cluster bus port).
	extra func(port int) []string
}

// StartWith is Start with options.
func StartWith(t testing.TB, o Options) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server is not installed (apt-get install redis-server); this test needs a real one")
	}
	s := &Server{t: t, bin: bin, dir: t.TempDir(), opts: o}
	if o.TLS {
		files := GenerateTLS(t, s.dir)
		s.tls = &files
		s.ping = files.ClientConfig(t)
	}
	var last error
	// A free port can be taken by someone else between probing and binding; try a few.
	for range 5 {
		s.port, err = freePort()
		if err != nil {
			t.Fatalf("redistest: free port: %v", err)
		}
		if last = s.start(); last == nil {
			t.Cleanup(s.stop)
			return s
		}
	}
	t.Fatalf("redistest: redis-server did not start: %v", last)
	return nil
}

// TLS is the server's certificate files (nil without Options.TLS).
func (s *Server) TLS() *TLSFiles { return s.tls }

// Port is the port the server listens on (its TLS port with Options.TLS).
func (s *Server) Port() int { return s.port }

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// start runs redis-server on s.port and waits for PING.
func (s *Server) start() error {
	var args []string
	if s.opts.conf != nil {
		args = append(args, s.opts.conf(s.port))
	}
	if s.tls != nil {
		auth := "no"
		if s.opts.TLSClientAuth {
			auth = "yes"
		}
		args = append(args, "--port", "0", "--tls-port", strconv.Itoa(s.port),
			"--tls-cert-file", s.tls.Cert, "--tls-key-file", s.tls.Key, "--tls-ca-cert-file", s.tls.CA,
			"--tls-auth-clients", auth)
	} else {
		args = append(args, "--port", strconv.Itoa(s.port))
	}
	args = append(args, "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--daemonize", "no", "--protected-mode", "no", "--loglevel", "warning")
	if s.opts.extra != nil {
		args = append(args, s.opts.extra(s.port)...)
	}
	args = append(args, s.opts.Args...)
	cmd := exec.Command(s.bin, args...)
	logs := &bytes.Buffer{}
	cmd.Stdout = logs
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.bin, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done, s.logs = cmd, done, logs
	s.mu.Unlock()

	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case <-done:
			return fmt.Errorf("redis-server exited at start: %s", logs.String())
		default:
		}
		if err := ping(s.Addr(), s.ping); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			s.kill()
			return fmt.Errorf("no PONG within %s: %w", startTimeout, err)
		}
		time.Sleep(5 * time.Millisecond) // polling for readiness only
	}
}

// ping sends one inline PING and expects +PONG, or -NOAUTH from a server that wants a
// password first (it is up all the same). tc, when set, makes it a TLS connection.
func ping(addr string, tc *tls.Config) error {
	line, err := Command(addr, tc, "PING")
	if err != nil {
		return err
	}
	if line != "+PONG" && !strings.HasPrefix(line, "-NOAUTH") {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// Command sends one inline command on a fresh connection (TLS when tc is set) and returns
// the first line of the reply without its CRLF.
func Command(addr string, tc *tls.Config, cmd string) (string, error) {
	d := &net.Dialer{Timeout: time.Second}
	var (
		c   net.Conn
		err error
	)
	if tc != nil {
		c, err = tls.DialWithDialer(d, "tcp", addr, tc)
	} else {
		c, err = d.Dial("tcp", addr)
	}
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte(cmd + "\r\n")); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimRight(line, "\r\n"), nil
}

// Addr is host:port of the server.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// URL is the server's redis:// URL (rediss:// with Options.TLS).
func (s *Server) URL() string {
	if s.tls != nil {
		return "rediss://" + s.Addr()
	}
	return "redis://" + s.Addr()
}

// Dir is the server's working directory (its config and TLS files live there).
func (s *Server) Dir() string { return s.dir }

// Kill SIGKILLs the server and waits until it is gone: no shutdown, clients see their
// connections drop and every key is lost (nothing is persisted).
func (s *Server) Kill() {
	s.t.Helper()
	s.kill()
}

func (s *Server) kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// Restart starts the server again on the same port (killing it first if it still runs) and
// waits until it answers PING. The restarted server is empty.
func (s *Server) Restart() {
	s.t.Helper()
	s.kill()
	// A snapshot RestartWithData left behind would be loaded at start.
	if err := os.Remove(filepath.Join(s.dir, dumpFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.t.Fatalf("redistest: %v", err)
	}
	s.restart()
}

// dumpFile is redis-server's default snapshot name in its --dir.
const dumpFile = "dump.rdb"

// RestartWithData snapshots the data set (SAVE), SIGKILLs the server and starts it again on
// the same port from the snapshot: a crash of a server that persisted every write, so the
// restarted server holds what the killed one held at the SAVE. Not for TLS servers.
func (s *Server) RestartWithData() {
	s.t.Helper()
	if line, err := Command(s.Addr(), s.ping, "SAVE"); err != nil || line != "+OK" {
		s.t.Fatalf("redistest: SAVE before restart: %q %v", line, err)
	}
	s.kill()
	s.restart()
}

func (s *Server) restart() {
	s.t.Helper()
	deadline := time.Now().Add(startTimeout)
	for {
		err := s.start()
		if err == nil {
			return
		}
		// The port of a killed server can take a moment to be free again.
		if time.Now().After(deadline) {
			s.t.Fatalf("redistest: restart on port %d: %v", s.port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *Server) stop() {
	s.kill()
}

// Proxy forwards TCP connections to a target address until the test partitions it. Besides
// partitions and freezes it can cut the open connections (Cut), delay what crosses it
// (SetDelay) and drop connections at random (SetDropRate).
type Proxy struct {
	t      testing.TB
	target string
	l      net.Listener
	wg     sync.WaitGroup

	mu          sync.Mutex
	partitioned bool
	frozen      bool
	thaw        chan struct{} // closed and replaced when a freeze ends
	closed      bool
	conns       map[net.Conn]struct{} // every open connection, either side
	held        map[net.Conn]struct{} // accepted during a partition, not forwarded
	delay       time.Duration         // added before every chunk is forwarded
	dropRate    float64               // chance a new connection or a chunk drops its connection
	rng         *rand.Rand            // draws the drops; seeded by SetDropRate
}

// NewProxy listens on a free 127.0.0.1 port and forwards every connection to target (host:port)
// until the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: proxy listen: %v", err)
	}
	p := &Proxy{t: t, target: target, l: l, thaw: make(chan struct{}), conns: map[net.Conn]struct{}{}, held: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// URL is the proxy's redis:// URL.
func (p *Proxy) URL() string { return "redis://" + p.Addr() }

// Partition cuts the network: when it returns, every connection through the proxy is closed,
// and new ones are accepted but held silent (nothing forwarded, nothing answered) as a black
// hole would, until Heal.
func (p *Proxy) Partition() {
	p.mu.Lock()
	p.partitioned = true
	conns := p.conns
	p.conns = map[net.Conn]struct{}{}
	p.mu.Unlock()
	for c := range conns {
		_ = c.Close()
	}
}

// Freeze is a silent partition: open connections stay open but nothing crosses them any
// more (what was sent is delivered on Heal), and new ones are held as in Partition. Only a
// client that times out on its own notices, as on a network that drops packets without a
// reset.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	p.partitioned = true
	p.frozen = true
	p.mu.Unlock()
}

// Cut resets the network once: every connection through the proxy is closed, as a reset
// would, and new ones are forwarded as before (clients redial at once).
func (p *Proxy) Cut() {
	p.mu.Lock()
	conns := p.conns
	p.conns = map[net.Conn]struct{}{}
	p.mu.Unlock()
	for c := range conns {
		_ = c.Close()
	}
}

// SetDelay makes every chunk of bytes wait d before the proxy forwards it, either way (0
// ends the delay): a slow link. Order is kept.
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = max(d, 0)
	p.mu.Unlock()
}

// SetDropRate makes the link lossy: each new connection is closed at once, and each chunk
// of bytes closes its connection instead of crossing, with probability rate (0 ends it). A
// lost TCP segment cannot vanish from a stream, so a loss the transport gives up on is a
// dropped connection. seed makes the draws repeatable.
func (p *Proxy) SetDropRate(rate float64, seed uint64) {
	p.mu.Lock()
	p.dropRate = min(max(rate, 0), 1)
	p.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	p.mu.Unlock()
}

// dropNow draws whether a connection is dropped now; p.mu is held.
func (p *Proxy) dropNow() bool {
	return p.dropRate > 0 && p.rng != nil && p.rng.Float64() < p.dropRate
}

// Heal ends a partition, a freeze, a delay and a drop rate: connections held during a
// partition are closed (their clients redial), frozen ones carry on, and new ones are
// forwarded again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.partitioned = false
	p.delay, p.dropRate = 0, 0
	if p.frozen {
		p.frozen = false
		close(p.thaw)
		p.thaw = make(chan struct{})
	}
	held := p.held
	p.held = map[net.Conn]struct{}{}
	p.mu.Unlock()
	for c := range held {
		_ = c.Close()
	}
}

// Held is how many connections the current partition holds; a test polls it to know a client
// has reached the black hole.
func (p *Proxy) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.held)
}

func (p *Proxy) close() {
	p.mu.Lock()
	p.closed = true
	if p.frozen {
		p.frozen = false
		close(p.thaw)
	}
	all := []net.Conn{}
	for c := range p.conns {
		all = append(all, c)
	}
	for c := range p.held {
		all = append(all, c)
	}
	p.conns, p.held = map[net.Conn]struct{}{}, map[net.Conn]struct{}{}
	p.mu.Unlock()
	_ = p.l.Close()
	for _, c := range all {
		_ = c.Close()
	}
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		p.mu.Lock()
		switch {
		case p.closed:
			p.mu.Unlock()
			_ = c.Close()
			continue
		case p.partitioned:
			p.held[c] = struct{}{}
			p.mu.Unlock()
			continue
		case p.dropNow():
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go p.forward(c)
	}
}

// forward dials the target for client connection c and copies both ways until either side
// closes or a partition closes them.
func (p *Proxy) forward(c net.Conn) {
	defer p.wg.Done()
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		p.drop(c)
		return
	}
	p.mu.Lock()
	if _, live := p.conns[c]; !live { // partitioned or closed while dialling
		p.mu.Unlock()
		_ = up.Close()
		return
	}
	p.conns[up] = struct{}{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				p.waitThaw()
				if !p.pace() {
					break
				}
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		// Either direction ending ends the pair, as a real connection reset would.
		p.drop(c)
		p.drop(up)
	}
	go pipe(up, c)
	go pipe(c, up)
	wg.Wait()
}

// pace waits out the link's delay and reports whether a chunk may cross (false: the drop
// rate dropped its connection).
func (p *Proxy) pace() bool {
	p.mu.Lock()
	delay, drop := p.delay, p.dropNow()
	p.mu.Unlock()
	if drop {
		return false
	}
	if delay > 0 {
		time.Sleep(delay) // the link's latency, by definition a wait
	}
	return true
}

// waitThaw returns once the proxy is not frozen.
func (p *Proxy) waitThaw() {
	for {
		p.mu.Lock()
		frozen, thaw := p.frozen, p.thaw
		p.mu.Unlock()
		if !frozen {
			return
		}
		<-thaw
	}
}

func (p *Proxy) drop(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}
