package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/protocol"
	"github.com/rolloutkit/rollout/server/agent"
)

// SimConfig configures Simulate.
type SimConfig struct {
	Net NetModel
	// FanOut and OriginFanOut shape the distribution tree (sdk.Plan's; 0: the defaults,
	// FanOut < 0: no peers).
	FanOut, OriginFanOut int
	// Rounds is how many control round trips are timed.
	Rounds int
}

// SimResult is one fleet size's figures. Stage and egress figures come from NetModel (virtual
// time, deterministic); ControlRTT is measured (real time on the in-process bus); Ops counts
// the bus operations the SDK and the agents' cores actually issued during one UpdateWeights.
type SimResult struct {
	Servers    int     `json:"servers"`
	ControlRTT Latency `json:"control_rtt"`
	// EgressCheckpoints is the origin's bytes for one update over the checkpoint size.
	EgressCheckpoints float64 `json:"egress_checkpoints"`
	// StageSingle is one server alone; StageFleet the whole fleet staged; StageBound the goal
	// (2x single plus one hop per level); Depth the tree's levels.
	StageSingle time.Duration `json:"stage_single"`
	StageFleet  time.Duration `json:"stage_fleet"`
	StageBound  time.Duration `json:"stage_bound"`
	Depth       int           `json:"depth"`
	// Bubble is the largest commit bubble the SDK reported.
	Bubble  time.Duration `json:"bubble"`
	Outcome sdk.Outcome   `json:"outcome"`
	// UpdateOps are the bus operations of one UpdateWeights, by kind.
	UpdateOps map[string]int64 `json:"update_ops"`
}

// Simulate runs one UpdateWeights over n simulated servers: each is a real agent.Core (the
// state machine every rollout server runs) on the in-process bus, executing its work on a
// simulated engine and network (NetModel), driven by a real sdk.Client; the SDK's transaction
// logic, signing, acks and the distribution tree are the production code.
func Simulate(ctx context.Context, cfg SimConfig, n int) (SimResult, error) {
	res := SimResult{Servers: n}
	mem := bus.NewMem(bus.MemOptions{})
	defer mem.Close()
	cb := &countingBus{Bus: mem}
	fleet := "sim"
	var wg sync.WaitGroup
	sctx, stop := context.WithCancel(ctx)
	defer func() { stop(); wg.Wait() }()
	model := &simModel{net: cfg.Net, plans: map[string]*StagePlan{}}
	ids := make([]string, n)
	for i := range n {
		ids[i] = "sim-" + strconv.Itoa(i)
		s, err := startSimServer(sctx, cb, fleet, ids[i], model)
		if err != nil {
			return res, err
		}
		wg.Add(1)
		go func() { defer wg.Done(); s.run(sctx) }()
	}
	c, err := sdk.Dial(ctx, sdk.Options{Bus: cb, Fleet: fleet, Secret: fleetSecret, Logger: quiet, RefreshInterval: time.Hour})
	if err != nil {
		return res, err
	}
	defer c.Close()
	lat := make([]time.Duration, 0, cfg.Rounds)
	for range cfg.Rounds {
		t0 := time.Now()
		// No explicit targets: the command is small, as a fleet-wide call's is.
		if _, err := c.Resume(ctx, sdk.ResumeOptions{}); err != nil {
			return res, fmt.Errorf("control round trip: %w", err)
		}
		lat = append(lat, time.Since(t0))
	}
	res.ControlRTT = Summarize(lat)
	cb.reset()
	ref := sdk.WeightsRef{Version: 1, URI: "http://origin/v1/", SHA256: fmt.Sprintf("%064x", 1)}
	ur, err := c.UpdateWeights(ctx, ref, sdk.Plan{PeerFanOut: cfg.FanOut, OriginFanOut: cfg.OriginFanOut, Targets: ids})
	if err != nil {
		return res, fmt.Errorf("update weights: %w", err)
	}
	res.UpdateOps = cb.snapshot()
	res.Outcome = ur.Outcome
	res.Bubble = ur.MaxBubble
	res.EgressCheckpoints = float64(ur.OriginBytes) / float64(cfg.Net.CheckpointBytes)
	model.mu.Lock()
	for _, p := range model.plans {
		for _, t := range p.Staged {
			res.StageFleet = max(res.StageFleet, t)
		}
		res.Depth = p.Depth
	}
	model.mu.Unlock()
	res.StageSingle = cfg.Net.Single()
	res.StageBound = cfg.Net.Bound(res.Depth)
	return res, nil
}

// simModel evaluates the network model once per stage command (every server of the command
// reads its own time from the same plan).
type simModel struct {
	net   NetModel
	mu    sync.Mutex
	plans map[string]*StagePlan // by command id
}

func (m *simModel) plan(cmdID string, targets []string, tree map[string]string) *StagePlan {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p, ok := m.plans[cmdID]; ok {
		return p
	}
	full := make(map[string]string, len(targets))
	for _, id := range targets {
		full[id] = tree[id] // absent: the origin
	}
	p := m.net.Stage(order(targets, full), full)
	m.plans[cmdID] = &p
	return &p
}

// order lists targets so that every source comes before its children (the tree was built
// breadth first over targets, but a holder-less relay may be listed after its child when the
// caller's order differs).
func order(targets []string, tree map[string]string) []string {
	out := make([]string, 0, len(targets))
	placed := make(map[string]bool, len(targets))
	var place func(id string, depth int)
	place = func(id string, depth int) {
		if placed[id] || depth > len(targets) {
			return
		}
		if src, ok := tree[id]; ok && src != "" {
			place(src, depth+1)
		}
		if _, ok := tree[id]; ok {
			placed[id] = true
			out = append(out, id)
		}
	}
	for _, id := range targets {
		place(id, 0)
	}
	return out
}

// simServer is one simulated server: a real agent core, its I/O done inline.
type simServer struct {
	b     bus.Bus
	names protocol.Names
	id    string
	core  *agent.Core
	sub   bus.Subscription
	st    agent.EngineState
	model *simModel
	auth  *protocol.Auth // derived once: signing must not derive the keys per ack
}

func startSimServer(ctx context.Context, b bus.Bus, fleet, id string, m *simModel) (*simServer, error) {
	s := &simServer{b: b, names: protocol.Names{Fleet: fleet}, id: id, model: m, st: agent.EngineState{State: protocol.StateRunning},
		auth: protocol.SecretAuth(fleetSecret)}
	s.core = agent.NewCore(agent.CoreConfig{Fleet: fleet, ServerID: id, AdvertiseURL: "http://" + id, PeerURL: "http://" + id + "/weights",
		Secret: fleetSecret, Auth: s.auth, Start: time.Now()})
	s.core.Engine(s.st)
	sub, err := b.Subscribe(ctx, s.names.Control())
	if err != nil {
		return nil, err
	}
	s.sub = sub
	raw, err := b.Get(ctx, s.names.Desired())
	if err != nil && !errors.Is(err, bus.ErrNotFound) {
		return nil, err
	}
	if err := s.core.Desired(raw, err == nil, time.Now()); err != nil {
		return nil, err
	}
	s.core.Converge(time.Now())
	s.drain(ctx)
	return s, s.heartbeat(ctx)
}

func (s *simServer) heartbeat(ctx context.Context) error {
	hb := s.core.Heartbeat(time.Now())
	raw, err := hb.Encode()
	if err != nil {
		return err
	}
	return s.b.Set(ctx, s.names.Heartbeat(s.id), raw, time.Hour)
}

func (s *simServer) run(ctx context.Context) {
	defer s.sub.Close()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-s.sub.Events():
			if !ok {
				return
			}
			if ev.Kind == bus.EventMessage {
				s.core.Envelope(ev.Payload, time.Now())
				s.drain(ctx)
			}
		}
	}
}

// drain carries out the core's Ready until it has nothing left: acks pushed, work executed on
// the simulated engine at once (its durations are virtual, reported in the phases).
func (s *simServer) drain(ctx context.Context) {
	for {
		r := s.core.Ready()
		if r.Resync {
			raw, err := s.b.Get(ctx, s.names.Desired())
			_ = s.core.Desired(raw, err == nil, time.Now())
			s.core.Resynced(time.Now()) // what it hands out comes with the next Ready
		}
		for _, a := range r.Acks {
			a.SignWith(s.auth, s.names.Fleet)
			if raw, err := a.Encode(); err == nil {
				_ = s.b.Push(ctx, s.names.Acks(a.CommandID), raw, time.Minute)
			}
		}
		if r.Work == nil && r.Fetch == nil && !r.Resync {
			if len(r.Acks) > 0 {
				_ = s.heartbeat(ctx) // as the agent does after work
			}
			return
		}
		for _, w := range []*agent.Work{r.Work, r.Fetch} {
			if w != nil {
				res := s.execute(w)
				s.core.Done(w, res, s.st, time.Now())
			}
		}
	}
}

func phase(name string, d time.Duration, detail map[string]int64) protocol.Phase {
	return protocol.Phase{Name: name, OK: true, Seconds: d.Seconds(), Detail: detail}
}

func (s *simServer) execute(w *agent.Work) agent.Result {
	e := s.model.net.Engine
	var res agent.Result
	switch c := w.Command.(type) {
	case protocol.Stage:
		p := s.model.plan(w.Envelope.ID, w.Envelope.Targets, c.Sources)
		bytes := s.model.net.CheckpointBytes
		detail := map[string]int64{"version": c.Weights.Version, "bytes": bytes, "origin_bytes": bytes}
		if c.Sources[s.id] != "" {
			detail = map[string]int64{"version": c.Weights.Version, "bytes": bytes, "peer_bytes": bytes}
		}
		res.Phases = []protocol.Phase{phase("stage", p.Staged[s.id], detail)}
		s.st.StagedVersion, s.st.StagedSHA256 = c.Weights.Version, c.Weights.SHA256
	case protocol.Commit:
		res.Phases = []protocol.Phase{phase("pause", e.Pause, nil)}
		if c.SleepLevel > 0 {
			res.Phases = append(res.Phases, phase("sleep", e.Sleep, nil))
		}
		res.Phases = append(res.Phases, phase("commit", e.Swap, map[string]int64{"version": c.Version}))
		if c.SleepLevel > 0 {
			res.Phases = append(res.Phases, phase("wake", e.Wake, nil))
		}
		res.Phases = append(res.Phases, phase("resume", e.Resume, nil))
		if s.st.StagedVersion == c.Version {
			s.st.WeightVersion, s.st.StagedVersion, res.Committed = c.Version, 0, c.Version
			s.st.WeightSHA256, s.st.StagedSHA256 = s.st.StagedSHA256, ""
		}
	case protocol.Resume:
		res.Phases = []protocol.Phase{phase("resume", 0, nil)}
	default:
		// Convergence and the other commands have nothing to simulate.
	}
	res.WeightVersion, res.StagedVersion = s.st.WeightVersion, s.st.StagedVersion
	return res
}

// countingBus counts the operations that reach the bus, by kind; a Publish also counts its
// deliveries (one per subscriber), a Scan the keys it returns.
type countingBus struct {
	bus.Bus
	mu  sync.Mutex
	ops map[string]int64
	on  atomic.Bool
}

func (b *countingBus) add(kind string, n int64) {
	if !b.on.Load() {
		return
	}
	b.mu.Lock()
	b.ops[kind] += n
	b.mu.Unlock()
}

func (b *countingBus) reset() {
	b.mu.Lock()
	b.ops = map[string]int64{}
	b.mu.Unlock()
	b.on.Store(true)
}

func (b *countingBus) snapshot() map[string]int64 {
	b.on.Store(false)
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]int64, len(b.ops))
	for k, v := range b.ops {
		out[k] = v
	}
	return out
}

func (b *countingBus) Publish(ctx context.Context, ch string, msg []byte) (int, error) {
	n, err := b.Bus.Publish(ctx, ch, msg)
	b.add("publish", 1)
	b.add("delivery", int64(n))
	return n, err
}

func (b *countingBus) Set(ctx context.Context, key string, val []byte, ttl time.Duration) error {
	b.add("set", 1)
	return b.Bus.Set(ctx, key, val, ttl)
}

func (b *countingBus) Get(ctx context.Context, key string) ([]byte, error) {
	b.add("get", 1)
	return b.Bus.Get(ctx, key)
}

func (b *countingBus) Scan(ctx context.Context, prefix string) (map[string][]byte, error) {
	kv, err := b.Bus.Scan(ctx, prefix)
	b.add("scan", 1)
	b.add("scan_keys", int64(len(kv)))
	return kv, err
}

func (b *countingBus) CompareAndSwap(ctx context.Context, key string, old, val []byte) (bool, error) {
	b.add("cas", 1)
	return b.Bus.CompareAndSwap(ctx, key, old, val)
}

func (b *countingBus) Push(ctx context.Context, list string, val []byte, ttl time.Duration) error {
	b.add("push", 1)
	return b.Bus.Push(ctx, list, val, ttl)
}

func (b *countingBus) Pop(ctx context.Context, list string, limit int, wait time.Duration) ([][]byte, error) {
	v, err := b.Bus.Pop(ctx, list, limit, wait)
	b.add("pop", 1)
	return v, err
}

func (b *countingBus) Delete(ctx context.Context, keys ...string) error {
	b.add("delete", 1)
	return b.Bus.Delete(ctx, keys...)
}

// SimReport is `rollout bench fleet --simulate`'s output: the model, then per fleet size the
// simulation's figures and the control plane's load.
type SimReport struct {
	Model        NetModel      `json:"model"`
	FanOut       int           `json:"fan_out"`
	OriginFanOut int           `json:"origin_fan_out"`
	UpdateEvery  time.Duration `json:"update_every"`
	// RedisGETPerSec is redis-benchmark's GET rate on the Redis the load was replayed on.
	RedisGETPerSec float64       `json:"redis_get_per_sec"`
	RedisNote      string        `json:"redis_note"`
	Rows           []SimResult   `json:"rows"`
	Load           []ControlLoad `json:"load"`
}
