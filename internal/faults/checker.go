package faults

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Violation kinds Check reports.
const (
	// KindTwoDigests: one version number was served (or committed) under two digests.
	KindTwoDigests = "version-under-two-digests"
	// KindUncommitted: a token of a version the fleet never committed (no update passed its
	// commit point for it and no desired state named it).
	KindUncommitted = "token-from-uncommitted-version"
	// KindBelowFloor: a token older than the request's floor.
	KindBelowFloor = "token-below-floor"
	// KindBackwards: a sample whose tokens' versions go backwards.
	KindBackwards = "token-version-backwards"
	// KindNotConverged: a server not in rotation on the final desired version within the
	// bound after the faults were healed.
	KindNotConverged = "not-converged"
	// KindUnanswered: a request or op that never completed, or a request after convergence
	// that failed.
	KindUnanswered = "unanswered"
	// KindCounter: a server's violation counter above 0.
	KindCounter = "violation-counter"
	// KindSession: a session's transcript is not its successful steps in order (a token lost,
	// duplicated or out of place), or a model token's version or loss mask is not the one its
	// turn returned.
	KindSession = "session-transcript"
)

// Kinds lists every violation kind, in report order.
func Kinds() []string {
	return []string{KindTwoDigests, KindUncommitted, KindBelowFloor, KindBackwards, KindNotConverged, KindUnanswered, KindCounter,
		KindSession}
}

// maxDetails bounds how many violations of one kind the report spells out.
const maxDetails = 8

// Violation is one thing that must not happen, with what shows it.
type Violation struct {
	Kind   string `json:"kind"`
	Detail string `json:"detail"`
}

// Report is what Check found.
type Report struct {
	Seed uint64
	// Ops, Faults, Requests count the history's entries; Samples and Tokens what the
	// answered requests returned; RequestErrors the requests that failed.
	Ops, Faults, Requests, Samples, Tokens, RequestErrors int
	OpsByKind, FaultsByKind                               map[string]int
	// Committed are the versions the fleet committed.
	Committed []int64
	// Violations, in kind order; ByKind counts them.
	Violations []Violation
	ByKind     map[string]int
}

// OK reports whether no violation was found.
func (r *Report) OK() bool { return len(r.Violations) == 0 }

// Check judges a history: it never looks at timing margins, only at what happened.
func Check(h *History) *Report {
	r := &Report{Seed: h.Seed, Ops: len(h.Ops), Faults: len(h.Faults), Requests: len(h.Requests),
		OpsByKind: map[string]int{}, FaultsByKind: map[string]int{}, ByKind: map[string]int{}}
	for _, op := range h.Ops {
		r.OpsByKind[op.Kind]++
	}
	for _, f := range h.Faults {
		r.FaultsByKind[f.Kind]++
	}
	committed := committedVersions(h)
	r.Committed = slices.Sorted(maps.Keys(committed))

	add := func(kind, format string, args ...any) {
		r.Violations = append(r.Violations, Violation{Kind: kind, Detail: fmt.Sprintf(format, args...)})
	}
	checkDigests(h, add)
	for _, q := range h.Requests {
		if !q.Done {
			add(KindUnanswered, "request %d (%s, %s) sent at %s never completed", q.ID, q.Process, q.Phase, q.Invoke)
			continue
		}
		if q.Err != "" {
			r.RequestErrors++
			if q.Phase == PhaseFinal {
				add(KindUnanswered, "request %d sent at %s after convergence failed: %s", q.ID, q.Invoke, q.Err)
			}
			continue
		}
		checkRequest(q, committed, r, add)
	}
	for _, op := range h.Ops {
		if !op.Done {
			add(KindUnanswered, "op %d %s %s (%s) invoked at %s never completed", op.ID, op.Process, op.Kind, op.Args, op.Invoke)
		}
	}
	for _, c := range h.Convergence {
		if !c.Converged {
			add(KindNotConverged, "server %s not in rotation on version %d %s after the heal; last heartbeat %s", c.Server, c.Want, c.After, c.Last)
		}
	}
	for _, o := range h.Sessions {
		checkSession(o, add)
	}
	type key struct{ server, metric string }
	worst := map[key]CounterObs{}
	for _, c := range h.Counters {
		k := key{c.Server, c.Metric}
		if c.Value > 0 && c.Value > worst[k].Value {
			worst[k] = c
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(worst), func(a, b key) int {
		return cmp.Or(cmp.Compare(a.server, b.server), cmp.Compare(a.metric, b.metric))
	}) {
		c := worst[k]
		add(KindCounter, "server %s: %s = %g (at %s)", c.Server, c.Metric, c.Value, c.At)
	}
	order := map[string]int{}
	for i, k := range Kinds() {
		order[k] = i
	}
	slices.SortStableFunc(r.Violations, func(a, b Violation) int { return cmp.Compare(order[a.Kind], order[b.Kind]) })
	for _, v := range r.Violations {
		r.ByKind[v.Kind]++
	}
	return r
}

// PhaseLoad and PhaseFinal are a request's phases: during the faults, and after convergence.
const (
	PhaseLoad  = "load"
	PhaseFinal = "final"
)

// committedVersions is version 0 (what servers load at start), every version an update
// carried past its commit point, and every version a desired state named.
func committedVersions(h *History) map[int64]bool {
	c := map[int64]bool{0: true}
	for _, op := range h.Ops {
		if u := op.Update; u != nil && op.Done && u.CommitPointPassed() {
			c[u.Version] = true
		}
	}
	for _, d := range h.Desired {
		if d.Version > 0 {
			c[d.Version] = true
		}
	}
	return c
}

// checkDigests finds versions observed under more than one digest.
func checkDigests(h *History, add func(kind, format string, args ...any)) {
	byVersion := map[int64]map[string]ServeObs{} // version → digest → first observation
	for _, o := range h.Serving {
		if o.Digest == "" {
			continue
		}
		m := byVersion[o.Version]
		if m == nil {
			m = map[string]ServeObs{}
			byVersion[o.Version] = m
		}
		if _, seen := m[o.Digest]; !seen {
			m[o.Digest] = o
		}
	}
	for _, v := range slices.Sorted(maps.Keys(byVersion)) {
		m := byVersion[v]
		if len(m) < 2 {
			continue
		}
		var ev []string
		for _, d := range slices.Sorted(maps.Keys(m)) {
			o := m[d]
			ev = append(ev, fmt.Sprintf("%s on %s at %s (%s%s)", short(d), o.Server, o.At, o.Source, prefixed(": ", o.Why)))
		}
		add(KindTwoDigests, "version %d under %d digests: %s", v, len(m), strings.Join(ev, "; "))
	}
}

// checkRequest checks every token of an answered request.
func checkRequest(q Request, committed map[int64]bool, r *Report, add func(kind, format string, args ...any)) {
	uncommitted, below, backwards := false, false, false
	for si, s := range q.Samples {
		r.Samples++
		r.Tokens += len(s.Versions)
		for i, v := range s.Versions {
			if !committed[v] && !uncommitted {
				uncommitted = true
				add(KindUncommitted, "request %d (sent %s, floor %d) sample %d token %d has version %d, never committed; servers %v, versions %s",
					q.ID, q.Invoke, q.Floor, si, i, v, s.Servers, runs(s.Versions))
			}
			if v < q.Floor && !below {
				below = true
				add(KindBelowFloor, "request %d (sent %s) sample %d token %d has version %d below the floor %d; servers %v, versions %s",
					q.ID, q.Invoke, si, i, v, q.Floor, s.Servers, runs(s.Versions))
			}
			if i > 0 && v < s.Versions[i-1] && !backwards {
				backwards = true
				add(KindBackwards, "request %d (sent %s) sample %d goes back from version %d to %d at token %d; servers %v, versions %s",
					q.ID, q.Invoke, si, s.Versions[i-1], v, i, s.Servers, runs(s.Versions))
			}
		}
	}
}

// runs prints versions run-length encoded: "3x5 4x11".
func runs(vs []int64) string {
	var b strings.Builder
	for i := 0; i < len(vs); {
		j := i
		for j < len(vs) && vs[j] == vs[i] {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "v%dx%d", vs[i], j-i)
		i = j
	}
	return b.String()
}

func short(d string) string {
	if len(d) > 12 {
		return d[:12]
	}
	return d
}

func prefixed(p, s string) string {
	if s == "" {
		return ""
	}
	return p + s
}

// String is the report as the harness prints it: the counts, the violations by kind (the
// first few of each spelled out) and the seed to replay.
func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "faults report (seed %d)\n", r.Seed)
	fmt.Fprintf(&b, "  ops:        %d %s\n", r.Ops, counts(r.OpsByKind))
	fmt.Fprintf(&b, "  faults:     %d %s\n", r.Faults, counts(r.FaultsByKind))
	fmt.Fprintf(&b, "  requests:   %d (%d failed), %d samples, %d tokens\n", r.Requests, r.RequestErrors, r.Samples, r.Tokens)
	fmt.Fprintf(&b, "  committed:  %v\n", r.Committed)
	fmt.Fprintf(&b, "  violations: %d\n", len(r.Violations))
	for _, k := range Kinds() {
		fmt.Fprintf(&b, "    %-32s %d\n", k, r.ByKind[k])
	}
	shown := map[string]int{}
	for _, v := range r.Violations {
		if shown[v.Kind]++; shown[v.Kind] <= maxDetails {
			fmt.Fprintf(&b, "  - %s: %s\n", v.Kind, v.Detail)
		} else if shown[v.Kind] == maxDetails+1 {
			fmt.Fprintf(&b, "  - %s: ... %d more\n", v.Kind, r.ByKind[v.Kind]-maxDetails)
		}
	}
	fmt.Fprintf(&b, "replay: ROLLOUT_FAULTS_SEED=%d\n", r.Seed)
	return b.String()
}

func counts(m map[string]int) string {
	if len(m) == 0 {
		return ""
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return "(" + strings.Join(parts, " ") + ")"
}

// checkSession compares a session's final trajectory with its steps: the completion is the
// steps' tokens in order, each model token with its turn's version and mask 1, each
// environment token with mask 0.
func checkSession(o SessionObs, add func(kind, format string, args ...any)) {
	var want []int
	var versions []int64
	var mask []uint8
	for _, st := range o.Steps {
		want = append(want, st.Env...)
		for range st.Env {
			versions, mask = append(versions, 0), append(mask, 0)
		}
		want = append(want, st.Tokens...)
		versions = append(versions, st.Versions...)
		for range st.Tokens {
			mask = append(mask, 1)
		}
	}
	switch {
	case !slices.Equal(want, o.Completion):
		add(KindSession, "session %s (%s): transcript after the prompt is %d tokens, its steps give %d; first difference at %d",
			o.ID, o.Process, len(o.Completion), len(want), firstDiff(want, o.Completion))
	case !slices.Equal(versions, o.Versions):
		add(KindSession, "session %s (%s): token versions %s, its turns returned %s", o.ID, o.Process, runs(o.Versions), runs(versions))
	case !slices.Equal(mask, o.Mask):
		add(KindSession, "session %s (%s): loss mask differs from its steps at token %d", o.ID, o.Process, firstDiff(mask, o.Mask))
	}
}

// firstDiff is the first index where a and b differ (the shorter length when one is a prefix
// of the other).
func firstDiff[T comparable](a, b []T) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
