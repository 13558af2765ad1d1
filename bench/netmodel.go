package bench

import (
	"math"
	"time"
)

// NetModel is the simulated network and engine of `rollout bench fleet --simulate`: every
// server has a symmetric link of LinkBytesPerSec, the origin (the trainer's weight server) an
// egress link of OriginBytesPerSec, and each hop costs Latency before its first byte. A
// source's uplink is shared evenly by its children; a relaying server forwards a chunk once it
// has received it whole (ChunkBytes), so a stream runs at the slowest link share on its path
// and each tree level adds one hop latency and one chunk time. After the last byte a server
// spends StageCost loading and verifying the checkpoint; the commit's pause, sleep, swap, wake
// and resume cost the Engine durations.
type NetModel struct {
	CheckpointBytes   int64
	LinkBytesPerSec   float64
	OriginBytesPerSec float64
	Latency           time.Duration
	ChunkBytes        int64
	StageCost         time.Duration
	Engine            EngineCosts
}

// EngineCosts are a simulated server's commit phases.
type EngineCosts struct {
	Pause, Sleep, Swap, Wake, Resume time.Duration
}

// Total is the cut: the commit bubble of one server.
func (e EngineCosts) Total() time.Duration { return e.Pause + e.Sleep + e.Swap + e.Wake + e.Resume }

// DefaultNetModel is an 8B-parameter model in bf16 (16 GB) over 25 Gbit/s links with 0.5 ms
// hops and 16 MiB relay chunks; the origin has one such link.
func DefaultNetModel() NetModel {
	link := 25e9 / 8
	return NetModel{CheckpointBytes: 16e9, LinkBytesPerSec: link, OriginBytesPerSec: link, Latency: 500 * time.Microsecond,
		ChunkBytes: 16 << 20, StageCost: 1600 * time.Millisecond,
		Engine: EngineCosts{Pause: 5 * time.Millisecond, Sleep: 20 * time.Millisecond, Swap: 50 * time.Millisecond,
			Wake: 20 * time.Millisecond, Resume: 5 * time.Millisecond}}
}

// StagePlan is the model's answer for one distribution tree.
type StagePlan struct {
	// Staged is each server's time from the stage command to staged.
	Staged map[string]time.Duration
	// Depth is the tree's number of levels below the origin and the holders.
	Depth int
	// OriginBytes is what the origin sends: one checkpoint per child.
	OriginBytes int64
	// PeerBytes is what servers send each other.
	PeerBytes int64
}

// Single is one server alone fetching from the origin: the baseline of the fleet's stage time.
func (m NetModel) Single() time.Duration {
	return m.Latency + seconds(float64(m.CheckpointBytes)/math.Min(m.OriginBytesPerSec, m.LinkBytesPerSec)) + m.StageCost
}

// HopCost is what one tree level adds to a relayed stream running at rate bytes/s: a hop's
// latency and one chunk.
func (m NetModel) HopCost(rate float64) time.Duration {
	return m.Latency + seconds(float64(min(m.ChunkBytes, m.CheckpointBytes))/rate)
}

// Stage evaluates a distribution tree: order lists the servers that fetch (each after its
// source, as sdk.AssignSources places them), tree maps each to its source ("" the origin, or a
// holder, which has every byte at time 0).
func (m NetModel) Stage(order []string, tree map[string]string) StagePlan {
	children := map[string]int{}
	for _, id := range order {
		children[tree[id]]++
	}
	type node struct {
		first, last time.Duration // first and last byte received
		rate        float64       // stream rate, bytes/s
		depth       int
	}
	nodes := make(map[string]node, len(order))
	plan := StagePlan{Staged: make(map[string]time.Duration, len(order))}
	S := float64(m.CheckpointBytes)
	for _, id := range order {
		src := tree[id]
		var up float64
		p, relayed := nodes[src]
		switch {
		case src == "":
			up = m.OriginBytesPerSec
			plan.OriginBytes += m.CheckpointBytes
		default:
			up = m.LinkBytesPerSec
			plan.PeerBytes += m.CheckpointBytes
		}
		rate := math.Min(up/float64(children[src]), m.LinkBytesPerSec)
		n := node{depth: 1}
		if relayed {
			rate = math.Min(rate, p.rate)
			// The first chunk must reach the relay whole before it forwards it; the last byte
			// cannot leave before the relay has it.
			n.first = p.first + m.HopCost(p.rate)
			n.last = max(n.first+seconds(S/rate), p.last+m.HopCost(rate))
			n.depth = p.depth + 1
		} else {
			n.first = m.Latency
			n.last = n.first + seconds(S/rate)
		}
		n.rate = rate
		nodes[id] = n
		plan.Staged[id] = n.last + m.StageCost
		plan.Depth = max(plan.Depth, n.depth)
	}
	return plan
}

// Bound is the goal the fleet's stage time is held to: twice one server's, plus one hop per
// tree level at half a link (a relay's uplink shared by two children).
func (m NetModel) Bound(depth int) time.Duration {
	return 2*m.Single() + time.Duration(depth)*m.HopCost(m.LinkBytesPerSec/2)
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
