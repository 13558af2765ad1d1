package engine

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestControlTransitions walks the table through the documented paths: a sleep Sleep paused
// resumes on a full wake-up, a caller's pause survives it, Resume is refused while asleep, and
// a sleep never ends on a running engine.
func TestControlTransitions(t *testing.T) {
	step := func(s controlState, ev ctlEvent) controlState {
		t.Helper()
		next, err := s.next(ev)
		require.NoError(t, err, "%s in %+v", ev.kind, s)
		return next
	}
	var running controlState
	_, err := running.next(ctlEvent{kind: evSleep, level: 1})
	require.ErrorIs(t, err, errIllegalTransition)

	// Sleep(2, keep) on a running engine, then wake the weights (committed), then the KV.
	s := step(running, ctlEvent{kind: evSleepPause, mode: PauseKeep})
	require.Equal(t, controlState{Phase: ctlPaused, Mode: PauseKeep, BySleep: true}, s)
	s = step(s, ctlEvent{kind: evSleep, level: 2})
	require.Equal(t, controlState{Phase: ctlAsleep, Mode: PauseKeep, BySleep: true, Level: 2, KVReleased: true, WeightsReleased: true}, s)
	_, err = s.next(ctlEvent{kind: evResume})
	require.ErrorIs(t, err, ErrAsleep)
	_, err = s.next(ctlEvent{kind: evWake, wakeWeights: true, wakeKV: true})
	require.ErrorIs(t, err, ErrNoWeights, "waking needs weights committed after a level-2 sleep")
	s = step(s, ctlEvent{kind: evWake, wakeWeights: true, haveWeights: true})
	require.Equal(t, ctlAsleep, s.Phase)
	require.Equal(t, running, step(s, ctlEvent{kind: evWake, wakeKV: true, haveWeights: true}), "the sleep's own pause ends with it")

	// A caller's pause made during the sleep stays after the wake-up.
	s = step(step(running, ctlEvent{kind: evSleepPause, mode: PauseAbort}), ctlEvent{kind: evSleep, level: 1})
	s = step(s, ctlEvent{kind: evPause, mode: PauseWait})
	s = step(s, ctlEvent{kind: evWake, wakeWeights: true, wakeKV: true, haveWeights: true})
	require.Equal(t, controlState{Phase: ctlPaused, Mode: PauseWait}, s)
	require.Equal(t, running, step(s, ctlEvent{kind: evResume}))

	// Every phase has an entry for every event but a running engine's end of sleep.
	for p := range numCtlPhases {
		for k := range numCtlEvents {
			_, err := controlState{Phase: p}.next(ctlEvent{kind: k, mode: PauseAbort})
			if errors.Is(err, errIllegalTransition) != (p == ctlRunning && k == evSleep) {
				t.Errorf("%s while %s: %v", k, p, err)
			}
		}
	}
}
