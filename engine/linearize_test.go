package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/model"
)

// This file checks that the engine's control calls are linearizable: several goroutines issue
// random control calls (and reads of the control state) at once against a real engine, each
// call's invocation and response are recorded on one logical clock, and a Wing-Gong search
// looks for a sequential order of the calls that (a) respects real time (a call that returned
// before another was invoked comes first) and (b) gives every call the result it returned
// under a sequential model of the control state (control.go's table plus the weight
// versions). A call whose caller gave up is checked too: withdrawn (ctx.Err() alone), it must
// not take effect; started (ErrStillRunning), it must.

// linState is the sequential model's state: what the control calls change.
type linState struct {
	Ctl     controlState
	NoModel bool
	Version int64
	Staged  int64
}

// toLinState is the part of the engine's state the model covers.
func toLinState(s propState) linState {
	return linState{Ctl: s.Ctl, NoModel: s.NoModel, Version: s.Version, Staged: s.Staged}
}

// linKind is a kind of operation in a history.
type linKind uint8

const (
	linPause linKind = iota
	linResume
	linSleep
	linWake
	linUpdate // UpdateWeights
	linCommit // CommitWeights
	linIsPaused
	linIsSleeping
	linRead // the whole state (testState): the final read of every run, and some reads inside
	numLinKinds
)

// linErr is the class of a call's error: the sentinel the model predicts.
type linErr uint8

const (
	errNone linErr = iota
	errAsleep
	errNoWeights
	errStale
	errNothingStaged
	errNotStaged
	errOther
)

func classify(err error) linErr {
	switch {
	case err == nil:
		return errNone
	case errors.Is(err, ErrAsleep):
		return errAsleep
	case errors.Is(err, ErrNoWeights):
		return errNoWeights
	case errors.Is(err, ErrStaleVersion):
		return errStale
	case errors.Is(err, ErrNothingStaged):
		return errNothingStaged
	case errors.Is(err, ErrNotStaged):
		return errNotStaged
	}
	return errOther
}

// linOp is one operation of a history: what was called, when (logical clock), what it
// returned.
type linOp struct {
	kind      linKind
	mode      PauseMode
	clear     bool
	level     int
	tags      []string
	version   int64
	stageOnly bool
	cancel    int // 0: never cancelled; n > 0: the context is cancelled after n-1 yields

	inv, ret int64
	// unknown: the call started but its caller gave up (ErrStillRunning): it takes effect
	// with a result nobody saw. withdrawn: it never started and must take no effect.
	unknown, withdrawn bool
	err                linErr
	rawErr             error
	gotInt             int64 // UpdateWeights' and CommitWeights' version
	gotBool            bool  // IsPaused, IsSleeping
	gotState           linState
}

func (o *linOp) String() string {
	var b strings.Builder
	switch o.kind {
	case linPause:
		fmt.Fprintf(&b, "pause(%s,%v)", o.mode, o.clear)
	case linResume:
		b.WriteString("resume")
	case linSleep:
		fmt.Fprintf(&b, "sleep(%d,%s)", o.level, o.mode)
	case linWake:
		fmt.Fprintf(&b, "wake_up(%v)", o.tags)
	case linUpdate:
		fmt.Fprintf(&b, "update(%d,stage_only=%v)->%d", o.version, o.stageOnly, o.gotInt)
	case linCommit:
		fmt.Fprintf(&b, "commit(%d)->%d", o.version, o.gotInt)
	case linIsPaused:
		fmt.Fprintf(&b, "is_paused->%v", o.gotBool)
	case linIsSleeping:
		fmt.Fprintf(&b, "is_sleeping->%v", o.gotBool)
	case linRead:
		fmt.Fprintf(&b, "read->%+v", o.gotState)
	}
	switch {
	case o.withdrawn:
		b.WriteString(" withdrawn")
	case o.unknown:
		b.WriteString(" still running")
	case o.rawErr != nil:
		fmt.Fprintf(&b, " err=%v", o.rawErr)
	}
	fmt.Fprintf(&b, " [%d,%d]", o.inv, o.ret)
	return b.String()
}

// apply is the sequential model: the state after o from s, and whether o's recorded result is
// the one the model gives (an unknown result matches any).
func (o *linOp) apply(s linState) (linState, bool) {
	next, res, val := s, errNone, int64(0)
	switch o.kind {
	case linPause:
		next.Ctl = mustNext(s.Ctl, ctlEvent{kind: evPause, mode: o.mode})
	case linResume:
		c, err := s.Ctl.next(ctlEvent{kind: evResume})
		next.Ctl, res = c, classify(err)
	case linSleep:
		next.Ctl = mustNext(mustNext(s.Ctl, ctlEvent{kind: evSleepPause, mode: o.mode}), ctlEvent{kind: evSleep, level: o.level})
		if o.level == 2 {
			next.NoModel = true
		}
	case linWake:
		tags := o.tags
		if len(tags) == 0 {
			tags = []string{TagWeights, TagKVCache}
		}
		c, err := s.Ctl.next(ctlEvent{kind: evWake, wakeWeights: slices.Contains(tags, TagWeights),
			wakeKV: slices.Contains(tags, TagKVCache), haveWeights: !s.NoModel})
		next.Ctl, res = c, classify(err)
	case linUpdate:
		switch {
		case o.version <= s.Version || (s.Staged != 0 && o.version < s.Staged):
			res = errStale // the staged version itself may be staged again (another checkpoint of it)
		case o.stageOnly:
			next.Staged, val = o.version, s.Version
		default:
			next.Staged, next.Version, next.NoModel, val = 0, o.version, false, o.version
		}
	case linCommit:
		switch {
		case s.Staged == 0:
			res = errNothingStaged
		case s.Staged != o.version:
			res = errNotStaged
		default:
			next.Staged, next.Version, next.NoModel, val = 0, o.version, false, o.version
		}
	case linIsPaused:
		return s, o.unknown || o.err == errNone && o.gotBool == (s.Ctl.Phase != ctlRunning)
	case linIsSleeping:
		return s, o.unknown || o.err == errNone && o.gotBool == (s.Ctl.Phase == ctlAsleep)
	case linRead:
		return s, o.unknown || o.err == errNone && o.gotState == s
	}
	if o.unknown {
		return next, true
	}
	if res != errNone {
		// A refused call changes nothing.
		return s, o.err == res
	}
	if o.err != errNone {
		return next, false
	}
	if (o.kind == linUpdate || o.kind == linCommit) && o.gotInt != val {
		return next, false
	}
	return next, true
}

func mustNext(s controlState, ev ctlEvent) controlState {
	next, err := s.next(ev)
	if err != nil {
		panic(fmt.Sprintf("model: %s in %+v: %v", ev.kind, s, err))
	}
	return next
}

// linearizable reports whether the history has a linearization from init (Wing and Gong's
// search, with failed (state, done set) pairs memoised), and the order it found. Withdrawn ops
// are left out: they must have no effect, which the reads and the final state check.
func linearizable(init linState, history []*linOp) ([]*linOp, bool) {
	var ops []*linOp
	for _, o := range history {
		if !o.withdrawn {
			ops = append(ops, o)
		}
	}
	if len(ops) > 64 {
		panic("history too long for the search")
	}
	type key struct {
		s    linState
		done uint64
	}
	failed := map[key]bool{}
	all := uint64(1)<<len(ops) - 1
	order := make([]*linOp, 0, len(ops))
	var search func(s linState, done uint64) bool
	search = func(s linState, done uint64) bool {
		if done == all {
			return true
		}
		if failed[key{s, done}] {
			return false
		}
		// An op may go next only if no pending op returned before it was invoked.
		minRet := int64(1 << 62)
		for i, o := range ops {
			if done&(1<<i) == 0 && o.ret < minRet {
				minRet = o.ret
			}
		}
		for i, o := range ops {
			if done&(1<<i) != 0 || o.inv > minRet {
				continue
			}
			next, ok := o.apply(s)
			if !ok {
				continue
			}
			order = append(order, o)
			if search(next, done|1<<i) {
				return true
			}
			order = order[:len(order)-1]
		}
		failed[key{s, done}] = true
		return false
	}
	if !search(init, 0) {
		return nil, false
	}
	return order, true
}

// linRuns is the number of runs: TestControlLinearizable's default, or ROLLOUT_LINEARIZE_RUNS.
func linRuns(t *testing.T, def int) int {
	if v := os.Getenv("ROLLOUT_LINEARIZE_RUNS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "ROLLOUT_LINEARIZE_RUNS")
		return n
	}
	if testing.Short() {
		return def / 5
	}
	return def
}

// barrier returns once every control call received before it has returned: it is a control
// call that does nothing, so it starts only after them.
func (e *Engine) barrier(ctx context.Context) error {
	_, err := controlCall(ctx, e, "test_barrier", func(_ context.Context, done func(struct{}, error)) { done(struct{}{}, nil) })
	return err
}

// TestControlLinearizable: 3 goroutines issue 3 random control calls or reads each, at once,
// against one real engine with requests in flight (so pauses with wait and sleeps drain); some
// callers give up at a random moment. Every run's history must be linearizable against the
// sequential model from the state the run started in, the final state (read behind a barrier)
// included. Runs follow each other on the same engine, starting from where the last one left
// it, with fixed seeds: the operations are the same every time, the interleavings are not.
// ROLLOUT_LINEARIZE_RUNS sets the number of runs (default 2000, about 12 s with -race on 2
// cores).
func TestControlLinearizable(t *testing.T) {
	runs := linRuns(t, 2000)
	w1, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	w2, err := model.Preset("tiny", 2)
	require.NoError(t, err)
	var (
		e    *Engine
		hook atomic.Pointer[func()] // the scripted run's forward hook, on the engine goroutine
	)
	e, err = New(Config{Weights: w1, WeightVersion: 1, NumBlocks: 64, Workers: 2, MaxNumSeqs: 4,
		MaxBatchedTokens: 32, Logger: slog.New(slog.DiscardHandler),
		Hooks: Hooks{BeforeForward: func(uint64) error {
			if h := hook.Load(); h != nil {
				(*h)()
			}
			return nil
		}}})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- e.Run(runCtx) }()
	t.Cleanup(func() { stop(); require.NoError(t, <-runDone) })
	// Not ctxT's minute: ROLLOUT_LINEARIZE_RUNS may ask for many runs.
	ctx, cancelAll := context.WithTimeout(context.Background(), time.Duration(runs)*100*time.Millisecond+time.Minute)
	defer cancelAll()

	const goroutines, perG = 3, 3
	var (
		clock                       atomic.Int64
		kinds                       [numLinKinds]int
		withdrawn, unknown, refused int
		nextReq                     int
	)
	count := func(history []*linOp) {
		for _, o := range history {
			kinds[o.kind]++
			switch {
			case o.withdrawn:
				withdrawn++
			case o.unknown:
				unknown++
			case o.err != errNone:
				refused++
			}
		}
	}
	// The random runs reach a withdrawn call and one that completes without its caller only as
	// the goroutines happen to run (a CI machine once ran 2000 with no call of the second
	// kind): the scripted run makes both every time, on the fresh engine.
	count(linScriptedRun(t, ctx, e, &hook, &clock, w1, w2))
	start := time.Now()
	for run := range runs {
		rng := rand.New(rand.NewPCG(uint64(run), 0x5eed))
		before, _, err := e.testState(ctx)
		require.NoError(t, err)
		init := toLinState(before)
		// Requests in flight, so that a pause with wait and a sleep have something to drain.
		var ids []string
		for range rng.IntN(3) {
			nextReq++
			id := fmt.Sprintf("q%d", nextReq)
			if _, err := e.Add(ctx, Request{ID: id, PromptTokenIDs: prompt(4+rng.IntN(20), nextReq), Sampling: greedy(1 + rng.IntN(24))}); err == nil {
				ids = append(ids, id)
			}
		}
		var history []*linOp
		plans := make([][]*linOp, goroutines)
		for g := range plans {
			for range perG {
				o := drawLinOp(rng, init.Version)
				plans[g] = append(plans[g], o)
				history = append(history, o)
			}
		}
		var wg sync.WaitGroup
		for g := range plans {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for _, o := range plans[g] {
					o.exec(ctx, e, &clock, w1, w2)
				}
			}()
		}
		wg.Wait()
		history = checkLinRun(t, ctx, e, &clock, w1, w2, fmt.Sprintf("run %d (seed %d)", run, run), init, history)
		count(history)
		e.Abort(ids...)
	}
	t.Logf("%d runs of %d goroutines x %d calls, 0 failures, in %v: calls by kind %v (pause resume sleep wake update commit is_paused is_sleeping read), withdrawn %d, still running %d, refused %d",
		runs, goroutines, perG, time.Since(start).Round(time.Millisecond), kinds, withdrawn, unknown, refused)
	// The runs must reach the situations the property is about (the scripted run makes the
	// first two every time).
	require.Positive(t, withdrawn, "no call was withdrawn")
	require.Positive(t, unknown, "no call completed without its caller")
	require.Positive(t, refused, "no call was refused")
}

// checkLinRun ends a run: it waits for every call the run sent (a barrier), reads the final
// state, checks that the history with that read is linearizable from init, and returns it.
func checkLinRun(t *testing.T, ctx context.Context, e *Engine, clock *atomic.Int64, w1, w2 *model.Weights,
	name string, init linState, history []*linOp) []*linOp {
	t.Helper()
	require.NoError(t, e.barrier(ctx))
	// A call that completes without its caller has its response at the barrier's.
	barrierRet := clock.Add(1)
	for _, o := range history {
		if o.unknown {
			o.ret = barrierRet
		}
	}
	final := &linOp{kind: linRead}
	final.exec(ctx, e, clock, w1, w2)
	history = append(history, final)
	if _, ok := linearizable(init, history); !ok {
		var lines []string
		for _, o := range history {
			lines = append(lines, o.String())
		}
		t.Fatalf("%s: not linearizable from %+v:\n%s", name, init, strings.Join(lines, "\n"))
	}
	return history
}

// linScriptedRun makes, with gates rather than luck, the two situations the property is about
// besides refusals, and checks its history like a random run's. With a request's first
// forward held, a Pause(wait) and then a Sleep queue behind it; the Sleep's caller gives up
// while it is queued (withdrawn: it must take no effect). Once the pause has started and the
// engine drains, its caller gives up too (ErrStillRunning: it must take effect), and a Resume
// follows. The engine must be running with weights, as New leaves it.
func linScriptedRun(t *testing.T, ctx context.Context, e *Engine, hook *atomic.Pointer[func()],
	clock *atomic.Int64, w1, w2 *model.Weights) []*linOp {
	t.Helper()
	before, _, err := e.testState(ctx)
	require.NoError(t, err)
	init := toLinState(before)
	pause := &linOp{kind: linPause, mode: PauseWait}
	sleep := &linOp{kind: linSleep, level: 1, mode: PauseAbort}
	resume := &linOp{kind: linResume}
	pctx, cancelPause := context.WithCancel(ctx)
	defer cancelPause()
	sctx, cancelSleep := context.WithCancel(ctx)
	defer cancelSleep()
	var (
		stage              atomic.Int32
		entered, gate      = make(chan struct{}), make(chan struct{})
		pauseRet, sleepRet = make(chan struct{}), make(chan struct{})
	)
	h := func() {
		switch {
		case stage.CompareAndSwap(1, 2): // the request's first forward, before the calls
			close(entered)
			<-gate
		case e.ctl.Phase == ctlPaused && stage.CompareAndSwap(3, 4): // a forward of the drain
			cancelPause()
			<-pauseRet // its caller has its answer before the drain can end
		}
	}
	hook.Store(&h)
	defer hook.Store(nil)
	stage.Store(1)
	_, err = e.Add(ctx, Request{ID: "scripted", PromptTokenIDs: prompt(8, 0), Sampling: greedy(24)})
	require.NoError(t, err)
	defer e.Abort("scripted")
	<-entered
	go func() { defer close(pauseRet); pause.exec(pctx, e, clock, w1, w2) }()
	waitQueued(t, e, 1)
	go func() { defer close(sleepRet); sleep.exec(sctx, e, clock, w1, w2) }()
	waitQueued(t, e, 2)
	cancelSleep() // the loop is held in the forward: the sleep cannot have started
	<-sleepRet
	stage.Store(3)
	close(gate)
	<-pauseRet
	resume.exec(ctx, e, clock, w1, w2)
	require.True(t, sleep.withdrawn, "the sleep was withdrawn while queued: %v", sleep.rawErr)
	require.True(t, pause.unknown, "the pause had started: %v", pause.rawErr)
	require.NoError(t, resume.rawErr)
	return checkLinRun(t, ctx, e, clock, w1, w2, "the scripted run", init, []*linOp{pause, sleep, resume})
}

// drawLinOp draws one operation; versions are drawn near the serving one so that stale and
// mismatched versions happen.
func drawLinOp(rng *rand.Rand, version int64) *linOp {
	modes := []PauseMode{PauseAbort, PauseWait, PauseKeep}
	o := &linOp{}
	switch r := rng.IntN(100); {
	case r < 18:
		o.kind, o.mode, o.clear = linPause, modes[rng.IntN(3)], rng.IntN(4) == 0
	case r < 36:
		o.kind = linResume
	case r < 50:
		o.kind, o.level, o.mode = linSleep, rng.IntN(3), modes[rng.IntN(3)]
	case r < 66:
		o.kind = linWake
		o.tags = [][]string{nil, {TagWeights}, {TagKVCache}, {TagWeights, TagKVCache}}[rng.IntN(4)]
	case r < 76:
		o.kind, o.version, o.stageOnly = linUpdate, version+int64(rng.IntN(4)), rng.IntN(3) == 0
	case r < 82:
		o.kind, o.version = linCommit, version+int64(rng.IntN(4))
	case r < 88:
		o.kind = linIsPaused
	case r < 94:
		o.kind = linIsSleeping
	default:
		o.kind = linRead
	}
	if o.kind != linRead && rng.IntN(5) == 0 {
		o.cancel = 1 + rng.IntN(4)
	}
	return o
}

// exec runs o against e and records its invocation, response and result.
func (o *linOp) exec(ctx context.Context, e *Engine, clock *atomic.Int64, w1, w2 *model.Weights) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if o.cancel > 0 {
		// The caller gives up at some moment: before the call is sent, while it is queued,
		// or after it started, depending on how the goroutines run.
		go func() {
			for range o.cancel - 1 {
				runtime.Gosched()
			}
			cancel()
		}()
	}
	var err error
	o.inv = clock.Add(1)
	switch o.kind {
	case linPause:
		_, err = e.Pause(ctx, o.mode, o.clear)
	case linResume:
		err = e.Resume(ctx)
	case linSleep:
		err = e.Sleep(ctx, o.level, o.mode)
	case linWake:
		err = e.WakeUp(ctx, o.tags)
	case linUpdate:
		w := w1
		if o.version%2 == 0 {
			w = w2
		}
		o.gotInt, err = e.UpdateWeights(ctx, w, o.version, o.stageOnly)
	case linCommit:
		o.gotInt, err = e.CommitWeights(ctx, o.version)
	case linIsPaused:
		o.gotBool, err = e.IsPaused(ctx)
	case linIsSleeping:
		o.gotBool, err = e.IsSleeping(ctx)
	case linRead:
		var s propState
		s, _, err = e.testState(ctx)
		o.gotState = toLinState(s)
		if err == nil && s.NoKV != s.Ctl.KVReleased {
			err = fmt.Errorf("engine holds KV %v with the control state %+v", !s.NoKV, s.Ctl)
		}
	}
	o.ret = clock.Add(1)
	o.rawErr = err
	switch {
	case errors.Is(err, ErrStillRunning):
		o.unknown = true // it takes effect some time before the barrier returns: see the run
	case errors.Is(err, context.Canceled):
		o.withdrawn = true
	default:
		o.err = classify(err)
	}
}
