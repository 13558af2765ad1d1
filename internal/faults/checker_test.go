package faults

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/sdk/protocol"
)

const (
	digestA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	digestB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// clean is a history without a violation: version 1 committed by trainer-a under quorum:2,
// requests before and after it, every server converged, counters at 0.
func clean() History {
	return History{
		Seed: 42,
		Ops: []Op{{ID: 0, Process: "trainer-a", Kind: OpUpdate, Invoke: ms(100), Complete: ms(900), Done: true, Result: "ok",
			Update: &UpdateOp{Trainer: "trainer-a", Version: 1, Digest: digestA, Policy: "quorum:2", Outcome: "committed", Epoch: 2,
				Committed: []string{"s1", "s2", "s3"}}}},
		Faults:    []Fault{{Kind: FaultKill, Target: "s3", At: ms(200), Healed: ms(1500)}},
		Published: []Publish{{Trainer: "trainer-a", Version: 1, Digest: digestA, At: ms(50)}},
		Requests: []Request{
			{ID: 0, Process: "load-0", Phase: PhaseLoad, Invoke: ms(10), Complete: ms(700), Done: true, Floor: 0,
				Samples: []Sample{{Versions: []int64{0, 0, 1, 1}, Servers: []string{"s1"}}, {Versions: []int64{0, 0, 0, 0}, Servers: []string{"s1"}}}},
			{ID: 1, Process: "load-1", Phase: PhaseLoad, Invoke: ms(950), Complete: ms(1200), Done: true, Floor: 1,
				Samples: []Sample{{Versions: []int64{1, 1, 1, 1}, Servers: []string{"s2"}}}},
			{ID: 2, Process: "load-1", Phase: PhaseLoad, Invoke: ms(1300), Complete: ms(1400), Done: true, Floor: 1, Err: "sdk: timeout"},
			{ID: 3, Process: "final", Phase: PhaseFinal, Invoke: ms(3000), Complete: ms(3100), Done: true, Floor: 1,
				Samples: []Sample{{Versions: []int64{1, 1}, Servers: []string{"s3"}}}},
		},
		Serving: []ServeObs{
			{At: ms(5), Server: "s1", Version: 0, Digest: InitialDigest, Source: "heartbeat"},
			{At: ms(900), Server: "s1", Version: 1, Digest: digestA, Source: "commit-ack"},
			{At: ms(2500), Server: "s3", Version: 1, Digest: digestA, Source: "heartbeat", Why: "converged to the desired state"},
			{At: ms(2600), Server: "s2", Version: 1, Digest: "", Source: "heartbeat"}, // unknown: no evidence
		},
		Sessions: []SessionObs{{ID: "ep-0", Process: "session-0", Prompt: []int{5, 6},
			Steps: []SessionStep{{Request: 0, Tokens: []int{9, 9}, Versions: []int64{0, 1}}, {Env: []int{7, 8}},
				{Request: 1, Tokens: []int{3, 4}, Versions: []int64{1, 1}}},
			Completion: []int{9, 9, 7, 8, 3, 4}, Versions: []int64{0, 1, 0, 0, 1, 1}, Mask: []uint8{1, 1, 0, 0, 1, 1}}},
		Desired:     []DesiredObs{{At: ms(800), Epoch: 2, Version: 1, Digest: digestA}},
		Counters:    []CounterObs{{At: ms(3200), Server: "s1", Metric: "rollout_safety_violations_total", Value: 0}},
		HealedAt:    ms(2000),
		Convergence: []ConvergeObs{{Server: "s1", Want: 1, Converged: true}, {Server: "s2", Want: 1, Converged: true}, {Server: "s3", Want: 1, Converged: true}},
	}
}

func TestCheckCleanHistory(t *testing.T) {
	h := clean()
	r := Check(&h)
	require.True(t, r.OK(), "%s", r)
	assert.Equal(t, 1, r.Ops)
	assert.Equal(t, 1, r.Faults)
	assert.Equal(t, 4, r.Requests)
	assert.Equal(t, 1, r.RequestErrors)
	assert.Equal(t, 4, r.Samples)
	assert.Equal(t, 14, r.Tokens)
	assert.Equal(t, []int64{0, 1}, r.Committed)
	out := r.String()
	assert.Contains(t, out, "seed 42")
	assert.Contains(t, out, "ROLLOUT_FAULTS_SEED=42")
	assert.Contains(t, out, "violations: 0")
}

// Each case breaks the clean history in one way; the checker must report exactly that kind
// (and nothing else), so a checker that misses the violation fails the test.
func TestCheckFindsEachViolationKind(t *testing.T) {
	cases := []struct {
		kind   string
		mutate func(h *History)
		detail string
	}{
		{KindTwoDigests, func(h *History) {
			// trainer-b's checkpoint under the same version number, acked by s2.
			h.Serving = append(h.Serving, ServeObs{At: ms(1000), Server: "s2", Version: 1, Digest: digestB, Source: "commit-ack", Why: "trainer-b's update"})
		}, "version 1 under 2 digests"},
		{KindTwoDigests, func(h *History) {
			// version 0 is one set of weights too.
			h.Serving = append(h.Serving, ServeObs{At: ms(1000), Server: "s3", Version: 0, Digest: digestB, Source: "heartbeat"})
		}, "version 0 under 2 digests"},
		{KindUncommitted, func(h *History) {
			// version 2 was tried (aborted, never past its commit point) and yet served.
			h.Ops = append(h.Ops, Op{ID: 1, Process: "trainer-b", Kind: OpUpdate, Invoke: ms(1000), Complete: ms(1100), Done: true, Result: "aborted",
				Update: &UpdateOp{Trainer: "trainer-b", Version: 2, Digest: digestB, Policy: "all", Outcome: "aborted"}})
			h.Requests[1].Samples[0].Versions = []int64{1, 1, 2, 2}
		}, "version 2, never committed"},
		{KindUncommitted, func(h *History) {
			// A cancelled update that never reached its commit point commits nothing.
			h.Ops = append(h.Ops, Op{ID: 1, Process: "trainer-a", Kind: FaultCancelUpdate, Invoke: ms(1000), Complete: ms(1100), Done: true,
				Result: "context canceled", Update: &UpdateOp{Trainer: "trainer-a", Version: 2, Digest: digestB, Policy: "rolling:1", Cancelled: true}})
			h.Requests[3].Samples[0].Versions = []int64{2, 2}
			h.Requests[3].Floor = 1
		}, "version 2, never committed"},
		{KindBelowFloor, func(h *History) {
			h.Requests[1].Samples[0].Versions = []int64{0, 1, 1, 1}
		}, "version 0 below the floor 1"},
		{KindBackwards, func(h *History) {
			h.Requests[0].Samples[0].Versions = []int64{0, 1, 0, 1}
		}, "goes back from version 1 to 0"},
		{KindNotConverged, func(h *History) {
			h.Convergence[2] = ConvergeObs{Server: "s3", Want: 1, Converged: false, After: 30 * time.Second, Last: "state=paused in_rotation=false v=1"}
		}, "server s3 not in rotation on version 1"},
		{KindUnanswered, func(h *History) {
			h.Requests[1].Done, h.Requests[1].Samples = false, nil
		}, "request 1 (load-1, load) sent at 950ms never completed"},
		{KindUnanswered, func(h *History) {
			h.Requests[3].Err, h.Requests[3].Samples = "sdk: no server at the requested weight version", nil
		}, "after convergence failed"},
		{KindUnanswered, func(h *History) {
			h.Ops[0].Done = false
		}, "never completed"},
		{KindCounter, func(h *History) {
			h.Counters = append(h.Counters, CounterObs{At: ms(1400), Server: "s3", Metric: "rollout_safety_violations_total", Value: 2})
		}, "server s3: rollout_safety_violations_total = 2"},
		{KindSession, func(h *History) {
			// a turn's tokens lost from the transcript
			o := &h.Sessions[0]
			o.Completion, o.Versions, o.Mask = o.Completion[:4], o.Versions[:4], o.Mask[:4]
		}, "transcript after the prompt is 4 tokens, its steps give 6; first difference at 4"},
		{KindSession, func(h *History) {
			// a turn counted twice
			o := &h.Sessions[0]
			o.Completion = append(o.Completion, 3, 4)
			o.Versions, o.Mask = append(o.Versions, 1, 1), append(o.Mask, 1, 1)
		}, "its steps give 6"},
		{KindSession, func(h *History) {
			// a model token that lost the version that sampled it
			h.Sessions[0].Versions[1] = 0
		}, "token versions v0x4 v1x2, its turns returned v0x1 v1x1 v0x2 v1x2"},
		{KindSession, func(h *History) {
			// an environment token trained on
			h.Sessions[0].Mask[2] = 1
		}, "loss mask differs from its steps at token 2"},
	}
	for _, c := range cases {
		t.Run(c.kind, func(t *testing.T) {
			h := clean()
			c.mutate(&h)
			r := Check(&h)
			require.False(t, r.OK(), "the checker missed a %s", c.kind)
			require.Len(t, r.Violations, 1, "%s", r)
			assert.Equal(t, c.kind, r.Violations[0].Kind)
			assert.Contains(t, r.Violations[0].Detail, c.detail)
			assert.Equal(t, 1, r.ByKind[c.kind])
			assert.Contains(t, r.String(), c.kind+": ")
		})
	}
}

// A desired state naming a version commits it, even when no update reported so (the call
// was cancelled after its commit point, or its result was lost).
func TestCheckDesiredStateCommits(t *testing.T) {
	h := clean()
	h.Requests[1].Samples[0].Versions = []int64{1, 3}
	r := Check(&h)
	require.Equal(t, 1, r.ByKind[KindUncommitted], "%s", r)
	h.Desired = append(h.Desired, DesiredObs{At: ms(1100), Epoch: 3, Version: 3, Digest: digestB})
	assert.True(t, Check(&h).OK())
	// So does an update whose call failed after it wrote the desired state.
	h = clean()
	h.Requests[1].Samples[0].Versions = []int64{1, 3}
	h.Ops = append(h.Ops, Op{ID: 1, Kind: FaultCancelUpdate, Done: true, Result: "context canceled",
		Update: &UpdateOp{Version: 3, Epoch: 4, Cancelled: true}})
	assert.True(t, Check(&h).OK())
}

// One request with every token wrong counts once per kind, not once per token.
func TestCheckCountsPerRequest(t *testing.T) {
	h := clean()
	h.Requests[1].Floor = 5
	h.Requests[1].Samples = []Sample{{Versions: []int64{1, 0, 1, 0}}, {Versions: []int64{1, 0}}}
	r := Check(&h)
	assert.Equal(t, 1, r.ByKind[KindBelowFloor], "%s", r)
	assert.Equal(t, 1, r.ByKind[KindBackwards], "%s", r)
	assert.Contains(t, r.String(), "v1x1 v0x1 v1x1 v0x1")
}

func TestRecorderBuildsAHistory(t *testing.T) {
	rec := NewRecorder(7)
	op := rec.Invoke("trainer-a", OpUpdate, "v1 all", &UpdateOp{Trainer: "trainer-a", Version: 1})
	f := rec.Fault(FaultKill, "s1", "")
	q := rec.Request("load-0", PhaseLoad, 0)
	rec.Answer(q, []Sample{{Versions: []int64{0, 1}}}, nil)
	q2 := rec.Request("load-0", PhaseLoad, 1)
	rec.Answer(q2, nil, errors.New("sdk: timeout"))
	rec.Complete(op, nil, func(u *UpdateOp) { u.Outcome, u.Epoch = "committed", 1 })
	rec.Healed(f)
	rec.Publish("trainer-a", 1, digestA)
	rec.Serve("s1", 1, digestA, "commit-ack", "")
	rec.Desired(DesiredObs{Epoch: 1, Version: 1, Digest: digestA})
	rec.Counter("s1", "rollout_safety_violations_total", 0)
	rec.Heal()
	rec.Converge(ConvergeObs{Server: "s1", Want: 1, Converged: true})
	h := rec.History()
	assert.Equal(t, uint64(7), h.Seed)
	require.Len(t, h.Ops, 1)
	assert.True(t, h.Ops[0].Done)
	assert.Equal(t, "ok", h.Ops[0].Result)
	assert.GreaterOrEqual(t, h.Ops[0].Complete, h.Ops[0].Invoke)
	assert.Equal(t, "committed", h.Ops[0].Update.Outcome)
	assert.NotZero(t, h.Faults[0].Healed)
	assert.Equal(t, "sdk: timeout", h.Requests[1].Err)
	r := Check(&h)
	assert.True(t, r.OK(), "%s", r)
	assert.Equal(t, 1, r.RequestErrors)

	var buf bytes.Buffer
	require.NoError(t, h.WriteJSON(&buf))
	var back History
	require.NoError(t, json.Unmarshal(buf.Bytes(), &back))
	assert.Equal(t, h.Requests, back.Requests)
	// The copy is deep: later records do not change it.
	rec.Complete(op, errors.New("again"), func(u *UpdateOp) { u.Outcome = "aborted" })
	assert.Equal(t, "committed", h.Ops[0].Update.Outcome)
}

func TestServingDigest(t *testing.T) {
	d := NewDigests()
	hb := func(v int64) *protocol.Heartbeat { return &protocol.Heartbeat{ServerID: "s1", WeightVersion: v} }
	dg, why := d.ServingDigest("s1", hb(0))
	assert.Equal(t, InitialDigest, dg, why)
	dg, _ = d.ServingDigest("s1", hb(1))
	assert.Empty(t, dg, "nothing published yet")

	d.Published("trainer-a", 1, digestA)
	dg, why = d.ServingDigest("s1", hb(1))
	assert.Equal(t, digestA, dg)
	assert.Contains(t, why, "only trainer-a")

	d.Published("trainer-b", 1, digestB)
	dg, _ = d.ServingDigest("s1", hb(1))
	assert.Empty(t, dg, "two trainers published version 1 and nothing says which one s1 took")

	d.Desired(&protocol.DesiredState{Weights: &protocol.WeightsRef{Version: 1, URI: "x", SHA256: digestB}})
	dg, why = d.ServingDigest("s1", hb(1))
	assert.Equal(t, digestB, dg)
	assert.Contains(t, why, "desired")

	d.CommitAcked("s1", "trainer-a", 1, digestA)
	dg, why = d.ServingDigest("s1", hb(1))
	assert.Equal(t, digestA, dg, "its own commit ack says which checkpoint s1 swapped in")
	assert.True(t, strings.Contains(why, "trainer-a"), why)
	dg, _ = d.ServingDigest("s2", &protocol.Heartbeat{ServerID: "s2", WeightVersion: 1})
	assert.Equal(t, digestB, dg, "s2 acked nothing: it converged to the desired state")

	d.Restarted("s1")
	dg, _ = d.ServingDigest("s1", hb(1))
	assert.Equal(t, digestB, dg, "a restarted server loads what it converges to")

	// s3 staged trainer-a's version 1 (its update aborted) and then converged to the desired
	// state naming trainer-b's: it committed what it had staged.
	d.Staged("s3", "trainer-a", 1, digestA)
	dg, why = d.ServingDigest("s3", &protocol.Heartbeat{ServerID: "s3", WeightVersion: 1})
	assert.Equal(t, digestA, dg)
	assert.Contains(t, why, "staged trainer-a's")
	d.Restarted("s3")
	dg, _ = d.ServingDigest("s3", &protocol.Heartbeat{ServerID: "s3", WeightVersion: 1})
	assert.Equal(t, digestB, dg, "a restart drops what was staged")
}
