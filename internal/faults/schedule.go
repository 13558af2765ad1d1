package faults

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"time"
)

// Event kinds: operations (run by a trainer or the operator), faults (each one injected
// fault) and heals (each ends the fault Of).
const (
	// Operations.
	OpUpdate       = "update"
	OpPause        = "pause"
	OpResume       = "resume"
	OpSleep        = "sleep"
	OpWake         = "wake"
	OpPauseServer  = "pause-server"
	OpResumeServer = "resume-server"

	// Faults.
	FaultKill          = "kill"
	FaultKillMidStage  = "kill-mid-stage"
	FaultKillMidCommit = "kill-mid-commit"
	FaultStop          = "sigstop"
	FaultRedisEmpty    = "redis-restart-empty"
	FaultRedisData     = "redis-restart-data"
	FaultPartition     = "partition"
	FaultFreeze        = "freeze"
	FaultDelay         = "delay"
	FaultDrop          = "drop"
	FaultCut           = "cut"
	FaultTwoTrainers   = "two-trainers"
	FaultCancelUpdate  = "cancel-update"
	// FaultRaceRedisLoss is two-trainers with Redis restarting empty the moment the desired
	// state names the version they race for: one trainer's record is lost around its commit
	// point while the other writes the same version.
	FaultRaceRedisLoss = "two-trainers-redis-loss"

	// Heals.
	HealRestart = "restart"
	HealCont    = "sigcont"
	HealProxy   = "heal-proxy"
)

// Trainers are the two trainer processes.
var Trainers = []string{"trainer-a", "trainer-b"}

// Event is one step of a schedule, at At from the start of the run.
type Event struct {
	At   time.Duration
	Kind string
	// Fault: the event injects a fault; a heal event ends fault number Of (its index among
	// the schedule's faults).
	Fault bool
	Of    int
	// Server is the target server's index (-1: none, or the whole fleet).
	Server int
	// Trainer runs an update (and the update of a kill-mid-* fault).
	Trainer string
	// Update is the update's plan (OpUpdate, FaultCancelUpdate, FaultKillMid*,
	// FaultTwoTrainers and FaultRaceRedisLoss: trainer-a's); Other is trainer-b's plan in
	// those two.
	Update, Other *UpdateSpec
	// Mode is a pause or sleep mode; Level a sleep level.
	Mode  string
	Level int
	// Delay is a proxy's added latency; Rate its drop rate; Seed its draws'.
	Delay time.Duration
	Rate  float64
	Seed  uint64
}

// UpdateSpec is how one weight update is run.
type UpdateSpec struct {
	Policy string // "all", "quorum:K", "rolling:K"
	Mode   string // the cut's pause mode
	Sleep  int    // the cut's sleep level
	Peers  bool   // false: every server fetches from the origin
	// OriginDelay slows the trainer's weight server down for this update, so the stage
	// phase is long enough to be hit.
	OriginDelay time.Duration
	// CancelAfter, when set, cancels the call this long after it starts.
	CancelAfter time.Duration
}

// Schedule is a seeded plan of a fault run.
type Schedule struct {
	Seed    uint64
	Servers int
	Events  []Event
	// Faults is how many events inject a fault.
	Faults int
}

// Schedule parameters.
const (
	// maxImpaired bounds the servers impaired at once (down, stopped, or behind a bad link),
	// so the fleet can still commit under a quorum.
	maxImpaired  = 2
	faultGapLow  = 300 * time.Millisecond
	faultGapHigh = 1600 * time.Millisecond
	opGapLow     = 400 * time.Millisecond
	opGapHigh    = 2000 * time.Millisecond
	// StopHold is how long a SIGSTOPped server stays stopped at least: past the heartbeat
	// TTL (5 s), so its key expires and the fleet moves on without it.
	StopHold = 5500 * time.Millisecond
	// TriggerTimeout bounds how long a kill-mid-* fault waits for its moment before it kills
	// anyway.
	TriggerTimeout = 4 * time.Second
)

var faultWeights = []struct {
	kind   string
	weight int
	server bool // needs an unimpaired server and impairs it
}{
	{FaultKill, 3, true}, {FaultKillMidStage, 2, true}, {FaultKillMidCommit, 2, true}, {FaultStop, 1, true},
	{FaultPartition, 2, true}, {FaultFreeze, 1, true}, {FaultDelay, 2, true}, {FaultDrop, 2, true},
	{FaultCut, 3, false}, {FaultRedisEmpty, 1, false}, {FaultRedisData, 1, false},
	{FaultTwoTrainers, 2, false}, {FaultCancelUpdate, 2, false}, {FaultRaceRedisLoss, 1, false},
}

// NewSchedule draws a schedule of n faults for servers servers from seed, with operations
// (updates under every policy, pauses, resumes, sleeps, wakes) interleaved. The same seed
// gives the same schedule.
func NewSchedule(seed uint64, n, servers int) Schedule {
	s := Schedule{Seed: seed, Servers: servers}
	fr := rand.New(rand.NewPCG(seed, 1)) // faults
	or := rand.New(rand.NewPCG(seed, 2)) // operations
	impairedUntil := make([]time.Duration, servers)
	at := time.Second
	for i := range n {
		at += between(fr, faultGapLow, faultGapHigh)
		var free []int
		for sv, until := range impairedUntil {
			if until <= at {
				free = append(free, sv)
			}
		}
		canImpair := len(free) > 0 && servers-len(free) < maxImpaired
		total := 0
		for _, w := range faultWeights {
			if !w.server || canImpair {
				total += w.weight
			}
		}
		pick := fr.IntN(total)
		kind, server := "", false
		for _, w := range faultWeights {
			if w.server && !canImpair {
				continue
			}
			if pick < w.weight {
				kind, server = w.kind, w.server
				break
			}
			pick -= w.weight
		}
		e := Event{At: at, Kind: kind, Fault: true, Of: i, Server: -1, Seed: fr.Uint64()}
		var heal Event
		if server {
			e.Server = free[fr.IntN(len(free))]
			heal = Event{Kind: HealProxy, Of: i, Server: e.Server}
			var hold time.Duration
			switch kind {
			case FaultKill:
				heal.Kind, hold = HealRestart, between(fr, 500*time.Millisecond, 3*time.Second)
			case FaultKillMidStage, FaultKillMidCommit:
				e.Trainer = Trainers[fr.IntN(len(Trainers))]
				e.Update = drawUpdate(fr, servers)
				e.Update.OriginDelay = between(fr, 300*time.Millisecond, 800*time.Millisecond)
				heal.Kind, hold = HealRestart, TriggerTimeout+between(fr, 500*time.Millisecond, 2*time.Second)
			case FaultStop:
				heal.Kind, hold = HealCont, between(fr, StopHold, StopHold+1500*time.Millisecond)
			case FaultDelay:
				e.Delay, hold = between(fr, 20*time.Millisecond, 300*time.Millisecond), between(fr, time.Second, 4*time.Second)
			case FaultDrop:
				e.Rate, hold = 0.05+0.45*fr.Float64(), between(fr, time.Second, 4*time.Second)
			default: // partition, freeze
				hold = between(fr, time.Second, 4*time.Second)
			}
			heal.At = at + hold
			impairedUntil[e.Server] = heal.At + 100*time.Millisecond
		} else {
			switch kind {
			case FaultCut:
				e.Server = fr.IntN(servers)
			case FaultTwoTrainers, FaultRaceRedisLoss:
				// Each trainer its own plan; quorum:1 half the time, where both can pass
				// their commit point with the servers split between them.
				e.Update, e.Other = drawUpdate(fr, servers), drawUpdate(fr, servers)
				for _, u := range []*UpdateSpec{e.Update, e.Other} {
					if fr.IntN(2) == 0 {
						u.Policy = "quorum:1"
					}
				}
			case FaultCancelUpdate:
				e.Trainer = Trainers[fr.IntN(len(Trainers))]
				e.Update = drawUpdate(fr, servers)
				e.Update.OriginDelay = between(fr, 0, 400*time.Millisecond)
				e.Update.CancelAfter = between(fr, 50*time.Millisecond, 1500*time.Millisecond)
			}
		}
		s.Events = append(s.Events, e)
		if heal.Kind != "" {
			s.Events = append(s.Events, heal)
		}
		s.Faults++
	}
	end := at
	// Operations over the same span: an update most often, and a pause or a sleep is
	// usually undone soon after, so the fleet spends most of the run serving.
	var paused, slept bool
	for at := 500 * time.Millisecond; ; {
		at += between(or, opGapLow, opGapHigh)
		if at >= end {
			break
		}
		e := Event{At: at, Server: -1}
		switch {
		case paused && or.IntN(10) < 6:
			e.Kind, paused = OpResume, false
		case slept && or.IntN(10) < 6:
			e.Kind, slept = OpWake, false
		default:
			switch r := or.IntN(12); {
			case r < 6:
				e.Kind = OpUpdate
				e.Trainer = Trainers[0]
				if or.IntN(10) < 3 {
					e.Trainer = Trainers[1]
				}
				e.Update = drawUpdate(or, servers)
				e.Update.OriginDelay = between(or, 0, 200*time.Millisecond)
			case r == 6:
				e.Kind, e.Mode, paused = OpPause, drawMode(or), true
			case r == 7:
				e.Kind, paused = OpResume, false
			case r == 8:
				e.Kind, e.Level, e.Mode, slept = OpSleep, 1+or.IntN(2), drawMode(or), true
				if or.IntN(2) == 0 {
					e.Server = or.IntN(servers)
				}
			case r == 9:
				e.Kind, slept = OpWake, false
				if or.IntN(2) == 0 {
					e.Server = or.IntN(servers)
				}
			case r == 10:
				e.Kind, e.Mode, e.Server = OpPauseServer, drawMode(or), or.IntN(servers)
			default:
				e.Kind, e.Server = OpResumeServer, or.IntN(servers)
			}
		}
		s.Events = append(s.Events, e)
	}
	slices.SortStableFunc(s.Events, func(a, b Event) int { return cmp.Compare(a.At, b.At) })
	return s
}

// drawUpdate draws an update's plan: every policy, mode, sleep level, with and without peers.
func drawUpdate(r *rand.Rand, servers int) *UpdateSpec {
	policies := []string{"all", "quorum:1", "quorum:2", "rolling:1", "rolling:2"}
	if servers < 2 {
		policies = []string{"all", "quorum:1", "rolling:1"}
	}
	return &UpdateSpec{Policy: policies[r.IntN(len(policies))], Mode: drawMode(r), Sleep: r.IntN(2), Peers: r.IntN(2) == 0}
}

func drawMode(r *rand.Rand) string { return []string{"abort", "wait", "keep"}[r.IntN(3)] }

func between(r *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(r.Int64N(int64(hi-lo)))
}
