package sdk

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/sdk/protocol"
)

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%04d", prefix, i)
	}
	return out
}

// checkTree checks the invariants every assignment keeps and returns the tree's depth (the
// origin's children are at depth 1) and each source's child count.
func checkTree(t *testing.T, need, holders []string, tree map[string]string, fanOut, originFanOut int) (int, map[string]int) {
	t.Helper()
	require.Len(t, tree, len(need))
	isHolder := map[string]bool{}
	for _, h := range holders {
		isHolder[h] = true
	}
	pos := map[string]int{}
	for i, id := range need {
		pos[id] = i
	}
	children := map[string]int{}
	depth := 0
	level := map[string]int{} // the origin and holders are level 0
	for i, id := range need {
		src, ok := tree[id]
		require.True(t, ok, "%s has no source", id)
		children[src]++
		// A source is the origin, a holder, or a server placed earlier (so no cycle).
		if src != Origin && !isHolder[src] {
			p, member := pos[src]
			require.True(t, member, "%s's source %s is neither a holder nor a target", id, src)
			require.Less(t, p, i, "%s's source %s is placed after it", id, src)
		}
		// Sources come earlier, so their level is known: no cycle is possible.
		level[id] = level[src] + 1
		depth = max(depth, level[id])
	}
	for src, n := range children {
		limit := fanOut
		if src == Origin {
			limit = originFanOut
		}
		require.LessOrEqual(t, n, limit, "%q feeds %d servers", src, n)
	}
	return depth, children
}

func TestAssignSourcesTree(t *testing.T) {
	for _, n := range []int{1, 2, 3, 10, 100, 1000} {
		for _, k := range []int{1, 2, 4} {
			t.Run(fmt.Sprintf("n=%d/k=%d", n, k), func(t *testing.T) {
				need := ids("s", n)
				tree := AssignSources(need, nil, nil, k, DefaultOriginFanOut)
				depth, children := checkTree(t, need, nil, tree, k, DefaultOriginFanOut)
				assert.Equal(t, DefaultOriginFanOut, children[Origin], "the origin feeds exactly its fan-out")
				// Breadth first under one origin child: level d holds k^(d-1) servers.
				want := n
				if k > 1 {
					want = int(math.Ceil(math.Log(float64(n*(k-1)+1))/math.Log(float64(k)) - 1e-9))
				}
				assert.Equal(t, want, depth)
			})
		}
	}
}

func TestAssignSourcesHoldersFirst(t *testing.T) {
	need, holders := ids("s", 10), []string{"h1", "h2"}
	tree := AssignSources(need, nil, holders, 2, 1)
	_, children := checkTree(t, need, holders, tree, 2, 1)
	assert.Equal(t, 2, children["h1"])
	assert.Equal(t, 2, children["h2"])
	assert.Equal(t, 1, children[Origin])
	assert.Equal(t, "h1", tree["s0000"])
	assert.Equal(t, Origin, tree["s0004"], "the origin comes after the holders")
}

func TestAssignSourcesHolderInNeedIsSkipped(t *testing.T) {
	tree := AssignSources([]string{"a", "b", "a"}, nil, []string{"b"}, 2, 1)
	assert.Equal(t, map[string]string{"a": "b"}, tree)
}

func TestAssignSourcesLeavesOnly(t *testing.T) {
	need := ids("s", 6)
	relay := func(id string) bool { return id == "s0000" }
	tree := AssignSources(need, relay, nil, 2, 1)
	_, children := checkTree(t, need, nil, tree, 2, len(need))
	assert.Equal(t, 2, children["s0000"], "the one relay feeds two")
	for id, src := range tree {
		assert.True(t, src == Origin || src == "s0000", "%s fetches from %q, which cannot relay", id, src)
	}
	assert.Equal(t, 4, children[Origin], "once every source is full the rest fetch from the origin")
}

func TestAssignSourcesNoPeers(t *testing.T) {
	tree := AssignSources(ids("s", 5), nil, []string{"h"}, 0, 1)
	for _, src := range tree {
		assert.Equal(t, Origin, src)
	}
}

// UpdateWeights sends the tree in the signed stage command: with peer routes on every server,
// the origin feeds one and that one the other two; a server that already holds the version
// feeds before the origin.
func TestUpdateWeightsSendsTheTree(t *testing.T) {
	_, agents, c := newMemFleet(t, secret, 3, 0)
	for _, a := range agents {
		a.set(func(a *fakeAgent) { a.peerURL = "http://" + a.id + "/weights" })
	}
	res, err := c.UpdateWeights(t.Context(), ref(1), Plan{})
	require.NoError(t, err)
	require.Len(t, res.Sources, 2)
	var stage protocol.Stage
	for _, env := range agents[0].got() {
		if env.Kind == protocol.KindStage {
			cmd, err := env.Command()
			require.NoError(t, err)
			stage = cmd.(protocol.Stage)
		}
	}
	assert.Equal(t, res.Sources, stage.Sources, "the signed command carries the tree the result reports")
	root := ""
	for _, a := range agents {
		if _, ok := stage.Sources[a.id]; !ok {
			root = a.id
		}
	}
	require.NotEmpty(t, root, "one server fetches from the origin")
	for _, src := range stage.Sources {
		assert.Equal(t, root, src)
	}

	agents[2].set(func(a *fakeAgent) { a.holds = []int64{2} })
	res, err = c.UpdateWeights(t.Context(), ref(2), Plan{Targets: []string{"a", "b", "c"}})
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"a": "c", "b": "c"}, res.Sources, "the holder feeds both")

	res, err = c.UpdateWeights(t.Context(), ref(3), Plan{PeerFanOut: -1})
	require.NoError(t, err)
	assert.Empty(t, res.Sources, "no peers: everyone from the origin")
}
