package sdk

import "slices"

// The UpdateWeights transaction as a pure state machine, in the manner of raft's RawNode: the
// driver feeds it acks, timeouts and the outcome of the desired-state write, and it answers
// with the next action. It does no I/O and reads no clock, so every policy decision is
// unit-tested on its own.

type actionKind int

const (
	actStage      actionKind = iota + 1 // publish stage to targets
	actSetDesired                       // move the desired state to the new version (the commit point)
	actCommit                           // publish commit to targets
	actDone                             // the transaction is over
)

func (k actionKind) String() string {
	switch k {
	case actStage:
		return "stage"
	case actSetDesired:
		return "set_desired"
	case actCommit:
		return "commit"
	case actDone:
		return "done"
	}
	return "?"
}

// action is what the driver must do next.
type action struct {
	kind    actionKind
	targets []string // actStage, actCommit
	outcome Outcome  // actDone
	reason  string   // actDone: why it ended this way
}

type txnPhase int

const (
	phaseIdle txnPhase = iota
	phaseStaging
	phaseDesired
	phaseCommitting
	phaseDone
)

// tracker decides one UpdateWeights transaction.
type tracker struct {
	kind    policyKind
	k       int
	targets []string // sorted, distinct

	phase    txnPhase
	pending  map[string]bool // targets of the current command that have not answered
	stageOK  map[string]bool // answered stage: true ok, false failed
	commitOK map[string]bool
	batches  [][]string // rolling: commit batches; others: one batch, fixed at the decision
	batch    int
	desired  bool // the commit point passed
	result   action
}

func newTracker(kind policyKind, k int, targets []string) *tracker {
	ts := slices.Clone(targets)
	slices.Sort(ts)
	return &tracker{kind: kind, k: k, targets: slices.Compact(ts), stageOK: map[string]bool{}, commitOK: map[string]bool{}}
}

// start begins the transaction: stage on every target.
func (t *tracker) start() action {
	t.phase = phaseStaging
	t.pending = setOf(t.targets)
	return action{kind: actStage, targets: slices.Clone(t.targets)}
}

// stageAck records server's answer to stage; it returns the next action, or ok == false
// to keep waiting.
func (t *tracker) stageAck(server string, staged bool) (action, bool) {
	if t.phase != phaseStaging || !t.pending[server] {
		return action{}, false
	}
	delete(t.pending, server)
	t.stageOK[server] = staged
	return t.decideStage(false)
}

// stageTimeout ends the stage phase: every target that has not answered failed.
func (t *tracker) stageTimeout() action {
	if t.phase != phaseStaging {
		return t.current()
	}
	for id := range t.pending {
		t.stageOK[id] = false
	}
	clear(t.pending)
	a, _ := t.decideStage(true)
	return a
}

func (t *tracker) decideStage(final bool) (action, bool) {
	ok, failed := 0, 0
	for _, v := range t.stageOK {
		if v {
			ok++
		} else {
			failed++
		}
	}
	need := len(t.targets) // all-or-nothing and rolling need every target staged
	if t.kind == policyQuorum {
		need = t.k
	}
	if ok+len(t.pending) < need {
		return t.finish(OutcomeAborted, "too few servers staged for the policy"), true
	}
	if len(t.pending) > 0 && !final {
		return action{}, false
	}
	staged := t.staged()
	if t.kind == policyRolling {
		for b := range slices.Chunk(staged, t.k) {
			t.batches = append(t.batches, b)
		}
		return t.startBatch(), true
	}
	t.batches = [][]string{staged}
	t.phase = phaseDesired
	return action{kind: actSetDesired}, true
}

// staged lists the targets that staged, sorted.
func (t *tracker) staged() []string {
	var out []string
	for _, id := range t.targets {
		if t.stageOK[id] {
			out = append(out, id)
		}
	}
	return out
}

func (t *tracker) startBatch() action {
	t.phase = phaseCommitting
	b := t.batches[t.batch]
	t.pending = setOf(b)
	return action{kind: actCommit, targets: slices.Clone(b)}
}

// desiredWritten reports the desired-state write: written moves past the commit point;
// otherwise (a concurrent writer, Redis down) the transaction ends.
func (t *tracker) desiredWritten(written bool) action {
	if t.phase != phaseDesired {
		return t.current()
	}
	if !written {
		if t.kind == policyRolling && len(t.commitOK) > 0 {
			return t.finish(OutcomePartial, "desired state not written after the rolling commit")
		}
		return t.finish(OutcomeAborted, "desired state not written")
	}
	t.desired = true
	if t.kind == policyRolling {
		return t.finishCommitted()
	}
	return t.startBatch()
}

// commitAck records server's answer to commit.
func (t *tracker) commitAck(server string, committed bool) (action, bool) {
	if t.phase != phaseCommitting || !t.pending[server] {
		return action{}, false
	}
	delete(t.pending, server)
	t.commitOK[server] = committed
	if len(t.pending) > 0 {
		return action{}, false
	}
	return t.batchDone(), true
}

// commitTimeout ends the current commit batch: servers that have not answered failed.
func (t *tracker) commitTimeout() action {
	if t.phase != phaseCommitting {
		return t.current()
	}
	for id := range t.pending {
		t.commitOK[id] = false
	}
	clear(t.pending)
	return t.batchDone()
}

func (t *tracker) batchDone() action {
	if t.kind == policyRolling {
		// A server whose commit failed keeps its staged version and converges by itself once
		// the desired state moves; the roll goes on, so the fleet is never all down at once.
		if t.batch+1 < len(t.batches) {
			t.batch++
			return t.startBatch()
		}
		t.phase = phaseDesired
		return action{kind: actSetDesired}
	}
	return t.finishCommitted()
}

// cancel ends the transaction where it stands (the caller's context ended).
func (t *tracker) cancel() action {
	if t.phase == phaseDone {
		return t.result
	}
	if t.desired || len(t.commitOK) > 0 {
		return t.finish(OutcomePartial, "cancelled after the commit point")
	}
	return t.finish(OutcomeAborted, "cancelled before the commit point")
}

// lost ends the transaction before a commit batch went out because the desired state the
// update wrote is gone or replaced and another writer now binds its version (or a later
// one): nothing of this batch committed, so it is aborted unless an earlier batch's servers
// did.
func (t *tracker) lost(reason string) action {
	if t.phase == phaseDone {
		return t.result
	}
	t.desired = false
	for _, ok := range t.commitOK {
		if ok {
			return t.finish(OutcomePartial, reason)
		}
	}
	return t.finish(OutcomeAborted, reason)
}

func (t *tracker) finishCommitted() action {
	n := 0
	for _, ok := range t.commitOK {
		if ok {
			n++
		}
	}
	switch {
	case n == len(t.targets):
		return t.finish(OutcomeCommitted, "every target serves the new version")
	case t.kind == policyQuorum && n >= t.k:
		return t.finish(OutcomeDegraded, "quorum committed; the rest are stale until they converge")
	}
	return t.finish(OutcomePartial, "some targets did not commit; they are stale until they converge")
}

func (t *tracker) finish(o Outcome, reason string) action {
	t.phase = phaseDone
	clear(t.pending)
	t.result = action{kind: actDone, outcome: o, reason: reason}
	return t.result
}

// current is the action in force (used when an input arrives in the wrong phase).
func (t *tracker) current() action {
	if t.phase == phaseDone {
		return t.result
	}
	return action{}
}

// committed reports whether server committed the new version.
func (t *tracker) committed(server string) bool { return t.commitOK[server] }

// stagedOK reports whether server staged it.
func (t *tracker) stagedOK(server string) bool { return t.stageOK[server] }

func setOf(ids []string) map[string]bool {
	m := make(map[string]bool, len(ids))
	for _, id := range ids {
		m[id] = true
	}
	return m
}
