package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
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
	// Secret signs heartbeats and verifies commands and the desired state (empty: unsigned);
	// Auth, when set, replaces it (an issued server key, or a cached NewAuth(Secret)).
	Secret []byte
	Auth   *protocol.Auth
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
	// Saved is the desired-state record this server accepted last before it restarted (from
	// its state directory; nil: none). It is verified like a record read from the bus and
	// is the floor from which the desired state only moves forward: after a Redis restart
	// that lost the key, the server still knows the fleet's version and writes it back.
	Saved []byte
}

// Work is one thing the I/O loop must execute, on the engine, before it reports back with
// Core.Done. The core hands out one Work at a time.
type Work struct {
	// A command: its envelope and decoded body (one of the protocol command types).
	Envelope *protocol.Envelope
	Command  any
	// Convergence (Envelope == nil) does one of: stage Stage, run Commit, Pause, Sleep, Wake
	// (then resume when Resume is set too) or Resume, towards the desired state.
	Stage  *protocol.WeightsRef
	Commit *protocol.Commit
	Pause  *protocol.Pause
	Sleep  *protocol.Sleep
	Wake   bool
	Resume bool
	// Epoch is the desired-state epoch a convergence works towards.
	Epoch int64
	// Trace is the trace context of the call that wrote that desired state.
	Trace map[string]string
	// StayPaused tells a commit not to resume at its end: the desired state says paused.
	StayPaused bool
	// Deadline is when a command's execution gives up (zero for convergence).
	Deadline time.Time
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

// Fetch reports whether w runs on the fetch lane (a stage command or a convergence's
// stage): it may take minutes, so it runs beside the control lane, and abort, pause or
// resume never wait behind it.
func (w *Work) Fetch() bool {
	if w.Envelope != nil {
		return w.Envelope.Kind == protocol.KindStage
	}
	return w.Stage != nil
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
// (each to protocol.Names.Acks(CommandID)), count Rejected and Commands, start Work on the
// control lane and Fetch on the fetch lane, cancel the fetch in flight (CancelFetch), save
// Persist to the state directory, write Repair back over the desired-state key, and read
// the desired state again before anything else (Resync; then call Resynced).
type Ready struct {
	Work        *Work
	Fetch       *Work
	CancelFetch bool
	Persist     []byte
	Repair      *Repair
	Resync      bool
	Acks        []protocol.Ack
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

// Repair asks the loop to replace the desired-state key's value Old (nil: the key is
// missing) with New, the newest record this server accepted, by compare-and-swap: a key
// lost in a Redis restart, overwritten with garbage or with an older record (a replay) is
// put back by the servers, so the fleet's state only moves forward.
type Repair struct{ Old, New []byte }

// Empty reports whether there is nothing to do.
func (r Ready) Empty() bool {
	return r.Work == nil && r.Fetch == nil && !r.CancelFetch && r.Persist == nil && r.Repair == nil && !r.Resync &&
		len(r.Acks) == 0 && len(r.Rejected) == 0 && len(r.Commands) == 0
}

// ErrRefuseJoin is returned when the fleet's desired state says it is signed and this server
// has no secret: it must not take commands it cannot verify.
var ErrRefuseJoin = errors.New("agent: the fleet is signed and this server has no fleet secret; refusing to join")

type seenCmd struct {
	id       string        // the command id, a copy: the key of seen, and the stored ack's
	deadline int64         // Unix ms; forgotten after it
	ack      *protocol.Ack // nil while queued or running
	span     trace.SpanContext
}

// Core is the agent's deterministic state machine: no I/O, no goroutines, no clock of its
// own (every input carries now). It is not safe for concurrent use; the agent's loop owns it.
type Core struct {
	cfg CoreConfig

	known      bool                   // the desired state was read at least once (found or absent)
	desired    *protocol.DesiredState // newest verified; nil: none. Never forgotten, never older.
	desiredRaw []byte                 // desired's bytes, what a repair writes back
	badRaw     []byte                 // last refused desired-state bytes, so a bad key is counted once
	// desiredErr says why the current desired-state key was refused ("" when it was not).
	desiredErr string
	eng        EngineState

	seen       map[string]*seenCmd
	pruned     time.Time // last walk of seen
	queue      []*Work   // control lane
	fetchQueue []*Work   // fetch lane
	busy       *Work
	fetch      *Work
	// waitEpoch holds commands back until the desired state read is at least this epoch
	// (a command said its sender wrote it); resyncing says a read was asked for.
	waitEpoch int64
	resyncing bool
	// localHold: a command aimed at this server alone paused it or put it to sleep, so
	// convergence leaves its run state alone until a resume or wake.
	localHold bool

	wantConverge bool
	convEpoch    int64 // epoch last converged to
	convErr      string
	failVersion  int64 // version whose convergence failed last, at epoch failEpoch
	failEpoch    int64
	retryAt      time.Time
	backoff      time.Duration
	commits      map[int64]Result // what recent commits did, for a commit command that raced one
	rejectTokens float64          // rejection acks allowed now (allowRejectAck)
	rejectAt     time.Time
	stopping     bool
	draining     bool

	out Ready
}

// NewCore returns a core; zero durations take the defaults (ClockSkew protocol.ClockSkew,
// MaxLifetime protocol.MaxCommandLifetime, RetryMin 1s, RetryMax 30s).
func NewCore(cfg CoreConfig) *Core {
	if cfg.ClockSkew <= 0 {
		cfg.ClockSkew = protocol.ClockSkew
	}
	if cfg.MaxLifetime <= 0 {
		cfg.MaxLifetime = protocol.MaxCommandLifetime
	}
	if cfg.RetryMin <= 0 {
		cfg.RetryMin = time.Second
	}
	if cfg.Auth == nil {
		cfg.Auth = protocol.SecretAuth(cfg.Secret)
	}
	if cfg.RetryMax < cfg.RetryMin {
		cfg.RetryMax = max(30*time.Second, cfg.RetryMin)
	}
	c := &Core{cfg: cfg, seen: map[string]*seenCmd{}, commits: map[int64]Result{}, rejectTokens: rejectAcksPerSecond}
	if len(cfg.Saved) > 0 {
		// A saved record that no longer verifies (the secret changed) is dropped: the
		// bus's record decides then.
		if d, err := c.verifyDesired(cfg.Saved); err == nil {
			c.desired, c.desiredRaw = d, bytes.Clone(cfg.Saved)
		}
	}
	return c
}

// verifyDesired decodes and verifies a desired-state record.
func (c *Core) verifyDesired(raw []byte) (*protocol.DesiredState, error) {
	d, err := protocol.DecodeDesiredState(raw)
	if err != nil {
		return nil, err
	}
	if d.Signed && !c.cfg.Auth.Signed() {
		return nil, ErrRefuseJoin
	}
	if err := d.VerifyWith(c.cfg.Auth, c.cfg.Fleet); err != nil {
		return nil, err
	}
	return d, nil
}

// Ready returns and clears what the loop must do.
func (c *Core) Ready() Ready {
	r := c.out
	c.out = Ready{}
	return r
}

// Busy reports whether a Work is out and not Done yet.
func (c *Core) Busy() bool { return c.busy != nil || c.fetch != nil }

// Engine records a fresh engine snapshot.
func (c *Core) Engine(st EngineState) { c.eng = st }

// Desired takes the desired-state key as read: raw with found, or found == false when the
// key does not exist. The core keeps the newest record it ever verified: a missing key, a
// record that fails to decode or verify, and a verified record older than the one it holds
// (a replay) change nothing, and each asks for a Repair that writes the held record back.
// A refused record is counted once per distinct value. ErrRefuseJoin means this server
// must leave.
func (c *Core) Desired(raw []byte, found bool, now time.Time) error {
	defer c.schedule(now)
	c.wantConverge = true
	if !found {
		c.known, c.badRaw, c.desiredErr = true, nil, ""
		c.repair(nil)
		return nil
	}
	if c.desiredRaw != nil && bytes.Equal(raw, c.desiredRaw) {
		c.known, c.badRaw, c.desiredErr = true, nil, ""
		return nil
	}
	if c.badRaw != nil && bytes.Equal(raw, c.badRaw) {
		c.known = true
		c.repair(raw)
		return nil
	}
	d, err := c.verifyDesired(raw)
	if errors.Is(err, ErrRefuseJoin) {
		return err
	}
	if err != nil {
		// Ignored, as a tampered record is. Without a record of its own the server counts
		// as in a fresh fleet (known, nothing desired): one bad write must not keep
		// correct servers out of rotation for good.
		c.known = true
		c.refuseDesired(raw, reasonOf(err))
		c.repair(raw)
		return nil
	}
	c.known, c.badRaw, c.desiredErr = true, nil, ""
	if c.desired != nil && !newer(d, raw, c.desired, c.desiredRaw) {
		// An older record: a stale read, or someone wrote back an old signed record (a
		// replay). The servers hold the newer one and put it back.
		c.out.Rejected = append(c.out.Rejected, ReasonReplayed)
		c.repair(raw)
		return nil
	}
	if c.fetch != nil && c.fetch.Envelope == nil && (d.Weights == nil || *d.Weights != *c.fetch.Stage) {
		c.out.CancelFetch = true // a convergence stage of what the fleet no longer wants
	}
	c.desired, c.desiredRaw = d, bytes.Clone(raw)
	c.out.Persist = c.desiredRaw
	return nil
}

// newer reports whether record a (bytes ra) supersedes b (bytes rb): a higher epoch, or at
// the same epoch (two writers that each rebuilt a lost key) the larger bytes, so every
// server picks the same one.
func newer(a *protocol.DesiredState, ra []byte, b *protocol.DesiredState, rb []byte) bool {
	if a.Epoch != b.Epoch {
		return a.Epoch > b.Epoch
	}
	return bytes.Compare(ra, rb) > 0
}

// repair asks the loop to write the held record over old (the key's value; nil: missing).
func (c *Core) repair(old []byte) {
	if c.desiredRaw == nil {
		return
	}
	c.out.Repair = &Repair{Old: bytes.Clone(old), New: c.desiredRaw}
}

// TakeRepair returns and clears the pending Repair, so the loop can write the record back
// at once after a read, before it heartbeats.
func (c *Core) TakeRepair() *Repair {
	r := c.out.Repair
	c.out.Repair = nil
	return r
}

// Resynced tells the core that the read Ready.Resync asked for was attempted (whatever it
// found): commands held for a newer desired state go ahead.
func (c *Core) Resynced(now time.Time) {
	c.waitEpoch, c.resyncing = 0, false
	c.schedule(now)
}

func (c *Core) desiredEpoch() int64 {
	if c.desired == nil {
		return 0
	}
	return c.desired.Epoch
}

// refuseDesired counts a desired state that fails to decode or verify; it is ignored (the
// last good one stands).
func (c *Core) refuseDesired(raw []byte, reason string) {
	c.badRaw = bytes.Clone(raw)
	c.out.Rejected = append(c.out.Rejected, reason)
	// Said in the heartbeat, so the operator sees why the key is being rewritten.
	c.desiredErr = "the fleet's desired state was refused: " + reason
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
	// The deadline is the sender's clock: allow the same skew as for issued_at, so a
	// trainer whose clock runs behind is not refused outright.
	if err := e.VerifyFor(c.cfg.Auth, c.cfg.Fleet, c.cfg.ServerID, now.Add(-c.cfg.ClockSkew)); err != nil {
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
	// A decoded envelope's strings share the message's bytes: the key is cloned so the
	// replay window keeps ids, not whole messages.
	id := strings.Clone(e.ID)
	c.seen[id] = &seenCmd{id: id, deadline: e.Deadline + c.cfg.ClockSkew.Milliseconds()}
	// The command runs until its lifetime from arrival has passed, and never past its
	// deadline plus the skew allowance: a sender whose clock runs behind gets its whole
	// lifetime, not a deadline already past on this server's clock.
	life := time.Duration(e.Deadline-e.IssuedAt) * time.Millisecond
	w := &Work{Envelope: e, Command: cmd, Deadline: minTime(now.Add(life), time.UnixMilli(e.Deadline).Add(c.cfg.ClockSkew))}
	if w.Fetch() {
		c.fetchQueue = append(c.fetchQueue, w)
	} else {
		c.queue = append(c.queue, w)
	}
	if len(e.Desired) > 0 {
		// The sender attached the desired state it wrote: take it as if read from the key
		// (it is verified the same way), which saves a read before acting.
		_ = c.Desired(e.Desired, true, now)
	}
	if e.Epoch > c.desiredEpoch() {
		// The sender wrote a newer desired state than this server has read: read it before
		// acting, so the command is judged against the state it was sent for.
		c.waitEpoch = max(c.waitEpoch, e.Epoch)
		if !c.resyncing {
			c.resyncing, c.out.Resync = true, true
		}
	}
	c.schedule(now)
}

// reject counts a refusal and, when the sender can be told (the command is this fleet's),
// acks it as rejected.
func (c *Core) reject(e *protocol.Envelope, reason string, err error, now time.Time) {
	c.out.Rejected = append(c.out.Rejected, reason)
	if reason == ReasonWrongFleet || e.ID == "" || !c.allowRejectAck(now) {
		return
	}
	c.ack(protocol.Ack{V: protocol.Version, CommandID: e.ID, ServerID: c.cfg.ServerID, Kind: e.Kind,
		Result: protocol.ResultRejected, Code: reason, Error: err.Error(), WeightSHA256: c.eng.WeightSHA256,
		WeightVersion: c.eng.WeightVersion, StagedVersion: c.eng.StagedVersion, At: now.UnixMilli()},
		AckTrace{Parent: SenderSpan(e.Trace)})
}

// Rejection acks a second, at most: a flood of forged commands costs a Redis write each
// otherwise. Beyond the budget a refusal is only counted; a real sender with a wrong secret
// still learns it from the first ones.
const rejectAcksPerSecond = 16

// allowRejectAck spends one rejection ack from a bucket refilled at rejectAcksPerSecond.
func (c *Core) allowRejectAck(now time.Time) bool {
	if el := now.Sub(c.rejectAt); el > 0 {
		c.rejectTokens = min(rejectAcksPerSecond, c.rejectTokens+el.Seconds()*rejectAcksPerSecond)
	}
	c.rejectAt = now
	if c.rejectTokens < 1 {
		return false
	}
	c.rejectTokens--
	return true
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

// Done reports the end of w, one of the Works handed out, with the engine's state after it.
func (c *Core) Done(w *Work, res Result, st EngineState, now time.Time) {
	switch w {
	case nil:
		return
	case c.busy:
		c.busy = nil
	case c.fetch:
		c.fetch = nil
	default:
		return // not out (a second report): nothing to do
	}
	c.eng = st
	if res.Committed > 0 && w.Envelope == nil {
		// Kept for a commit command that arrives after this self-convergence.
		c.commits = map[int64]Result{res.Committed: res}
	}
	if w.Envelope == nil {
		c.convergeDone(w, res, now)
	} else {
		c.finish(w, res, now)
		if res.Err == nil {
			c.noteHold(w)
		}
	}
	c.wantConverge = true // the engine changed: check again
	c.schedule(now)
}

// noteHold records whether a command that succeeded leaves this server paused or asleep on
// its own account: a pause or sleep that is not fleet-wide is the operator's for the
// servers it names, and convergence leaves them be until a resume or wake.
func (c *Core) noteHold(w *Work) {
	switch w.Envelope.Kind {
	case protocol.KindPause, protocol.KindSleep:
		if !w.Envelope.FleetWide && w.Answer == nil {
			c.localHold = true
		}
	case protocol.KindResume, protocol.KindWake:
		if w.Answer == nil {
			c.localHold = false
		}
	}
}

func (c *Core) finish(w *Work, res Result, now time.Time) {
	e := w.Envelope
	ack := protocol.Ack{V: protocol.Version, CommandID: e.ID, ServerID: c.cfg.ServerID, Kind: e.Kind, Result: protocol.ResultOK,
		Phases: res.Phases, WeightVersion: res.WeightVersion, StagedVersion: res.StagedVersion, WeightSHA256: c.eng.WeightSHA256,
		LastTokenBefore: res.LastTokenBefore, FirstTokenAfter: res.FirstTokenAfter, At: now.UnixMilli()}
	if res.Err != nil {
		ack.Result, ack.Code, ack.Error = protocol.ResultFailed, res.Code, res.Err.Error()
		if ack.Code == "" {
			ack.Code = "failed"
		}
	}
	if s := c.seen[e.ID]; s != nil {
		// Kept for re-acks until the deadline: it must not hold the envelope's strings,
		// substrings of the whole message (a 32-target command is over a kilobyte, and a
		// server keeps every command of the last lifetime).
		stored := ack
		stored.CommandID, stored.Kind = s.id, protocol.Kind(strings.Clone(string(e.Kind)))
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
	switch {
	case w.Commit != nil:
		v = w.Commit.Version
	case w.Stage != nil:
		v = w.Stage.Version
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
	for _, w := range append(c.queue, c.fetchQueue...) {
		c.finish(w, Result{Err: errors.New("the server is shutting down"), Code: CodeStopping,
			WeightVersion: c.eng.WeightVersion, StagedVersion: c.eng.StagedVersion}, now)
	}
	c.queue, c.fetchQueue = nil, nil
	if c.fetch != nil && c.fetch.Envelope == nil {
		c.out.CancelFetch = true
	}
}

// schedule hands out the next work of each idle lane: queued commands first, in order,
// then a convergence step. Nothing goes out while a command waits for a newer desired
// state to be read.
func (c *Core) schedule(now time.Time) {
	if c.stopping || c.waitEpoch > c.desiredEpoch() && c.resyncing {
		return
	}
	if c.busy == nil {
		if w := c.next(&c.queue, now); w != nil {
			c.prepare(w)
			c.busy, c.out.Work = w, w
		}
	}
	if c.fetch == nil {
		if w := c.next(&c.fetchQueue, now); w != nil {
			c.fetch, c.out.Fetch = w, w
		}
	}
	if !c.wantConverge || c.busy != nil || len(c.queue) > 0 || len(c.fetchQueue) > 0 {
		return
	}
	c.wantConverge = false
	w := c.convergeWork(now)
	switch {
	case w == nil:
	case w.Fetch():
		if c.fetch == nil {
			c.fetch, c.out.Fetch = w, w
		}
	default:
		c.busy, c.out.Work = w, w
	}
}

// next pops the first queued command still within its deadline; one that waited past it
// is refused as expired (the sender gave up on it).
func (c *Core) next(q *[]*Work, now time.Time) *Work {
	for len(*q) > 0 {
		w := (*q)[0]
		*q = (*q)[1:]
		if now.After(w.Deadline) {
			delete(c.seen, w.Envelope.ID)
			c.reject(w.Envelope, ReasonExpired, fmt.Errorf("%w: deadline passed while queued", protocol.ErrExpired), now)
			continue
		}
		return w
	}
	return nil
}

// prepare settles, as a control-lane command goes out, what the desired state decides
// about it: whether a commit resumes at its end, whether a commit already happened, and
// whether a fleet-wide run-state command has been superseded.
func (c *Core) prepare(w *Work) {
	switch cm := w.Command.(type) {
	case protocol.Commit:
		if sha := c.desired.Claims(cm.Version); sha != "" && sha != cm.SHA256 {
			// The fleet bound this version to another checkpoint (another trainer's update
			// or roll got there first): committing this one would put two checkpoints under
			// one number.
			w.Answer = &Result{Err: fmt.Errorf("version %d is the fleet's checkpoint %s, not %s", cm.Version, shortDigest(sha), shortDigest(cm.SHA256)),
				Code: "conflict", WeightVersion: c.eng.WeightVersion, StagedVersion: c.eng.StagedVersion}
			break
		}
		w.StayPaused = c.desired != nil && (c.desired.Paused || c.desired.Sleep > 0)
		if prev, ok := c.commits[cm.Version]; ok && c.eng.WeightVersion >= cm.Version && c.eng.WeightSHA256 == cm.SHA256 {
			// A self-convergence committed this version a moment ago: report its cut.
			r := alreadyCommitted(prev, c.eng)
			w.Answer = &r
		}
	case protocol.Pause, protocol.Resume, protocol.Sleep, protocol.Wake:
		if superseded(w.Envelope, c.desired) {
			p := protocol.Phase{Name: string(w.Envelope.Kind), OK: true, Detail: map[string]int64{"superseded": 1}}
			w.Answer = &Result{Phases: []protocol.Phase{p}}
		}
	}
}

// superseded reports whether a fleet-wide run-state command disagrees with the desired
// state the server holds, which is at least as new as the command: a resume after a later
// fleet pause, or a pause replayed after the fleet resumed. Such a command changes
// nothing; convergence keeps the server at the desired state.
func superseded(e *protocol.Envelope, d *protocol.DesiredState) bool {
	if !e.FleetWide || e.Epoch == 0 || d == nil || d.Epoch < e.Epoch {
		return false
	}
	asleep := d.Sleep > 0
	paused := d.Paused || asleep
	switch e.Kind {
	case protocol.KindPause:
		return !paused
	case protocol.KindSleep:
		return !asleep
	case protocol.KindResume:
		return paused
	case protocol.KindWake:
		return asleep
	}
	return false
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func alreadyCommitted(prev Result, st EngineState) Result {
	r := prev
	r.Err, r.Code, r.Committed, r.Span = nil, "", 0, trace.SpanContext{}
	r.WeightVersion, r.StagedVersion = st.WeightVersion, st.StagedVersion
	return r
}

// convergeWork decides the next step that brings the server to the desired state, or nil
// when it is there (or must wait before retrying a failure). Weights first (stage, then
// commit; a stage whose version or digest differs from the desired one is replaced), then
// the run state, in both directions: pause or sleep when the record says so, wake and
// resume when it says serving (unless a command aimed at this server alone holds it).
func (c *Core) convergeWork(now time.Time) *Work {
	if !c.known {
		return nil
	}
	d := c.desired
	if d == nil {
		c.convEpoch, c.convErr = 0, ""
		return nil
	}
	st := c.eng
	mode := protocol.ModeAbort
	if d.Plan != nil && d.Plan.Mode != "" {
		mode = d.Plan.Mode
	}
	pauseMode := mode
	if d.PauseMode != "" {
		pauseMode = d.PauseMode
	}
	base := Work{Epoch: d.Epoch, Trace: d.Trace}
	if d.Weights != nil && st.WeightVersion < d.Weights.Version && st.State != protocol.StateSleeping {
		v := d.Weights.Version
		if v == c.failVersion && d.Epoch == c.failEpoch && now.Before(c.retryAt) {
			// The same record failed a moment ago (a bad digest, a fetch error): back off
			// rather than refetch on every heartbeat; a new epoch retries at once.
			return nil
		}
		if st.StagedVersion != v || st.StagedSHA256 != d.Weights.SHA256 {
			if c.fetch != nil {
				return nil // a stage is in flight; its end converges again
			}
			ref := *d.Weights
			w := base
			w.Stage = &ref
			return &w
		}
		plan := protocol.Commit{Mode: mode, ClearCache: true}
		if d.Plan != nil {
			plan = *d.Plan
			plan.Mode = mode
		}
		plan.Version, plan.SHA256 = v, d.Weights.SHA256
		w := base
		w.Commit, w.StayPaused = &plan, d.Paused || d.Sleep > 0
		return &w
	}
	w := base
	switch {
	case d.Sleep > 0:
		if st.State == protocol.StateSleeping {
			break
		}
		w.Sleep = &protocol.Sleep{Level: d.Sleep, Mode: pauseMode}
		return &w
	case d.Paused:
		if st.State == protocol.StateRunning {
			w.Pause = &protocol.Pause{Mode: pauseMode}
			return &w
		}
		if st.State == protocol.StateSleeping && !c.localHold {
			w.Wake = true // waking may resume (a sleep that paused); the next step pauses
			return &w
		}
	case c.localHold:
	case st.State == protocol.StateSleeping:
		w.Wake, w.Resume = true, true
		return &w
	case st.State == protocol.StatePaused:
		w.Resume = true
		return &w
	}
	c.convEpoch, c.convErr = d.Epoch, ""
	return nil
}

// Drain takes the server out of rotation for good (it is shutting down); work continues.
func (c *Core) Drain() { c.draining = true }

// InRotation reports whether the server may take traffic: it has read the desired state,
// serves its checkpoint (version and digest, or a later version), is neither paused nor
// asleep, the fleet is not paused, and the server is not leaving.
func (c *Core) InRotation() bool {
	return RotationError(c.known, c.desired, c.eng, c.stopping || c.draining) == nil
}

// RotationError is nil when a server may take traffic, else why not; known says whether the
// desired state d (nil: none) was read, st is the engine, stopping whether it is leaving.
func RotationError(known bool, d *protocol.DesiredState, st EngineState, stopping bool) error {
	switch {
	case stopping:
		return errors.New("leaving the fleet")
	case !known:
		return errors.New("the fleet's desired state has not been read yet")
	case d != nil && d.Sleep > 0:
		return fmt.Errorf("the fleet is asleep (level %d)", d.Sleep)
	case d != nil && d.Paused:
		return errors.New("the fleet is paused")
	case d != nil && d.Weights != nil && st.WeightVersion < d.Weights.Version:
		return fmt.Errorf("serving weight version %d, the fleet's desired version is %d", st.WeightVersion, d.Weights.Version)
	case d != nil && d.Weights != nil && st.WeightVersion == d.Weights.Version && st.WeightSHA256 != d.Weights.SHA256:
		return fmt.Errorf("serving weight version %d from checkpoint %s, the fleet's version %d is %s: the fleet must move to a later version",
			st.WeightVersion, shortDigest(st.WeightSHA256), d.Weights.Version, shortDigest(d.Weights.SHA256))
	case st.State != protocol.StateRunning:
		return errors.New("engine is " + string(st.State))
	}
	return nil
}

func shortDigest(s string) string {
	if s == "" {
		return "(unknown)"
	}
	return s[:min(len(s), 12)]
}

// Heartbeat builds this server's (signed) heartbeat.
func (c *Core) Heartbeat(now time.Time) protocol.Heartbeat {
	hb := c.heartbeat(now)
	c.sign(&hb)
	return hb
}

// sign signs hb for writing (nothing on an unsigned fleet).
func (c *Core) sign(hb *protocol.Heartbeat) {
	if c.cfg.Auth.Signed() {
		hb.SignWith(c.cfg.Auth)
	}
}

// heartbeat is Heartbeat unsigned: the agent compares one after every command with what it
// last wrote, and signs only the ones it writes.
func (c *Core) heartbeat(now time.Time) protocol.Heartbeat {
	state := c.eng.State
	switch {
	case c.stopping && c.busy == nil:
		state = protocol.StateStopping
	case c.busy != nil && (c.busy.Commit != nil || isCommit(c.busy.Command)) && c.busy.Answer == nil:
		state = protocol.StateUpdating
	case state == "":
		state = protocol.StateRunning
	}
	rotErr := RotationError(c.known, c.desired, c.eng, c.stopping || c.draining)
	why := "" // why the server is out of rotation, which `rollout fleet status` shows
	if rotErr != nil {
		why = "out of rotation: " + rotErr.Error()
	}
	hb := protocol.Heartbeat{V: protocol.Version, Fleet: c.cfg.Fleet, ServerID: c.cfg.ServerID, State: state,
		WeightVersion: c.eng.WeightVersion, StagedVersion: c.eng.StagedVersion, Epoch: c.convEpoch, InRotation: rotErr == nil,
		WeightSHA256: c.eng.WeightSHA256, DesiredEpoch: c.desiredEpoch(),
		Running: c.eng.Running, Waiting: c.eng.Waiting, KVUsage: c.eng.KVUsage, AdvertiseURL: c.cfg.AdvertiseURL,
		Build: c.cfg.Build, Error: joinErrs(c.desiredErr, c.convErr, why), At: now.UnixMilli()}
	if c.cfg.PeerURL != "" {
		hb.PeerURL, hb.Holds = c.cfg.PeerURL, c.eng.Holds
	}
	return hb
}

func joinErrs(errs ...string) string {
	var out []string
	for _, e := range errs {
		if e != "" {
			out = append(out, e)
		}
	}
	return strings.Join(out, "; ")
}

func isCommit(cmd any) bool {
	_, ok := cmd.(protocol.Commit)
	return ok
}

// DesiredState is the desired state the core holds (nil: none; the record is never
// modified, so the caller may keep it) and whether it was read.
func (c *Core) DesiredState() (d *protocol.DesiredState, known bool) { return c.desired, c.known }
