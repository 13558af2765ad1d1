package redistest_test

import (
	"bufio"
	"errors"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rolloutkit/rollout/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// roundTrip sends one inline command on a fresh connection and returns the reply line.
func roundTrip(t *testing.T, addr, cmd string) (string, error) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte(cmd + "\r\n")); err != nil {
		return "", err
	}
	return bufio.NewReader(c).ReadString('\n')
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func mustReply(t *testing.T, addr, cmd, want string) {
	t.Helper()
	got, err := roundTrip(t, addr, cmd)
	if err != nil {
		t.Fatalf("%s via %s: %v", cmd, addr, err)
	}
	if got != want+"\r\n" {
		t.Fatalf("%s via %s = %q, want %q", cmd, addr, got, want)
	}
}

func TestServerKillRestart(t *testing.T) {
	s := redistest.Start(t)
	if s.URL() != "redis://"+s.Addr() {
		t.Fatalf("URL %q does not match Addr %q", s.URL(), s.Addr())
	}
	mustReply(t, s.Addr(), "SET k v", "+OK")
	mustReply(t, s.Addr(), "GET k", "$1")

	s.Kill()
	if _, err := roundTrip(t, s.Addr(), "PING"); err == nil {
		t.Fatal("killed server still answers")
	}
	s.Kill() // idempotent

	s.Restart()
	mustReply(t, s.Addr(), "PING", "+PONG")
	mustReply(t, s.Addr(), "GET k", "$-1") // nothing persisted
}

func TestTwoServersAreIndependent(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	if a.Addr() == b.Addr() {
		t.Fatalf("both servers on %s", a.Addr())
	}
	mustReply(t, a.Addr(), "SET k a", "+OK")
	mustReply(t, b.Addr(), "EXISTS k", ":0")
}

func TestProxyPartitionHeal(t *testing.T) {
	s := redistest.Start(t)
	p := redistest.NewProxy(t, s.Addr())
	if p.URL() != "redis://"+p.Addr() {
		t.Fatalf("URL %q does not match Addr %q", p.URL(), p.Addr())
	}
	mustReply(t, p.Addr(), "PING", "+PONG")

	// A connection open across the partition is cut by it.
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := r.ReadString('\n'); err != nil || line != "+PONG\r\n" {
		t.Fatalf("before partition: %q, %v", line, err)
	}

	p.Partition()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = c.Write([]byte("PING\r\n"))
	if line, err := r.ReadString('\n'); err == nil {
		t.Fatalf("connection survived the partition: read %q", line)
	} else if isTimeout(err) {
		t.Fatal("connection left open by the partition (read timed out instead of ending)")
	}

	// A new connection during the partition is held: accepted, never answered, then closed by
	// Heal. The read ends because Heal closes it, not by a timeout.
	held, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if _, err := held.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); p.Held() != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("proxy holds %d connections, want 1", p.Held())
		}
	}
	got := make(chan error, 1)
	go func() {
		_ = held.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, err := bufio.NewReader(held).ReadString('\n')
		got <- err
	}()
	p.Heal()
	if err := <-got; err == nil {
		t.Fatal("held connection was answered")
	} else if isTimeout(err) {
		t.Fatal("held connection not closed by Heal")
	}

	mustReply(t, p.Addr(), "PING", "+PONG")
}

func TestProxyFreeze(t *testing.T) {
	s := redistest.Start(t)
	p := redistest.NewProxy(t, s.Addr())
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	// One round trip first, so the connection is forwarded (not held) when the freeze starts.
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := r.ReadString('\n'); err != nil || line != "+PONG\r\n" {
		t.Fatalf("before freeze: %q, %v", line, err)
	}
	p.Freeze()
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	go func() {
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		line, _ := r.ReadString('\n')
		got <- line
	}()
	// New connections are held while frozen.
	held, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	for deadline := time.Now().Add(10 * time.Second); p.Held() != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("proxy holds %d connections, want 1", p.Held())
		}
	}
	p.Heal()
	// The frozen connection carries what was sent once healed.
	if line := <-got; line != "+PONG\r\n" {
		t.Fatalf("frozen connection after heal read %q", line)
	}
	mustReply(t, p.Addr(), "PING", "+PONG")
}

func TestTLSServer(t *testing.T) {
	s := redistest.StartWith(t, redistest.Options{TLS: true})
	require := func(ok bool, format string, a ...any) {
		t.Helper()
		if !ok {
			t.Fatalf(format, a...)
		}
	}
	require(s.URL() == "rediss://"+s.Addr(), "URL %q", s.URL())
	line, err := redistest.Command(s.Addr(), s.TLS().ClientConfig(t), "PING")
	require(err == nil && line == "+PONG", "PING over TLS: %q, %v", line, err)
	// Plain text gets no answer: the server hangs up.
	line, err = redistest.Command(s.Addr(), nil, "PING")
	require(err != nil, "plain PING to the TLS port answered %q", line)
	// Another CA's client does not get through.
	other := redistest.GenerateTLS(t, t.TempDir())
	_, err = redistest.Command(s.Addr(), other.ClientConfig(t), "PING")
	require(err != nil, "a client trusting another CA got through")
}

func TestServerRestartWithData(t *testing.T) {
	s := redistest.Start(t)
	mustReply(t, s.Addr(), "SET k v", "+OK")
	s.RestartWithData()
	mustReply(t, s.Addr(), "GET k", "$1") // the snapshot came back
	s.Restart()
	mustReply(t, s.Addr(), "GET k", "$-1") // an empty restart does not load the old snapshot
}

func TestProxyCutDelayDrop(t *testing.T) {
	s := redistest.Start(t)
	p := redistest.NewProxy(t, s.Addr())

	// Cut closes an open connection; a new one is forwarded at once.
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := r.ReadString('\n'); err != nil || line != "+PONG\r\n" {
		t.Fatalf("before cut: %q, %v", line, err)
	}
	p.Cut()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = c.Write([]byte("PING\r\n"))
	if line, err := r.ReadString('\n'); err == nil {
		t.Fatalf("connection survived the cut: read %q", line)
	} else if isTimeout(err) {
		t.Fatal("connection left open by the cut")
	}
	mustReply(t, p.Addr(), "PING", "+PONG")

	// A delay holds each chunk back, both ways.
	p.SetDelay(100 * time.Millisecond)
	began := time.Now()
	mustReply(t, p.Addr(), "PING", "+PONG")
	if took := time.Since(began); took < 200*time.Millisecond {
		t.Fatalf("a round trip through a 100ms link took %s", took)
	}
	p.SetDelay(0)

	// A drop rate of 1 drops every new connection; Heal ends it.
	p.SetDropRate(1, 7)
	if _, err := roundTrip(t, p.Addr(), "PING"); err == nil {
		t.Fatal("a connection crossed a link that drops everything")
	} else if isTimeout(err) {
		t.Fatal("a dropped connection was held open, not closed")
	}
	p.Heal()
	mustReply(t, p.Addr(), "PING", "+PONG")
}
