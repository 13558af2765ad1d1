package engine

import (
	"errors"
	"fmt"
)

// The engine's control state (paused, asleep and what sleeps) is one controlState value,
// changed only through controlState.next, which looks the transition up in ctlTransitions.
// The engine applies an event's side effects (aborting requests, releasing the KV pool or the
// weights) around the transition; the property test predicts the state after each operation
// with the same table and checks the engine's against it.

// ctlPhase is the engine's control phase.
type ctlPhase uint8

// Control phases.
const (
	// ctlRunning schedules requests; the state carries nothing else.
	ctlRunning ctlPhase = iota
	// ctlPaused schedules nothing new (or nothing at all for keep): Mode and BySleep.
	ctlPaused
	// ctlAsleep is paused with some part asleep: Mode, BySleep, Level and the released parts.
	ctlAsleep
	numCtlPhases
)

// State is the engine's control phase as Stats and Metrics report it. The engine imports
// nothing of the fleet protocol, so it names its phases itself; the server maps them to the
// protocol's states in one place (server/agent.WireState).
type State string

// The states the engine reports.
const (
	// StateRunning schedules requests.
	StateRunning State = "running"
	// StatePaused schedules nothing new.
	StatePaused State = "paused"
	// StateSleeping is paused with the KV pool (and perhaps the weights) released.
	StateSleeping State = "sleeping"
)

// ctlPhaseStates are the phases as Stats.State reports them.
var ctlPhaseStates = [numCtlPhases]State{ctlRunning: StateRunning, ctlPaused: StatePaused, ctlAsleep: StateSleeping}

// State is the phase as Stats.State reports it.
func (p ctlPhase) State() State {
	if p < numCtlPhases {
		return ctlPhaseStates[p]
	}
	return State(fmt.Sprintf("phase(%d)", uint8(p)))
}

func (p ctlPhase) String() string { return string(p.State()) }

// ctlEventKind is what changes the control state.
type ctlEventKind uint8

// Control events, one for each utility call or part of one.
const (
	// evPause is Pause(mode): the pause is the caller's, whatever Sleep did before.
	evPause ctlEventKind = iota
	// evResume is Resume: refused while anything sleeps.
	evResume
	// evSleepPause is the start of Sleep: it pauses with mode unless already paused, in which
	// case the existing pause stands.
	evSleepPause
	// evSleep is the end of Sleep(level), once the engine drained and released what the
	// level releases.
	evSleep
	// evWake is WakeUp(tags).
	evWake
	numCtlEvents
)

// ctlEventNames name the events in errors and traces.
var ctlEventNames = [numCtlEvents]string{evPause: "pause", evResume: "resume", evSleepPause: "sleep_pause", evSleep: "sleep", evWake: "wake_up"}

func (k ctlEventKind) String() string {
	if k < numCtlEvents {
		return ctlEventNames[k]
	}
	return fmt.Sprintf("event(%d)", uint8(k))
}

// ctlEvent is one event and what it carries.
type ctlEvent struct {
	kind ctlEventKind
	// mode is the pause mode of evPause and evSleepPause.
	mode PauseMode
	// level is evSleep's sleep level (0, 1 or 2).
	level int
	// wakeWeights and wakeKV are evWake's tags; haveWeights says a weight set is loaded (one
	// committed after a level-2 sleep), which waking either part needs.
	wakeWeights, wakeKV, haveWeights bool
}

// controlState is the engine's pause and sleep state. Fields a phase does not carry are zero.
type controlState struct {
	Phase ctlPhase
	// Mode is the pause's mode (paused and asleep; "" when running).
	Mode PauseMode
	// BySleep says Sleep made the pause, so waking everything resumes; a Pause made after it,
	// or before the sleep, stays until Resume.
	BySleep bool
	// Level is the deepest level slept since the engine last woke fully (Stats.SleepLevel).
	Level int
	// KVReleased: the KV pool is released (a level ≥ 1 sleep) until a kv_cache wake-up.
	// WeightsReleased: the weights sleep (level 2) until a weights wake-up.
	KVReleased, WeightsReleased bool
}

// errIllegalTransition is an event the engine must never produce in a state; the engine counts
// it as an invariant violation.
var errIllegalTransition = errors.New("engine: illegal control transition")

// ctlTransition computes the state after ev, or the error the call reports (the state stays).
type ctlTransition func(s controlState, ev ctlEvent) (controlState, error)

// ctlTransitions is the table of legal transitions: by phase, then event. A nil entry is
// illegal: Sleep pauses before it sleeps and Resume waits for a pending Sleep, so a sleep never
// ends on a running engine.
var ctlTransitions = [numCtlPhases][numCtlEvents]ctlTransition{
	ctlRunning: {evPause: ctlPauseWith, evResume: ctlStay, evSleepPause: ctlSleepPause, evWake: ctlStay},
	ctlPaused:  {evPause: ctlPauseWith, evResume: ctlResume, evSleepPause: ctlStay, evSleep: ctlFallAsleep, evWake: ctlWakePaused},
	ctlAsleep:  {evPause: ctlPauseWith, evResume: ctlRefuseAsleep, evSleepPause: ctlStay, evSleep: ctlFallAsleep, evWake: ctlWakeAsleep},
}

// next is the state after ev: the one place the control state changes.
func (s controlState) next(ev ctlEvent) (controlState, error) {
	if s.Phase >= numCtlPhases || ev.kind >= numCtlEvents || ctlTransitions[s.Phase][ev.kind] == nil {
		return s, fmt.Errorf("%w: %s while %s", errIllegalTransition, ev.kind, s.Phase)
	}
	return ctlTransitions[s.Phase][ev.kind](s, ev)
}

func ctlStay(s controlState, _ ctlEvent) (controlState, error) { return s, nil }

// ctlPauseWith makes the pause the caller's: a later full wake-up no longer resumes. Asleep
// stays asleep.
func ctlPauseWith(s controlState, ev ctlEvent) (controlState, error) {
	if s.Phase == ctlRunning {
		s.Phase = ctlPaused
	}
	s.Mode, s.BySleep = ev.mode, false
	return s, nil
}

func ctlSleepPause(_ controlState, ev ctlEvent) (controlState, error) {
	return controlState{Phase: ctlPaused, Mode: ev.mode, BySleep: true}, nil
}

func ctlResume(controlState, ctlEvent) (controlState, error) { return controlState{}, nil }

func ctlRefuseAsleep(s controlState, _ ctlEvent) (controlState, error) {
	return s, fmt.Errorf("%w: wake up before resuming", ErrAsleep)
}

func ctlFallAsleep(s controlState, ev ctlEvent) (controlState, error) {
	s.Phase = ctlAsleep
	s.Level = max(s.Level, ev.level)
	s.KVReleased = s.KVReleased || ev.level >= 1
	s.WeightsReleased = s.WeightsReleased || ev.level == 2
	return s, nil
}

// ctlWakePaused: nothing sleeps, so a wake-up ends a pause Sleep made (one whose sleep failed
// before it released anything) and leaves the caller's.
func ctlWakePaused(s controlState, _ ctlEvent) (controlState, error) {
	if s.BySleep {
		return controlState{}, nil
	}
	return s, nil
}

func ctlWakeAsleep(s controlState, ev ctlEvent) (controlState, error) {
	orig := s
	if ev.wakeWeights && s.WeightsReleased {
		if !ev.haveWeights {
			return orig, fmt.Errorf("%w: the level-2 sleep released them; commit new weights before waking", ErrNoWeights)
		}
		s.WeightsReleased = false
	}
	if ev.wakeKV && s.KVReleased {
		if !ev.haveWeights {
			return orig, fmt.Errorf("%w: the KV pool's shape comes from the weights; commit weights first", ErrNoWeights)
		}
		s.KVReleased = false
	}
	if s.KVReleased || s.WeightsReleased {
		return s, nil
	}
	if s.BySleep {
		return controlState{}, nil
	}
	return controlState{Phase: ctlPaused, Mode: s.Mode}, nil
}
