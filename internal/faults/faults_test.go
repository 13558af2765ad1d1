package faults

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/weights"
	"github.com/rolloutkit/rollout/internal/fleettest"
	"github.com/rolloutkit/rollout/internal/redistest"
	"github.com/rolloutkit/rollout/sdk"
	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/bus/redisconf"
	"github.com/rolloutkit/rollout/sdk/protocol"
	"github.com/rolloutkit/rollout/weightstore"
)

// Knobs of a run.
const (
	fleetName     = "faults"
	servers       = 3
	loadWorkers   = 2
	finalRequests = 6
	// ConvergeBound is how long every server has, after the heal, to heartbeat in rotation
	// on the final desired version.
	convergeBound = 30 * time.Second
	monitorEvery  = 200 * time.Millisecond
	opTimeout     = 45 * time.Second
	// raceTrigger bounds how long a two-trainers-redis-loss fault waits for its commit point:
	// both racers stage first, each from its own origin, so it comes later than a
	// kill-mid-commit's (TriggerTimeout missed half of them in a first run).
	raceTrigger  = 3 * TriggerTimeout
	requestBound = 40 * time.Second
	// routingRefresh is the SDK's default RefreshInterval.
	routingRefresh = 500 * time.Millisecond
	// thinkTime separates a load worker's requests (the tiny model answers in a few ms; the
	// history stays a readable size).
	thinkTime = 20 * time.Millisecond
	// sessionTurns and sessionTurnTokens shape the session worker's episodes.
	sessionTurns      = 6
	sessionTurnTokens = 8
)

// serverArgs give every server a KV offloading connector, so its safety violation counter
// exists, and a pool small enough for the tiny model.
var serverArgs = []string{"--offload-cpu-bytes", "64MiB", "--kv-blocks", "512"}

// sendFloor sends each request's floor as its MinVersion (ROLLOUT_FAULTS_MIN_VERSION=1). By
// default requests carry none, as a trainer's rollout workers' would: the harness checks the
// fleet's own guarantee that a request sent after a commit gets no older token.
var sendFloor = os.Getenv("ROLLOUT_FAULTS_MIN_VERSION") == "1"

// storm, from ROLLOUT_FAULTS_STORM (a duration), runs the schedule's first stretch of that
// length at once, at the start: a fault storm (Redis restarted empty several times within
// milliseconds, servers cut, stopped and killed, two trainers updating), then the rest of
// the schedule at its offsets. A CI machine that took long to build the servers once ran
// its first 40 s so, and found a version under two digests.
var storm = func() time.Duration {
	d, err := time.ParseDuration(os.Getenv("ROLLOUT_FAULTS_STORM"))
	if err != nil || d < 0 {
		return 0
	}
	return d
}()

// TestFaults runs the fault harness (see the package doc): ROLLOUT_FAULTS=n injects n faults,
// ROLLOUT_FAULTS_SEED=s replays seed s, ROLLOUT_FAULTS_HISTORY=path keeps the history.
func TestFaults(t *testing.T) {
	n, err := strconv.Atoi(os.Getenv("ROLLOUT_FAULTS"))
	if err != nil || n <= 0 {
		t.Skip("set ROLLOUT_FAULTS=n (faults to inject) to run the fault harness; make faults-ci, make faults")
	}
	seed := rand.Uint64() //nolint:gosec // a seed to print and replay, not a secret
	if s := os.Getenv("ROLLOUT_FAULTS_SEED"); s != "" {
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("ROLLOUT_FAULTS_SEED=%q: %v", s, err)
		}
	}
	say(t, "faults: seed %d, %d faults (replay: ROLLOUT_FAULTS=%d ROLLOUT_FAULTS_SEED=%d)", seed, n, n, seed)
	began := time.Now()
	var summary string
	// Registered first, so it runs last: after the servers' output a failure writes.
	t.Cleanup(func() {
		if summary != "" && t.Failed() {
			fmt.Println(summary)
		}
	})
	h := newHarness(t, NewSchedule(seed, n, servers))
	h.run()
	hist := h.rec.History()
	rep := Check(&hist)
	path := os.Getenv("ROLLOUT_FAULTS_HISTORY")
	if path == "" {
		path = filepath.Join(os.TempDir(), fmt.Sprintf("rollout-faults-%d.json", seed))
	}
	if err := writeHistory(path, &hist); err != nil {
		t.Errorf("%v", err)
	}
	summary = fmt.Sprintf("%sduration: %s; history: %s", rep, time.Since(began).Round(time.Second), path)
	say(t, "%s", summary)
	if !rep.OK() {
		t.Errorf("%d violations; replay with ROLLOUT_FAULTS=%d ROLLOUT_FAULTS_SEED=%d", len(rep.Violations), n, seed)
	}
}

// say logs and prints: the report must show without -v too.
func say(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	t.Log(msg)
	fmt.Println(msg)
}

func writeHistory(path string, h *History) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("faults: %w", err)
	}
	if err := h.WriteJSON(f); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("faults: %w", err)
	}
	return nil
}

// harness is one fault run.
type harness struct {
	t       *testing.T
	sched   Schedule
	rec     *Recorder
	digests *Digests
	start   time.Time

	redis    *redistest.Server
	proxies  []*redistest.Proxy
	fleet    *fleettest.Fleet
	bus      bus.Bus // the harness's own view of Redis: heartbeats, desired state
	scrape   *http.Client
	trainers map[string]*trainer
	operator *process
	load     *sdk.Client

	// floor is the newest version the harness knows committed; maxVersion the newest it
	// knows of at all (tried, served, staged, desired), so a new update takes the next one.
	floor      atomic.Int64
	mu         sync.Mutex
	maxVersion int64
	faultIdx   map[int]int           // schedule fault → recorder fault
	killed     map[int]chan struct{} // kill-mid-* fault → closed once it killed
	bg         sync.WaitGroup        // kill-mid-* goroutines
	// held are the servers a targeted pause or sleep left paused: the operator's own doing,
	// which the final heal undoes (a fleet-wide pause is undone through the desired state).
	held map[string]bool
	// lastDesired is the last desired state read.
	lastDesired *DesiredObs
	// deferred are restarts due before their kill-mid-* fault killed (its update started
	// late): each runs once its kill is done.
	deferred []Event

	stopLoad    chan struct{}
	loadWG      sync.WaitGroup
	stopMonitor chan struct{}
	monitorWG   sync.WaitGroup
}

// process runs one Jepsen process's ops one at a time, in the order they were scheduled.
type process struct {
	name    string
	queue   chan func()
	done    chan struct{}
	closing atomic.Bool
}

func newProcess(name string) *process {
	p := &process{name: name, queue: make(chan func(), 256), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for op := range p.queue {
			if !p.closing.Load() {
				op()
			}
		}
	}()
	return p
}

func (p *process) enqueue(op func()) { p.queue <- op }

// finish waits for the op in progress and drops the ops still queued: once the schedule is
// over, nothing it did not time may change the fleet (a late update's cut would resume a
// server that missed a resume, hiding it).
func (p *process) finish() {
	p.closing.Store(true)
	close(p.queue)
	select {
	case <-p.done:
	case <-time.After(hangBound):
		// An op that outlives every timeout it was given stays without a completion in
		// the history: the checker reports it.
	}
}

// hangBound is how long the harness waits for an op or a request past its own timeout
// before it leaves it unanswered in the history and goes on.
const hangBound = opTimeout + 15*time.Second

// waitBounded waits for wg at most hangBound.
func waitBounded(wg *sync.WaitGroup) {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(hangBound):
	}
}

// trainer is a trainer process: its own client and its own weight server (the origin).
type trainer struct {
	*process
	client  *sdk.Client
	store   *weightstore.Store
	url     string
	seed    uint64
	delay   atomic.Int64  // the origin's delay per checkpoint file, ns
	fetches chan struct{} // one per checkpoint download started on the origin

	mu        sync.Mutex
	published map[int64]sdk.WeightsRef
}

func newHarness(t *testing.T, s Schedule) *harness {
	h := &harness{t: t, sched: s, digests: NewDigests(),
		faultIdx: map[int]int{}, held: map[string]bool{}, killed: map[int]chan struct{}{}, stopLoad: make(chan struct{}), stopMonitor: make(chan struct{}),
		scrape: &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}}
	h.redis = redistest.Start(t)
	for range servers {
		h.proxies = append(h.proxies, redistest.NewProxy(t, h.redis.Addr()))
	}
	h.fleet = fleettest.Start(t, fleettest.Options{Servers: servers, Fleet: fleetName, Redis: h.redis, Args: serverArgs,
		RedisURL: func(i int) string { return h.proxies[i].URL() }})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	b, err := bus.DialRedis(ctx, h.redis.URL(), bus.RedisOptions{})
	if err != nil {
		t.Fatalf("faults: %v", err)
	}
	h.bus = b
	t.Cleanup(func() { _ = b.Close() })
	h.trainers = map[string]*trainer{}
	for i, name := range Trainers {
		h.trainers[name] = h.newTrainer(name, uint64(1000*(i+1)))
	}
	h.operator = newProcess("operator")
	// The rollout workers share trainer-a's client, as a trainer's would: the floor of a
	// request is what that client knew committed.
	h.load = h.trainers[Trainers[0]].client
	// The schedule's clock (and the history's) starts only now: starting the fleet builds
	// the rollout binary, which takes from seconds to a minute. Started before it, the
	// schedule's first minute of faults and updates ran in one burst at a fleet not yet up.
	h.rec, h.start = NewRecorder(s.Seed), time.Now()
	return h
}

func (h *harness) dial() *sdk.Client {
	c, err := sdk.Dial(h.t.Context(), sdk.Options{Redis: redisconf.Config{URL: h.redis.URL()}, Fleet: fleetName, Secret: []byte(h.fleet.Secret),
		Logger: slog.New(slog.DiscardHandler), CommandTimeout: 5 * time.Second, RouteTimeout: 20 * time.Second})
	if err != nil {
		h.t.Fatalf("faults: dial: %v", err)
	}
	h.t.Cleanup(func() { _ = c.Close() })
	return c
}

func (h *harness) newTrainer(name string, seed uint64) *trainer {
	t := h.t
	st, err := weightstore.Open(t.Context(), t.TempDir())
	if err != nil {
		t.Fatalf("faults: %v", err)
	}
	tr := &trainer{process: newProcess(name), client: h.dial(), store: st, seed: seed, fetches: make(chan struct{}, 64),
		published: map[int64]sdk.WeightsRef{}}
	inner := st.Handler()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("faults: %v", err)
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, weights.SafetensorsFile) {
			select {
			case tr.fetches <- struct{}{}:
			default:
			}
			if d := time.Duration(tr.delay.Load()); d > 0 {
				select {
				case <-time.After(d): // a slow origin: the stage phase lasts long enough to be hit
				case <-r.Context().Done():
					return
				}
			}
		}
		inner.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	tr.url = "http://" + ln.Addr().String()
	return tr
}

// publish writes the trainer's checkpoint for version v (its own weights: each trainer's
// version v is another checkpoint) once, and returns its ref.
func (h *harness) publish(tr *trainer, v int64) (sdk.WeightsRef, error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if ref, ok := tr.published[v]; ok {
		return ref, nil
	}
	w, err := model.Preset("tiny", tr.seed+uint64(v))
	if err != nil {
		return sdk.WeightsRef{}, fmt.Errorf("faults: %w", err)
	}
	e, err := tr.store.Publish(h.t.Context(), v, w)
	if err != nil {
		return sdk.WeightsRef{}, fmt.Errorf("faults: publish %d: %w", v, err)
	}
	ref := e.Ref(tr.url)
	tr.published[v] = ref
	h.rec.Publish(tr.name, v, e.SHA256)
	h.digests.Published(tr.name, v, e.SHA256)
	return ref, nil
}

// noteVersion raises the newest version the harness knows of.
func (h *harness) noteVersion(v int64) {
	h.mu.Lock()
	h.maxVersion = max(h.maxVersion, v)
	h.mu.Unlock()
}

// nextVersion reserves the version after every one the harness knows of.
func (h *harness) nextVersion() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.maxVersion++
	return h.maxVersion
}

// raiseFloor records that v is committed: later requests carry it as their floor.
func (h *harness) raiseFloor(v int64) {
	for {
		cur := h.floor.Load()
		if v <= cur || h.floor.CompareAndSwap(cur, v) {
			return
		}
	}
}

func (h *harness) run() {
	h.monitorWG.Add(1)
	go h.monitor()
	for i := range loadWorkers {
		h.loadWG.Add(1)
		go h.loadWorker(i)
	}
	h.loadWG.Add(1)
	go h.sessionWorker()
	for _, e := range h.sched.Events {
		// The schedule's clock: events run at their offsets, less the storm's (whose
		// events all run at the start, back to back).
		if d := time.Until(h.start.Add(max(0, e.At-storm))); d > 0 {
			time.Sleep(d)
		}
		h.runDeferred(false)
		h.dispatch(e)
	}
	h.healAll()
	h.converge()
	close(h.stopLoad)
	waitBounded(&h.loadWG)
	h.finalProbe()
	h.scrapeAll()
	close(h.stopMonitor)
	h.monitorWG.Wait()
}

func (h *harness) proc(i int) *fleettest.Proc { return h.fleet.Procs[i] }

// dispatch runs one event: a fault or a heal here, in the test goroutine (fleettest and
// redistest fail the test from it); an op on its process.
func (h *harness) dispatch(e Event) {
	var id string
	if e.Server >= 0 {
		id = h.proc(e.Server).ID
	}
	fault := func(detail string) {
		i := h.rec.Fault(e.Kind, id, detail)
		h.mu.Lock()
		h.faultIdx[e.Of] = i
		h.mu.Unlock()
	}
	healed := func() {
		h.mu.Lock()
		i, ok := h.faultIdx[e.Of]
		delete(h.faultIdx, e.Of)
		h.mu.Unlock()
		if ok {
			h.rec.Healed(i)
		}
	}
	switch e.Kind {
	case OpUpdate:
		tr := h.trainers[e.Trainer]
		tr.enqueue(func() { h.update(tr, e.Update, 0, "", nil) })
	case OpPause, OpResume, OpSleep, OpWake, OpPauseServer, OpResumeServer:
		h.operator.enqueue(func() { _ = h.control(e, id, "") })

	case FaultKill:
		fault("")
		h.kill(e.Server)
	case FaultKillMidStage, FaultKillMidCommit:
		h.killMid(e, fault)
	case HealRestart:
		h.mu.Lock()
		done := h.killed[e.Of]
		h.mu.Unlock()
		if done != nil {
			select {
			case <-done:
			default:
				h.deferred = append(h.deferred, e)
				return
			}
		}
		h.restart(e.Server)
		healed()
	case FaultStop:
		fault(fmt.Sprintf("past the heartbeat TTL (held at least %s)", StopHold))
		h.proc(e.Server).Suspend()
	case HealCont:
		h.proc(e.Server).Resume()
		healed()
	case FaultPartition:
		fault("")
		h.proxies[e.Server].Partition()
	case FaultFreeze:
		fault("")
		h.proxies[e.Server].Freeze()
	case FaultDelay:
		fault(e.Delay.String())
		h.proxies[e.Server].SetDelay(e.Delay)
	case FaultDrop:
		fault(fmt.Sprintf("rate %.2f", e.Rate))
		h.proxies[e.Server].SetDropRate(e.Rate, e.Seed)
	case HealProxy:
		h.proxies[e.Server].Heal()
		healed()
	case FaultCut:
		fault("")
		h.proxies[e.Server].Cut()
	case FaultRedisEmpty:
		fault("")
		h.redis.Restart()
	case FaultRedisData:
		fault("")
		h.redis.RestartWithData()
	case FaultTwoTrainers, FaultRaceRedisLoss:
		// Both trainers at once, beside whatever their processes are doing: each publishes
		// its own checkpoint as version v, then both calls start together.
		v := h.nextVersion()
		what := fmt.Sprintf("both trainers update version %d at once, each with its own checkpoint", v)
		if e.Kind == FaultRaceRedisLoss {
			h.bg.Add(1)
			go func() {
				defer h.bg.Done()
				fault(what + "; Redis restarts empty " + h.whenDesiredNames(v))
				h.redis.Restart()
			}()
		} else {
			fault(what)
		}
		var ready sync.WaitGroup
		gate := make(chan struct{})
		ready.Add(len(Trainers))
		for i, name := range Trainers {
			tr, spec := h.trainers[name], e.Update
			if i > 0 {
				spec = e.Other
			}
			h.bg.Add(1)
			go func() {
				defer h.bg.Done()
				h.update(tr, spec, v, e.Kind, &dual{ready: &ready, gate: gate})
			}()
		}
		h.bg.Add(1)
		go func() {
			defer h.bg.Done()
			ready.Wait()
			close(gate)
		}()
	case FaultCancelUpdate:
		fault(fmt.Sprintf("%s cancels its next update after %s", e.Trainer, e.Update.CancelAfter))
		tr := h.trainers[e.Trainer]
		tr.enqueue(func() { h.update(tr, e.Update, 0, FaultCancelUpdate, nil) })
	default:
		h.t.Fatalf("faults: unknown event %q", e.Kind)
	}
}

// runDeferred runs the deferred restarts whose kill is done (all of them, waiting, with
// wait).
func (h *harness) runDeferred(wait bool) {
	var keep []Event
	for _, e := range h.deferred {
		h.mu.Lock()
		done := h.killed[e.Of]
		h.mu.Unlock()
		if wait {
			<-done
		}
		select {
		case <-done:
			h.dispatch(e)
		default:
			keep = append(keep, e)
		}
	}
	h.deferred = keep
}

// kill scrapes the server's violation counters (a restart resets them) and SIGKILLs it.
func (h *harness) kill(i int) {
	p := h.proc(i)
	h.scrapeCounters(p)
	p.Kill()
	h.digests.Restarted(p.ID)
}

// restart starts a killed server again (a no-op when it runs).
func (h *harness) restart(i int) {
	p := h.proc(i)
	if p.Running() {
		return
	}
	p.Kill() // reaps a process that exited by itself, so Start may run it again
	h.digests.Restarted(p.ID)
	p.Start()
}

// killMid schedules an update on the event's trainer and kills the target server at the
// moment the fault names: when the origin starts sending a checkpoint (mid-stage), or when the
// desired state moves to a new version (the commit point: mid-commit). Past TriggerTimeout it
// kills anyway and says so.
func (h *harness) killMid(e Event, fault func(string)) {
	tr := h.trainers[e.Trainer]
	done, started := make(chan struct{}), make(chan struct{})
	h.mu.Lock()
	h.killed[e.Of] = done
	h.mu.Unlock()
	tr.enqueue(func() { h.update(tr, e.Update, 0, e.Kind, &dual{started: started}) })
	h.bg.Add(1)
	go func() {
		defer h.bg.Done()
		defer close(done)
		detail := ""
		// The trainer may be busy with an earlier update: the moment is this one's.
		select {
		case <-started:
		case <-time.After(opTimeout):
			detail = "its update never started; "
		}
		before := h.readDesired()
		deadline := time.After(TriggerTimeout)
		switch e.Kind {
		case FaultKillMidStage:
			select {
			case <-tr.fetches:
				detail += "while " + tr.name + "'s origin sends a checkpoint"
			case <-deadline:
				detail += "trigger missed: no checkpoint download within " + TriggerTimeout.String()
			}
		default:
			moved := func(d *DesiredObs) (string, bool) {
				return "", before == nil || d.Version > before.Version
			}
			if at, ok := h.pollDesired(deadline, moved); ok {
				detail += at
			} else {
				detail += "trigger missed: the desired state did not move within " + TriggerTimeout.String()
			}
		}
		fault(detail)
		h.kill(e.Server)
	}()
}

// whenDesiredNames waits until the desired state names version v (the first racer's commit
// point), moves past it, or raceTrigger passes, and says which.
func (h *harness) whenDesiredNames(v int64) string {
	at, ok := h.pollDesired(time.After(raceTrigger), func(d *DesiredObs) (string, bool) {
		if d.Version > v {
			return fmt.Sprintf("(trigger missed: the desired state moved to version %d without naming %d)", d.Version, v), true
		}
		return "", d.Version == v
	})
	if !ok {
		return "(trigger missed: the desired state did not name it within " + raceTrigger.String() + ")"
	}
	return at
}

// pollDesired reads the desired state every 10 ms until stop, given a record, says to stop,
// or deadline fires (ok false). It returns stop's text, or when that is empty "at the commit
// point of version v (epoch e)" of the record it stopped at.
func (h *harness) pollDesired(deadline <-chan time.Time, stop func(*DesiredObs) (string, bool)) (string, bool) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			d := h.readDesired()
			if d == nil {
				continue
			}
			if text, ok := stop(d); ok {
				if text == "" {
					text = fmt.Sprintf("at the commit point of version %d (epoch %d)", d.Version, d.Epoch)
				}
				return text, true
			}
		case <-deadline:
			return "", false
		}
	}
}

// dual synchronises an update with a fault: started, when set, is closed just before the call
// (once the origin's earlier downloads are forgotten); ready, when set, is marked done once
// the checkpoint is published, and the call waits for gate.
type dual struct {
	started chan struct{}
	ready   *sync.WaitGroup
	gate    chan struct{}
}

// update runs one UpdateWeights of trainer tr: version fixed, or the next one. The load
// shares trainer-a's client, so trainer-a's committed updates raise the requests' floor.
func (h *harness) update(tr *trainer, spec *UpdateSpec, fixed int64, why string, d *dual) {
	if d == nil {
		d = &dual{}
	}
	started := d.started
	v := fixed
	if v == 0 {
		v = h.nextVersion()
	}
	args := fmt.Sprintf("v%d %s mode=%s sleep=%d peers=%t", v, spec.Policy, spec.Mode, spec.Sleep, spec.Peers)
	if spec.CancelAfter > 0 {
		args += " cancel-after=" + spec.CancelAfter.String()
	}
	if why != "" {
		args += " (" + why + ")"
	}
	process := tr.name
	if d.ready != nil {
		process += "/dual"
	}
	ref, err := h.publish(tr, v)
	if d.ready != nil {
		d.ready.Done()
		<-d.gate
	}
	u := &UpdateOp{Trainer: tr.name, Version: v, Digest: ref.SHA256, Policy: spec.Policy, Cancelled: spec.CancelAfter > 0}
	id := h.rec.Invoke(process, OpUpdate, args, u)
	if err != nil {
		h.rec.Complete(id, err, nil)
		if started != nil {
			close(started)
		}
		return
	}
	tr.delay.Store(int64(spec.OriginDelay))
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if spec.CancelAfter > 0 {
		stop := time.AfterFunc(spec.CancelAfter, cancel)
		defer stop.Stop()
	}
	plan := sdk.Plan{Policy: sdk.Policy(spec.Policy), Mode: sdk.PauseMode(spec.Mode), SleepLevel: spec.Sleep, NoSleep: spec.Sleep == 0,
		StageTimeout: 4 * time.Second, CommitTimeout: 4 * time.Second}
	if !spec.Peers {
		plan.PeerFanOut = -1
	}
	if started != nil {
		for len(tr.fetches) > 0 {
			<-tr.fetches // downloads of earlier updates
		}
		close(started)
	}
	res, err := tr.client.UpdateWeights(ctx, ref, plan)
	var committed []string
	if res != nil {
		for _, s := range res.Servers {
			if s.Staged && !s.Committed {
				h.digests.Staged(s.ServerID, tr.name, v, ref.SHA256)
			}
		}
	}
	h.rec.Complete(id, err, func(u *UpdateOp) {
		if res == nil {
			return
		}
		u.Outcome, u.Epoch = string(res.Outcome), res.Epoch
		for _, s := range res.Servers {
			if s.Staged {
				u.Staged = append(u.Staged, s.ServerID)
			}
			if s.Committed {
				u.Committed = append(u.Committed, s.ServerID)
			}
		}
		committed = u.Committed
		if u.CommitPointPassed() && tr.client == h.load {
			h.raiseFloor(v)
		}
	})
	for _, s := range committed {
		h.digests.CommitAcked(s, tr.name, v, ref.SHA256)
		h.rec.Serve(s, v, ref.SHA256, "commit-ack", fmt.Sprintf("%s's update (op %d)", tr.name, id))
	}
}

// control runs one operator call.
func (h *harness) control(e Event, id, why string) error {
	c := h.trainers[Trainers[0]].client // the operator shares trainer-a's client, as a trainer would
	args := ""
	call := sdk.Call{Timeout: 4 * time.Second}
	if id != "" {
		call.Targets = []string{id}
		args = id
	}
	switch e.Kind {
	case OpPause, OpPauseServer:
		args = strings.TrimSpace(args + " mode=" + e.Mode)
	case OpSleep:
		args = strings.TrimSpace(fmt.Sprintf("%s level=%d mode=%s", args, e.Level, e.Mode))
	}
	if why != "" {
		args = strings.TrimSpace(args + " (" + why + ")")
	}
	op := h.rec.Invoke(h.operator.name, e.Kind, args, nil)
	if id != "" {
		h.mu.Lock()
		switch e.Kind {
		case OpPauseServer, OpSleep:
			h.held[id] = true
		}
		h.mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var err error
	switch e.Kind {
	case OpPause, OpPauseServer:
		_, err = c.Pause(ctx, sdk.PauseOptions{Call: call, Mode: sdk.PauseMode(e.Mode)})
	case OpResume, OpResumeServer:
		_, err = c.Resume(ctx, sdk.ResumeOptions{Call: call})
	case OpSleep:
		_, err = c.Sleep(ctx, sdk.SleepOptions{Call: call, Level: e.Level, Mode: sdk.PauseMode(e.Mode)})
	case OpWake:
		_, err = c.WakeUp(ctx, sdk.WakeOptions{Call: call})
	}
	h.rec.Complete(op, err, nil)
	if err == nil && e.Kind == OpResumeServer {
		h.mu.Lock()
		delete(h.held, id)
		h.mu.Unlock()
	}
	return err
}

// loadWorker keeps generating, as a trainer's rollout workers do, each request carrying the
// newest committed version the harness knows as its floor.
func (h *harness) loadWorker(w int) {
	defer h.loadWG.Done()
	name := fmt.Sprintf("load-%d", w)
	for i := 0; ; i++ {
		select {
		case <-h.stopLoad:
			return
		default:
		}
		pause := thinkTime
		if err := h.generate(name, PhaseLoad, []int{1, 2 + w, 3 + i%50, 4}); err != nil {
			pause = 50 * time.Millisecond // no server right now: do not spin
		}
		select {
		case <-h.stopLoad:
		case <-time.After(pause):
		}
	}
}

// sessionWorker runs multi-turn episodes (sdk.Session) through the faults, as an agentic
// trainer's rollout worker does: turns of sessionTurns tokens with environment tokens
// between them. Each turn is a Request of the history (checked like the load's); each
// episode's steps and final trajectory are a SessionObs, checked for lost, duplicated or
// misversioned tokens. A failed turn is retried on the same session, as a caller would.
func (h *harness) sessionWorker() {
	defer h.loadWG.Done()
	const process = "session-0"
	for ep := 0; ; ep++ {
		prompt := []int{1, 9, 9, 3 + ep%50}
		s, err := h.load.NewSession(prompt, sdk.SessionOptions{ID: fmt.Sprintf("ep-%d", ep),
			Sampling: sdk.SamplingParams{MaxTokens: sessionTurnTokens, Temperature: 1, IgnoreEOS: true}})
		if err != nil {
			h.t.Errorf("faults: new session: %v", err)
			return
		}
		o := SessionObs{ID: s.ID(), Process: process, Prompt: prompt}
		for turn := 0; turn < sessionTurns; {
			select {
			case <-h.stopLoad:
				h.endSession(s, o)
				return
			default:
			}
			id := h.rec.Request(process, PhaseLoad, h.floor.Load())
			ctx, cancel := context.WithTimeout(context.Background(), requestBound)
			tr, err := s.Generate(ctx, sdk.TurnOptions{})
			cancel()
			if err != nil {
				h.rec.Answer(id, nil, err)
				select {
				case <-h.stopLoad:
				case <-time.After(50 * time.Millisecond): // no server right now: do not spin
				}
				continue
			}
			h.rec.Answer(id, []Sample{{Versions: tr.Sample.WeightVersions(), Servers: tr.Sample.Servers}}, nil)
			o.Steps = append(o.Steps, SessionStep{Request: id, Tokens: tr.Sample.TokenIDs(), Versions: tr.Sample.WeightVersions()})
			env := []int{7, 8 + turn%20}
			if err := s.Append(env...); err != nil {
				h.t.Errorf("faults: append: %v", err)
				return
			}
			o.Steps = append(o.Steps, SessionStep{Env: env})
			turn++
			select {
			case <-h.stopLoad:
			case <-time.After(thinkTime): // the environment's step; the history stays readable
			}
		}
		h.endSession(s, o)
	}
}

// endSession records an episode with the session's trajectory.
func (h *harness) endSession(s *sdk.Session, o SessionObs) {
	tj := s.Trajectory()
	o.Completion, o.Versions, o.Mask = tj.Completion, tj.Versions, tj.LossMask
	h.rec.Session(o)
}

func (h *harness) generate(process, phase string, prompt []int) error {
	floor := h.floor.Load()
	id := h.rec.Request(process, phase, floor)
	ctx, cancel := context.WithTimeout(context.Background(), requestBound)
	defer cancel()
	req := sdk.GenerateRequest{PromptTokenIDs: prompt, N: 2,
		Sampling: sdk.SamplingParams{MaxTokens: 24, Temperature: 1, IgnoreEOS: true}}
	if sendFloor {
		req.MinVersion = floor
	}
	res, err := h.load.Generate(ctx, req)
	var samples []Sample
	if err == nil {
		for _, s := range res.Samples {
			samples = append(samples, Sample{Versions: s.WeightVersions(), Servers: s.Servers})
		}
	}
	h.rec.Answer(id, samples, err)
	return err
}

// monitor polls the desired state and every heartbeat, recording each change: what the
// fleet desired and what each server served under which digest.
func (h *harness) monitor() {
	defer h.monitorWG.Done()
	tick := time.NewTicker(monitorEvery)
	defer tick.Stop()
	var lastDesired DesiredObs
	lastServe := map[string]ServeObs{}
	for {
		if d := h.readDesired(); d != nil && (d.Epoch != lastDesired.Epoch || d.Version != lastDesired.Version || d.Digest != lastDesired.Digest || d.Paused != lastDesired.Paused) {
			lastDesired = *d
			h.rec.Desired(*d)
		}
		for _, p := range h.fleet.Procs {
			hb := h.heartbeat(p.ID)
			if hb == nil {
				continue
			}
			h.noteVersion(max(hb.WeightVersion, hb.StagedVersion))
			digest, why := h.digests.ServingDigest(p.ID, hb)
			if last, ok := lastServe[p.ID]; ok && last.Version == hb.WeightVersion && last.Digest == digest {
				continue
			}
			lastServe[p.ID] = ServeObs{Version: hb.WeightVersion, Digest: digest}
			h.rec.Serve(p.ID, hb.WeightVersion, digest, "heartbeat", why)
		}
		select {
		case <-h.stopMonitor:
			return
		case <-tick.C:
		}
	}
}

// readDesired reads the desired state key directly (nil when absent or unreadable) and
// feeds what it names to the digests, the floor and the version counter.
func (h *harness) readDesired() *DesiredObs {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	raw, err := h.bus.Get(ctx, protocol.Names{Fleet: fleetName}.Desired())
	if err != nil {
		return nil
	}
	d, err := protocol.DecodeDesiredState(raw)
	if err != nil {
		return nil
	}
	o := &DesiredObs{Epoch: d.Epoch, Paused: d.Paused}
	if d.Weights != nil {
		o.Version, o.Digest = d.Weights.Version, d.Weights.SHA256
		h.digests.Desired(d)
		h.noteVersion(o.Version)
	}
	h.mu.Lock()
	h.lastDesired = o
	h.mu.Unlock()
	return o
}

// heartbeat reads a server's heartbeat key (nil when absent or unreadable).
func (h *harness) heartbeat(id string) *protocol.Heartbeat {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	raw, err := h.bus.Get(ctx, protocol.Names{Fleet: fleetName}.Heartbeat(id))
	if err != nil {
		return nil
	}
	hb, err := protocol.DecodeHeartbeat(raw)
	if err != nil {
		return nil
	}
	return hb
}

// healAll ends every fault: stopped servers continue, killed ones start again, every link is
// healed; then the trainers' and the operator's queued ops run out, and the fleet is resumed
// and woken (each retried until it succeeds, within a bound).
func (h *harness) healAll() {
	waitBounded(&h.bg)
	h.runDeferred(true)
	for i, p := range h.fleet.Procs {
		p.Resume()
		h.restart(i)
	}
	for _, px := range h.proxies {
		px.Heal()
	}
	h.mu.Lock()
	for of, i := range h.faultIdx {
		h.rec.Healed(i)
		delete(h.faultIdx, of)
	}
	h.mu.Unlock()
	for _, name := range Trainers {
		h.trainers[name].finish()
	}
	h.operator.finish()
	// Undo what the operator did on purpose, and nothing more: wake every server (an
	// asleep engine refuses to resume), resume the servers a targeted pause or sleep
	// held, and resume the fleet only when the desired state says paused. A server that
	// missed a fleet resume must come back by converging; a fleet resume here would hide it.
	wakeErr := h.retry(func() error { return h.control(Event{Kind: OpWake, Server: -1}, "", "final heal") })
	h.mu.Lock()
	var held []int
	for i, p := range h.fleet.Procs {
		if h.held[p.ID] {
			held = append(held, i)
		}
	}
	h.mu.Unlock()
	for _, i := range held {
		_ = h.retry(func() error {
			return h.control(Event{Kind: OpResumeServer, Server: i}, h.proc(i).ID, "final heal: undo a targeted pause or sleep")
		})
	}
	if d := h.readDesired(); d != nil && d.Paused {
		_ = h.retry(func() error {
			return h.control(Event{Kind: OpResume, Server: -1}, "", "final heal: the fleet is paused")
		})
	}
	// A level-2 sleep released the weights: only new weights bring such a server back.
	if wakeErr != nil && strings.Contains(wakeErr.Error(), "no weights loaded") {
		spec := &UpdateSpec{Policy: "quorum:1", Mode: "abort", Sleep: 0}
		h.update(h.trainers[Trainers[0]], spec, 0, "final heal: new weights for servers a level-2 sleep emptied", nil)
		// A server that gets them by converging stays asleep (the operator put it there):
		// wake it now that it has weights again.
		_ = h.retry(func() error {
			return h.control(Event{Kind: OpWake, Server: -1}, "", "final heal: after the new weights")
		})
	}
	h.rec.Heal()
}

// retry runs call until it succeeds, at most 5 times a second apart (restarted servers join
// the fleet meanwhile), and returns its last error.
func (h *harness) retry(call func() error) error {
	var err error
	for range 5 {
		if err = call(); err == nil {
			return nil
		}
		time.Sleep(time.Second)
	}
	return err
}

// converge polls the heartbeats until every server is in rotation, running, on the final
// desired version, recording each server's result; the bound is convergeBound.
func (h *harness) converge() {
	healed := time.Now()
	deadline := healed.Add(convergeBound)
	pending := map[string]bool{}
	for _, p := range h.fleet.Procs {
		pending[p.ID] = true
	}
	last := map[string]string{}
	for len(pending) > 0 {
		desired := h.readDesired()
		if desired == nil {
			// The key is gone (Redis restarted empty and nobody wrote since): the final
			// desired state is the last one read.
			h.mu.Lock()
			desired = h.lastDesired
			h.mu.Unlock()
		}
		want := int64(0)
		if desired != nil {
			want = desired.Version
		}
		for _, p := range h.fleet.Procs {
			if !pending[p.ID] {
				continue
			}
			hb := h.heartbeat(p.ID)
			if hb == nil {
				last[p.ID] = "none (key absent)"
				continue
			}
			last[p.ID] = fmt.Sprintf("state=%s in_rotation=%t weight_version=%d staged=%d epoch=%d error=%q",
				hb.State, hb.InRotation, hb.WeightVersion, hb.StagedVersion, hb.Epoch, hb.Error)
			if converged(hb, desired) {
				h.rec.Converge(ConvergeObs{Server: p.ID, Want: want, Converged: true, After: time.Since(healed), Last: last[p.ID]})
				delete(pending, p.ID)
			}
		}
		if time.Now().After(deadline) {
			for _, p := range h.fleet.Procs {
				if pending[p.ID] {
					h.rec.Converge(ConvergeObs{Server: p.ID, Want: want, After: time.Since(healed), Last: last[p.ID]})
				}
			}
			return
		}
		time.Sleep(100 * time.Millisecond) // polling heartbeats, which change once a second
	}
}

// converged is the convergence predicate: the heartbeat says in rotation, running, on the
// desired version (version 0 when the desired state names none). When heartbeats carry the
// serving digest, this is where it is compared with desired.Digest.
func converged(hb *protocol.Heartbeat, desired *DesiredObs) bool {
	want := int64(0)
	if desired != nil {
		want = desired.Version
	}
	return hb.InRotation && hb.State == protocol.StateRunning && hb.WeightVersion == want &&
		(want == 0 || desired.Digest == "" || hb.WeightSHA256 == desired.Digest)
}

// finalProbe sends a few requests once the fleet converged: each must be answered. It first
// lets the client's routing cache catch up with the heartbeats (it rereads them every
// RefreshInterval, 500 ms, by design).
func (h *harness) finalProbe() {
	time.Sleep(2 * routingRefresh)
	for i := range finalRequests {
		_ = h.generate("final", PhaseFinal, []int{9, 8, 7, i})
	}
}

func (h *harness) scrapeAll() {
	for _, p := range h.fleet.Procs {
		if p.Running() {
			h.scrapeCounters(p)
		}
	}
}

// scrapeCounters records every metric of the server's /metrics whose name has "violation"
// in it (today rollout_safety_violations_total, from the KV offloading connector).
func (h *harness) scrapeCounters(p *fleettest.Proc) {
	if p.Suspended() {
		return
	}
	resp, err := h.scrape.Get(p.URL() + "/metrics")
	if err != nil {
		return
	}
	defer resp.Body.Close()
	sums, err := violationCounters(resp.Body)
	if err != nil {
		return
	}
	for name, v := range sums {
		h.rec.Counter(p.ID, name, v)
	}
}

// violationCounters sums, per metric name, the samples in Prometheus text whose metric name
// contains "violation".
func violationCounters(r io.Reader) (map[string]float64, error) {
	sums := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		name, _, _ := strings.Cut(line, " ")
		name, _, _ = strings.Cut(name, "{")
		if !strings.Contains(name, "violation") {
			continue
		}
		rest := strings.TrimPrefix(line, name)
		if i := strings.LastIndex(rest, "}"); i >= 0 {
			rest = rest[i+1:]
		}
		fields := strings.Fields(rest) // value [timestamp]
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("faults: metric line %q: %w", line, err)
		}
		sums[name] += v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("faults: read metrics: %w", err)
	}
	return sums, nil
}
