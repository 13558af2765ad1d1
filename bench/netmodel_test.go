package bench

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/sdk"
)

// round numbers: 1000-byte checkpoint, 100 B/s links, 100-byte chunks, 1 s hops.
var unit = NetModel{CheckpointBytes: 1000, LinkBytesPerSec: 100, OriginBytesPerSec: 100, Latency: time.Second, ChunkBytes: 100}

func names(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("s%04d", i)
	}
	return out
}

func TestNetModelSingle(t *testing.T) {
	p := unit.Stage([]string{"a"}, map[string]string{"a": ""})
	assert.Equal(t, 11*time.Second, p.Staged["a"], "one hop plus 1000 B at 100 B/s")
	assert.Equal(t, unit.Single(), p.Staged["a"])
	assert.Equal(t, int64(1000), p.OriginBytes)
}

// The formula on the smallest relay: a from the origin at a full link, b and c from a at half
// a link each, one chunk and one hop behind a.
func TestNetModelRelayFormula(t *testing.T) {
	p := unit.Stage([]string{"a", "b", "c"}, map[string]string{"a": "", "b": "a", "c": "a"})
	assert.Equal(t, 11*time.Second, p.Staged["a"])
	// first byte: a's first (1 s) + a hop (1 s) + a's first chunk (100 B at 100 B/s);
	// then 1000 B at 50 B/s.
	assert.Equal(t, 23*time.Second, p.Staged["b"])
	assert.Equal(t, p.Staged["b"], p.Staged["c"])
	assert.Equal(t, 2, p.Depth)
	assert.Equal(t, int64(1000), p.OriginBytes)
	assert.Equal(t, int64(2000), p.PeerBytes)
}

// With the SDK's tree the origin sends exactly one checkpoint at any fleet size, and the fleet
// stages within twice one server's time plus a hop per level.
func TestNetModelFanOutTree(t *testing.T) {
	m := DefaultNetModel()
	for _, n := range []int{1, 10, 100, 1000} {
		ids := names(n)
		tree := sdk.AssignSources(ids, nil, nil, sdk.DefaultPeerFanOut, sdk.DefaultOriginFanOut)
		p := m.Stage(ids, tree)
		assert.Equal(t, m.CheckpointBytes, p.OriginBytes, "n=%d: egress is one checkpoint", n)
		var last time.Duration
		for _, d := range p.Staged {
			last = max(last, d)
		}
		assert.LessOrEqual(t, last, m.Bound(p.Depth), "n=%d", n)
		assert.LessOrEqual(t, p.Depth, 10, "n=%d: log2 levels", n)
	}
}

// Without peers every server pulls from the origin: egress n checkpoints and the origin's link
// shared n ways.
func TestNetModelNoPeers(t *testing.T) {
	ids := names(10)
	tree := sdk.AssignSources(ids, nil, nil, -1, 1)
	p := unit.Stage(ids, tree)
	assert.Equal(t, int64(10_000), p.OriginBytes)
	assert.Equal(t, 101*time.Second, p.Staged["s0003"], "1000 B at 10 B/s after a hop")
}

// A holder feeds at a full link from the start, like the origin, at no egress.
func TestNetModelHolder(t *testing.T) {
	p := unit.Stage([]string{"a"}, map[string]string{"a": "h"})
	assert.Equal(t, 11*time.Second, p.Staged["a"])
	assert.Zero(t, p.OriginBytes)
}

func TestSimulateSmallFleet(t *testing.T) {
	m := DefaultNetModel()
	r, err := Simulate(t.Context(), SimConfig{Net: m, Rounds: 2}, 10)
	require.NoError(t, err)
	assert.Equal(t, sdk.OutcomeCommitted, r.Outcome)
	assert.InDelta(t, 1.0, r.EgressCheckpoints, 1e-9, "the real SDK's tree: one checkpoint from the origin")
	assert.Equal(t, 4, r.Depth)
	assert.LessOrEqual(t, r.StageFleet, r.StageBound)
	assert.Equal(t, m.Engine.Total(), r.Bubble, "the bubble is the simulated cut")
	assert.Equal(t, int64(20), r.UpdateOps["push"], "a stage and a commit ack per server")
	l := Load(10, r.UpdateOps, 10*time.Second)
	assert.InDelta(t, 10, l.DesiredReadsPS-2, 1e-9)
}
