package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/protocol"
	"github.com/rolloutkit/rollout/server/agent"
)

// ControlLoad is the control plane's load at one fleet size: what n agents and one SDK client
// send the bus per second in steady state (each agent heartbeats and rereads the desired state
// once per agent.DefaultHeartbeatInterval; the client rereads every heartbeat once per
// sdk.DefaultRefreshInterval), plus one UpdateWeights (its operations as counted by Simulate)
// every UpdateEvery.
type ControlLoad struct {
	Servers          int     `json:"servers"`
	HeartbeatsPerSec float64 `json:"heartbeats_per_sec"`
	DesiredReadsPS   float64 `json:"desired_reads_per_sec"`
	AcksPerSec       float64 `json:"acks_per_sec"`
	// HeartbeatReadsPS counts the heartbeats the client reads (one Scan returns n).
	HeartbeatReadsPS float64 `json:"heartbeat_reads_per_sec"`
	// KeyOpsPerSec is every key touched per second (a Scan or an MGET of n keys counts n, a
	// publish one per subscriber it reaches).
	KeyOpsPerSec float64 `json:"key_ops_per_sec"`
	// RedisCPU is the fraction of one core redis-server spent serving this traffic, replayed
	// against it (0 when no redis-server ran); CapacityShare is KeyOpsPerSec over the
	// redis-benchmark GET rate of the same server.
	RedisCPU      float64 `json:"redis_cpu"`
	CapacityShare float64 `json:"capacity_share"`
}

// Load computes the steady and per-update rates of n servers from one update's counted ops.
func Load(n int, update map[string]int64, every time.Duration) ControlLoad {
	hb := float64(n) / agent.DefaultHeartbeatInterval.Seconds()
	refresh := 1 / sdk.DefaultRefreshInterval.Seconds()
	per := 1 / every.Seconds()
	l := ControlLoad{Servers: n, HeartbeatsPerSec: hb + float64(update["set"])*per, DesiredReadsPS: hb + refresh,
		AcksPerSec: float64(update["push"]) * per, HeartbeatReadsPS: refresh * float64(n)}
	var upd int64
	for k, v := range update {
		if k != "scan" && k != "publish" { // scan_keys and delivery stand for them
			upd += v
		}
	}
	l.KeyOpsPerSec = 2*hb + refresh*(1+float64(n)) + float64(upd)*per
	return l
}

// RedisBenchmarkGET runs redis-benchmark (when on PATH) against url's server and returns its
// GET requests per second, pipelined 16 deep so that the server's one core, not the client's
// round trips, is the limit: one core's capacity for the commands the control plane issues.
func RedisBenchmarkGET(ctx context.Context, url string) (float64, error) {
	bin, err := exec.LookPath("redis-benchmark")
	if err != nil {
		return 0, errors.New("bench: redis-benchmark is not on PATH")
	}
	hostport := strings.TrimPrefix(url, "redis://")
	host, port, _ := strings.Cut(hostport, ":")
	out, err := exec.CommandContext(ctx, bin, "-h", host, "-p", port, "-q", "-t", "get", "-n", "400000", "-c", "16", "-P", "16").Output()
	if err != nil {
		return 0, fmt.Errorf("bench: redis-benchmark: %w", err)
	}
	m := regexp.MustCompile(`GET: ([0-9.]+) requests per second`).FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("bench: redis-benchmark printed %q", bytes.TrimSpace(out))
	}
	return strconv.ParseFloat(string(m[1]), 64)
}

// ReplayLoad replays secs seconds of l's traffic (steady state plus the update's ops at its
// rate) against the Redis at url through the production bus client, and returns the share of
// one core redis-server (process pid) spent on it. Heartbeats and acks carry payloads of the
// real size; a publish's deliveries are replayed as one GET each (a reply written to one
// connection).
func ReplayLoad(ctx context.Context, url string, pid int, l ControlLoad, update map[string]int64, every time.Duration, secs int) (float64, error) {
	b, err := bus.DialRedis(ctx, url, bus.RedisOptions{PoolSize: 32})
	if err != nil {
		return 0, err
	}
	defer b.Close()
	names := protocol.Names{Fleet: "load"}
	hb := protocol.Heartbeat{V: protocol.Version, Fleet: "load", State: protocol.StateRunning, WeightVersion: 41, InRotation: true,
		Running: 12, Waiting: 3, KVUsage: 0.61, AdvertiseURL: "http://10.0.12.34:8000", PeerURL: "http://10.0.12.34:8000/weights",
		Holds: []int64{41}, Build: "v1.0.0", At: time.Now().UnixMilli()}
	hb.Sign(fleetSecret)
	hbRaw, _ := hb.Encode()
	ack := protocol.Ack{V: protocol.Version, CommandID: protocol.NewID(), Kind: protocol.KindStage, Result: protocol.ResultOK,
		Phases: []protocol.Phase{{Name: "stage", OK: true, Seconds: 5.1, Detail: map[string]int64{"bytes": 16e9, "peer_bytes": 16e9}}}, WeightVersion: 41, At: time.Now().UnixMilli()}
	ackRaw, _ := ack.Encode()
	if err := b.Set(ctx, names.Desired(), hbRaw, 0); err != nil {
		return 0, err
	}
	n := l.Servers
	for i := range n {
		if err := b.Set(ctx, names.Heartbeat(strconv.Itoa(i)), hbRaw, time.Minute); err != nil {
			return 0, err
		}
	}
	refreshes := int(float64(secs) / sdk.DefaultRefreshInterval.Seconds())
	updates := float64(secs) / every.Seconds()
	scaled := func(k string) int { return int(float64(update[k]) * updates) }
	// The work: one job per op, spread over 32 workers.
	type job func(context.Context) error
	jobs := make(chan job, 1024)
	var firstErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				if err := j(ctx); err != nil {
					mu.Lock()
					firstErr = firstOf(firstErr, err)
					mu.Unlock()
				}
			}
		}()
	}
	before, err := cpuTicks(pid)
	if err != nil {
		close(jobs)
		wg.Wait()
		return 0, err
	}
	beats := int(float64(n)*float64(secs)/agent.DefaultHeartbeatInterval.Seconds()) + scaled("set")
	for i := range beats {
		key := names.Heartbeat(strconv.Itoa(i % n))
		jobs <- func(ctx context.Context) error { return b.Set(ctx, key, hbRaw, 5*time.Second) }
	}
	gets := int(float64(n)*float64(secs)/agent.DefaultHeartbeatInterval.Seconds()) + refreshes + scaled("get") + scaled("delivery")
	for range gets {
		jobs <- func(ctx context.Context) error { _, err := b.Get(ctx, names.Desired()); return err }
	}
	for range refreshes {
		jobs <- func(ctx context.Context) error { _, err := b.Scan(ctx, names.HeartbeatPrefix()); return err }
	}
	for i := range scaled("push") {
		list := names.Acks(strconv.Itoa(i % 64))
		jobs <- func(ctx context.Context) error { return b.Push(ctx, list, ackRaw, time.Minute) }
	}
	for i := range scaled("pop") {
		list := names.Acks(strconv.Itoa(i % 64))
		jobs <- func(ctx context.Context) error { _, err := b.Pop(ctx, list, 64, 0); return err }
	}
	for range scaled("cas") + scaled("delete") {
		jobs <- func(ctx context.Context) error { return b.Set(ctx, names.Desired(), hbRaw, 0) }
	}
	for range scaled("publish") {
		jobs <- func(ctx context.Context) error { _, err := b.Publish(ctx, names.Control(), ackRaw); return err }
	}
	close(jobs)
	wg.Wait()
	after, err := cpuTicks(pid)
	if err != nil {
		return 0, err
	}
	if firstErr != nil {
		return 0, firstErr
	}
	return float64(after-before) / clockTicks / float64(secs), nil
}

func firstOf(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// clockTicks is Linux's USER_HZ, the unit of /proc/PID/stat's CPU times.
const clockTicks = 100

// cpuTicks is the user + system CPU time of process pid in clock ticks.
func cpuTicks(pid int) (int64, error) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("bench: redis-server CPU time: %w", err)
	}
	// Fields after the command name (which may hold spaces) start after the last ')'.
	i := bytes.LastIndexByte(raw, ')')
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 13 {
		return 0, errors.New("bench: short /proc stat")
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, errors.New("bench: unreadable /proc stat")
	}
	return u + s, nil
}

// PID is the redis-server's process id.
func (s *RedisServer) PID() int { return s.cmd.Process.Pid }
