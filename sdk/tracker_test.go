package sdk

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ev is one input to the tracker in a scripted transaction.
type ev struct {
	kind   string // "stage", "commit", "stage_timeout", "commit_timeout", "desired", "cancel"
	server string
	ok     bool
}

// run feeds the events and returns every action the tracker produced (the start action first).
func run(t *testing.T, tr *tracker, evs ...ev) []action {
	t.Helper()
	acts := []action{tr.start()}
	for _, e := range evs {
		var a action
		var ok bool
		switch e.kind {
		case "stage":
			a, ok = tr.stageAck(e.server, e.ok)
		case "commit":
			a, ok = tr.commitAck(e.server, e.ok)
		case "stage_timeout":
			a, ok = tr.stageTimeout(), true
		case "commit_timeout":
			a, ok = tr.commitTimeout(), true
		case "desired":
			a, ok = tr.desiredWritten(e.ok), true
		case "cancel":
			a, ok = tr.cancel(), true
		default:
			t.Fatalf("bad event %q", e.kind)
		}
		if ok && a.kind != 0 {
			acts = append(acts, a)
		}
	}
	return acts
}

func kinds(acts []action) []string {
	var out []string
	for _, a := range acts {
		s := a.kind.String()
		if a.targets != nil {
			s += ":"
			for i, id := range a.targets {
				if i > 0 {
					s += ","
				}
				s += id
			}
		}
		if a.kind == actDone {
			s += ":" + string(a.outcome)
		}
		out = append(out, s)
	}
	return out
}

func TestTrackerPolicies(t *testing.T) {
	abc := []string{"c", "a", "b"}
	for _, tc := range []struct {
		name   string
		kind   policyKind
		k      int
		events []ev
		want   []string
		stale  []string // servers that end without committing after the commit point
	}{
		{"all ok", policyAll, 0, []ev{{"stage", "a", true}, {"stage", "b", true}, {"stage", "c", true},
			{"desired", "", true}, {"commit", "a", true}, {"commit", "b", true}, {"commit", "c", true}},
			[]string{"stage:a,b,c", "set_desired", "commit:a,b,c", "done:committed"}, nil},
		{"all: one stage failure aborts at once", policyAll, 0, []ev{{"stage", "a", true}, {"stage", "b", false}, {"stage", "c", true}},
			[]string{"stage:a,b,c", "done:aborted"}, nil},
		{"all: stage timeout aborts", policyAll, 0, []ev{{"stage", "a", true}, {"stage", "b", true}, {"stage_timeout", "", false}},
			[]string{"stage:a,b,c", "done:aborted"}, nil},
		{"all: desired write fails aborts", policyAll, 0, []ev{{"stage", "a", true}, {"stage", "b", true}, {"stage", "c", true}, {"desired", "", false}},
			[]string{"stage:a,b,c", "set_desired", "done:aborted"}, nil},
		{"all: commit failure is partial", policyAll, 0, []ev{{"stage", "a", true}, {"stage", "b", true}, {"stage", "c", true},
			{"desired", "", true}, {"commit", "a", true}, {"commit", "b", false}, {"commit", "c", true}},
			[]string{"stage:a,b,c", "set_desired", "commit:a,b,c", "done:partial"}, []string{"b"}},
		{"quorum 2: one stage failure commits the rest", policyQuorum, 2, []ev{{"stage", "a", true}, {"stage", "b", false}, {"stage", "c", true},
			{"desired", "", true}, {"commit", "a", true}, {"commit", "c", true}},
			[]string{"stage:a,b,c", "set_desired", "commit:a,c", "done:degraded"}, []string{"b"}},
		{"quorum 2: timeout with two staged commits them", policyQuorum, 2, []ev{{"stage", "a", true}, {"stage", "c", true}, {"stage_timeout", "", false},
			{"desired", "", true}, {"commit", "a", true}, {"commit", "c", true}},
			[]string{"stage:a,b,c", "set_desired", "commit:a,c", "done:degraded"}, []string{"b"}},
		{"quorum 2: two failures abort early", policyQuorum, 2, []ev{{"stage", "a", false}, {"stage", "b", false}},
			[]string{"stage:a,b,c", "done:aborted"}, nil},
		{"quorum 2: commit failure below quorum is partial", policyQuorum, 2, []ev{{"stage", "a", true}, {"stage", "b", true}, {"stage", "c", false},
			{"desired", "", true}, {"commit", "a", true}, {"commit_timeout", "", false}},
			[]string{"stage:a,b,c", "set_desired", "commit:a,b", "done:partial"}, []string{"b", "c"}},
		{"quorum 3 all ok is committed", policyQuorum, 3, []ev{{"stage", "a", true}, {"stage", "b", true}, {"stage", "c", true},
			{"desired", "", true}, {"commit", "a", true}, {"commit", "b", true}, {"commit", "c", true}},
			[]string{"stage:a,b,c", "set_desired", "commit:a,b,c", "done:committed"}, nil},
		{"rolling 2: batches then desired", policyRolling, 2, []ev{{"stage", "a", true}, {"stage", "b", true}, {"stage", "c", true},
			{"commit", "a", true}, {"commit", "b", true}, {"commit", "c", true}, {"desired", "", true}},
			[]string{"stage:a,b,c", "commit:a,b", "commit:c", "set_desired", "done:committed"}, nil},
		{"rolling 1: a failed commit does not stop the roll", policyRolling, 1, []ev{{"stage", "a", true}, {"stage", "b", true}, {"stage", "c", true},
			{"commit", "a", true}, {"commit", "b", false}, {"commit", "c", true}, {"desired", "", true}},
			[]string{"stage:a,b,c", "commit:a", "commit:b", "commit:c", "set_desired", "done:partial"}, []string{"b"}},
		{"rolling: a stage failure aborts", policyRolling, 1, []ev{{"stage", "a", false}},
			[]string{"stage:a,b,c", "done:aborted"}, nil},
		{"cancel before commit point aborts", policyQuorum, 1, []ev{{"stage", "a", true}, {"cancel", "", false}},
			[]string{"stage:a,b,c", "done:aborted"}, nil},
		{"cancel after commit point is partial", policyAll, 0, []ev{{"stage", "a", true}, {"stage", "b", true}, {"stage", "c", true},
			{"desired", "", true}, {"commit", "a", true}, {"cancel", "", false}},
			[]string{"stage:a,b,c", "set_desired", "commit:a,b,c", "done:partial"}, []string{"b", "c"}},
		{"acks from strangers and duplicates are ignored", policyAll, 0, []ev{{"stage", "x", false}, {"stage", "a", true}, {"stage", "a", false},
			{"stage", "b", true}, {"stage", "c", true}, {"commit", "zz", false}, {"desired", "", true}, {"commit", "a", true}, {"commit", "a", false},
			{"commit", "b", true}, {"commit", "c", true}},
			[]string{"stage:a,b,c", "set_desired", "commit:a,b,c", "done:committed"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTracker(tc.kind, tc.k, abc)
			acts := run(t, tr, tc.events...)
			assert.Equal(t, tc.want, kinds(acts))
			require.Equal(t, phaseDone, tr.phase)
			var stale []string
			for _, id := range tr.targets {
				if tr.desired && !tr.committed(id) {
					stale = append(stale, id)
				}
			}
			assert.Equal(t, tc.stale, stale)
		})
	}
}

func TestTrackerIgnoresLateInputs(t *testing.T) {
	tr := newTracker(policyAll, 0, []string{"a"})
	tr.start()
	a, ok := tr.stageAck("a", false)
	require.True(t, ok)
	require.Equal(t, OutcomeAborted, a.outcome)
	// Inputs after the end change nothing and repeat the result.
	_, ok = tr.commitAck("a", true)
	assert.False(t, ok)
	assert.Equal(t, a, tr.stageTimeout())
	assert.Equal(t, a, tr.desiredWritten(true))
	assert.Equal(t, a, tr.cancel())
	assert.False(t, tr.desired)
}

func TestParsePolicy(t *testing.T) {
	for _, tc := range []struct {
		in   string
		kind policyKind
		k    int
		bad  bool
	}{
		{"all", policyAll, 0, false},
		{"", policyAll, 0, false},
		{"quorum:2", policyQuorum, 2, false},
		{"rolling:1", policyRolling, 1, false},
		{"quorum", 0, 0, true},
		{"quorum:0", 0, 0, true},
		{"rolling:-1", 0, 0, true},
		{"rolling:x", 0, 0, true},
		{"majority", 0, 0, true},
	} {
		p, err := ParsePolicy(tc.in)
		if tc.bad {
			require.ErrorIs(t, err, ErrInvalid, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		kind, k, err := p.parse()
		require.NoError(t, err)
		assert.Equal(t, tc.kind, kind, tc.in)
		assert.Equal(t, tc.k, k, tc.in)
	}
	assert.Equal(t, Policy("quorum:3"), Quorum(3))
	assert.Equal(t, Policy("rolling:2"), Rolling(2))
	assert.Equal(t, "all", Policy("").String())
}
