package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/rolloutkit/rollout/sdk/protocol"
)

// Rejection reasons, the label values of rollout_control_rejected_total.
const (
	ReasonUnsigned     = "unsigned"
	ReasonBadSignature = "bad_signature"
	ReasonExpired      = "expired"
	ReasonReplayed     = "replayed"
	ReasonWrongFleet   = "wrong_fleet"
	ReasonMalformed    = "malformed"
)

// Codes of failed acks that the core produces itself.
const (
	// CodeStopping: the server shut down before it ran the command.
	CodeStopping = "stopping"
)

// CoreConfig configures the pure core.
type CoreConfig struct {
	Fleet, ServerID, AdvertiseURL, Build string
	// PeerURL is the base of the server's /weights/ route (empty: none), advertised with the
	// versions EngineState.Holds lists.
	PeerURL string
	// Secret signs heartbeats and verifies commands and the desired state (empty: unsigned).
	Secret []byte
	// Start is when the agent started: a command issued more than ClockSkew before it is
	// refused as replayed (the ids it executed before a restart are gone).
	Start     time.Time
	ClockSkew time.Duration
	// MaxLifetime is the longest deadline - issued_at accepted; longer ones are refused as
	// replayed, since they would have to be remembered that long.
	MaxLifetime time.Duration
	// RetryMin and RetryMax bound the backoff between failed convergence attempts at one
	// desired version.
	RetryMin, RetryMax time.Duration
}

// Work is one thing the I/O loop must execute, on the engine, before it reports back with
// Core.Done. The core hands out one Work at a time.
type Work struct {
	// A command: its envelope and decoded body (one of the protocol command types).
	Envelope *protocol.Envelope
	Command  any
	// Convergence (Envelope == nil): stage Stage (when set), then run Commit (when set);
	// Pause asks for a pause instead (the desired state says paused).
	Stage  *protocol.WeightsRef
	Commit *protocol.Commit
	Pause  *protocol.Pause
	// Epoch is the desired-state epoch a convergence works towards.
	Epoch int64
	// Trace is the trace context of the call that wrote that desired state.
	Trace map[string]string
	// StayPaused tells a commit not to resume at its end: the desired state says paused.
	StayPaused bool
	// Answer, when set, is the command's result already: a commit of the version a
	// self-convergence just committed reports that cut. The loop still runs it as work, so the
	// command gets its control.process span in the sender's trace, but touches no engine.
	Answer *Result
}

// Kind is the command kind, or "converge".
func (w *Work) Kind() string {
	if w.Envelope != nil {
		return string(w.Envelope.Kind)
	}
	return "converge"
}

// Result is how a Work ended.
type Result struct {
	Phases []protocol.Phase
	// Err is the failure (nil: ok); Code its short machine-readable reason.
	Err  error
	Code string
	// WeightVersion and StagedVersion after the work.
	WeightVersion, StagedVersion int64
	// LastTokenBefore and FirstTokenAfter (Unix ns) bound a commit's generation bubble.
	LastTokenBefore, FirstTokenAfter int64
	// Committed is the version a commit swapped in (0: none).
	Committed int64
	// Span is the work's control.process span: the parent of its ack's span, and the link
	// of a re-ack when the command is delivered again.
	Span trace.SpanContext
}

// CommandCount is one executed command, for rollout_control_commands_total.
type CommandCount struct {
	Kind, Result string
}

// Ready is what the core asks the I/O loop to do after an input (raft's Ready): push Acks
// (each to protocol.Names.Acks(CommandID)), count Rejected and Commands, and start Work.
type Ready struct {
	Work *Work
	Acks []protocol.Ack
	// AckTraces has one entry per ack, in the same order: where its span belongs.
	AckTraces []AckTrace
	Rejected  []string
	Commands  []CommandCount
}

// AckTrace places an ack's span: a child of Parent (the command's control.process span, or
// the sender's span when the command never ran), linked to Links. A re-ack of a command
// delivered again is a child of the redelivery's sender span and links to the original
// control.process span, so it never starts a new root.
type AckTrace struct {
	Parent    trace.SpanContext
	Links     []trace.SpanContext
	Duplicate bool
}

// SenderSpan is the span context of the W3C trace context in an envelope's Trace field; the
// zero value when it is missing or malformed (a bad traceparent is ignored, never an error).
func SenderSpan(carrier map[string]string) trace.SpanContext {
	if len(carrier) == 0 {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(carrier)))
}

func (c *Core) ack(a protocol.Ack, at AckTrace) {
	c.out.Acks = append(c.out.Acks, a)
	c.out.AckTraces = append(c.out.AckTraces, at)
}

// Empty reports whether there is nothing to do.
func (r Ready) Empty() bool {
	return r.Work == nil && len(r.Acks) == 0 && len(r.Rejected) == 0 && len(r.Commands) == 0
}

// ErrRefuseJoin is returned when the fleet's desired state says it is signed and this server
// has no secret: it must not take commands it cannot verify.
var ErrRefuseJoin = errors.New("agent: the fleet is signed and this server has no fleet secret; refusing to join")

type seenCmd struct {
	deadline int64         // Unix ms; forgotten after it
	ack      *protocol.Ack // nil while queued or running
	span     trace.SpanContext
}

// Core is the agent's deterministic state machine: no I/O, no goroutines, no clock of its
// own (every input carries now). It is not safe for concurrent use; the agent's loop owns it.
type Core struct {
	cfg CoreConfig

	known   bool                   // the desired state was read at least once (found or absent)
	desired *protocol.DesiredState // last verified; nil: none
	badRaw  []byte                 // last refused desired-state bytes, so a bad key is counted once
	// desiredErr says why the current desired-state key was refused ("" when it was not).
	desiredErr string
	eng        EngineState

	seen   map[string]*seenCmd
	pruned time.Time // last walk of seen
	queue  []*Work
	busy   *Work

	wantConverge bool
	convEpoch    int64 // epoch last converged to
	convErr      string
	failVersion  int64 // version whose convergence failed last, at epoch failEpoch
	failEpoch    int64
	retryAt      time.Time
	backoff      time.Duration
	commits      map[int64]Result // what recent commits did, for a commit command that raced one
	stopping     bool
	draining     bool

	out Ready
}

// NewCore returns a core; zero durations take the defaults (ClockSkew 30s, MaxLifetime
// 15m, RetryMin 1s, RetryMax 30s).
func NewCore(cfg CoreConfig) *Core {
	if cfg.ClockSkew <= 0 {
		cfg.ClockSkew = 30 * time.Second
	}
	if cfg.MaxLifetime <= 0 {
		cfg.MaxLifetime = 15 * time.Minute
	}
	if cfg.RetryMin <= 0 {
		cfg.RetryMin = time.Second
	}
	if cfg.RetryMax < cfg.RetryMin {
		cfg.RetryMax = max(30*time.Second, cfg.RetryMin)
	}
	return &Core{cfg: cfg, seen: map[string]*seenCmd{}, commits: map[int64]Result{}}
}

// Ready returns and clears what the loop must do.
func (c *Core) Ready() Ready {
	r := c.out
	c.out = Ready{}
	return r
}

// Busy reports whether a Work is out and not Done yet.
func (c *Core) Busy() bool { return c.busy != nil }

// Engine records a fresh engine snapshot.
func (c *Core) Engine(st EngineState) { c.eng = st }

// Desired takes the desired-state key as read: raw with found, or found == false when the
// key does not exist. A record that fails to decode or verify is ignored and counted (once
// per distinct value); ErrRefuseJoin means this server must leave.
func (c *Core) Desired(raw []byte, found bool, now time.Time) error {
	if !found {
		c.known, c.desired, c.badRaw, c.desiredErr = true, nil, nil, ""
		c.wantConverge = true
		c.schedule(now)
		return nil
	}
	if c.badRaw != nil && bytes.Equal(raw, c.badRaw) {
		return nil
	}
	d, derr := protocol.DecodeDesiredState(raw)
	if derr != nil {
		return c.refuseDesired(raw, ReasonMalformed) // ignored, as a tampered record is
	}
	if d.Signed && len(c.cfg.Secret) == 0 {
		return ErrRefuseJoin
	}
	if verr := d.Verify(c.cfg.Secret, c.cfg.Fleet); verr != nil {
		return c.refuseDesired(raw, reasonOf(verr))
	}
	c.badRaw, c.desiredErr = nil, ""
	if c.desired != nil && d.Epoch < c.desired.Epoch {
		return nil // an older record (a stale read): keep the newer one
	}
	c.known, c.desired = true, d
	c.wantConverge = true
	c.schedule(now)
	return nil
}

// refuseDesired counts a desired state that fails to decode or verify; it is ignored (the
// last good one stands), so the answer is no error.
func (c *Core) refuseDesired(raw []byte, reason string) error {
	c.badRaw = bytes.Clone(raw)
	c.out.Rejected = append(c.out.Rejected, reason)
	// Said in the heartbeat: a server with a secret in an unsigned fleet (or the reverse)
	// stays out of rotation, and the operator should see why.
	c.desiredErr = "the fleet's desired state was refused: " + reason
	return nil
}

// Converge asks for a convergence check (after a resubscription or a heartbeat).
func (c *Core) Converge(now time.Time) {
	c.wantConverge = true
	c.schedule(now)
}

// Envelope takes one message from the control channel.
func (c *Core) Envelope(raw []byte, now time.Time) {
	c.prune(now)
	e, err := protocol.DecodeEnvelope(raw)
	if err != nil {
		c.out.Rejected = append(c.out.Rejected, ReasonMalformed)
		return
	}
	if !e.ForServer(c.cfg.ServerID) {
		return
	}
	if err := e.Verify(c.cfg.Secret, c.cfg.Fleet, now); err != nil {
		c.reject(e, reasonOf(err), err, now)
		return
	}
	if s, ok := c.seen[e.ID]; ok {
		if s.ack != nil {
			dup := *s.ack
			dup.Duplicate, dup.At = true, now.UnixMilli()
			at := AckTrace{Parent: SenderSpan(e.Trace), Duplicate: true}
			if s.span.IsValid() {
				at.Links = []trace.SpanContext{s.span}
				if !at.Parent.IsValid() {
					at.Parent = s.span
				}
			}
			c.ack(dup, at)
		}
		return // still queued or running: its ack is on the way
	}
	if e.IssuedAt < c.cfg.Start.Add(-c.cfg.ClockSkew).UnixMilli() {
		c.reject(e, ReasonReplayed, fmt.Errorf("command issued at %s, before this server started", time.UnixMilli(e.IssuedAt).UTC().Format(time.RFC3339Nano)), now)
		return
	}
	if life := time.Duration(e.Deadline-e.IssuedAt) * time.Millisecond; life > c.cfg.MaxLifetime {
		c.reject(e, ReasonReplayed, fmt.Errorf("command lifetime %s above the maximum %s", life, c.cfg.MaxLifetime), now)
		return
	}
	cmd, err := e.Command()
	if err != nil {
		c.reject(e, ReasonMalformed, err, now)
		return
	}
	c.seen[e.ID] = &seenCmd{deadline: e.Deadline}
	c.queue = append(c.queue, &Work{Envelope: e, Command: cmd})
	c.schedule(now)
}

// reject counts a refusal and, when the sender can be told (the command is this fleet's),
// acks it as rejected.
func (c *Core) reject(e *protocol.Envelope, reason string, err error, now time.Time) {
	c.out.Rejected = append(c.out.Rejected, reason)
	if reason == ReasonWrongFleet || e.ID == "" {
		return
	}
	c.ack(protocol.Ack{V: protocol.Version, CommandID: e.ID, ServerID: c.cfg.ServerID, Kind: e.Kind,
		Result: protocol.ResultRejected, Code: reason, Error: err.Error(),
		WeightVersion: c.eng.WeightVersion, StagedVersion: c.eng.StagedVersion, At: now.UnixMilli()},
		AckTrace{Parent: SenderSpan(e.Trace)})
}

func reasonOf(err error) string {
	switch {
	case errors.Is(err, protocol.ErrUnsigned):
		return ReasonUnsigned
	case errors.Is(err, protocol.ErrBadSignature):
		return ReasonBadSignature
	case errors.Is(err, protocol.ErrExpired):
		return ReasonExpired
	case errors.Is(err, protocol.ErrWrongFleet):
		return ReasonWrongFleet
	}
	return ReasonMalformed
}

// prune forgets commands past their deadline: a copy arriving later is refused as expired
// before the dedupe check, so nothing needs them. It walks the map at most once a second, so
// a burst of commands costs no more than one walk.
func (c *Core) prune(now time.Time) {
	if now.Sub(c.pruned) < time.Second && !now.Before(c.pruned) {
		return
	}
	c.pruned = now
	ms := now.UnixMilli()
	for id, s := range c.seen {
		if s.ack != nil && s.deadline < ms {
			delete(c.seen, id)
		}
	}
}

// Done reports the end of the Work handed out, with the engine's state after it.
func (c *Core) Done(res Result, st EngineState, now time.Time) {
	w := c.busy
	c.busy = nil
	c.eng = st
	if w == nil {
		return
	}
	if res.Committed > 0 && w.Envelope == nil {
		// Kept for a commit command that arrives after this self-convergence.
		c.commits = map[int64]Result{res.Committed: res}
	}
	if w.Envelope == nil {
		c.convergeDone(w, res, now)
	} else {
		c.finish(w, res, now)
	}
	c.wantConverge = true // the engine changed: check again
	c.schedule(now)
}

func (c *Core) finish(w *Work, res Result, now time.Time) {
	e := w.Envelope
	ack := protocol.Ack{V: protocol.Version, CommandID: e.ID, ServerID: c.cfg.ServerID, Kind: e.Kind, Result: protocol.ResultOK,
		Phases: res.Phases, WeightVersion: res.WeightVersion, StagedVersion: res.StagedVersion,
		LastTokenBefore: res.LastTokenBefore, FirstTokenAfter: res.FirstTokenAfter, At: now.UnixMilli()}
	if res.Err != nil {
		ack.Result, ack.Code, ack.Error = protocol.ResultFailed, res.Code, res.Err.Error()
		if ack.Code == "" {
			ack.Code = "failed"
		}
	}
	if s := c.seen[e.ID]; s != nil {
		stored := ack
		s.ack = &stored
		s.span = res.Span
	}
	at := AckTrace{Parent: res.Span}
	if !at.Parent.IsValid() {
		at.Parent = SenderSpan(e.Trace)
	}
	c.ack(ack, at)
	c.out.Commands = append(c.out.Commands, CommandCount{Kind: string(e.Kind), Result: string(ack.Result)})
}

func (c *Core) convergeDone(w *Work, res Result, now time.Time) {
	if res.Err == nil {
		c.convErr, c.failVersion, c.backoff = "", 0, 0
		return
	}
	c.convErr = res.Err.Error()
	v := int64(0)
	if w.Commit != nil {
		v = w.Commit.Version
	}
	if v != c.failVersion || w.Epoch != c.failEpoch {
		c.failVersion, c.failEpoch, c.backoff = v, w.Epoch, 0
	}
	c.backoff = min(max(2*c.backoff, c.cfg.RetryMin), c.cfg.RetryMax)
	c.retryAt = now.Add(c.backoff)
}

// Stop makes the core hand out no more work; queued commands are acked as failed with
// CodeStopping.
func (c *Core) Stop(now time.Time) {
	c.stopping = true
	for _, w := range c.queue {
		c.finish(w, Result{Err: errors.New("the server is shutting down"), Code: CodeStopping,
			WeightVersion: c.eng.WeightVersion, StagedVersion: c.eng.StagedVersion}, now)
	}
	c.queue = nil
}

// schedule hands out the next work when idle: queued commands first, in order, then a
// convergence step.
func (c *Core) schedule(now time.Time) {
	if c.busy != nil || c.stopping {
		return
	}
	for len(c.queue) > 0 {
		w := c.queue[0]
		c.queue = c.queue[1:]
		if now.UnixMilli() > w.Envelope.Deadline {
			// It waited behind longer work past its deadline: the sender gave up on it.
			delete(c.seen, w.Envelope.ID)
			c.reject(w.Envelope, ReasonExpired, fmt.Errorf("%w: deadline passed while queued", protocol.ErrExpired), now)
			continue
		}
		if cm, ok := w.Command.(protocol.Commit); ok {
			w.StayPaused = c.desired != nil && c.desired.Paused
			if prev, ok := c.commits[cm.Version]; ok && c.eng.WeightVersion >= cm.Version {
				// A self-convergence committed this version a moment ago: report its cut.
				r := alreadyCommitted(prev, c.eng)
				w.Answer = &r
			}
		}
		c.busy = w
		c.out.Work = w
		return
	}
	if !c.wantConverge {
		return
	}
	c.wantConverge = false
	if w := c.convergeWork(now); w != nil {
		c.busy = w
		c.out.Work = w
	}
}

func alreadyCommitted(prev Result, st EngineState) Result {
	r := prev
	r.Err, r.Code, r.Committed, r.Span = nil, "", 0, trace.SpanContext{}
	r.WeightVersion, r.StagedVersion = st.WeightVersion, st.StagedVersion
	return r
}

// convergeWork decides what brings the server to the desired state, or nil when it is there
// (or must wait before retrying a failure).
func (c *Core) convergeWork(now time.Time) *Work {
	if !c.known {
		return nil
	}
	d := c.desired
	if d == nil {
		c.convEpoch, c.convErr = 0, ""
		return nil
	}
	mode := protocol.ModeAbort
	if d.Plan != nil && d.Plan.Mode != "" {
		mode = d.Plan.Mode
	}
	if d.Weights != nil && c.eng.WeightVersion < d.Weights.Version {
		if d.Weights.Version == c.failVersion && d.Epoch == c.failEpoch && now.Before(c.retryAt) {
			// The same record failed a moment ago (a bad digest, a fetch error): back off
			// rather than refetch on every heartbeat; a new epoch retries at once.
			return nil
		}
		plan := protocol.Commit{Mode: mode, ClearCache: true}
		if d.Plan != nil {
			plan = *d.Plan
			plan.Mode = mode
		}
		plan.Version = d.Weights.Version
		w := &Work{Commit: &plan, Epoch: d.Epoch, Trace: d.Trace, StayPaused: d.Paused}
		if c.eng.StagedVersion != d.Weights.Version {
			ref := *d.Weights
			w.Stage = &ref
		}
		return w
	}
	if d.Paused && c.eng.State == "running" {
		return &Work{Pause: &protocol.Pause{Mode: mode}, Epoch: d.Epoch, Trace: d.Trace}
	}
	c.convEpoch, c.convErr = d.Epoch, ""
	return nil
}

// Drain takes the server out of rotation for good (it is shutting down); work continues.
func (c *Core) Drain() { c.draining = true }

// InRotation reports whether the server may take traffic: it has read the desired state,
// serves at least its version, is neither paused nor asleep, the fleet is not paused, and the
// server is not leaving.
func (c *Core) InRotation() bool {
	return inRotation(c.known, c.desired, c.eng, c.stopping || c.draining)
}

func inRotation(known bool, d *protocol.DesiredState, st EngineState, stopping bool) bool {
	if !known || stopping || st.State != "running" {
		return false
	}
	if d == nil {
		return true
	}
	return !d.Paused && (d.Weights == nil || st.WeightVersion >= d.Weights.Version)
}

// Heartbeat builds this server's (signed) heartbeat.
func (c *Core) Heartbeat(now time.Time) protocol.Heartbeat {
	state := c.eng.State
	switch {
	case c.stopping && c.busy == nil:
		state = protocol.StateStopping
	case c.busy != nil && (c.busy.Commit != nil || isCommit(c.busy.Command)):
		state = protocol.StateUpdating
	case state == "":
		state = protocol.StateRunning
	}
	hb := protocol.Heartbeat{V: protocol.Version, Fleet: c.cfg.Fleet, ServerID: c.cfg.ServerID, State: state,
		WeightVersion: c.eng.WeightVersion, StagedVersion: c.eng.StagedVersion, Epoch: c.convEpoch, InRotation: c.InRotation(),
		Running: c.eng.Running, Waiting: c.eng.Waiting, KVUsage: c.eng.KVUsage, AdvertiseURL: c.cfg.AdvertiseURL,
		Build: c.cfg.Build, Error: joinErrs(c.desiredErr, c.convErr), At: now.UnixMilli()}
	if c.cfg.PeerURL != "" {
		hb.PeerURL, hb.Holds = c.cfg.PeerURL, c.eng.Holds
	}
	if len(c.cfg.Secret) > 0 {
		hb.Sign(c.cfg.Secret)
	}
	return hb
}

func joinErrs(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}

func isCommit(cmd any) bool {
	_, ok := cmd.(protocol.Commit)
	return ok
}

// DesiredVersion is the version the desired state names (0: none) and whether the fleet is
// paused, as last read.
func (c *Core) DesiredVersion() (version int64, paused, known bool) {
	if c.desired == nil {
		return 0, false, c.known
	}
	if c.desired.Weights != nil {
		version = c.desired.Weights.Version
	}
	return version, c.desired.Paused, c.known
}
