package faults

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestScheduleIsSeeded(t *testing.T) {
	a, b := NewSchedule(11, 200, 3), NewSchedule(11, 200, 3)
	require.Equal(t, a, b, "one seed, one schedule")
	c := NewSchedule(12, 200, 3)
	assert.NotEqual(t, a.Events, c.Events)
}

func TestScheduleShape(t *testing.T) {
	s := NewSchedule(3, 400, 3)
	require.Equal(t, 400, s.Faults)
	kinds := map[string]int{}
	faults := 0
	heals := map[int]Event{}
	starts := map[int]Event{}
	var last time.Duration
	for _, e := range s.Events {
		require.GreaterOrEqual(t, e.At, last, "events in time order")
		last = e.At
		kinds[e.Kind]++
		if e.Fault {
			faults++
			starts[e.Of] = e
		}
		switch e.Kind {
		case HealRestart, HealCont, HealProxy:
			heals[e.Of] = e
		}
	}
	assert.Equal(t, 400, faults)
	for _, k := range []string{FaultKill, FaultKillMidStage, FaultKillMidCommit, FaultStop, FaultRedisEmpty, FaultRedisData,
		FaultPartition, FaultFreeze, FaultDelay, FaultDrop, FaultCut, FaultTwoTrainers, FaultCancelUpdate,
		FaultRaceRedisLoss, OpUpdate, OpPause, OpResume, OpSleep, OpWake, OpPauseServer, OpResumeServer} {
		assert.Positive(t, kinds[k], "no %s in 400 faults", k)
	}
	policies := map[string]bool{}
	for _, e := range s.Events {
		if e.Update != nil {
			policies[e.Update.Policy] = true
		}
	}
	assert.Len(t, policies, 5, "every policy: %v", policies)

	// Every fault that impairs a server is healed later on the same server, a stop only after
	// the heartbeat TTL has passed; at no moment are more than maxImpaired servers impaired.
	type span struct{ from, to time.Duration }
	var spans []span
	for of, h := range heals {
		f, ok := starts[of]
		require.True(t, ok)
		assert.Equal(t, f.Server, h.Server)
		assert.Greater(t, h.At, f.At)
		want := map[string]string{FaultKill: HealRestart, FaultKillMidStage: HealRestart, FaultKillMidCommit: HealRestart, FaultStop: HealCont}[f.Kind]
		if want == "" {
			want = HealProxy
		}
		assert.Equal(t, want, h.Kind, f.Kind)
		if f.Kind == FaultStop {
			assert.GreaterOrEqual(t, h.At-f.At, StopHold)
		}
		if f.Kind == FaultKillMidStage || f.Kind == FaultKillMidCommit {
			assert.Greater(t, h.At-f.At, TriggerTimeout, "the restart comes after the kill")
		}
		spans = append(spans, span{f.At, h.At})
	}
	for _, a := range spans {
		n := 0
		for _, b := range spans {
			if b.from <= a.from && a.from < b.to {
				n++
			}
		}
		assert.LessOrEqual(t, n, maxImpaired, "at %s", a.from)
	}
	// CI's 200 faults fit in about four minutes of schedule.
	assert.Less(t, NewSchedule(1, 200, 3).Events[len(NewSchedule(1, 200, 3).Events)-1].At, 4*time.Minute)
}
