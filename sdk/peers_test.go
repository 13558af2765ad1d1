package sdk

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
		d := 1
		for s := src; s != Origin && !isHolder[s]; s = tree[s] {
			d++
			require.LessOrEqual(t, d, len(need)+1, "cycle through %s", id)
		}
		depth = max(depth, d)
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
