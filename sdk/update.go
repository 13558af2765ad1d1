package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/rolloutkit/rollout/sdk/protocol"
)

// Defaults of Plan (DefaultSleepLevel is SleepOptions' too).
const (
	DefaultStageTimeout  = 2 * time.Minute
	DefaultCommitTimeout = time.Minute
	DefaultSleepLevel    = 1
)

// Policy decides how an update proceeds when servers fail: AllOrNothing, Quorum(K) or
// Rolling(K). Its text form is what ParsePolicy reads ("all", "quorum:K", "rolling:K"); the
// zero value is AllOrNothing.
type Policy string

// AllOrNothing commits only when every target staged; otherwise nobody swaps and the fleet
// keeps serving the old version.
const AllOrNothing Policy = "all"

// Quorum commits on the servers that staged when at least k did; the others are stale (out of
// rotation) until they converge by themselves.
func Quorum(k int) Policy { return Policy("quorum:" + strconv.Itoa(k)) }

// Rolling needs every target staged, then commits k servers at a time while the others keep
// generating, so part of the fleet always serves.
func Rolling(k int) Policy { return Policy("rolling:" + strconv.Itoa(k)) }

type policyKind int

const (
	policyAll policyKind = iota + 1
	policyQuorum
	policyRolling
)

// ParsePolicy reads "all", "quorum:K" or "rolling:K" (K >= 1).
func ParsePolicy(s string) (Policy, error) {
	p := Policy(s)
	if _, _, err := p.parse(); err != nil {
		return "", err
	}
	return p, nil
}

// String returns the policy's text form.
func (p Policy) String() string {
	if p == "" {
		return string(AllOrNothing)
	}
	return string(p)
}

func (p Policy) parse() (policyKind, int, error) {
	s := strings.TrimSpace(string(p))
	if s == "" || s == "all" || s == "all-or-nothing" {
		return policyAll, 0, nil
	}
	name, arg, ok := strings.Cut(s, ":")
	var kind policyKind
	switch name {
	case "quorum":
		kind = policyQuorum
	case "rolling":
		kind = policyRolling
	default:
		return 0, 0, invalid("unknown policy %q: want all, quorum:K or rolling:K", s)
	}
	if !ok {
		return 0, 0, invalid("policy %q needs K, as in %s:2", s, name)
	}
	k, err := strconv.Atoi(arg)
	if err != nil || k < 1 {
		return 0, 0, invalid("policy %q: K must be an integer >= 1", s)
	}
	return kind, k, nil
}

// Plan configures UpdateWeights. The zero value is all-or-nothing with pause mode abort, the
// cache cleared and sleep level 1 on every live server.
type Plan struct {
	Policy Policy
	// Mode is the pause mode of the cut (default PauseAbort: Generate continues the aborted
	// samples on the new weights).
	Mode PauseMode
	// KeepCache keeps the prefix cache and offloaded KV at the pause (default: both are
	// cleared, so that no KV computed by the old weights meets the new ones).
	KeepCache bool
	// SleepLevel is the sleep level of the cut (0: DefaultSleepLevel; 2 also releases the old
	// weights before the swap). NoSleep skips sleeping (SleepLevel must then be 0).
	SleepLevel int
	NoSleep    bool
	// StageTimeout bounds fetching and staging (default 2m); CommitTimeout each commit
	// command (per batch when rolling; default 1m).
	StageTimeout, CommitTimeout time.Duration
	// Targets names the servers the update stages and commits on (default: every live
	// server). It must include every live server: the desired state moves for the whole
	// fleet, so a server left out would follow by itself and the result would not say so.
	Targets []string
	// PeerFanOut is how many servers one server feeds at most in the distribution tree
	// (0: DefaultPeerFanOut; negative: no peers, every server fetches from the origin);
	// OriginFanOut how many fetch from the origin itself (0: DefaultOriginFanOut).
	PeerFanOut, OriginFanOut int
}

// Outcome says how an update ended.
type Outcome string

// Outcomes.
const (
	// OutcomeCommitted: every target serves the new version.
	OutcomeCommitted Outcome = "committed"
	// OutcomeDegraded: the policy was met (a quorum committed); the rest are stale.
	OutcomeDegraded Outcome = "degraded"
	// OutcomePartial: the commit point passed but the policy was not met; servers that did
	// not commit are stale until they converge.
	OutcomePartial Outcome = "partial"
	// OutcomeAborted: stopped before the commit point, or after it when Redis lost the
	// record before the commit went out and another writer now binds the version elsewhere
	// (ErrConflict beside ErrAborted); nobody swapped.
	OutcomeAborted Outcome = "aborted"
)

// PhaseResult is one phase of the update on one server.
type PhaseResult struct {
	Name    string  `json:"name"`
	OK      bool    `json:"ok"`
	Error   string  `json:"error,omitempty"`
	Seconds float64 `json:"seconds"`
}

// ServerUpdate is what the update did on one server.
type ServerUpdate struct {
	ServerID  string `json:"server_id"`
	Staged    bool   `json:"staged"`
	Committed bool   `json:"committed"`
	// Stale: the desired state moved to the new version and this server did not commit; it
	// is out of rotation until it converges by itself.
	Stale bool `json:"stale"`
	// Phases are stage, then the commit's pause, sleep, swap, wake and resume, as the server
	// reported them.
	Phases []PhaseResult `json:"phases"`
	// Bubble is the server's generation gap: the last token before the pause to the first
	// after the resume when the server measured both (BubbleMeasured), else the commit's
	// duration on the server.
	Bubble         time.Duration `json:"bubble"`
	BubbleMeasured bool          `json:"bubble_measured"`
	WeightVersion  int64         `json:"weight_version"`
	// Stage and Commit are the raw command results (Commit is nil when not sent).
	Stage  *ServerResult `json:"stage,omitempty"`
	Commit *ServerResult `json:"commit,omitempty"`
	// Err is the server's failure, if any.
	Err error `json:"-"`
}

// MarshalJSON adds "error" (Err's message) to the JSON form.
func (u ServerUpdate) MarshalJSON() ([]byte, error) {
	type plain ServerUpdate
	return json.Marshal(struct {
		plain
		Error string `json:"error,omitempty"`
	}{plain(u), errText(u.Err)})
}

// UpdateResult reports an UpdateWeights transaction.
type UpdateResult struct {
	Version int64   `json:"version"`
	Policy  Policy  `json:"policy"`
	Outcome Outcome `json:"outcome"`
	Reason  string  `json:"reason"`
	// Epoch is the desired-state epoch the update wrote (0 when it did not get there).
	Epoch   int64          `json:"epoch"`
	Servers []ServerUpdate `json:"servers"`
	// Stale lists the servers left behind (out of rotation until they converge).
	Stale []string `json:"stale,omitempty"`
	// StageTime is publishing stage to the decision; CommitTime the commit point to the last
	// commit ack; Duration the whole call.
	StageTime  time.Duration `json:"stage_time"`
	CommitTime time.Duration `json:"commit_time"`
	Duration   time.Duration `json:"duration"`
	// MaxBubble is the largest per-server bubble.
	MaxBubble time.Duration `json:"max_bubble"`
	// OriginBytes and PeerBytes are what the servers' stage acks say they fetched from the
	// origin (the trainer's egress for this update) and from peers.
	OriginBytes int64 `json:"origin_bytes"`
	PeerBytes   int64 `json:"peer_bytes"`
	// Sources is the distribution tree the stage command carried: server id to the peer it
	// fetched from first (absent: the origin).
	Sources map[string]string `json:"sources,omitempty"`
}

// Server returns the named server's entry (nil when it was not a target).
func (r *UpdateResult) Server(id string) *ServerUpdate {
	for i := range r.Servers {
		if r.Servers[i].ServerID == id {
			return &r.Servers[i]
		}
	}
	return nil
}

// resolvedPlan is a Plan with defaults filled and the policy parsed.
type resolvedPlan struct {
	kind          policyKind
	k             int
	fanOut        int
	originFanOut  int
	mode          string
	clearCache    bool
	sleepLevel    int
	stageTimeout  time.Duration
	commitTimeout time.Duration
}

func resolvePlan(p Plan) (resolvedPlan, error) {
	kind, k, err := p.Policy.parse()
	if err != nil {
		return resolvedPlan{}, err
	}
	r := resolvedPlan{kind: kind, k: k, mode: p.Mode.orDefault(), clearCache: !p.KeepCache, sleepLevel: p.SleepLevel,
		stageTimeout: p.StageTimeout, commitTimeout: p.CommitTimeout, fanOut: p.PeerFanOut, originFanOut: p.OriginFanOut}
	if r.fanOut == 0 {
		r.fanOut = DefaultPeerFanOut
	}
	if r.originFanOut == 0 {
		r.originFanOut = DefaultOriginFanOut
	}
	if r.originFanOut < 0 {
		return resolvedPlan{}, invalid("origin fan-out must be >= 0")
	}
	switch {
	case p.NoSleep && p.SleepLevel != 0:
		return resolvedPlan{}, invalid("plan: NoSleep with sleep level %d", p.SleepLevel)
	case p.NoSleep:
		r.sleepLevel = 0
	case r.sleepLevel == 0:
		r.sleepLevel = DefaultSleepLevel
	}
	if r.stageTimeout == 0 {
		r.stageTimeout = DefaultStageTimeout
	}
	if r.commitTimeout == 0 {
		r.commitTimeout = DefaultCommitTimeout
	}
	if r.stageTimeout < 0 || r.commitTimeout < 0 || r.stageTimeout > protocol.MaxCommandLifetime || r.commitTimeout > protocol.MaxCommandLifetime {
		return resolvedPlan{}, invalid("timeouts must be > 0 and at most %s (protocol.MaxCommandLifetime): servers refuse longer commands", protocol.MaxCommandLifetime)
	}
	if err := (protocol.Commit{Version: 1, Mode: r.mode, SleepLevel: r.sleepLevel, SHA256: strings.Repeat("0", 64)}).Validate(); err != nil {
		return resolvedPlan{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return r, nil
}

// UpdateWeights moves the fleet to ref as one transaction:
//  1. stage: every target fetches and verifies ref while it keeps serving;
//  2. decide by the plan's policy; with too few staged servers it stops here (ErrAborted)
//     and nothing changed;
//  3. commit point: the desired state moves to ref (compare-and-swap), so a server that
//     misses what follows converges by itself;
//  4. commit: each staged server runs pause → sleep → swap → wake → resume as one command
//     (K at a time when rolling).
//
// Bad arguments (unknown policy, K out of range, a version not above the serving one, no
// servers, a cancelled context) are refused before anything is sent. The result is returned
// whenever the fleet was touched, with an error (a *FleetError) when the policy was not met.
//
// Errors: ErrInvalid (bad ref or plan, or a version not above the serving one), ErrNoServers,
// ErrConflict (another client moved the desired state), ErrBadSecret, ErrClosed, a
// *FleetError wrapping ErrAborted (stopped before the commit point: nobody swapped) or
// ErrPartial (committed, but some targets failed; errors.Is also finds their ErrTimeout,
// ErrRejected or ErrFailed), or the context's error.
func (c *Client) UpdateWeights(ctx context.Context, ref WeightsRef, plan Plan) (res *UpdateResult, err error) {
	ctx, span := c.tracer.Start(ctx, "sdk.update_weights", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.Int64("rollout.weight_version", ref.Version), attribute.String("rollout.policy", plan.Policy.String())))
	defer func() { endSpan(span, err) }()
	began := time.Now()
	if err := c.checkOpen(ctx); err != nil {
		return nil, err
	}
	if err := ref.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if ref.SHA256 == "" {
		return nil, invalid("weights version %d without a sha256: a fleet version names one checkpoint only with its digest (rollout weights digest prints it)", ref.Version)
	}
	rp, err := resolvePlan(plan)
	if err != nil {
		return nil, err
	}
	targets, err := c.resolveTargets(ctx, plan.Targets, true)
	if err != nil {
		return nil, err
	}
	if rp.kind != policyAll && rp.k > len(targets) {
		return nil, invalid("policy %s: K=%d is more than the %d target servers", plan.Policy, rp.k, len(targets))
	}
	if len(plan.Targets) > 0 {
		all, err := c.resolveTargets(ctx, nil, true)
		if err != nil {
			return nil, err
		}
		if missing := without(all, targets); len(missing) > 0 {
			return nil, invalid("Plan.Targets leaves out live servers %q: an update moves the whole fleet's desired state, so every live server follows; name them all (or none)", missing)
		}
	}
	serving, desired, err := c.servingVersion(ctx)
	if err != nil {
		return nil, err
	}
	if retry, err := isRetry(desired, ref); err != nil {
		return nil, err
	} else if ref.Version <= serving && !retry {
		return nil, invalid("weights version %d is not above the fleet's version %d (the same version and digest again completes an update)", ref.Version, serving)
	}

	res = &UpdateResult{Version: ref.Version, Policy: Policy(plan.Policy.String()), Servers: make([]ServerUpdate, len(targets))}
	for i, id := range targets {
		res.Servers[i].ServerID = id
	}
	t := newTracker(rp.kind, rp.k, targets)
	d := &updateDriver{c: c, t: t, ref: ref, rp: rp, res: res}
	act := t.start()
	var stageEnd, commitStart time.Time
	for act.kind != actDone {
		if ctx.Err() != nil {
			d.settle(ctx)
			act = t.cancel()
			break
		}
		switch act.kind {
		case actStage:
			act = d.stage(ctx, act.targets)
			stageEnd = time.Now()
		case actSetDesired:
			act = d.setDesired(ctx)
			if commitStart.IsZero() {
				commitStart = time.Now()
			}
		case actCommit:
			if commitStart.IsZero() {
				commitStart = time.Now()
			}
			act = d.commit(ctx, act.targets)
		default:
			return nil, fmt.Errorf("sdk: tracker returned %v", act.kind)
		}
	}
	res.Outcome, res.Reason = act.outcome, act.reason
	if !stageEnd.IsZero() {
		res.StageTime = stageEnd.Sub(began)
	}
	if !commitStart.IsZero() {
		res.CommitTime = time.Since(commitStart)
	}
	res.Duration = time.Since(began)
	d.finish()
	span.SetAttributes(attribute.String("rollout.outcome", string(res.Outcome)), attribute.StringSlice("rollout.stale", res.Stale),
		attribute.Float64("rollout.max_bubble_seconds", res.MaxBubble.Seconds()))
	switch {
	case ctx.Err() != nil:
		return res, fmt.Errorf("sdk: update_weights %s: %w", res.Outcome, ctxError(ctx))
	case res.Outcome == OutcomeAborted:
		return res, d.fleetError(ErrAborted)
	case res.Outcome == OutcomePartial:
		return res, d.fleetError(ErrPartial)
	}
	return res, nil
}

// isRetry reports whether ref is the version the desired state d names already, with the
// same digest: UpdateWeights runs again to bring every server to it (after a cancelled or
// partial update). The same version with another digest is refused: a version names one
// checkpoint.
func isRetry(d *protocol.DesiredState, ref WeightsRef) (bool, error) {
	if d == nil || d.Weights == nil || d.Weights.Version != ref.Version {
		return false, nil
	}
	if d.Weights.SHA256 != ref.SHA256 {
		return false, fmt.Errorf("%w: fleet version %d is checkpoint %s, not %s", ErrConflict, ref.Version, d.Weights.SHA256, ref.SHA256)
	}
	return true, nil
}

// without returns the ids of all (sorted) that are not in some (sorted).
func without(all, some []string) []string {
	var out []string
	for _, id := range all {
		if _, ok := slices.BinarySearch(some, id); !ok {
			out = append(out, id)
		}
	}
	return out
}

// claim writes the rolling update's claim on its version into the desired state (Rolling),
// refused when the fleet already binds the version, or a later one, to another checkpoint.
func (d *updateDriver) claim(ctx context.Context) error {
	ref := d.ref
	d.change = func(s *protocol.DesiredState) error {
		if s.Weights != nil && s.Weights.Version >= ref.Version && s.Claims(ref.Version) != ref.SHA256 {
			return fmt.Errorf("%w: the desired state already names version %d (%s)", ErrConflict, s.Weights.Version, s.Weights.SHA256)
		}
		if s.Rolling != nil && s.Rolling.Version >= ref.Version && *s.Rolling != ref {
			return fmt.Errorf("%w: another rolling update claims version %d (%s)", ErrConflict, s.Rolling.Version, s.Rolling.SHA256)
		}
		r := ref
		s.Rolling = &r
		return nil
	}
	ds, err := d.c.updateDesired(ctx, d.change)
	if err != nil {
		return err
	}
	if raw, err := ds.Encode(); err == nil {
		d.desiredRaw = raw // attached to the batches' commit commands
	}
	return nil
}

// settle runs when the caller cancels an update: if servers already swapped (a rolling
// update between batches) but the desired state does not name the version yet, it writes
// it, on a short context of its own, so the whole fleet converges to one version instead of
// staying on two.
func (d *updateDriver) settle(ctx context.Context) {
	if d.t.desired || len(d.t.commitOK) == 0 {
		return
	}
	swapped := false
	for _, ok := range d.t.commitOK {
		swapped = swapped || ok
	}
	if !swapped {
		return
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.c.opts.CommandTimeout)
	defer cancel()
	d.setDesired(sctx)
}

// servingVersion is the fleet's current version: the desired one, or the newest a live
// server reports when the desired state names none (or an older one), and the desired
// state it read.
func (c *Client) servingVersion(ctx context.Context) (int64, *protocol.DesiredState, error) {
	d, _, err := c.readDesired(ctx)
	if err != nil {
		return 0, nil, err
	}
	var v int64
	if d != nil && d.Weights != nil {
		v = d.Weights.Version
	}
	hbs, err := c.readHeartbeats(ctx, false)
	if err != nil {
		return 0, nil, err
	}
	for _, hb := range hbs {
		v = max(v, hb.WeightVersion)
	}
	return v, d, nil
}

// updateDriver does the I/O the tracker asks for and fills the result.
type updateDriver struct {
	c      *Client
	t      *tracker
	ref    WeightsRef
	rp     resolvedPlan
	res    *UpdateResult
	desErr error
	errs   map[string]error
	// desiredRaw is the record the commit point wrote (nil before it).
	desiredRaw []byte
	// change is what that write asked of the desired state (claim's or setDesired's), so
	// that reassert can ask it again.
	change func(*protocol.DesiredState) error
}

func (d *updateDriver) server(id string) *ServerUpdate { return d.res.Server(id) }

func (d *updateDriver) stage(ctx context.Context, targets []string) action {
	ctx, span := d.c.tracer.Start(ctx, "sdk.update_weights.stage")
	defer span.End()
	stage := protocol.Stage{Weights: d.ref, Sources: d.sources(ctx, targets), Grant: d.c.auth.PeerGrant(d.c.opts.Fleet, d.ref.Version, d.ref.SHA256)}
	s, err := d.c.publish(ctx, targets, stage, d.rp.stageTimeout, pubOpts{})
	if err != nil {
		d.desErr = err
		span.RecordError(err)
		return d.t.stageTimeout() // nothing was sent: every target counts as failed
	}
	var next action
	var decided bool
	results, _ := d.c.collect(ctx, s, func(r ServerResult) bool {
		ok := r.Err == nil && r.StagedVersion >= d.ref.Version || r.Err == nil && r.WeightVersion >= d.ref.Version
		if r.Err == nil && !ok {
			r.Err = fmt.Errorf("%w: stage acked ok but the server reports staged version %d", ErrFailed, r.StagedVersion)
		}
		d.recordStage(r)
		next, decided = d.t.stageAck(r.ServerID, ok)
		return decided
	})
	for _, r := range results {
		if su := d.server(r.ServerID); su != nil && su.Stage == nil {
			if decided {
				r.Err = fmt.Errorf("%w: not waited for (the update was decided without it)", ErrAborted)
			}
			d.recordStage(r)
		}
	}
	if decided {
		return next
	}
	return d.t.stageTimeout()
}

// sources assigns each target its first source (AssignSources over the live heartbeats):
// members that hold the version feed first, then the origin, then the targets relay.
func (d *updateDriver) sources(ctx context.Context, targets []string) map[string]string {
	hbs, err := d.c.readHeartbeats(ctx, false)
	if err != nil {
		d.c.log.Warn("sdk: no heartbeats to build the distribution tree from; every server fetches from the origin", "err", err)
		return nil
	}
	var holders []string
	for id, hb := range hbs {
		if hb.HoldsVersion(d.ref.Version) {
			holders = append(holders, id)
		}
	}
	slices.Sort(holders) // map order is random; the tree should not be
	relay := func(id string) bool { hb, ok := hbs[id]; return ok && hb.PeerURL != "" }
	tree := AssignSources(targets, relay, holders, d.rp.fanOut, d.rp.originFanOut)
	out := make(map[string]string, len(tree))
	for id, src := range tree {
		if src != Origin {
			out[id] = src
		}
	}
	if len(out) == 0 {
		return nil
	}
	d.res.Sources = out
	return out
}

func (d *updateDriver) recordStage(r ServerResult) {
	su := d.server(r.ServerID)
	if su == nil {
		return
	}
	for _, p := range r.Phases {
		d.res.OriginBytes += p.Detail["origin_bytes"]
		d.res.PeerBytes += p.Detail["peer_bytes"]
	}
	rr := r
	su.Stage = &rr
	ph := PhaseResult{Name: "stage", OK: r.Err == nil, Seconds: r.Latency.Seconds()}
	if len(r.Phases) > 0 {
		ph.Seconds = 0
		for _, p := range r.Phases {
			ph.Seconds += p.Seconds
		}
	}
	if r.Err != nil {
		ph.Error = r.Err.Error()
		d.setErr(r.ServerID, r.Err)
	}
	su.Phases = append(su.Phases, ph)
	su.Staged = r.Err == nil
	su.WeightVersion = r.WeightVersion
}

func (d *updateDriver) setDesired(ctx context.Context) action {
	ctx, span := d.c.tracer.Start(ctx, "sdk.update_weights.commit_point")
	defer span.End()
	ref := d.ref
	d.change = func(s *protocol.DesiredState) error {
		if s.Weights != nil && (s.Weights.Version > ref.Version || s.Weights.Version == ref.Version && s.Weights.SHA256 != ref.SHA256) {
			return fmt.Errorf("%w: the desired state already names version %d (%s)", ErrConflict, s.Weights.Version, s.Weights.SHA256)
		}
		if sha := s.Claims(ref.Version); sha != "" && sha != ref.SHA256 {
			return fmt.Errorf("%w: a rolling update claims version %d for checkpoint %s", ErrConflict, ref.Version, sha)
		}
		if s.Rolling != nil && s.Rolling.Version <= ref.Version {
			s.Rolling = nil // this roll is done, or superseded
		}
		s.Weights = &ref
		s.Plan = &protocol.Commit{Mode: d.rp.mode, ClearCache: d.rp.clearCache, SleepLevel: d.rp.sleepLevel}
		return nil
	}
	ds, err := d.c.updateDesired(ctx, d.change)
	if err != nil {
		d.desErr = err
		span.RecordError(err)
		return d.t.desiredWritten(false)
	}
	d.res.Epoch = ds.Epoch
	if raw, err := ds.Encode(); err == nil {
		d.desiredRaw = raw // attached to the commit commands: the servers need not read it
	}
	span.SetAttributes(attribute.Int64("rollout.epoch", ds.Epoch))
	return d.t.desiredWritten(true)
}

// reassert writes again, through updateDesired, what this update's last write asked of the
// desired state, and takes the record the key now holds as the one its commit carries. It
// writes nothing when the key still holds that record, or a later one asking the same. After
// Redis lost the key between that write and this commit, it waits for the servers as any
// write does and writes the record again; when another writer has meanwhile bound the
// version to another checkpoint, it fails with ErrConflict and no commit goes out. Without
// it, the commit would carry a record the key no longer holds: servers that took it would
// serve this checkpoint under a version others serve from the other writer's.
func (d *updateDriver) reassert(ctx context.Context) error {
	if d.change == nil {
		return nil
	}
	ds, err := d.c.updateDesired(ctx, d.change)
	if err != nil {
		return err
	}
	raw, err := ds.Encode()
	if err != nil {
		return err
	}
	d.desiredRaw = raw
	return nil
}

func (d *updateDriver) commit(ctx context.Context, targets []string) action {
	ctx, span := d.c.tracer.Start(ctx, "sdk.update_weights.commit", trace.WithAttributes(attribute.StringSlice("rollout.targets", targets)))
	defer span.End()
	if d.rp.kind == policyRolling && d.desiredRaw == nil {
		// Claim the version before the first batch swaps: from here on no other update can
		// put another checkpoint under this number, while the servers not yet rolled stay
		// in rotation on the old version.
		if err := d.claim(ctx); err != nil {
			d.desErr = err
			span.RecordError(err)
			return d.t.cancel()
		}
	} else if err := d.reassert(ctx); err != nil {
		span.RecordError(err)
		if errors.Is(err, ErrConflict) {
			d.desErr = err
			return d.t.lost("the desired state this update wrote was lost or replaced before its commit went out, and could not be written again: " + err.Error())
		}
		for _, id := range targets {
			d.recordCommit(ctx, ServerResult{ServerID: id, Err: err}, time.Now())
		}
		return d.t.commitTimeout()
	}
	cmd := protocol.Commit{Version: d.ref.Version, Mode: d.rp.mode, ClearCache: d.rp.clearCache, SleepLevel: d.rp.sleepLevel, SHA256: d.ref.SHA256}
	d.c.committing(targets, d.ref.Version)
	defer d.c.committing(targets, 0)
	s, err := d.c.publish(ctx, targets, cmd, d.rp.commitTimeout, pubOpts{desired: d.desiredRaw})
	if err != nil {
		span.RecordError(err)
		for _, id := range targets {
			d.recordCommit(ctx, ServerResult{ServerID: id, Err: err}, time.Now())
		}
		return d.t.commitTimeout()
	}
	var next action
	var decided bool
	results, _ := d.c.collect(ctx, s, func(r ServerResult) bool {
		ok := r.Err == nil && (r.WeightVersion > d.ref.Version || r.WeightVersion == d.ref.Version && r.Ack.WeightSHA256 == d.ref.SHA256)
		if r.Err == nil && !ok {
			r.Err = fmt.Errorf("%w: commit acked ok but the server serves version %d (%s)", ErrFailed, r.WeightVersion, r.Ack.WeightSHA256)
		}
		d.recordCommit(ctx, r, s.start)
		next, decided = d.t.commitAck(r.ServerID, ok)
		return decided
	})
	for _, r := range results {
		if su := d.server(r.ServerID); su != nil && su.Commit == nil {
			d.recordCommit(ctx, r, s.start)
		}
	}
	if decided {
		return next
	}
	return d.t.commitTimeout()
}

func (d *updateDriver) recordCommit(ctx context.Context, r ServerResult, published time.Time) {
	su := d.server(r.ServerID)
	if su == nil {
		return
	}
	rr := r
	su.Commit = &rr
	var total float64
	for _, p := range r.Phases {
		su.Phases = append(su.Phases, PhaseResult{Name: phaseName(p.Name), OK: p.OK, Error: p.Error, Seconds: p.Seconds})
		total += p.Seconds
	}
	if r.Err != nil {
		d.setErr(r.ServerID, r.Err)
		if len(r.Phases) == 0 {
			su.Phases = append(su.Phases, PhaseResult{Name: "commit", Error: r.Err.Error(), Seconds: r.Latency.Seconds()})
		}
		return
	}
	su.Committed = true
	su.WeightVersion = r.WeightVersion
	// The bubble cannot begin before the command was sent: an idle server's last token may
	// be long before.
	if a := r.Ack; a != nil && a.FirstTokenAfter > 0 && a.LastTokenBefore > 0 && a.FirstTokenAfter > a.LastTokenBefore {
		start := max(a.LastTokenBefore, published.UnixNano())
		su.Bubble, su.BubbleMeasured = time.Duration(a.FirstTokenAfter-start), true
	} else if total > 0 {
		su.Bubble = time.Duration(total * float64(time.Second))
	} else {
		su.Bubble = r.Latency
	}
	d.phaseSpans(ctx, r)
}

// phaseSpans records the server's commit phases as child spans, placed back to back ending
// at the ack's time.
func (d *updateDriver) phaseSpans(ctx context.Context, r ServerResult) {
	if r.Ack == nil || r.Ack.At == 0 || len(r.Phases) == 0 {
		return
	}
	var total float64
	for _, p := range r.Phases {
		total += p.Seconds
	}
	at := time.UnixMilli(r.Ack.At).Add(-time.Duration(total * float64(time.Second)))
	for _, p := range r.Phases {
		end := at.Add(time.Duration(p.Seconds * float64(time.Second)))
		_, s := d.c.tracer.Start(ctx, "sdk.update_weights."+phaseName(p.Name), trace.WithTimestamp(at),
			trace.WithAttributes(attribute.String("rollout.server_id", r.ServerID), attribute.Bool("rollout.ok", p.OK)))
		if p.Error != "" {
			s.RecordError(errors.New(p.Error))
		}
		s.End(trace.WithTimestamp(end))
		at = end
	}
}

func (d *updateDriver) setErr(id string, err error) {
	if d.errs == nil {
		d.errs = map[string]error{}
	}
	if d.errs[id] == nil {
		d.errs[id] = err
	}
}

// finish fills the per-server verdicts once the tracker is done.
func (d *updateDriver) finish() {
	for i := range d.res.Servers {
		su := &d.res.Servers[i]
		su.Staged = d.t.stagedOK(su.ServerID)
		su.Committed = d.t.committed(su.ServerID)
		su.Stale = d.t.desired && !su.Committed
		if su.Stale {
			d.res.Stale = append(d.res.Stale, su.ServerID)
			if d.errs[su.ServerID] == nil {
				d.setErr(su.ServerID, fmt.Errorf("%w: did not commit", ErrFailed))
			}
		}
		su.Err = d.errs[su.ServerID]
		d.res.MaxBubble = max(d.res.MaxBubble, su.Bubble)
	}
	slices.Sort(d.res.Stale)
}

func (d *updateDriver) fleetError(kind error) error {
	results := make([]ServerResult, 0, len(d.res.Servers))
	for _, su := range d.res.Servers {
		r := ServerResult{ServerID: su.ServerID, Err: su.Err, WeightVersion: su.WeightVersion}
		if su.Commit != nil {
			r = *su.Commit
			r.Err = su.Err
		} else if su.Stage != nil {
			r = *su.Stage
			r.Err = su.Err
		}
		results = append(results, r)
	}
	fe := &FleetError{Op: "update_weights", Err: kind, Results: results}
	if d.desErr != nil {
		return errors.Join(fe, d.desErr)
	}
	return fe
}

// phaseName names a commit phase as the result reports it: the agent names the swap step
// after its command.
func phaseName(n string) string {
	if n == "commit" {
		return "swap"
	}
	return n
}
