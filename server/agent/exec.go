package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/rolloutkit/rollout/sdk/protocol"
)

// Bounds of a commit's steps after the pause: they run on even when the command's deadline
// passes (a server must not stay half-cut because the sender gave up), but not forever.
const (
	cutTimeout = time.Minute
	// firstTokenWait bounds the wait for the first token after a resume that the ack reports.
	firstTokenWait = 2 * time.Second
)

// execute runs one Work on the engine and reports what happened. It never panics on bad
// input: the core only hands out validated commands.
func (a *Agent) execute(ctx context.Context, w *Work) Result {
	return a.traced(ctx, w, func(ctx context.Context) Result {
		if w.Envelope == nil {
			return a.converge(ctx, w)
		}
		if !w.Deadline.IsZero() {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, w.Deadline)
			defer cancel()
		}
		if w.Answer != nil {
			return *w.Answer
		}
		return a.command(ctx, w)
	})
}

// resumeAtOnce runs w in the caller's goroutine when it is a Resume command the engine answers
// without its loop (running, no control call pending: engine.Engine.ResumeIfRunning), and
// reports whether it did. The agent's loop calls it instead of handing w to the control lane:
// the resume that follows every update and every retried resume then costs each server no
// goroutine hop and no wait. It never blocks, so the loop keeps its pace; when the engine is
// not in that state, w goes to the lane as any command.
func (a *Agent) resumeAtOnce(ctx context.Context, w *Work) (Result, bool) {
	if w.Envelope == nil || w.Answer != nil {
		return Result{}, false
	}
	if _, ok := w.Command.(protocol.Resume); !ok {
		return Result{}, false
	}
	eng, ok := a.cfg.Engine.(interface{ ResumeIfRunning() bool })
	if !ok {
		return Result{}, false
	}
	p := a.begin("resume")
	if !eng.ResumeIfRunning() {
		return Result{}, false
	}
	ph := p.end(nil)
	return a.traced(ctx, w, func(context.Context) Result { return Result{Phases: []protocol.Phase{ph}} }), true
}

// traced runs body, w's execution, inside w's span and completes its Result: the versions
// after it, the error code and the span.
func (a *Agent) traced(ctx context.Context, w *Work, body func(ctx context.Context) Result) Result {
	ctx, span := a.span(ctx, w)
	defer span.End()
	res := body(ctx)
	st := a.engineState()
	res.WeightVersion, res.StagedVersion = st.WeightVersion, st.StagedVersion
	if res.Err != nil {
		if res.Code == "" {
			res.Code = a.code(res.Err)
		}
		span.RecordError(res.Err)
		span.SetStatus(codes.Error, res.Err.Error())
		a.log.Warn("agent: work failed", "kind", w.Kind(), "code", res.Code, "err", res.Err)
	} else {
		a.log.Debug("agent: work done", "kind", w.Kind(), "weight_version", res.WeightVersion)
	}
	span.SetAttributes(attribute.Int64("rollout.weight_version", res.WeightVersion))
	res.Span = span.SpanContext()
	return res
}

// Span names of the fleet agent.
const (
	// SpanProcess is one command's execution on this server.
	SpanProcess = "control.process"
	// SpanConverge is one self-convergence step towards the fleet's desired state.
	SpanConverge = "control.converge"
	// SpanAck is the push of one ack (Duplicate marks a re-ack).
	SpanAck = "control.ack"
)

// span starts the work's span: a command's span is a child of the sender's (from the
// envelope's trace context) and links to it, so the transaction is one trace even through
// backends that show links only. A missing or malformed trace context makes it a root.
func (a *Agent) span(ctx context.Context, w *Work) (context.Context, trace.Span) {
	name, carrier, link := SpanConverge, w.Trace, "desired_state"
	if e := w.Envelope; e != nil {
		name, carrier, link = SpanProcess, e.Trace, "sender"
	}
	parent := SenderSpan(carrier)
	if parent.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, parent)
	}
	ctx, span := a.cfg.Tracer.Start(ctx, name, a.consumerSpan...)
	if !span.IsRecording() {
		return ctx, span // no tracing: every server pays this per command, so build nothing
	}
	// A convergence joins the trace of the call that set the desired state, so an update's
	// cut is in its trace whether a command or the server itself ran it.
	if parent.IsValid() {
		span.AddLink(trace.Link{SpanContext: parent, Attributes: []attribute.KeyValue{attribute.String("rollout.link", link)}})
	}
	span.SetAttributes(attribute.String("rollout.server_id", a.cfg.ServerID), attribute.String("rollout.fleet", a.cfg.Fleet))
	if e := w.Envelope; e != nil {
		span.SetAttributes(attribute.String("rollout.command_id", e.ID), attribute.String("rollout.command", string(e.Kind)))
	} else {
		span.SetAttributes(attribute.Int64("rollout.epoch", w.Epoch))
	}
	return ctx, span
}

func (a *Agent) code(err error) string {
	if c := a.cfg.ErrorCode(err); c != "" && c != "internal" {
		return c
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	}
	return "engine_error"
}

// phase times one step.
type phase struct {
	a     *Agent
	p     protocol.Phase
	start time.Time
}

func (a *Agent) begin(name string) *phase {
	return &phase{a: a, p: protocol.Phase{Name: name}, start: time.Now()}
}

func (p *phase) detail(k string, v int64) {
	if p.p.Detail == nil {
		p.p.Detail = map[string]int64{}
	}
	p.p.Detail[k] = v
}

func (p *phase) end(err error) protocol.Phase {
	p.p.Seconds = time.Since(p.start).Seconds()
	p.p.OK = err == nil
	if err != nil {
		p.p.Error = err.Error()
	}
	return p.p
}

func resetDetail(p *phase, r ResetResult) {
	p.detail("blocks_cleared", int64(r.BlocksCleared))
	p.detail("jobs_flushed", int64(r.JobsFlushed))
	p.detail("preempted", int64(r.Preempted))
}

// runPhase times one step of a command or convergence into res: its phase, and its error
// as the result's.
func (a *Agent) runPhase(res *Result, name string, f func(p *phase) error) error {
	p := a.begin(name)
	err := f(p)
	res.Phases = append(res.Phases, p.end(err))
	res.Err = err
	return err
}

// command runs one command's body.
func (a *Agent) command(ctx context.Context, w *Work) Result {
	eng := a.cfg.Engine
	var res Result
	switch c := w.Command.(type) {
	case protocol.Pause:
		_ = a.runPhase(&res, "pause", func(p *phase) error {
			r, err := eng.Pause(ctx, c.Mode, c.ClearCache)
			if c.ClearCache {
				resetDetail(p, r)
			}
			return err
		})
	case protocol.Resume:
		_ = a.runPhase(&res, "resume", func(*phase) error { return eng.Resume(ctx) })
	case protocol.Sleep:
		_ = a.runPhase(&res, "sleep", func(p *phase) error {
			p.detail("level", int64(c.Level))
			return eng.Sleep(ctx, c.Level, c.Mode)
		})
	case protocol.Wake:
		_ = a.runPhase(&res, "wake", func(*phase) error { return eng.WakeUp(ctx, c.Tags) })
	case protocol.Reset:
		_ = a.runPhase(&res, "reset", func(p *phase) error {
			r, err := eng.Reset(ctx, c.ResetRunning, c.ResetExternal)
			resetDetail(p, r)
			if err == nil && !r.Success {
				res.Code = "reset_incomplete"
				return fmt.Errorf("reset incomplete: %s", r.Reason)
			}
			return err
		})
	case protocol.Abort:
		_ = a.runPhase(&res, "abort", func(p *phase) error {
			p.detail("aborted", int64(eng.Abort(c.RequestIDs)))
			return nil
		})
	case protocol.Stage:
		return a.stage(ctx, c.Weights, c.Sources[a.cfg.ServerID], c.Grant, false)
	case protocol.Commit:
		return a.commit(ctx, c, w.StayPaused)
	default:
		res.Err, res.Code = fmt.Errorf("agent: no executor for %T", w.Command), ReasonMalformed
	}
	return res
}

// converge runs one convergence step towards the desired state: a stage, a commit, or a
// pause, sleep, wake (and resume) or resume.
func (a *Agent) converge(ctx context.Context, w *Work) Result {
	eng := a.cfg.Engine
	var res Result
	switch {
	case w.Stage != nil:
		a.log.Info("agent: converging: staging the fleet's desired version", "version", w.Stage.Version, "epoch", w.Epoch)
		return a.stage(ctx, *w.Stage, "", "", true)
	case w.Commit != nil:
		a.log.Info("agent: converging: committing the fleet's desired version", "version", w.Commit.Version, "epoch", w.Epoch)
		return a.commit(ctx, *w.Commit, w.StayPaused)
	case w.Pause != nil:
		a.log.Info("agent: converging: the fleet is paused", "mode", w.Pause.Mode, "epoch", w.Epoch)
		_ = a.runPhase(&res, "pause", func(*phase) error { _, err := eng.Pause(ctx, w.Pause.Mode, w.Pause.ClearCache); return err })
	case w.Sleep != nil:
		a.log.Info("agent: converging: the fleet is asleep", "level", w.Sleep.Level, "epoch", w.Epoch)
		_ = a.runPhase(&res, "sleep", func(*phase) error { return eng.Sleep(ctx, w.Sleep.Level, w.Sleep.Mode) })
	case w.Wake:
		a.log.Info("agent: converging: the fleet is awake", "epoch", w.Epoch)
		if a.runPhase(&res, "wake", func(*phase) error { return eng.WakeUp(ctx, nil) }) == nil && w.Resume && eng.State().State == protocol.StatePaused {
			_ = a.runPhase(&res, "resume", func(*phase) error { return eng.Resume(ctx) })
		}
	case w.Resume:
		a.log.Info("agent: converging: the fleet is serving", "epoch", w.Epoch)
		_ = a.runPhase(&res, "resume", func(*phase) error { return eng.Resume(ctx) })
	}
	return res
}

// stage fetches, verifies and stages ref while the engine keeps serving, from peer (a
// server id the stage command assigned; "" for the origin only) first.
// With desired (a convergence to the desired state) a newer staged set is dropped first;
// a stage command leaves it (another trainer's update may be about to commit it).
func (a *Agent) stage(ctx context.Context, ref protocol.WeightsRef, peer, grant string, desired bool) Result {
	st := a.engineState()
	p := a.begin("stage")
	p.detail("version", ref.Version)
	switch {
	case st.WeightVersion >= ref.Version:
		p.detail("already_serving", 1)
		return Result{Phases: []protocol.Phase{p.end(nil)}}
	case st.StagedVersion == ref.Version && st.StagedSHA256 == ref.SHA256:
		// A version and its digest name one checkpoint: a second stage of it, e.g. a retried
		// transaction, has nothing to do. The same version from another checkpoint (another
		// trainer's, or a stage whose digest this agent never learnt) is fetched and
		// replaces the staged set.
		p.detail("already_staged", 1)
		return Result{Phases: []protocol.Phase{p.end(nil)}}
	}
	if st.StagedVersion == ref.Version {
		p.detail("replaced", 1)
	}
	if desired && st.StagedVersion > ref.Version {
		// A newer version is staged, by an update that did not reach its commit point: the
		// fleet wants this one, and the engine stages only upwards.
		if dropped, err := a.cfg.Engine.DropStaged(ctx, st.StagedVersion); err != nil {
			return Result{Phases: []protocol.Phase{p.end(err)}, Err: err}
		} else if dropped {
			p.detail("dropped_staged", st.StagedVersion)
		}
	}
	var err error
	if a.cfg.StagePeers != nil {
		req := StageRequest{Ref: ref, Grant: grant}
		if req.Grant == "" {
			req.Grant = a.cfg.Auth.PeerGrant(a.cfg.Fleet, ref.Version, ref.SHA256)
		}
		if peer != "" {
			req.Peer, req.PeerRefused = a.lookupPeer(ctx, peer, ref.Version)
			if req.PeerRefused != nil {
				a.log.Warn("agent: refusing the assigned weight source; fetching from the origin", "peer", peer, "err", req.PeerRefused)
				p.detail("peer_refused", 1)
			}
		}
		var rep StageReport
		rep, err = a.cfg.StagePeers(ctx, req)
		p.detail("bytes", rep.OriginBytes+rep.PeerBytes)
		p.detail("origin_bytes", rep.OriginBytes)
		p.detail("peer_bytes", rep.PeerBytes)
		if rep.SourceFailures > 0 {
			p.detail("source_failures", rep.SourceFailures)
		}
	} else {
		var n int64
		n, err = a.cfg.Stage(ctx, ref)
		p.detail("bytes", n)
		p.detail("origin_bytes", n)
	}
	if err == nil {
		a.mu.Lock()
		a.staged = digestOf{ref.Version, ref.SHA256}
		a.mu.Unlock()
	}
	return Result{Phases: []protocol.Phase{p.end(err)}, Err: err}
}

// commit runs the cut: pause(mode, clear_cache) → sleep(level, when > 0) → swap → wake (when
// slept) → resume (unless the fleet's desired state says paused). It records
// the last token step before the pause and, when requests are waiting, the first after the
// resume.
func (a *Agent) commit(ctx context.Context, c protocol.Commit, stayPaused bool) Result {
	eng := a.cfg.Engine
	st := a.engineState()
	var res Result
	if st.WeightVersion > c.Version || st.WeightVersion == c.Version && st.WeightSHA256 == c.SHA256 {
		p := a.begin("commit")
		p.detail("version", st.WeightVersion)
		p.detail("already_serving", 1)
		res.Phases = append(res.Phases, p.end(nil))
		return res
	}
	if st.WeightVersion == c.Version {
		res.Code = "conflict"
		res.Err = fmt.Errorf("version %d is served from checkpoint %s, not %s", c.Version, shortDigest(st.WeightSHA256), shortDigest(c.SHA256))
		return res
	}
	if st.StagedVersion != c.Version {
		res.Code = "not_staged"
		res.Err = fmt.Errorf("version %d is not staged (staged: %d, serving: %d)", c.Version, st.StagedVersion, st.WeightVersion)
		return res
	}
	if st.StagedSHA256 != c.SHA256 {
		res.Code = "conflict"
		res.Err = fmt.Errorf("version %d is staged from checkpoint %s, not %s", c.Version, shortDigest(st.StagedSHA256), shortDigest(c.SHA256))
		return res
	}
	step := func(name string, f func(p *phase) error) error {
		p := a.begin(name)
		err := f(p)
		res.Phases = append(res.Phases, p.end(err))
		if err != nil && res.Err == nil {
			res.Err = fmt.Errorf("%s: %w", name, err)
		}
		return err
	}
	wasPaused := st.State != protocol.StateRunning
	// Whether the server was generating: after a pause that aborted its requests, their
	// clients resubmit (the SDK continues each sample), so the first token after the resume
	// is worth waiting for even when nothing waits at the resume itself.
	loaded := !wasPaused && st.Running+st.Waiting > 0
	// From the pause on, the cut runs to its end whatever the sender's deadline.
	cut, cancel := context.WithTimeout(context.WithoutCancel(ctx), cutTimeout)
	defer cancel()
	if err := step("pause", func(p *phase) error {
		r, err := eng.Pause(ctx, c.Mode, c.ClearCache)
		if c.ClearCache {
			resetDetail(p, r)
		}
		return err
	}); err != nil {
		// A pause cut short by the deadline may still have taken effect in the engine: undo
		// it rather than leave the server paused by a commit that did not happen.
		if !wasPaused && !stayPaused && eng.State().State == protocol.StatePaused {
			_ = step("resume", func(*phase) error { return eng.Resume(cut) })
		}
		return res
	}
	if t := eng.Steps().Last(); !t.IsZero() {
		res.LastTokenBefore = t.UnixNano()
	}
	slept := false
	if c.SleepLevel > 0 {
		slept = step("sleep", func(p *phase) error {
			p.detail("level", int64(c.SleepLevel))
			return eng.Sleep(cut, c.SleepLevel, c.Mode)
		}) == nil
	}
	if res.Err == nil {
		start := time.Now()
		if step("commit", func(p *phase) error {
			v, err := eng.Commit(cut, c.Version)
			p.detail("version", v)
			if err == nil {
				res.Committed = v
				a.mu.Lock()
				a.serving = digestOf{v, c.SHA256}
				a.mu.Unlock()
			}
			return err
		}) == nil {
			if o, ok := a.cfg.Metrics.(UpdateObserver); ok {
				o.ObserveUpdate(cut, "commit", time.Since(start))
			}
		}
	}
	if slept {
		_ = step("wake", func(*phase) error { return eng.WakeUp(cut, nil) })
	}
	if stayPaused {
		return res
	}
	// While paused the engine's request counts are exact: requests waiting now generate
	// right after the resume, and the ack waits (briefly) for their first token.
	running, waiting, cerr := eng.Requests(cut)
	eng.Steps().Arm()
	if err := step("resume", func(*phase) error { return eng.Resume(cut) }); err != nil {
		return res
	}
	if (loaded || cerr == nil && running+waiting > 0) && res.Committed > 0 {
		// Bounded by the command's deadline too: the ack must arrive before the sender gives up.
		wctx, cancel := context.WithTimeout(ctx, firstTokenWait)
		if t, err := eng.Steps().First(wctx); err == nil {
			res.FirstTokenAfter = t.UnixNano()
		}
		cancel()
	}
	return res
}
