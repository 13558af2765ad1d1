package engine

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/sample"
	"github.com/rolloutkit/rollout/engine/sched"
)

// This file drives the real engine (tiny preset, a small KV pool so preemption happens, a
// small token budget so prompts are chunked) with random interleavings of requests and RL
// control calls, and checks the engine's invariants after every operation and the
// end-to-end properties once everything has drained.
//
// Weight swaps and the greedy reference check. A commit while some request holds KV computed
// under the old weights (it runs, or is frozen by Pause(keep) without clear_cache) makes that
// request's later tokens depend on old KV, so they are not the reference continuation of any
// one weight set. The test does not forbid such swaps (they are legal and exercised); instead
// it marks the request's run of tokens under the new version "tainted" and skips only that run
// in the reference check. Whether a request may hold KV is decided from the engine's own state
// just before the commit: when the engine is paused, only the requests in the running batch
// hold KV (preempted and waiting ones hold none, and a paused engine admits nobody); when it
// is not paused, every live request counts. Every other run of same-version tokens is checked
// against the reference forward of that version's weights applied to prompt+previous tokens.

// propState is the part of the engine's state the model predicts. Ctl, the pause and sleep
// state, is predicted with the engine's own transition table (controlState.next): the model
// feeds it the events each operation must produce, so the test checks that the engine
// produces exactly those, at the right time, and that what it holds (NoKV, NoModel) matches.
type propState struct {
	Ctl controlState
	// NoKV says the engine holds no KV storage; it must equal Ctl.KVReleased.
	NoKV    bool
	NoModel bool
	Version int64
	Staged  int64
}

func (s propState) asleep() bool  { return s.Ctl.Phase == ctlAsleep }
func (s propState) running() bool { return s.Ctl.Phase == ctlRunning }

// paused is paused and awake (Resume would succeed).
func (s propState) paused() bool { return s.Ctl.Phase == ctlPaused }

// after is the state ev leads to from s by the engine's table, and the error the call
// returns; an illegal event means the model itself is wrong.
func (h *propHarness) after(s propState, ev ctlEvent) (propState, error) {
	h.rt.Helper()
	next, err := s.Ctl.next(ev)
	if errors.Is(err, errIllegalTransition) {
		h.fatalf("model: %v", err)
	}
	s.Ctl = next
	return s, err
}

// sameErr says the engine returned the error the table predicts: both nil, or the same message
// (the table's errors wrap the sentinels callers branch on).
func sameErr(got, want error) bool {
	if got == nil || want == nil {
		return got == nil && want == nil
	}
	return got.Error() == want.Error()
}

// mustAfter is after for an event the table accepts.
func (h *propHarness) mustAfter(s propState, ev ctlEvent) propState {
	h.rt.Helper()
	next, err := h.after(s, ev)
	if err != nil {
		h.fatalf("model: %s in %+v: %v", ev.kind, s.Ctl, err)
	}
	return next
}

// testState reads the control state and the running batch from the loop.
func (e *Engine) testState(ctx context.Context) (propState, []string, error) {
	type snap struct {
		s       propState
		running []string
	}
	v, err := call(ctx, e, "test_state", func(_ context.Context, done func(snap, error)) {
		s := propState{Ctl: e.ctl, NoKV: e.kv == nil, NoModel: e.model == nil, Version: e.version}
		if e.staged != nil {
			s.Staged = e.staged.version
		}
		var running []string
		for id := range e.reqs {
			if r, ok := e.sched.Get(id); ok && r.Status() == sched.StatusRunning {
				running = append(running, id)
			}
		}
		done(snap{s, running}, nil)
	})
	return v.s, v.running, err
}

// numPreemptions reads the scheduler's preemption counter.
func (e *Engine) numPreemptions(ctx context.Context) (int64, error) {
	return call(ctx, e, "test_preemptions", func(_ context.Context, done func(int64, error)) {
		done(e.sched.Stats().NumPreemptions, nil)
	})
}

type propReq struct {
	id        string
	prompt    []int
	params    sample.Params
	salt      string
	seed      int64 // for seeded sampling; 0 for greedy
	stream    *Stream
	addedVer  int64          // serving version when Add returned
	tainted   map[int64]bool // versions whose run of tokens may depend on older KV
	mayAbort  bool           // aborted by the test, or live during a pause/sleep with abort
	tokens    []Token
	finalOut  Output
	numFinals int
}

// hasTokens reports whether r has produced a token and not finished.
func (r *propReq) hasTokens() bool {
	r.stream.mu.Lock()
	defer r.stream.mu.Unlock()
	return !r.stream.finished && (len(r.stream.pending) > 0 || !r.stream.timings.FirstToken.IsZero())
}

// hasVersion reports whether the request has produced a token of weight version v, or ended.
func (r *propReq) hasVersion(v int64) bool {
	r.stream.mu.Lock()
	defer r.stream.mu.Unlock()
	return r.stream.finished || slices.ContainsFunc(r.stream.pending, func(t Token) bool { return t.WeightVersion == v })
}

func (r *propReq) streamFinished() bool {
	r.stream.mu.Lock()
	defer r.stream.mu.Unlock()
	return r.stream.finished
}

// propTotals aggregate coverage over all cases, so the test can assert that the interesting
// situations actually happened.
type propTotals struct {
	mu                                    sync.Mutex
	cases, ops, pairs, requests           int
	preemptions, prefixHits               int64
	cleanSwaps, dirtySwaps, taintedRuns   int
	checkedRuns, checkedTokens, nearTies  int
	multiVersionChecked, seededPairs      int
	refGreedySpot, queueFull, sleep2Cases int
	stepErrors, concurrentUpdates         int
	finishes                              map[FinishReason]int
	errs                                  map[string]int
}

func (tt *propTotals) add(f func(*propTotals)) {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	f(tt)
}

type propHarness struct {
	rt      *rapid.T
	t       *testing.T
	e       *Engine
	ctx     context.Context //nolint:containedctx // one case's deadline
	weights map[int64]*model.Weights
	seeds   [2]*model.Weights
	st      propState // the model's view, resynced from the engine after every operation
	nextVer int64
	nextID  int
	reqs    []*propReq
	byID    map[string]*propReq
	prefix  [][]int

	mu        sync.Mutex
	finishes  map[string]int
	finishGen map[string]int

	tot *propTotals
	ops int
	// failNext makes the next forward pass fail (opStepError); the requests of that step are
	// aborted, so every request live while it is armed may end aborted.
	failNext atomic.Bool
	// trace records what each operation did, for failure messages.
	trace []string
	// refs caches reference logits per weight set: a greedy repeat of a request produces the
	// same tokens, so its sequence is a prefix of one already computed.
	refs map[*model.Weights][]propRef
	spot int
}

type propRef struct {
	seq    []int
	logits [][]float32
}

// reference returns the reference logits for seq under w, reusing a cached longer sequence
// that starts with seq.
func (h *propHarness) reference(w *model.Weights, seq []int) [][]float32 {
	for _, r := range h.refs[w] {
		if len(r.seq) >= len(seq) && slices.Equal(r.seq[:len(seq)], seq) {
			return r.logits[:len(seq)]
		}
	}
	lg, err := model.Reference(w, seq)
	if err != nil {
		h.fatalf("reference: %v", err)
	}
	if h.refs == nil {
		h.refs = map[*model.Weights][]propRef{}
	}
	h.refs[w] = append(h.refs[w], propRef{seq, lg})
	return lg
}

const propTol = 2e-3 // logit gap below which float32-vs-float64 argmax differences are ties

// propChecks is the -rapid.checks value used when the flag is not given: each case starts an
// engine and runs 50-100 operations, so rapid's default of 100 cases would take minutes under
// -race on a small machine. 10 cases (~700 operations) take ~17 s with -race on 2 cores; with
// -short, rapid divides the count by 5, so 25 gives 5 cases. For thousands of operations pass
// e.g. -rapid.checks=100.
func propChecks() string {
	if testing.Short() {
		return "25"
	}
	return "10"
}

func TestPropertyRandomInterleavings(t *testing.T) {
	if f := flag.Lookup("rapid.checks"); f != nil {
		set := false
		flag.Visit(func(g *flag.Flag) { set = set || g.Name == f.Name })
		if !set {
			old := f.Value.String()
			require.NoError(t, f.Value.Set(propChecks()))
			t.Cleanup(func() { _ = f.Value.Set(old) })
		}
	}
	w1, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	w2, err := model.Preset("tiny", 2)
	require.NoError(t, err)
	tot := &propTotals{finishes: map[FinishReason]int{}, errs: map[string]int{}}
	start := time.Now()
	// Coverage, not correctness, decides how many rounds run: a rare situation can miss in 10
	// random cases, so a round that left one unreached is followed by another with fresh seeds,
	// up to propMaxRounds. A fixed -rapid.seed repeats the same cases, so it gets one round.
	for round := 1; ; round++ {
		rapid.Check(t, func(rt *rapid.T) { runPropCase(t, rt, [2]*model.Weights{w1, w2}, tot) })
		missing := tot.missingCoverage()
		if t.Failed() || len(missing) == 0 || round == propMaxRounds || seedFixed() {
			break
		}
		t.Logf("round %d left %v unreached: another round", round, missing)
	}
	t.Logf("cases %d, ops %d (pairs %d), requests %d, finishes %v, preemptions %d, prefix hits %d, "+
		"swaps clean %d dirty %d, checked runs %d (multi-version requests %d) tokens %d, near ties %d, tainted runs %d, "+
		"seeded pairs %d, referenceGreedy spot checks %d, queue-full %d, level-2 cases %d, step errors armed %d, concurrent updates %d, expected errors %v, in %v",
		tot.cases, tot.ops, tot.pairs, tot.requests, tot.finishes, tot.preemptions, tot.prefixHits,
		tot.cleanSwaps, tot.dirtySwaps, tot.checkedRuns, tot.multiVersionChecked, tot.checkedTokens, tot.nearTies, tot.taintedRuns,
		tot.seededPairs, tot.refGreedySpot, tot.queueFull, tot.sleep2Cases, tot.stepErrors, tot.concurrentUpdates, tot.errs, time.Since(start).Round(time.Millisecond))
	if t.Failed() || tot.cases < 8 {
		return
	}
	// The interleavings must actually reach the situations the properties are about.
	assert.Empty(t, tot.missingCoverage(), "situations no case reached")
	assert.Less(t, tot.nearTies*50, tot.checkedTokens+50, "too many near ties: the tolerance hides mismatches")
}

// propMaxRounds bounds the coverage rounds. A checked request with tokens of two versions is
// not on the coverage list, though the cases check every one they make: it needs a clean swap
// to catch a greedy request mid-generation, which depends on how fast the engine runs against
// the ops, and on a loaded 2-core machine (all packages testing at once, as in CI) five rounds
// of 10 cases all missed it about one run in 30. TestPerTokenVersionsAcrossSwapDuringKeep
// makes that situation every time, with a forward gate, and checks both versions' tokens.
const propMaxRounds = 5

// missingCoverage names the situations the cases so far have not reached.
func (tt *propTotals) missingCoverage() []string {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	var missing []string
	for _, c := range []struct {
		n    int
		what string
	}{
		{int(tt.preemptions), "preemption"},
		{int(tt.prefixHits), "prefix-cache hit"},
		{tt.cleanSwaps, "clean weight swap"},
		{tt.dirtySwaps, "weight swap with KV in use"},
		{tt.seededPairs, "seeded determinism pair"},
		{tt.finishes[FinishAbort], "abort finish"},
		{tt.finishes[FinishLength], "length finish"},
	} {
		if c.n <= 0 {
			missing = append(missing, c.what)
		}
	}
	return missing
}

// seedFixed reports whether -rapid.seed was given (or RAPID_SEED set), in which case every
// round would replay the same cases.
func seedFixed() bool {
	f := flag.Lookup("rapid.seed")
	return f != nil && f.Value.String() != "0"
}

func runPropCase(t *testing.T, rt *rapid.T, seeds [2]*model.Weights, tot *propTotals) {
	cfg := Config{
		Weights: seeds[0], WeightVersion: 1, Workers: 2,
		NumBlocks:        rapid.IntRange(48, 72).Draw(rt, "blocks"),
		MaxNumSeqs:       rapid.IntRange(4, 8).Draw(rt, "max_seqs"),
		MaxBatchedTokens: rapid.IntRange(16, 64).Draw(rt, "max_batched"),
		MaxQueued:        rapid.IntRange(6, 40).Draw(rt, "max_queued"),
		Logger:           slog.New(slog.DiscardHandler),
	}
	h := &propHarness{rt: rt, t: t, seeds: seeds, weights: map[int64]*model.Weights{1: seeds[0]},
		nextVer: 2, byID: map[string]*propReq{}, finishes: map[string]int{}, finishGen: map[string]int{}, tot: tot}
	cfg.Hooks.BeforeForward = func(uint64) error {
		if h.failNext.CompareAndSwap(true, false) {
			return errors.New("injected forward error")
		}
		return nil
	}
	cfg.Hooks.OnFinish = func(id string, _ FinishReason, _, gen int, _ Timings) {
		h.mu.Lock()
		h.finishes[id]++
		h.finishGen[id] += gen
		h.mu.Unlock()
	}
	e, err := New(cfg)
	if err != nil {
		rt.Fatalf("New: %v", err)
	}
	h.e = e
	ctx, cancelCase := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancelCase()
	h.ctx = ctx
	runCtx, stop := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- e.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-runDone; err != nil {
			rt.Errorf("Run: %v", err)
		}
	}()
	h.sync()
	for i := range 3 {
		h.prefix = append(h.prefix, rapid.SliceOfN(rapid.IntRange(0, 255), 16, 64).Draw(rt, fmt.Sprintf("prefix%d", i)))
	}

	n := rapid.IntRange(50, 100).Draw(rt, "ops")
	for range n {
		kind := rapid.IntRange(0, 99).Draw(rt, "op")
		switch {
		case kind < 32:
			h.opAdd()
		case kind < 35:
			h.opBurst()
		case kind < 42:
			h.opAbort()
		case kind < 51:
			h.opPause()
		case kind < 63:
			h.opResume()
		case kind < 68:
			h.opSleep()
		case kind < 75:
			h.opWake()
		case kind < 79:
			h.opReset()
		case kind < 86:
			h.opWeights()
		case kind < 91:
			h.opSwapUnderKeep()
		case kind < 93:
			h.opConcurrentUpdates()
		case kind < 95:
			h.opStepError()
		default:
			h.opPair()
		}
		h.ops++
		h.check()
	}
	h.finish()
	tot.add(func(tt *propTotals) { tt.cases++; tt.ops += h.ops })
}

func (h *propHarness) tracef(format string, args ...any) {
	h.trace = append(h.trace, fmt.Sprintf("op %d: ", h.ops)+fmt.Sprintf(format, args...))
}

// traceSince returns the trace from the entry where the request was added.
func (h *propHarness) traceSince(id string) string {
	for i, line := range h.trace {
		if strings.Contains(line, "add "+id+" ") {
			return strings.Join(h.trace[i:], "\n")
		}
	}
	return strings.Join(h.trace, "\n")
}

func (h *propHarness) fatalf(format string, args ...any) {
	h.rt.Helper()
	h.rt.Fatalf(format, args...)
}

// sync reads the engine's control state into the model.
func (h *propHarness) sync() []string {
	h.rt.Helper()
	s, running, err := h.e.testState(h.ctx)
	if err != nil {
		h.fatalf("test state: %v", err)
	}
	h.st = s
	return running
}

// expect compares the model's predicted state with the engine's, then adopts the engine's.
func (h *propHarness) expect(op string, want propState) {
	h.rt.Helper()
	h.sync()
	h.tracef("%s -> %+v", op, h.st)
	want.NoKV = want.Ctl.KVReleased
	if h.st != want {
		h.fatalf("after %s: engine state %+v, model predicts %+v", op, h.st, want)
	}
}

// check runs after every operation: the scheduler's and pool's invariants (CheckInvariants,
// which also fails on a counted violation such as a block owned across a pool release) and the
// engine-level ones.
func (h *propHarness) check() {
	h.rt.Helper()
	st, err := h.e.CheckInvariants(h.ctx)
	if err != nil {
		h.fatalf("after op %d: invariants: %v", h.ops, err)
	}
	if st.KVReleased && !st.Paused {
		h.fatalf("after op %d: KV pool released while the engine is not paused (it would step without KV): %+v", h.ops, st)
	}
	if h.st.NoModel && !st.Paused {
		h.fatalf("after op %d: weights released while the engine is not paused: %+v", h.ops, st)
	}
	if st.KVReleased && st.KVBlocksUsed != 0 {
		h.fatalf("after op %d: %d blocks in use with the pool released", h.ops, st.KVBlocksUsed)
	}
	if st.KVBlocksUsed < 0 || st.KVBlocksUsed > st.KVBlocksTotal {
		h.fatalf("after op %d: %d of %d blocks used", h.ops, st.KVBlocksUsed, st.KVBlocksTotal)
	}
	if st.WeightVersion != h.st.Version {
		h.fatalf("after op %d: Stats version %d, state %d", h.ops, st.WeightVersion, h.st.Version)
	}
}

func (h *propHarness) live() []*propReq {
	var out []*propReq
	for _, r := range h.reqs {
		if !r.streamFinished() {
			out = append(out, r)
		}
	}
	return out
}

func (h *propHarness) countErr(name string) {
	h.tot.add(func(tt *propTotals) { tt.errs[name]++ })
}

func (h *propHarness) opAdd() {
	rt := h.rt
	if len(h.reqs) > 0 && rapid.IntRange(0, 3).Draw(rt, "repeat") == 0 {
		// The same prompt, parameters and salt again: full prefix-cache hits, and for seeded
		// sampling a determinism pair.
		o := h.reqs[rapid.IntRange(0, len(h.reqs)-1).Draw(rt, "repeat_which")]
		h.add(o.prompt, o.params, o.seed, o.salt)
		return
	}
	var p []int
	switch rapid.IntRange(0, 2).Draw(rt, "prompt_kind") {
	case 0: // a fresh prompt
		p = rapid.SliceOfN(rapid.IntRange(0, 255), 1, 60).Draw(rt, "prompt")
	default: // a shared prefix, whole or with a suffix: prefix-cache hits
		pre := h.prefix[rapid.IntRange(0, len(h.prefix)-1).Draw(rt, "prefix")]
		p = append(slices.Clone(pre), rapid.SliceOfN(rapid.IntRange(0, 255), 0, 16).Draw(rt, "suffix")...)
	}
	params := sample.Defaults()
	params.MaxTokens = rapid.IntRange(1, 24).Draw(rt, "max_tokens")
	params.IgnoreEOS = rapid.Bool().Draw(rt, "ignore_eos")
	if rapid.IntRange(0, 4).Draw(rt, "stops") == 0 {
		params.StopTokenIDs = rapid.SliceOfN(rapid.IntRange(0, 255), 1, 3).Draw(rt, "stop_ids")
	}
	var seed int64
	if rapid.IntRange(0, 2).Draw(rt, "sampling") == 0 {
		params.Temperature = rapid.SampledFrom([]float64{0.7, 1.0, 1.3}).Draw(rt, "temperature")
		seed = int64(rapid.IntRange(1, 3).Draw(rt, "seed"))
		params.Seed = &seed
		if rapid.Bool().Draw(rt, "top_p") {
			params.TopP = 0.9
		}
	} else {
		params.Temperature = 0
	}
	salt := rapid.SampledFrom([]string{"", "", "a", "b"}).Draw(rt, "salt")

	// A duplicate of a live id: only when the engine is frozen, so that it cannot finish
	// between the check and the Add.
	if h.st.Ctl.Mode == PauseKeep && rapid.IntRange(0, 5).Draw(rt, "dup") == 0 {
		if lv := h.live(); len(lv) > 0 {
			r := lv[rapid.IntRange(0, len(lv)-1).Draw(rt, "dup_which")]
			if !r.mayAbort {
				_, err := h.e.Add(h.ctx, Request{ID: r.id, PromptTokenIDs: p, Sampling: params})
				if !errors.Is(err, ErrDuplicateID) {
					h.fatalf("duplicate id %q of a frozen request: err %v, want ErrDuplicateID", r.id, err)
				}
				h.countErr("duplicate")
				return
			}
		}
	}
	h.add(p, params, seed, salt)
}

func (h *propHarness) add(p []int, params sample.Params, seed int64, salt string) *propReq {
	h.nextID++
	id := fmt.Sprintf("r%d", h.nextID)
	armed := h.failNext.Load() // checked before Add: a failure consumed earlier cannot hit it
	s, err := h.e.Add(h.ctx, Request{ID: id, PromptTokenIDs: p, Sampling: params, CacheSalt: salt})
	if errors.Is(err, ErrQueueFull) {
		// The waiting queue is capped in every state, so a running engine may refuse too.
		h.tot.add(func(tt *propTotals) { tt.queueFull++ })
		return nil
	}
	if err != nil {
		h.fatalf("add %s: %v", id, err)
	}
	r := &propReq{id: id, prompt: p, params: params, salt: salt, seed: seed, stream: s, addedVer: h.st.Version, tainted: map[int64]bool{}, mayAbort: armed}
	h.tracef("add %s (prompt %d, max %d, temp %v)", id, len(p), params.MaxTokens, params.Temperature)
	h.reqs = append(h.reqs, r)
	h.byID[id] = r
	return r
}

// opBurst adds more long requests than the running batch holds and lets them start together
// (resuming a paused engine): together they need more KV than the pool holds, so the scheduler
// preempts. Most are seeded samples, which keeps the reference checks' cost bounded.
func (h *propHarness) opBurst() {
	rt := h.rt
	if h.st.running() {
		// Hold the engine while the burst is added, so that it starts together however fast
		// steps are: added one by one to a running engine, the first requests can finish
		// before the last arrive, and nothing is preempted (seen in CI under load).
		want := h.mustAfter(h.st, ctlEvent{kind: evPause, mode: PauseKeep})
		if _, err := h.e.Pause(h.ctx, PauseKeep, false); err != nil {
			h.fatalf("pause(keep) for a burst: %v", err)
		}
		h.expect("pause(keep) for a burst", want)
	}
	// Each request is long enough that MaxNumSeqs of them need 1.3x the pool: preemption is
	// then certain once they all run, whatever the timing.
	need := (13*h.e.cfg.NumBlocks*h.e.cfg.BlockSize/10 + h.e.cfg.MaxNumSeqs - 1) / h.e.cfg.MaxNumSeqs
	before, err := h.e.numPreemptions(h.ctx)
	if err != nil {
		h.fatalf("preemptions: %v", err)
	}
	var burst []string
	for range h.e.cfg.MaxNumSeqs + rapid.IntRange(0, 2).Draw(rt, "burst_extra") {
		p := rapid.SliceOfN(rapid.IntRange(0, 255), 60, 120).Draw(rt, "burst_prompt")
		params := greedy(max(20, need-len(p)) + rapid.IntRange(0, 20).Draw(rt, "burst_max_tokens"))
		var seed int64
		if rapid.IntRange(0, 3).Draw(rt, "burst_greedy") > 0 {
			params.Temperature = 1
			seed = int64(rapid.IntRange(1, 3).Draw(rt, "burst_seed"))
			params.Seed = &seed
		}
		if r := h.add(p, params, seed, ""); r != nil {
			burst = append(burst, r.id)
		}
	}
	if h.st.paused() {
		h.opResume()
		h.waitBurst(burst, before)
	}
}

// waitBurst lets a started burst run until the pool runs out (a preemption) or all of it has
// finished, so that the operations after it (aborts, pauses) cannot cut it short when the
// engine is slow (a loaded machine).
func (h *propHarness) waitBurst(ids []string, before int64) {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		n, err := h.e.numPreemptions(h.ctx)
		if err != nil {
			h.fatalf("preemptions: %v", err)
		}
		h.mu.Lock()
		done := 0
		for _, id := range ids {
			if h.finishes[id] > 0 {
				done++
			}
		}
		h.mu.Unlock()
		if n > before || done == len(ids) {
			return
		}
		time.Sleep(200 * time.Microsecond)
	}
}

func (h *propHarness) opAbort() {
	rt := h.rt
	var ids []string
	for range rapid.IntRange(1, 3).Draw(rt, "n_abort") {
		if len(h.reqs) == 0 || rapid.IntRange(0, 3).Draw(rt, "unknown") == 0 {
			ids = append(ids, fmt.Sprintf("nope%d", rapid.IntRange(0, 9).Draw(rt, "nope")))
			continue
		}
		r := h.reqs[rapid.IntRange(0, len(h.reqs)-1).Draw(rt, "abort_which")]
		r.mayAbort = true
		ids = append(ids, r.id)
	}
	h.e.Abort(ids...)
}

func (h *propHarness) drawMode(label string) PauseMode {
	return rapid.SampledFrom([]PauseMode{PauseAbort, PauseWait, PauseKeep}).Draw(h.rt, label)
}

func (h *propHarness) markAbortable() {
	for _, r := range h.live() {
		r.mayAbort = true
	}
}

func (h *propHarness) opPause() {
	mode := h.drawMode("pause_mode")
	clearCache := rapid.Bool().Draw(h.rt, "clear_cache")
	want := h.mustAfter(h.st, ctlEvent{kind: evPause, mode: mode})
	if mode == PauseAbort {
		h.markAbortable()
	}
	r, err := h.e.Pause(h.ctx, mode, clearCache)
	if err != nil {
		h.fatalf("pause(%s, %v): %v", mode, clearCache, err)
	}
	if clearCache && !r.Success {
		h.fatalf("pause(%s, clear_cache) did not clear: %+v", mode, r)
	}
	if !clearCache && r != (ResetResult{}) {
		h.fatalf("pause(%s) without clear_cache reports a reset: %+v", mode, r)
	}
	h.expect(fmt.Sprintf("pause(%s,%v)", mode, clearCache), want)
	if mode != PauseKeep || clearCache {
		if running := h.sync(); len(running) > 0 {
			h.fatalf("pause(%s,%v) returned with %v running", mode, clearCache, running)
		}
	}
}

func (h *propHarness) opResume() {
	want, wantErr := h.after(h.st, ctlEvent{kind: evResume})
	err := h.e.Resume(h.ctx)
	if !sameErr(err, wantErr) {
		h.fatalf("resume in %+v: %v, want %v", h.st.Ctl, err, wantErr)
	}
	if errors.Is(wantErr, ErrAsleep) {
		h.countErr("resume_asleep")
	} else if wantErr != nil {
		h.fatalf("model: resume refused with %v", wantErr)
	}
	h.expect("resume", want)
}

func (h *propHarness) opSleep() {
	level := rapid.IntRange(0, 2).Draw(h.rt, "sleep_level")
	mode := h.drawMode("sleep_mode")
	if h.st.running() && mode == PauseAbort {
		h.markAbortable()
	}
	want := h.mustAfter(h.mustAfter(h.st, ctlEvent{kind: evSleepPause, mode: mode}), ctlEvent{kind: evSleep, level: level})
	if level == 2 {
		want.NoModel = true
		h.tot.add(func(tt *propTotals) { tt.sleep2Cases++ })
	}
	if err := h.e.Sleep(h.ctx, level, mode); err != nil {
		h.fatalf("sleep(%d, %s): %v", level, mode, err)
	}
	h.expect(fmt.Sprintf("sleep(%d,%s)", level, mode), want)
	if level > 0 {
		if running := h.sync(); len(running) > 0 {
			h.fatalf("sleep(%d) returned with %v running", level, running)
		}
	}
}

func (h *propHarness) drawTags() []string {
	return rapid.SampledFrom([][]string{nil, {TagWeights}, {TagKVCache}, {TagWeights, TagKVCache}}).Draw(h.rt, "tags")
}

// predictWake is WakeUp's effect on s by the engine's table, and the error it must return.
func (h *propHarness) predictWake(s propState, tags []string) (propState, error) {
	if len(tags) == 0 {
		tags = []string{TagWeights, TagKVCache}
	}
	return h.after(s, ctlEvent{kind: evWake, wakeWeights: slices.Contains(tags, TagWeights),
		wakeKV: slices.Contains(tags, TagKVCache), haveWeights: !s.NoModel})
}

func (h *propHarness) opWake() {
	tags := h.drawTags()
	// Level 2 must be followed by new weights before waking; do so most of the time, and
	// otherwise check that waking refuses.
	if h.st.NoModel && rapid.IntRange(0, 3).Draw(h.rt, "commit_before_wake") > 0 {
		h.updateWeights(false)
	}
	want, wantErr := h.predictWake(h.st, tags)
	err := h.e.WakeUp(h.ctx, tags)
	if !sameErr(err, wantErr) {
		h.fatalf("wake_up(%v) in %+v: %v, want %v", tags, h.st, err, wantErr)
	}
	if wantErr != nil {
		h.countErr("wake_no_weights")
	}
	h.expect(fmt.Sprintf("wake_up(%v)", tags), want)
}

func (h *propHarness) opReset() {
	resetRunning := rapid.Bool().Draw(h.rt, "reset_running")
	resetConn := rapid.Bool().Draw(h.rt, "reset_connector")
	running := h.sync()
	frozen := h.st.Ctl.Mode == PauseKeep // PausedAll: the running batch cannot change
	quiet := !h.st.running() && len(running) == 0
	r, err := h.e.ResetPrefixCache(h.ctx, resetRunning, resetConn)
	if err != nil {
		h.fatalf("reset_prefix_cache: %v", err)
	}
	if r.Success == (r.Reason != "") {
		h.fatalf("reset_prefix_cache: success %v with reason %q", r.Success, r.Reason)
	}
	switch {
	case resetRunning:
		if !r.Success {
			h.fatalf("reset_prefix_cache(reset_running) failed: %+v", r)
		}
		if frozen && r.Preempted != len(running) {
			h.fatalf("reset_prefix_cache(reset_running) preempted %d of %d frozen requests", r.Preempted, len(running))
		}
	case quiet:
		if !r.Success {
			h.fatalf("reset_prefix_cache with nothing running failed: %+v", r)
		}
	case frozen && len(running) > 0:
		if r.Success || r.BlocksCleared != 0 {
			h.fatalf("reset_prefix_cache claimed a reset with %d frozen requests holding blocks: %+v", len(running), r)
		}
		h.countErr("reset_refused")
	}
	h.expect("reset_prefix_cache", h.st)
}

// commitCandidates returns the requests a commit made now may leave computed over older KV.
// It must be called before the commit: a request running at the commit can finish before the
// call returns (the loop keeps stepping), so the live set read afterwards may miss it.
func (h *propHarness) commitCandidates(running []string) []*propReq {
	if h.st.running() {
		return h.live()
	}
	var who []*propReq
	for _, id := range running {
		if r := h.byID[id]; r != nil {
			who = append(who, r)
		}
	}
	return who
}

// taintForCommit marks the runs of version ver of the commit's candidates as tainted.
func (h *propHarness) taintForCommit(ver int64, running []string, who []*propReq) {
	ids := make([]string, 0, len(who))
	for _, r := range who {
		r.tainted[ver] = true
		ids = append(ids, r.id)
	}
	h.tracef("commit %d (paused %q, running %v): tainted %v", ver, h.st.Ctl.Mode, running, ids)
	h.tot.add(func(tt *propTotals) {
		if len(who) > 0 {
			tt.dirtySwaps++
		} else {
			tt.cleanSwaps++
		}
	})
}

func (h *propHarness) newWeights(ver int64) *model.Weights {
	w := h.seeds[ver%2] // even versions use the second seed, odd ones the first
	return w
}

// updateWeights stages the next version and, unless stageOnly, commits it.
func (h *propHarness) updateWeights(stageOnly bool) {
	ver := h.nextVer
	h.nextVer++
	w := h.newWeights(ver)
	running := h.sync()
	want := h.st
	who := h.commitCandidates(running)
	v, err := h.e.UpdateWeights(h.ctx, w, ver, stageOnly)
	if err != nil {
		h.fatalf("update_weights(%d, stage only %v): %v", ver, stageOnly, err)
	}
	h.weights[ver] = w
	if stageOnly {
		want.Staged = ver
		if v != want.Version {
			h.fatalf("stage-only update returned version %d, serving %d", v, want.Version)
		}
	} else {
		h.taintForCommit(ver, running, who)
		want.Staged, want.Version, want.NoModel = 0, ver, false
		if v != ver {
			h.fatalf("update_weights returned %d, want %d", v, ver)
		}
	}
	h.expect("update_weights", want)
}

// opSwapUnderKeep is the RL weight-sync sequence: freeze with Pause(keep) (clearing the cache
// or not), swap the weights, resume.
func (h *propHarness) opSwapUnderKeep() {
	// Mostly clearing: only a clean swap (the requests hold no KV of the old version) gives
	// two-version runs the reference can check; a dirty one taints the new run.
	clearCache := rapid.IntRange(0, 3).Draw(h.rt, "swap_clear") > 0
	if h.st.paused() {
		h.opResume()
	}
	greedyMid := func(r *propReq) bool { return r.params.Temperature == 0 && r.hasTokens() }
	if h.st.running() && !slices.ContainsFunc(h.live(), greedyMid) {
		// Something greedy mid-generation (the reference checks greedy runs), so that its
		// tokens span the two versions.
		r := h.add(rapid.SliceOfN(rapid.IntRange(0, 255), 1, 40).Draw(h.rt, "swap_prompt"), greedy(60), 0, "")
		// It may also finish at once (EOS), which ends the wait too.
		for deadline := time.Now().Add(5 * time.Second); r != nil && !r.hasTokens() && !r.streamFinished() && time.Now().Before(deadline); {
			time.Sleep(100 * time.Microsecond)
		}
	}
	want := h.mustAfter(h.st, ctlEvent{kind: evPause, mode: PauseKeep})
	if _, err := h.e.Pause(h.ctx, PauseKeep, clearCache); err != nil {
		h.fatalf("pause(keep): %v", err)
	}
	h.expect("pause(keep) for a swap", want)
	h.updateWeights(false)
	if h.st.asleep() {
		return
	}
	live := h.live() // before resuming: what the swap caught mid-generation
	if err := h.e.Resume(h.ctx); err != nil {
		h.fatalf("resume after a swap: %v", err)
	}
	want = h.mustAfter(h.st, ctlEvent{kind: evResume})
	h.expect("resume after a swap", want)
	// Let what the swap caught produce a token of the new version (or end) before the next
	// operation can abort it: on a slow machine it otherwise rarely gets that far, and the
	// two-version runs the swap exists for go unchecked.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Microsecond) {
		if !slices.ContainsFunc(live, func(r *propReq) bool { return !r.hasVersion(h.st.Version) }) {
			break
		}
	}
}

func (h *propHarness) opWeights() {
	switch rapid.IntRange(0, 4).Draw(h.rt, "weights_op") {
	case 0, 1:
		h.updateWeights(false)
	case 2:
		h.updateWeights(true)
	case 3: // commit whatever is staged
		running := h.sync()
		want := h.st
		who := h.commitCandidates(running)
		ver := want.Staged
		if ver == 0 || rapid.IntRange(0, 4).Draw(h.rt, "commit_other") == 0 {
			ver = h.nextVer + 5 // a version that is not staged
		}
		v, err := h.e.CommitWeights(h.ctx, ver)
		if want.Staged == 0 {
			if !errors.Is(err, ErrNothingStaged) {
				h.fatalf("commit with nothing staged: %v", err)
			}
			h.countErr("nothing_staged")
		} else if ver != want.Staged {
			if !errors.Is(err, ErrNotStaged) {
				h.fatalf("commit of %d with %d staged: %v", ver, want.Staged, err)
			}
			h.countErr("not_staged")
		} else {
			if err != nil || v != want.Staged {
				h.fatalf("commit: %d, %v; staged %d", v, err, want.Staged)
			}
			h.taintForCommit(v, running, who)
			want.Version, want.Staged, want.NoModel = v, 0, false
		}
		h.expect("commit_weights", want)
	case 4: // a stale stage is refused and changes nothing
		want := h.st
		ver := want.Version
		if want.Staged > want.Version+1 && rapid.Bool().Draw(h.rt, "stale_vs_staged") {
			ver = want.Staged - 1 // below the staged version (the same version replaces it)
		}
		err := h.e.StageWeights(h.ctx, h.newWeights(ver), ver)
		if !errors.Is(err, ErrStaleVersion) {
			h.fatalf("stale stage: %v", err)
		}
		h.countErr("stale_stage")
		h.expect("stale stage", want)
	}
}

// opConcurrentUpdates queues two UpdateWeights calls back to back with the loop parked (the
// newer version first or second): each stages and commits atomically, so the newest version
// serves, a call never hears ErrNothingStaged, and the older one is refused as stale only
// when the newer one went first.
func (h *propHarness) opConcurrentUpdates() {
	lo, hi := h.nextVer, h.nextVer+1
	h.nextVer += 2
	wl, wh := h.newWeights(lo), h.newWeights(hi)
	h.weights[lo], h.weights[hi] = wl, wh
	newerFirst := rapid.Bool().Draw(h.rt, "newer_first")
	h.sync()
	before := h.st
	liveBefore := h.live()
	type res struct {
		v   int64
		err error
	}
	var rl, rh res
	release := h.e.block(h.t)
	var wg sync.WaitGroup
	runLo := func() { defer wg.Done(); rl.v, rl.err = h.e.UpdateWeights(h.ctx, wl, lo, false) }
	runHi := func() { defer wg.Done(); rh.v, rh.err = h.e.UpdateWeights(h.ctx, wh, hi, false) }
	first, second := runLo, runHi
	if newerFirst {
		first, second = runHi, runLo
	}
	wg.Add(2)
	go first()
	h.waitQueued(1)
	go second()
	h.waitQueued(2)
	release()
	wg.Wait()
	h.tracef("concurrent updates %d, %d (newer first %v): %v/%v, %v/%v", lo, hi, newerFirst, rl.v, rl.err, rh.v, rh.err)
	if rh.err != nil || rh.v != hi {
		h.fatalf("update to %d: %d, %v", hi, rh.v, rh.err)
	}
	if newerFirst {
		if !errors.Is(rl.err, ErrStaleVersion) {
			h.fatalf("update to %d after %d: %v, want ErrStaleVersion", lo, hi, rl.err)
		}
	} else if rl.err != nil || rl.v != lo {
		h.fatalf("update to %d before %d: %d, %v", lo, hi, rl.v, rl.err)
	}
	want := before
	want.Version, want.Staged, want.NoModel = hi, 0, false
	h.expect("concurrent updates", want)
	for _, r := range append(liveBefore, h.live()...) {
		r.tainted[lo], r.tainted[hi] = true, true
	}
	h.tot.add(func(tt *propTotals) { tt.concurrentUpdates++; tt.dirtySwaps++ })
}

// opStepError makes the next forward pass fail. The requests of that step end aborted; the
// engine's invariants and every other request's output must be unaffected.
func (h *propHarness) opStepError() {
	if h.failNext.Load() {
		return
	}
	h.markAbortable()
	h.failNext.Store(true)
	h.tracef("step error armed")
	h.tot.add(func(tt *propTotals) { tt.stepErrors++ })
}

// pairOp is one utility call of a back-to-back pair; it reports whether err is an allowed
// outcome given that the other call of the pair may have changed the state first.
type pairOp struct {
	name string
	run  func(ctx context.Context) error
	ok   func(err error) bool
}

const (
	pairPause = iota
	pairResume
	pairSleep
	pairWake
	pairReset
	pairStage
	pairCommit
	pairStats
	numPairKinds
)

// pairCombos are ordered pairs worth biasing towards: the second call depends on the state
// the first one leaves, and the first one may complete only later (pause(wait), sleep).
var pairCombos = [][2]int{
	{pairPause, pairSleep}, {pairSleep, pairWake}, {pairSleep, pairResume}, {pairPause, pairResume},
	{pairSleep, pairCommit}, {pairPause, pairCommit}, {pairStage, pairCommit}, {pairPause, pairReset},
	{pairSleep, pairSleep}, {pairCommit, pairSleep},
}

func (h *propHarness) drawPairOp(label string, kind int) pairOp {
	rt := h.rt
	nilOnly := func(err error) bool { return err == nil }
	if kind < 0 {
		kind = rapid.IntRange(0, numPairKinds-1).Draw(rt, label)
	}
	switch kind {
	case pairPause:
		mode, clearCache := h.drawMode(label+"_mode"), rapid.Bool().Draw(rt, label+"_clear")
		if mode == PauseAbort {
			h.markAbortable()
		}
		return pairOp{fmt.Sprintf("pause(%s,%v)", mode, clearCache), func(ctx context.Context) error {
			r, err := h.e.Pause(ctx, mode, clearCache)
			if err == nil && clearCache && !r.Success {
				return fmt.Errorf("pause clear_cache failed: %+v", r)
			}
			return err
		}, nilOnly}
	case pairResume:
		return pairOp{"resume", h.e.Resume, func(err error) bool { return err == nil || errors.Is(err, ErrAsleep) }}
	case pairSleep:
		level, mode := rapid.IntRange(0, 2).Draw(rt, label+"_level"), h.drawMode(label+"_mode")
		if mode == PauseAbort {
			h.markAbortable()
		}
		return pairOp{fmt.Sprintf("sleep(%d,%s)", level, mode), func(ctx context.Context) error { return h.e.Sleep(ctx, level, mode) }, nilOnly}
	case pairWake:
		tags := h.drawTags()
		return pairOp{fmt.Sprintf("wake_up(%v)", tags), func(ctx context.Context) error { return h.e.WakeUp(ctx, tags) },
			func(err error) bool { return err == nil || errors.Is(err, ErrNoWeights) }}
	case pairReset:
		rr, rc := rapid.Bool().Draw(rt, label+"_rr"), rapid.Bool().Draw(rt, label+"_rc")
		return pairOp{fmt.Sprintf("reset(%v,%v)", rr, rc), func(ctx context.Context) error {
			r, err := h.e.ResetPrefixCache(ctx, rr, rc)
			if err == nil && r.Success == (r.Reason != "") {
				return fmt.Errorf("reset success %v with reason %q", r.Success, r.Reason)
			}
			return err
		}, nilOnly}
	case pairStage:
		ver := h.nextVer
		h.nextVer++
		w := h.newWeights(ver)
		h.weights[ver] = w
		return pairOp{fmt.Sprintf("stage(%d)", ver), func(ctx context.Context) error { return h.e.StageWeights(ctx, w, ver) },
			func(err error) bool { return err == nil || errors.Is(err, ErrStaleVersion) }}
	case pairCommit:
		// The latest version staged so far, by the model or by a stage of this pair.
		ver := h.nextVer - 1
		return pairOp{fmt.Sprintf("commit(%d)", ver), func(ctx context.Context) error { _, err := h.e.CommitWeights(ctx, ver); return err },
			func(err error) bool {
				return err == nil || errors.Is(err, ErrNothingStaged) || errors.Is(err, ErrNotStaged) || errors.Is(err, ErrStaleVersion)
			}}
	default:
		return pairOp{"stats", func(ctx context.Context) error { _, err := h.e.Stats(ctx); return err }, nilOnly}
	}
}

// opPair queues two utility calls while the loop is parked, so it handles them with no step
// between. Their combined effect depends on what the engine was doing, so the model only checks
// the outcomes are allowed and the invariants hold, then adopts the engine's state; a commit in
// a pair taints every live request (the other call may have resumed the engine).
func (h *propHarness) opPair() {
	ka, kb := -1, -1
	if rapid.Bool().Draw(h.rt, "pair_biased") {
		c := rapid.SampledFrom(pairCombos).Draw(h.rt, "pair_combo")
		ka, kb = c[0], c[1]
		if len(h.live()) == 0 && h.st.running() {
			h.opAdd() // something in flight, so the first call may complete only later
		}
	}
	a, b := h.drawPairOp("pair_a", ka), h.drawPairOp("pair_b", kb)
	before := h.st.Version
	// A commit in the pair may land while these run and they may finish before the pair
	// returns (a sleep or pause with wait behind it), so taint those live now too.
	liveBefore := h.live()
	release := h.e.block(h.t)
	errs := make([]error, 2)
	done := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	go func() { defer close(done[0]); errs[0] = a.run(h.ctx) }()
	queued := 0
	if h.waitQueuedOr(queued+1, done[0]) {
		queued++
	}
	go func() { defer close(done[1]); errs[1] = b.run(h.ctx) }()
	h.waitQueuedOr(queued+1, done[1])
	release()
	<-done[0]
	<-done[1]
	h.tracef("pair %s, %s: %v, %v", a.name, b.name, errs[0], errs[1])
	if !a.ok(errs[0]) || !b.ok(errs[1]) {
		h.fatalf("pair %s, %s: errors %v, %v", a.name, b.name, errs[0], errs[1])
	}
	h.sync()
	// The second call is handled after the first, so its effect must be visible afterwards.
	switch {
	case kb == pairCommit && errs[1] == nil && h.st.NoModel:
		h.fatalf("pair %s, %s: the commit succeeded but the engine has no weights: %+v", a.name, b.name, h.st)
	case b.name == "wake_up([])" || b.name == "wake_up([weights kv_cache])":
		if errs[1] == nil && h.st.asleep() {
			h.fatalf("pair %s, %s: the full wake-up succeeded but the engine sleeps: %+v", a.name, b.name, h.st)
		}
	case kb == pairResume && errs[1] == nil && !h.st.running():
		h.fatalf("pair %s, %s: resume succeeded but the engine is paused: %+v", a.name, b.name, h.st)
	}
	for v := before + 1; v <= h.st.Version; v++ {
		for _, r := range append(liveBefore, h.live()...) {
			r.tainted[v] = true
		}
		h.tot.add(func(tt *propTotals) { tt.dirtySwaps++ })
	}
	h.tot.add(func(tt *propTotals) { tt.pairs++ })
}

// waitQueuedOr waits until n messages are queued, and reports true, or until done is closed
// first, and reports false: a call the engine answers without its loop (a Resume of a
// running engine with no control call pending) never queues.
func (h *propHarness) waitQueuedOr(n int, done <-chan struct{}) bool {
	deadline := time.Now().Add(10 * time.Second)
	for len(h.e.in) < n {
		select {
		case <-done:
			return len(h.e.in) >= n
		default:
		}
		if time.Now().After(deadline) {
			h.fatalf("%d messages never queued", n)
		}
		time.Sleep(200 * time.Microsecond)
	}
	return true
}

func (h *propHarness) waitQueued(n int) {
	deadline := time.Now().Add(10 * time.Second)
	for len(h.e.in) < n {
		if time.Now().After(deadline) {
			h.fatalf("%d messages never queued", n)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// finish wakes and resumes the engine, drains every stream and checks the end-to-end
// properties.
func (h *propHarness) finish() {
	h.sync()
	if h.st.NoModel {
		h.updateWeights(false)
	}
	if h.st.asleep() {
		if err := h.e.WakeUp(h.ctx, nil); err != nil {
			h.fatalf("final wake_up: %v", err)
		}
	}
	if err := h.e.Resume(h.ctx); err != nil {
		h.fatalf("final resume: %v", err)
	}
	h.expect("final wake+resume", func() propState {
		s := h.st
		s.Ctl = controlState{}
		return s
	}())

	var genTotal, promptTotal int64
	reasons := map[FinishReason]int64{}
	for _, r := range h.reqs {
		for {
			out, err := r.stream.Recv(h.ctx)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				h.fatalf("%s: recv: %v (engine state %+v)", r.id, err, h.st)
			}
			if r.numFinals > 0 {
				h.fatalf("%s: output after the final one", r.id)
			}
			r.tokens = append(r.tokens, out.Tokens...)
			if out.Finished {
				r.numFinals++
				r.finalOut = out
			} else if len(out.Tokens) == 0 {
				h.fatalf("%s: empty non-final output", r.id)
			}
		}
		if r.numFinals != 1 {
			h.fatalf("%s: %d final outputs", r.id, r.numFinals)
		}
		genTotal += int64(len(r.tokens))
		promptTotal += int64(len(r.prompt))
		reasons[r.finalOut.FinishReason]++
	}
	st, err := h.e.CheckInvariants(h.ctx)
	if err != nil {
		h.fatalf("final invariants: %v", err)
	}
	if st.Running != 0 || st.Waiting != 0 || st.KVBlocksUsed != 0 {
		h.fatalf("drained engine: %d running, %d waiting, %d blocks used", st.Running, st.Waiting, st.KVBlocksUsed)
	}
	m := h.e.Metrics()
	if m.GenerationTokens != genTotal || m.PromptTokens != promptTotal {
		h.fatalf("metrics count %d generated / %d prompt tokens, streams %d / %d", m.GenerationTokens, m.PromptTokens, genTotal, promptTotal)
	}
	if m.FinishedStop != reasons[FinishStop] || m.FinishedLength != reasons[FinishLength] || m.FinishedAbort != reasons[FinishAbort] {
		h.fatalf("metrics finishes stop %d length %d abort %d, streams %v", m.FinishedStop, m.FinishedLength, m.FinishedAbort, reasons)
	}
	h.mu.Lock()
	for _, r := range h.reqs {
		if h.finishes[r.id] != 1 || h.finishGen[r.id] != len(r.tokens) {
			h.mu.Unlock()
			h.fatalf("%s: finished %d times with %d tokens reported, stream has %d", r.id, h.finishes[r.id], h.finishGen[r.id], len(r.tokens))
		}
	}
	if len(h.finishes) != len(h.reqs) {
		h.mu.Unlock()
		h.fatalf("%d requests finished, %d were admitted", len(h.finishes), len(h.reqs))
	}
	h.mu.Unlock()
	pre, err := h.e.numPreemptions(h.ctx)
	if err != nil {
		h.fatalf("preemptions: %v", err)
	}
	for _, r := range h.reqs {
		h.checkRequest(r)
	}
	h.checkSeeded()
	h.tot.add(func(tt *propTotals) {
		tt.requests += len(h.reqs)
		tt.preemptions += pre
		tt.prefixHits += m.PrefixHits
		for k, v := range reasons {
			tt.finishes[k] += int(v)
		}
	})
}

func (h *propHarness) checkRequest(r *propReq) {
	toks := r.tokens
	n := len(toks)
	fr := r.finalOut.FinishReason
	if n > r.params.MaxTokens {
		h.fatalf("%s: %d tokens > max_tokens %d", r.id, n, r.params.MaxTokens)
	}
	if c := r.finalOut.NumCachedTokens; c < 0 || (c > 0 && c >= len(r.prompt)) {
		h.fatalf("%s: %d cached tokens for a %d-token prompt", r.id, r.finalOut.NumCachedTokens, len(r.prompt))
	}
	stops := slices.Clone(r.params.StopTokenIDs)
	if !r.params.IgnoreEOS {
		stops = append(stops, model.TinyEOS)
	}
	for i, tok := range toks {
		if i < n-1 && slices.Contains(stops, tok.ID) {
			h.fatalf("%s: stop token %d at %d of %d did not stop it", r.id, tok.ID, i, n)
		}
		if _, ok := h.weights[tok.WeightVersion]; !ok || tok.WeightVersion < r.addedVer {
			h.fatalf("%s: token %d has version %d (added under %d)", r.id, i, tok.WeightVersion, r.addedVer)
		}
		if i > 0 && tok.WeightVersion < toks[i-1].WeightVersion {
			h.fatalf("%s: versions go back at token %d: %d after %d", r.id, i, tok.WeightVersion, toks[i-1].WeightVersion)
		}
		if tok.Logprob > 0 {
			h.fatalf("%s: token %d logprob %v > 0", r.id, i, tok.Logprob)
		}
	}
	switch fr {
	case FinishLength:
		if n != r.params.MaxTokens {
			h.fatalf("%s: finished length with %d of %d tokens", r.id, n, r.params.MaxTokens)
		}
	case FinishStop:
		if n == 0 || !slices.Contains(stops, toks[n-1].ID) {
			h.fatalf("%s: finished stop without a stop token (%v)", r.id, tokenIDs(toks))
		}
	case FinishAbort:
		if !r.mayAbort {
			h.fatalf("%s: aborted though nobody aborted it", r.id)
		}
	default:
		h.fatalf("%s: finish reason %q", r.id, fr)
	}
	if r.params.Temperature == 0 {
		h.checkGreedy(r)
	}
}

// checkGreedy checks every untainted run of same-version tokens against the reference
// forward of that version's weights, teacher-forced on prompt+previous tokens: token j must
// be the argmax of the reference logits after prompt+tokens[:j] (up to float32-vs-float64
// near ties). With every token matching, the run is exactly referenceGreedy's continuation.
func (h *propHarness) checkGreedy(r *propReq) {
	ids := tokenIDs(r.tokens)
	runs := 0
	for start := 0; start < len(ids); {
		ver := r.tokens[start].WeightVersion
		end := start
		for end < len(ids) && r.tokens[end].WeightVersion == ver {
			end++
		}
		if r.tainted[ver] {
			h.tot.add(func(tt *propTotals) { tt.taintedRuns++ })
			start = end
			continue
		}
		seq := append(slices.Clone(r.prompt), ids[:end-1]...)
		lg := h.reference(h.weights[ver], seq)
		ties := 0
		for j := start; j < end; j++ {
			row := lg[len(r.prompt)+j-1]
			best := 0
			for k, v := range row {
				if v > row[best] {
					best = k
				}
			}
			if got := ids[j]; got != best {
				if row[best]-row[got] > propTol {
					h.fatalf("%s: token %d (version %d) is %d, the reference argmax is %d (logit %.5f vs %.5f); tokens %v versions %v tainted %v\ntrace:\n%s",
						r.id, j, ver, got, best, row[got], row[best], ids, versions(r.tokens), r.tainted, h.traceSince(r.id))
				}
				ties++
			}
		}
		runs++
		h.tot.add(func(tt *propTotals) { tt.checkedRuns++; tt.checkedTokens += end - start; tt.nearTies += ties })
		start = end
	}
	if runs > 1 {
		h.tot.add(func(tt *propTotals) { tt.multiVersionChecked++ })
	}
	// A literal referenceGreedy spot check on one short single-version untainted output per case.
	if h.spot == 0 && runs == 1 && len(ids) > 0 && len(ids) <= 4 && !r.tainted[r.tokens[0].WeightVersion] {
		h.spot++
		want := referenceGreedy(h.t, h.weights[r.tokens[0].WeightVersion], r.prompt, len(ids))
		if !slices.Equal(want, ids) {
			h.t.Logf("%s: referenceGreedy %v, engine %v (near tie?)", r.id, want, ids)
		}
		h.tot.add(func(tt *propTotals) { tt.refGreedySpot++ })
	}
}

func versions(toks []Token) []int64 {
	v := make([]int64, len(toks))
	for i, t := range toks {
		v[i] = t.WeightVersion
	}
	return v
}

// checkSeeded: two seeded requests with the same prompt, parameters and seed whose tokens all
// come from one untainted version produce the same tokens (up to the shorter, since an abort
// may cut one short), whatever batching, chunking, preemption and prefix-cache hits they saw.
func (h *propHarness) checkSeeded() {
	first := map[string]*propReq{}
	for _, r := range h.reqs {
		if r.seed == 0 || len(r.tokens) == 0 {
			continue
		}
		ver := r.tokens[0].WeightVersion
		if r.tokens[len(r.tokens)-1].WeightVersion != ver || r.tainted[ver] {
			continue
		}
		key := fmt.Sprintf("%v|%v|%d|%v|%v|%v|%d", r.prompt, r.params.Temperature, r.seed, r.params.TopP, r.params.IgnoreEOS, r.params.StopTokenIDs, ver)
		o, ok := first[key]
		if !ok {
			first[key] = r
			continue
		}
		k := min(len(o.tokens), len(r.tokens))
		if a, b := tokenIDs(o.tokens[:k]), tokenIDs(r.tokens[:k]); !slices.Equal(a, b) {
			h.fatalf("seeded %s and %s (seed %d, version %d) differ: %v vs %v", o.id, r.id, r.seed, ver, a, b)
		}
		h.tot.add(func(tt *propTotals) { tt.seededPairs++ })
	}
}

// TestSleepThenWakeUpBackToBack is the minimal case the property test found: a sleep that
// must wait (a request is in flight) and a wake-up queued right behind it. The wake-up must
// take effect after the sleep, not before it (which left the engine unpaused with its KV pool
// and weights released).
func TestSleepThenWakeUpBackToBack(t *testing.T) {
	for _, tc := range []struct {
		level int
		mode  PauseMode
		tags  []string
	}{{1, PauseAbort, nil}, {2, PauseWait, []string{TagWeights}}, {1, PauseWait, []string{TagKVCache}}} {
		t.Run(fmt.Sprintf("sleep%d_%s_wake%v", tc.level, tc.mode, tc.tags), func(t *testing.T) {
			e, _ := testEngine(t, nil)
			ctx := ctxT(t)
			s, err := e.Add(ctx, Request{ID: "a", PromptTokenIDs: prompt(8, 1), Sampling: greedy(300)})
			require.NoError(t, err)
			_, err = s.Recv(ctx)
			require.NoError(t, err)
			_, errSleep, errWake := backToBack(t, e,
				func() error { return e.Sleep(ctx, tc.level, tc.mode) },
				func() error { return e.WakeUp(ctx, tc.tags) })
			require.NoError(t, errSleep)
			st, err := e.Stats(ctx)
			require.NoError(t, err)
			assert.False(t, st.KVReleased && !st.Paused, "KV pool released while the engine runs: %+v", st)
			if tc.level == 2 {
				require.ErrorIs(t, errWake, ErrNoWeights, "waking the weights after a level-2 sleep needs new weights")
			} else {
				require.NoError(t, errWake)
			}
			_, err = s.Collect(ctx)
			require.NoError(t, err)
		})
	}
}

// TestSleep2ThenCommitBackToBack: weights committed right behind a level-2 sleep that must
// wait are the weights the engine wakes up with; the pending sleep must not drop them.
func TestSleep2ThenCommitBackToBack(t *testing.T) {
	e, _ := testEngine(t, nil)
	ctx := ctxT(t)
	w2, err := model.Preset("tiny", 2)
	require.NoError(t, err)
	require.NoError(t, e.StageWeights(ctx, w2, 2))
	s, err := e.Add(ctx, Request{ID: "a", PromptTokenIDs: prompt(8, 1), Sampling: greedy(300)})
	require.NoError(t, err)
	_, err = s.Recv(ctx)
	require.NoError(t, err)
	_, errSleep, errCommit := backToBack(t, e,
		func() error { return e.Sleep(ctx, 2, PauseWait) },
		func() error { _, err := e.CommitWeights(ctx, 2); return err })
	require.NoError(t, errSleep)
	require.NoError(t, errCommit)
	require.NoError(t, e.WakeUp(ctx, nil), "the committed weights survive the sleep")
	got, err := e.Weights(ctx)
	require.NoError(t, err)
	assert.Equal(t, w2, got)
	res, err := s.Collect(ctx)
	require.NoError(t, err)
	assert.Equal(t, FinishLength, res.FinishReason)
}
