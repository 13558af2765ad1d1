package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/rolloutkit/rollout/sdk/bus"
	"github.com/rolloutkit/rollout/sdk/protocol"
)

// PauseMode says what a pause does with requests in flight.
type PauseMode string

// Pause modes.
const (
	// PauseAbort finishes in-flight requests with finish reason abort (Generate continues
	// them once a server is back in rotation).
	PauseAbort PauseMode = protocol.ModeAbort
	// PauseWait lets in-flight requests finish, admitting nothing new.
	PauseWait PauseMode = protocol.ModeWait
	// PauseKeep freezes in-flight requests in place; they continue on resume.
	PauseKeep PauseMode = protocol.ModeKeep
)

func (m PauseMode) orDefault() string {
	if m == "" {
		return string(PauseAbort)
	}
	return string(m)
}

// Call is what every control call takes besides its own options: which servers it reaches
// and how long it waits. Each control call's options embed it (PauseOptions{Call:
// Call{Targets: ids}}); its zero value is every live server and Options.CommandTimeout.
// UpdateWeights does not take it: its Plan has its own Targets and per-phase timeouts.
type Call struct {
	// Targets limits the call to the named servers (default: every live server). A call
	// with targets does not change the fleet's desired state.
	Targets []string
	// Timeout bounds how long the call waits for every target's ack (0:
	// Options.CommandTimeout). The command's deadline on the servers is the same.
	Timeout time.Duration
}

// PauseOptions configure Pause.
type PauseOptions struct {
	Call
	// Mode defaults to PauseAbort.
	Mode PauseMode
	// ClearCache resets the prefix cache and the offloaded KV after pausing.
	ClearCache bool
}

// ResumeOptions configure Resume.
type ResumeOptions struct {
	Call
}

// SleepOptions configure Sleep.
type SleepOptions struct {
	Call
	// Level 1 releases the KV cache, 2 also the weights (0: DefaultSleepLevel, as for
	// Plan.SleepLevel).
	Level int
	// PauseOnly sleeps at level 0: the servers pause and release nothing (without targets
	// the desired state records a pause, as for Pause). Level must then be 0.
	PauseOnly bool
	// Mode is the pause mode used when the server is not paused already (default abort).
	Mode PauseMode
}

// level is the protocol's sleep level of o: 0 only with PauseOnly.
func (o SleepOptions) level() (int, error) {
	switch {
	case o.PauseOnly && o.Level != 0:
		return 0, invalid("SleepOptions: PauseOnly with level %d", o.Level)
	case o.PauseOnly:
		return 0, nil
	case o.Level == 0:
		return DefaultSleepLevel, nil
	}
	return o.Level, nil
}

// WakeOptions configure WakeUp.
type WakeOptions struct {
	Call
	// Tags name what to restore ("weights", "kv_cache"); empty restores everything.
	Tags []string
}

// ResetOptions configure ResetCache.
type ResetOptions struct {
	Call
	// ResetExternal also resets the offloaded (external) KV.
	ResetExternal bool
	// ResetRunning preempts running requests so that no block stays in use.
	ResetRunning bool
}

// AbortOptions configure Abort.
type AbortOptions struct {
	Call
	// RequestIDs name the requests to finish with finish reason abort; empty aborts all.
	RequestIDs []string
}

// callConfig is a Call with what the client adds to the command it sends.
type callConfig struct {
	Call
	pub pubOpts
}

// pubOpts is what a command carries about the desired state it was sent for.
type pubOpts struct {
	epoch int64 // the desired-state epoch (0: the client's last read)
	// fleetWide: a run-state command recorded in the desired state (protocol.Envelope.FleetWide).
	fleetWide bool
	desired   []byte // the record written for it, attached (nil: none)
}

// ServerResult is how one command ended on one server.
type ServerResult struct {
	ServerID string `json:"server_id"`
	// Result is the server's ("" when it never acked: Err wraps ErrTimeout).
	Result protocol.Result `json:"result,omitempty"`
	// Code is the server's short reason for a failure or rejection.
	Code string `json:"code,omitempty"`
	// Err is nil when the command succeeded on the server; otherwise it wraps ErrTimeout,
	// ErrRejected or ErrFailed.
	Err           error            `json:"-"`
	Phases        []protocol.Phase `json:"phases,omitempty"`
	WeightVersion int64            `json:"weight_version"`
	StagedVersion int64            `json:"staged_version,omitempty"`
	Duplicate     bool             `json:"duplicate,omitempty"`
	// Latency is the time from publishing the command to reading the ack.
	Latency time.Duration `json:"latency"`
	// Ack is the server's ack as received (nil without one).
	Ack *protocol.Ack `json:"-"`
}

// OK reports whether the command succeeded on the server.
func (r ServerResult) OK() bool { return r.Err == nil }

// MarshalJSON adds "error" (Err's message) to the JSON form, for `--json` output.
func (r ServerResult) MarshalJSON() ([]byte, error) {
	type plain ServerResult
	return json.Marshal(struct {
		plain
		Error string `json:"error,omitempty"`
	}{plain(r), errText(r.Err)})
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// Pause stops scheduling on the targets. Without targets it is a fleet pause: the desired
// state records it first (with the mode), so every server pauses and stays paused, also one
// that misses the command or restarts, until Resume; the command is the prompt
// notification, and its acks report each server's pause. With targets it pauses those
// servers alone and the desired state is untouched (they stay paused until a targeted
// Resume).
//
// It returns every target's result, also with an error once the command was sent. Errors:
// ErrInvalid (a bad mode or option), ErrNoServers (no live server, or a target that is
// not one), ErrConflict (the desired state changed under the call), ErrBadSecret, ErrClosed,
// a *FleetError wrapping ErrPartial when some targets failed (errors.Is also finds their
// ErrTimeout, ErrRejected or ErrFailed), or the context's error. The other control calls
// return the same.
func (c *Client) Pause(ctx context.Context, o PauseOptions) ([]ServerResult, error) {
	cmd := protocol.Pause{Mode: o.Mode.orDefault(), ClearCache: o.ClearCache}
	if err := cmd.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return c.runState(ctx, "pause", cmd, callConfig{Call: o.Call}, func(d *protocol.DesiredState) {
		d.Paused, d.PauseMode = true, cmd.Mode
	})
}

// Resume lets the targets schedule again. Without targets it clears the fleet's pause in the
// desired state first, so every server resumes, also one that misses the command. Results
// and errors as for Pause.
func (c *Client) Resume(ctx context.Context, o ResumeOptions) ([]ServerResult, error) {
	return c.runState(ctx, "resume", protocol.Resume{}, callConfig{Call: o.Call}, func(d *protocol.DesiredState) {
		d.Paused, d.PauseMode = false, ""
	})
}

// Sleep pauses the targets and releases memory (level 1, the default: KV cache; 2: also the
// weights). Without targets the desired state records the sleep first, as for Pause. Results
// and errors as for Pause.
func (c *Client) Sleep(ctx context.Context, o SleepOptions) ([]ServerResult, error) {
	level, err := o.level()
	if err != nil {
		return nil, err
	}
	cmd := protocol.Sleep{Level: level, Mode: string(o.Mode)}
	if err := cmd.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return c.runState(ctx, "sleep", cmd, callConfig{Call: o.Call}, func(d *protocol.DesiredState) {
		if cmd.Level > 0 {
			d.Sleep = cmd.Level
		} else {
			d.Paused, d.PauseMode = true, protocol.ModeAbort
			if cmd.Mode != "" {
				d.PauseMode = cmd.Mode
			}
		}
	})
}

// WakeUp restores what Sleep released (Tags: "weights", "kv_cache"; empty: everything).
// Without targets, a wake of everything clears the desired state's sleep first, as Resume
// does the pause; a partial wake (one tag: the weights before an update, say) leaves the
// fleet recorded as asleep until the rest wakes. Results and errors as for Pause.
func (c *Client) WakeUp(ctx context.Context, o WakeOptions) ([]ServerResult, error) {
	cmd := protocol.Wake{Tags: slices.Clone(o.Tags)}
	if err := cmd.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	cfg := callConfig{Call: o.Call}
	change := func(d *protocol.DesiredState) { d.Sleep = 0 }
	if len(cmd.Tags) > 0 && !(slices.Contains(cmd.Tags, protocol.TagWeights) && slices.Contains(cmd.Tags, protocol.TagKVCache)) {
		change = nil // a partial wake is not a run state the fleet records
	}
	return c.runState(ctx, "wake", cmd, cfg, change)
}

// runState runs a run-state command. Fleet-wide (no targets) with a change, it writes the
// desired state first and sends the command with that epoch: a server reads the record
// before it acts, and a command the record has since superseded changes nothing.
func (c *Client) runState(ctx context.Context, op string, cmd any, cfg callConfig, change func(*protocol.DesiredState)) ([]ServerResult, error) {
	if len(cfg.Targets) == 0 && change != nil {
		if err := c.checkOpen(ctx); err != nil {
			return nil, err
		}
		d, err := c.updateDesired(ctx, func(d *protocol.DesiredState) error { change(d); return nil })
		if err != nil {
			return nil, err
		}
		raw, err := d.Encode()
		if err != nil {
			return nil, err
		}
		cfg.pub = pubOpts{epoch: d.Epoch, fleetWide: true, desired: raw}
	}
	return c.control(ctx, op, cmd, cfg)
}

// ResetCache resets the targets' prefix cache (and with ResetExternal the offloaded KV). A
// server acks ok only when everything was cleared. Results and errors as for Pause.
func (c *Client) ResetCache(ctx context.Context, o ResetOptions) ([]ServerResult, error) {
	return c.control(ctx, "reset", protocol.Reset{ResetExternal: o.ResetExternal, ResetRunning: o.ResetRunning}, callConfig{Call: o.Call})
}

// Abort finishes the named requests (empty: all) with finish reason abort. Generate does not
// continue a sample the caller aborted. Results and errors as for Pause.
func (c *Client) Abort(ctx context.Context, o AbortOptions) ([]ServerResult, error) {
	for _, id := range o.RequestIDs {
		if id == "" {
			return nil, invalid("empty request id")
		}
	}
	ids := c.aborts.record(o.RequestIDs)
	return c.control(ctx, "abort", protocol.Abort{RequestIDs: ids}, callConfig{Call: o.Call})
}

// control runs one command on the configured targets and waits for their acks; it
// returns every target's result, with an error too.
func (c *Client) control(ctx context.Context, op string, cmd any, cfg callConfig) (results []ServerResult, err error) {
	ctx, span := c.tracer.Start(ctx, "sdk."+op, trace.WithSpanKind(trace.SpanKindClient))
	defer func() { endSpan(span, err) }()
	if err := c.checkOpen(ctx); err != nil {
		return nil, err
	}
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = c.opts.CommandTimeout
	}
	if timeout < 0 || timeout > protocol.MaxCommandLifetime {
		// Above the lifetime every server refuses the command as a replay: say so here.
		return nil, invalid("timeout %s must be > 0 and at most %s (protocol.MaxCommandLifetime)", timeout, protocol.MaxCommandLifetime)
	}
	targets, err := c.resolveTargets(ctx, cfg.Targets, false)
	if err != nil {
		return nil, err
	}
	span.SetAttributes(attribute.StringSlice("rollout.targets", targets))
	results, err = c.roundTrip(ctx, targets, cmd, timeout, cfg)
	if err != nil {
		return results, err
	}
	return results, fleetErr(op, ErrPartial, results)
}

// fleetErr is nil when every result is ok, else a *FleetError.
func fleetErr(op string, kind error, results []ServerResult) error {
	for _, r := range results {
		if r.Err != nil {
			return &FleetError{Op: op, Err: kind, Results: results}
		}
	}
	return nil
}

// resolveTargets checks explicit targets against the live servers, or returns every live
// server. With fresh it rereads the heartbeats; otherwise it uses the routing cache (at most
// RefreshInterval old, well inside a heartbeat's TTL), which keeps a control call to one
// publish and the ack reads.
func (c *Client) resolveTargets(ctx context.Context, want []string, fresh bool) ([]string, error) {
	var live []string
	if fresh {
		var err error
		if live, err = c.liveIDs(ctx); err != nil {
			return nil, err
		}
	} else if live = c.cachedIDs(); len(live) == 0 {
		// An empty view may only be out of date (servers heartbeating again after a Redis
		// restart): look before refusing.
		var err error
		if live, err = c.liveIDs(ctx); err != nil {
			return nil, err
		}
	}
	if len(want) == 0 {
		if len(live) == 0 {
			return nil, fmt.Errorf("%w: fleet %q has no live server", ErrNoServers, c.opts.Fleet)
		}
		return live, nil
	}
	out := slices.Clone(want)
	slices.Sort(out)
	out = slices.Compact(out)
	var missing []string
	for _, id := range out {
		if id == "" {
			return nil, invalid("empty target id")
		}
		if _, ok := slices.BinarySearch(live, id); !ok {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: no live server %q in fleet %q", ErrNoServers, missing, c.opts.Fleet)
	}
	return out, nil
}

// roundTrip publishes cmd to targets and collects every ack until the timeout.
func (c *Client) roundTrip(ctx context.Context, targets []string, cmd any, timeout time.Duration, cfg callConfig) ([]ServerResult, error) {
	s, err := c.publish(ctx, targets, cmd, timeout, cfg.pub)
	if err != nil {
		return nil, err
	}
	return c.collect(ctx, s, nil)
}

// noSubscriberWait bounds how long publish retries a command nobody is subscribed to.
const noSubscriberWait = 2 * time.Second

// sent is a published command awaiting acks.
type sent struct {
	env      *protocol.Envelope
	targets  []string
	start    time.Time
	deadline time.Time
	// listeners is how many subscribers the bus delivered the command to; with none, no
	// ack can come.
	listeners int
}

// publish signs and publishes cmd to targets, with what it carries about the desired state.
func (c *Client) publish(ctx context.Context, targets []string, cmd any, timeout time.Duration, pub pubOpts) (s *sent, err error) {
	ctx, span := c.tracer.Start(ctx, "sdk.publish", trace.WithSpanKind(trace.SpanKindProducer))
	defer func() { endSpan(span, err) }()
	now := time.Now()
	env, err := protocol.NewEnvelope(c.opts.Fleet, targets, cmd, now, timeout)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if pub.epoch == 0 {
		c.mu.Lock()
		if c.desired != nil {
			pub.epoch = c.desired.Epoch
		}
		c.mu.Unlock()
	}
	env.Epoch, env.FleetWide, env.Desired = pub.epoch, pub.fleetWide, pub.desired
	carrier := propagation.MapCarrier{}
	c.prop.Inject(ctx, carrier)
	if len(carrier) > 0 {
		env.Trace = map[string]string(carrier)
	}
	if c.auth.Signed() {
		env.SignWith(c.auth)
	}
	b, err := env.Encode()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	span.SetAttributes(attribute.String("rollout.command_id", env.ID), attribute.String("rollout.kind", string(env.Kind)),
		attribute.Int("rollout.targets", len(targets)))
	n, err := c.bus.Publish(ctx, c.names.Control(), b)
	// Nobody subscribed: servers resubscribing after a Redis restart (their heartbeat keys
	// may already be back). Publish again, the same envelope (its id dedupes), for a short
	// while within the command's lifetime before reporting ErrNoServers.
	for retry := time.Now().Add(min(timeout/2, noSubscriberWait)); err == nil && n == 0 && time.Now().Before(retry); {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		n, err = c.bus.Publish(ctx, c.names.Control(), b)
	}
	if err != nil {
		return nil, fmt.Errorf("sdk: publish %s: %w", env.Kind, err)
	}
	span.SetAttributes(attribute.Int("rollout.subscribers", n))
	return &sent{env: env, targets: targets, start: now, deadline: time.UnixMilli(env.Deadline), listeners: n}, nil
}

// collect reads acks of s until every target acked, the deadline passes or onAck returns
// true (stop early); targets without an ack get an ErrTimeout result. Results follow the
// order of s.targets. A context error ends the wait and is returned with the results so far.
func (c *Client) collect(ctx context.Context, s *sent, onAck func(ServerResult) bool) ([]ServerResult, error) {
	list := c.names.Acks(s.env.ID)
	defer c.discard(list)
	want := make(map[string]bool, len(s.targets))
	for _, id := range s.targets {
		want[id] = true
	}
	got := make(map[string]ServerResult, len(s.targets))
	var ctxErr error
	stopped := false
	for len(got) < len(s.targets) && !stopped && s.listeners > 0 {
		wait := time.Until(s.deadline)
		if wait <= 0 {
			break
		}
		vals, err := c.bus.Pop(ctx, list, 64, wait)
		if err != nil {
			if ctx.Err() != nil {
				ctxErr = ctx.Err()
				break
			}
			if errors.Is(err, bus.ErrUnavailable) {
				// Redis is reconnecting; the acks wait in the list.
				select {
				case <-time.After(50 * time.Millisecond):
				case <-ctx.Done():
				}
				continue
			}
			return nil, fmt.Errorf("sdk: read acks of %s: %w", s.env.Kind, err)
		}
		for _, v := range vals {
			a, err := protocol.DecodeAck(v)
			if err == nil {
				err = a.VerifyWith(c.auth, c.opts.Fleet)
			}
			if err != nil {
				// Whoever can write to Redis can push to an ack list: an ack that does not
				// verify is not a server's word and is dropped.
				c.log.Warn("sdk: ignoring an ack that does not verify", "command", s.env.ID, "err", err)
				continue
			}
			if a.CommandID != s.env.ID || !want[a.ServerID] {
				continue
			}
			if _, dup := got[a.ServerID]; dup {
				continue
			}
			r := resultOf(a, time.Since(s.start))
			got[a.ServerID] = r
			c.noteAck(a)
			if onAck != nil && onAck(r) {
				stopped = true
			}
		}
	}
	out := make([]ServerResult, 0, len(s.targets))
	for _, id := range s.targets {
		r, ok := got[id]
		if !ok {
			cause := fmt.Errorf("%w: no ack for %s within %s", ErrTimeout, s.env.Kind, s.deadline.Sub(s.start).Round(time.Millisecond))
			switch {
			case ctxErr != nil:
				cause = fmt.Errorf("no ack for %s: %w", s.env.Kind, ctxErr)
			case s.listeners == 0:
				cause = fmt.Errorf("%w: nobody is subscribed to the control channel of fleet %q", ErrNoServers, c.opts.Fleet)
			}
			r = ServerResult{ServerID: id, Err: cause, Latency: time.Since(s.start)}
		}
		out = append(out, r)
	}
	return out, ctxErr
}

// resultOf turns an ack into a result.
func resultOf(a *protocol.Ack, latency time.Duration) ServerResult {
	r := ServerResult{ServerID: a.ServerID, Result: a.Result, Code: a.Code, Phases: a.Phases, WeightVersion: a.WeightVersion,
		StagedVersion: a.StagedVersion, Duplicate: a.Duplicate, Latency: latency, Ack: a}
	switch a.Result {
	case protocol.ResultOK:
	case protocol.ResultRejected:
		r.Err = fmt.Errorf("%w: %s %s: %s", ErrRejected, a.Kind, a.Code, a.Error)
	default:
		r.Err = fmt.Errorf("%w: %s %s: %s", ErrFailed, a.Kind, a.Code, a.Error)
	}
	return r
}

func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
