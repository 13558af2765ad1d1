package faults

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"
)

// History is everything a fault run did and saw. Times are offsets from the start of the run,
// read from the monotonic clock.
type History struct {
	// Seed is the schedule's seed: ROLLOUT_FAULTS_SEED=Seed replays the schedule.
	Seed uint64 `json:"seed"`
	// Ops are the operations the trainers and the operator ran (updates, control calls).
	Ops []Op `json:"ops"`
	// Faults are the faults injected.
	Faults []Fault `json:"faults"`
	// Requests are the generation requests of the load (and the final probe).
	Requests []Request `json:"requests"`
	// Published are the checkpoints the trainers published: which digest each (trainer,
	// version) is.
	Published []Publish `json:"published"`
	// Serving is every observation of a server serving a version under a digest.
	Serving []ServeObs `json:"serving"`
	// Desired is every desired state read from Redis.
	Desired []DesiredObs `json:"desired"`
	// Counters are the servers' violation counters, scraped at the end (and before every
	// restart of a server, which resets them).
	Counters []CounterObs `json:"counters"`
	// Sessions are the multi-turn episodes the session worker ran.
	Sessions []SessionObs `json:"sessions,omitempty"`
	// HealedAt is when every fault was healed and the fleet resumed and woken.
	HealedAt time.Duration `json:"healed_at"`
	// Convergence is, per server, whether it heartbeat in rotation on the final desired
	// version within the bound after HealedAt.
	Convergence []ConvergeObs `json:"convergence"`
}

// Op is one operation of a process: invoked, then completed (or never, Done false).
type Op struct {
	ID       int           `json:"id"`
	Process  string        `json:"process"`
	Kind     string        `json:"kind"`
	Args     string        `json:"args,omitempty"`
	Invoke   time.Duration `json:"invoke"`
	Complete time.Duration `json:"complete"`
	Done     bool          `json:"done"`
	// Result is "ok" or the error's text.
	Result string `json:"result"`
	// Update is set for a weight update.
	Update *UpdateOp `json:"update,omitempty"`
}

// UpdateOp is what a weight update asked for and how it ended.
type UpdateOp struct {
	Trainer string `json:"trainer"`
	Version int64  `json:"version"`
	Digest  string `json:"digest"`
	Policy  string `json:"policy"`
	// Outcome is the result's outcome ("" when the call returned no result).
	Outcome string `json:"outcome,omitempty"`
	// Epoch is the desired-state epoch the update wrote (0: it never reached its commit
	// point).
	Epoch int64 `json:"epoch,omitempty"`
	// Staged are the servers whose stage ack the update counted; Committed those whose
	// commit ack it counted.
	Staged    []string `json:"staged,omitempty"`
	Committed []string `json:"committed,omitempty"`
	// Cancelled: the harness cancelled the call's context on purpose.
	Cancelled bool `json:"cancelled,omitempty"`
}

// CommitPointPassed reports whether the update moved the desired state (its commit point):
// its version is then committed whatever else happened.
func (u *UpdateOp) CommitPointPassed() bool {
	switch u.Outcome {
	case "committed", "degraded", "partial":
		return true
	}
	return u.Epoch > 0
}

// Fault is one fault injected: at At on Target, healed at Healed (0: healed by the final heal,
// or instantaneous).
type Fault struct {
	Kind   string        `json:"kind"`
	Target string        `json:"target,omitempty"`
	At     time.Duration `json:"at"`
	Healed time.Duration `json:"healed,omitempty"`
	Detail string        `json:"detail,omitempty"`
}

// Request is one Generate call of the load.
type Request struct {
	ID      int    `json:"id"`
	Process string `json:"process"`
	// Phase is "load" (during the faults) or "final" (after convergence: it must succeed).
	Phase    string        `json:"phase"`
	Invoke   time.Duration `json:"invoke"`
	Complete time.Duration `json:"complete"`
	Done     bool          `json:"done"`
	// Floor is the newest committed version the client knew when it sent the request (sent
	// as the request's MinVersion): no token may be older.
	Floor   int64    `json:"floor"`
	Err     string   `json:"err,omitempty"`
	Samples []Sample `json:"samples,omitempty"`
}

// Sample is one sample of a request: each token's weight version, and the servers that
// generated it, in order.
type Sample struct {
	Versions []int64  `json:"versions"`
	Servers  []string `json:"servers"`
}

// SessionObs is one multi-turn episode (sdk.Session): the steps the worker saw succeed, in
// order, and the transcript the session held at the end. Each turn is also a Request (its
// tokens' versions are checked there).
type SessionObs struct {
	ID      string `json:"id"`
	Process string `json:"process"`
	Prompt  []int  `json:"prompt"`
	// Steps are the appends and the successful turns; a failed turn is no step.
	Steps []SessionStep `json:"steps"`
	// Completion, Versions and Mask are the session's trajectory at the end (sdk.Trajectory):
	// every token after the prompt, its weight version and loss mask.
	Completion []int   `json:"completion"`
	Versions   []int64 `json:"versions"`
	Mask       []uint8 `json:"mask"`
}

// SessionStep is environment tokens appended (Env) or a model turn: its request's id in
// Requests and the tokens the turn returned with their versions.
type SessionStep struct {
	Env      []int   `json:"env,omitempty"`
	Request  int     `json:"request,omitempty"`
	Tokens   []int   `json:"tokens,omitempty"`
	Versions []int64 `json:"versions,omitempty"`
}

// Publish is one checkpoint a trainer published.
type Publish struct {
	Trainer string        `json:"trainer"`
	Version int64         `json:"version"`
	Digest  string        `json:"digest"`
	At      time.Duration `json:"at"`
}

// ServeObs is one observation that Server served Version under Digest. Source says where it
// comes from ("heartbeat", "commit-ack"), Why how the digest was determined.
type ServeObs struct {
	At      time.Duration `json:"at"`
	Server  string        `json:"server"`
	Version int64         `json:"version"`
	Digest  string        `json:"digest"`
	Source  string        `json:"source"`
	Why     string        `json:"why,omitempty"`
}

// DesiredObs is one desired state read from Redis.
type DesiredObs struct {
	At      time.Duration `json:"at"`
	Epoch   int64         `json:"epoch"`
	Version int64         `json:"version"` // 0: the desired state names no weights
	Digest  string        `json:"digest,omitempty"`
	Paused  bool          `json:"paused"`
}

// CounterObs is one scrape of a violation counter of a server.
type CounterObs struct {
	At     time.Duration `json:"at"`
	Server string        `json:"server"`
	Metric string        `json:"metric"`
	Value  float64       `json:"value"`
}

// ConvergeObs is whether Server heartbeat in rotation, running, on Want within the bound
// after the heal.
type ConvergeObs struct {
	Server    string        `json:"server"`
	Want      int64         `json:"want"`
	Converged bool          `json:"converged"`
	After     time.Duration `json:"after"`
	// Last is the last heartbeat seen, as text.
	Last string `json:"last"`
}

// Recorder builds a History from many goroutines. Its zero value is not usable: use
// NewRecorder.
type Recorder struct {
	start time.Time
	mu    sync.Mutex
	h     History
}

// NewRecorder starts a history with seed; its clock starts now.
func NewRecorder(seed uint64) *Recorder {
	return &Recorder{start: time.Now(), h: History{Seed: seed}}
}

// Now is the run's monotonic clock.
func (r *Recorder) Now() time.Duration { return time.Since(r.start) }

// Invoke records the start of an op and returns its id for Complete.
func (r *Recorder) Invoke(process, kind, args string, u *UpdateOp) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	id := len(r.h.Ops)
	r.h.Ops = append(r.h.Ops, Op{ID: id, Process: process, Kind: kind, Args: args, Invoke: r.Now(), Update: u})
	return id
}

// Complete records how op id ended (err nil: ok); update, when set, fills the op's update
// result.
func (r *Recorder) Complete(id int, err error, update func(*UpdateOp)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	op := &r.h.Ops[id]
	op.Complete, op.Done, op.Result = r.Now(), true, "ok"
	if err != nil {
		op.Result = err.Error()
	}
	if update != nil && op.Update != nil {
		update(op.Update)
	}
}

// Fault records a fault injected now and returns its index for Healed.
func (r *Recorder) Fault(kind, target, detail string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.h.Faults = append(r.h.Faults, Fault{Kind: kind, Target: target, At: r.Now(), Detail: detail})
	return len(r.h.Faults) - 1
}

// Healed records that fault i ended now.
func (r *Recorder) Healed(i int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.h.Faults[i].Healed = r.Now()
}

// Request records a request sent now with its floor and returns its id.
func (r *Recorder) Request(process, phase string, floor int64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	id := len(r.h.Requests)
	r.h.Requests = append(r.h.Requests, Request{ID: id, Process: process, Phase: phase, Invoke: r.Now(), Floor: floor})
	return id
}

// Answer records request id's answer: its samples, or the error.
func (r *Recorder) Answer(id int, samples []Sample, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	q := &r.h.Requests[id]
	q.Complete, q.Done, q.Samples = r.Now(), true, samples
	if err != nil {
		q.Err = err.Error()
	}
}

// Session records a finished episode.
func (r *Recorder) Session(o SessionObs) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.h.Sessions = append(r.h.Sessions, o)
}

// Publish records a checkpoint a trainer published.
func (r *Recorder) Publish(trainer string, version int64, digest string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.h.Published = append(r.h.Published, Publish{Trainer: trainer, Version: version, Digest: digest, At: r.Now()})
}

// Serve records an observation that server served version under digest.
func (r *Recorder) Serve(server string, version int64, digest, source, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.h.Serving = append(r.h.Serving, ServeObs{At: r.Now(), Server: server, Version: version, Digest: digest, Source: source, Why: why})
}

// Desired records a desired state read now.
func (r *Recorder) Desired(o DesiredObs) {
	r.mu.Lock()
	defer r.mu.Unlock()
	o.At = r.Now()
	r.h.Desired = append(r.h.Desired, o)
}

// Counter records a violation counter's value on a server.
func (r *Recorder) Counter(server, metric string, v float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.h.Counters = append(r.h.Counters, CounterObs{At: r.Now(), Server: server, Metric: metric, Value: v})
}

// Heal records that every fault is healed now.
func (r *Recorder) Heal() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.h.HealedAt = r.Now()
}

// Converge records a server's convergence after the heal.
func (r *Recorder) Converge(o ConvergeObs) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.h.Convergence = append(r.h.Convergence, o)
}

// History returns a deep copy of the history so far.
func (r *Recorder) History() History {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.h
	h.Ops = slices.Clone(h.Ops)
	for i := range h.Ops {
		if u := h.Ops[i].Update; u != nil {
			c := *u
			c.Staged, c.Committed = slices.Clone(u.Staged), slices.Clone(u.Committed)
			h.Ops[i].Update = &c
		}
	}
	h.Faults = slices.Clone(h.Faults)
	h.Requests = slices.Clone(h.Requests)
	h.Published = slices.Clone(h.Published)
	h.Serving = slices.Clone(h.Serving)
	h.Desired = slices.Clone(h.Desired)
	h.Counters = slices.Clone(h.Counters)
	h.Convergence = slices.Clone(h.Convergence)
	return h
}

// WriteJSON writes the history as one JSON document.
func (h *History) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	if err := enc.Encode(h); err != nil {
		return fmt.Errorf("faults: write history: %w", err)
	}
	return nil
}
