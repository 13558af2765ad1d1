package redistest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// MasterName is the master set a Sentinel setup from StartSentinel monitors.
const MasterName = "rollout"

// Sentinels is a primary, its replicas and the sentinels that watch them, all owned by one
// test.
type Sentinels struct {
	t         testing.TB
	dataPass  string    // --requirepass of the data servers
	sentPass  string    // --requirepass of the sentinels
	Servers   []*Server // Servers[0] is the first primary; the others start as its replicas
	Sentinels []*Server
}

// StartSentinel starts a primary, replicas replicas of it and n sentinels monitoring it
// (quorum n/2+1), and returns once every replica is in sync and every sentinel knows every
// replica, so a failover can pick one. args go to every data server (e.g. a password:
// "--requirepass", "pw", "--masterauth", "pw"); sentinelArgs to every sentinel.
func StartSentinel(t testing.TB, replicas, n int, args, sentinelArgs []string) *Sentinels {
	t.Helper()
	ss := &Sentinels{t: t}
	primary := StartWith(t, Options{Args: args})
	ss.Servers = append(ss.Servers, primary)
	for range replicas {
		r := StartWith(t, Options{Args: append([]string{"--replicaof", "127.0.0.1", strconv.Itoa(primary.port)}, args...)})
		ss.Servers = append(ss.Servers, r)
	}
	auth := argValue(args, "--masterauth")
	ss.dataPass, ss.sentPass = argValue(args, "--requirepass"), argValue(sentinelArgs, "--requirepass")
	for range n {
		s := StartWith(t, Options{Args: sentinelArgs, conf: func(port int) string {
			return ss.writeConf(t, primary, port, n/2+1, auth)
		}, extra: func(int) []string { return []string{"--sentinel"} }})
		ss.Sentinels = append(ss.Sentinels, s)
	}
	ss.waitReplicas(primary.Addr(), replicas)
	return ss
}

// writeConf writes a sentinel's config file (sentinels rewrite theirs, so each needs one).
func (ss *Sentinels) writeConf(t testing.TB, primary *Server, port, quorum int, auth string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "sentinel monitor %s 127.0.0.1 %d %d\n", MasterName, primary.port, quorum)
	fmt.Fprintf(&b, "sentinel down-after-milliseconds %s 1000\n", MasterName)
	fmt.Fprintf(&b, "sentinel failover-timeout %s 10000\n", MasterName)
	if auth != "" {
		fmt.Fprintf(&b, "sentinel auth-pass %s %s\n", MasterName, auth)
	}
	// Known from the start, so a sentinel need not wait for the primary's next INFO (every
	// 10 s) to learn of them.
	for _, r := range ss.Servers[1:] {
		fmt.Fprintf(&b, "sentinel known-replica %s 127.0.0.1 %d\n", MasterName, r.port)
	}
	path := filepath.Join(t.TempDir(), "sentinel-"+strconv.Itoa(port)+".conf")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return path
}

// waitReplicas waits until every sentinel reports primary as the master with want replicas
// in sync.
func (ss *Sentinels) waitReplicas(primary string, want int) {
	ss.t.Helper()
	ss.waitFor(fmt.Sprintf("sentinels to see %s with %d replicas in sync", primary, want), func() bool {
		for _, s := range ss.Sentinels {
			if got := ss.masterAddr(s); got != primary {
				return false
			}
			reps := ss.replicas(s)
			if reps < want {
				return false
			}
		}
		for _, r := range ss.Servers {
			if r.Addr() == primary {
				continue
			}
			if !strings.Contains(info(r.Addr(), ss.dataPass, "replication"), "master_link_status:up") {
				return false
			}
		}
		return true
	})
}

// URL is the redis+sentinel:// URL of the set (the sentinels' addresses, then the master).
func (ss *Sentinels) URL() string {
	addrs := make([]string, len(ss.Sentinels))
	for i, s := range ss.Sentinels {
		addrs[i] = s.Addr()
	}
	return "redis+sentinel://" + strings.Join(addrs, ",") + "/" + MasterName
}

// Primary is the address the first sentinel reports for the master.
func (ss *Sentinels) Primary() string { return ss.masterAddr(ss.Sentinels[0]) }

// Failover forces a failover (SENTINEL FAILOVER) and returns the new primary's address once
// every sentinel reports it and it answers as a master.
func (ss *Sentinels) Failover() string {
	ss.t.Helper()
	old := ss.Primary()
	ss.waitFor("SENTINEL FAILOVER to be accepted", func() bool {
		reply, err := command(ss.Sentinels[0].Addr(), ss.sentPass, "SENTINEL FAILOVER "+MasterName)
		// -NOGOODSLAVE: the sentinel has not judged a replica fit yet; try again.
		return err == nil && len(reply) == 1 && reply[0] == "OK"
	})
	var now string
	ss.waitFor("every sentinel to report the new primary", func() bool {
		now = ss.masterAddr(ss.Sentinels[0])
		if now == "" || now == old {
			return false
		}
		for _, s := range ss.Sentinels[1:] {
			if ss.masterAddr(s) != now {
				return false
			}
		}
		return strings.Contains(info(now, ss.dataPass, "replication"), "role:master")
	})
	return now
}

// masterAddr asks sentinel s where the master is ("" on any error).
func (ss *Sentinels) masterAddr(s *Server) string {
	reply, err := command(s.Addr(), ss.sentPass, "SENTINEL GET-MASTER-ADDR-BY-NAME "+MasterName)
	if err != nil || len(reply) != 2 {
		return ""
	}
	return net.JoinHostPort(reply[0], reply[1])
}

// replicas is how many replicas sentinel s knows of the master (-1 on any error).
func (ss *Sentinels) replicas(s *Server) int {
	c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	if err != nil {
		return -1
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	r := bufio.NewReader(c)
	if ss.sentPass != "" {
		if _, err := roundTrip(c, r, "AUTH "+ss.sentPass); err != nil {
			return -1
		}
	}
	// An array of per-replica arrays: only its length matters.
	if _, err := c.Write([]byte("SENTINEL REPLICAS " + MasterName + "\r\n")); err != nil {
		return -1
	}
	line, err := readLine(r)
	if err != nil || !strings.HasPrefix(line, "*") {
		return -1
	}
	n, err := strconv.Atoi(line[1:])
	if err != nil {
		return -1
	}
	return n
}

// argValue is the value following flag in args ("" when absent).
func argValue(args []string, flag string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == flag {
			return args[i+1]
		}
	}
	return ""
}

// waitFor polls cond (readiness only, never a result) until it holds or startTimeout passes.
func (ss *Sentinels) waitFor(what string, cond func() bool) {
	ss.t.Helper()
	waitFor(ss.t, what, 3*startTimeout, cond)
}

func waitFor(t testing.TB, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("redistest: gave up waiting for %s after %s", what, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// info returns the INFO section of the server at addr ("" on any error).
func info(addr, password, section string) string { return infoCmd(addr, password, "INFO "+section) }

// infoCmd runs a command answering one bulk string at addr ("" on any error).
func infoCmd(addr, password, cmd string) string {
	reply, err := command(addr, password, cmd)
	if err != nil || len(reply) != 1 {
		return ""
	}
	return reply[0]
}

// command runs one inline command on a fresh connection to addr, after AUTH when password is
// set, and returns its reply (see roundTrip).
func command(addr, password, cmd string) ([]string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	r := bufio.NewReader(c)
	if password != "" {
		if _, err := roundTrip(c, r, "AUTH "+password); err != nil {
			return nil, err
		}
	}
	return roundTrip(c, r, cmd)
}
