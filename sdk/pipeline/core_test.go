package pipeline

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// finishAt finishes in-flight group id with its oldest token at version v.
func finishAt(c *core, id uint64, v int64, keep bool) {
	c.finish(&Group{ID: id, MinVersion: v}, keep)
}

func TestCoreSynchronousAdmitsOneBatchPerVersion(t *testing.T) {
	c := newCore(2, 0, 0, 0, 0)
	var ids []uint64
	for c.canAdmit() {
		id, minV := c.admit()
		assert.Equal(t, int64(0), minV)
		ids = append(ids, id)
	}
	require.Len(t, ids, 2, "K=0 admits exactly one batch for the current version")
	_, _, ok := c.take(0)
	assert.False(t, ok, "nothing finished yet")
	finishAt(c, ids[0], 0, true)
	finishAt(c, ids[1], 0, true)
	b, stale, ok := c.take(0)
	require.True(t, ok)
	assert.Empty(t, stale)
	assert.Equal(t, []uint64{1, 2}, []uint64{b[0].ID, b[1].ID})
	assert.False(t, c.canAdmit(), "the next batch needs the next version on the fleet")
	c.setVersion(1)
	assert.True(t, c.canAdmit())
}

func TestCoreStalenessWindowAdmitsKPlusOneBatches(t *testing.T) {
	c := newCore(3, 2, 0, 0, 5)
	n := 0
	for c.canAdmit() {
		c.admit()
		n++
	}
	assert.Equal(t, 9, n, "versions 5, 6 and 7 may take groups generated at 5")
}

func TestCoreWithholdsBatchForGroupAtItsDeadline(t *testing.T) {
	c := newCore(1, 1, 0, 0, 0)
	a, _ := c.admit() // deadline 1
	b, _ := c.admit() // deadline 1
	finishAt(c, a, 0, true)
	batch, _, ok := c.take(0)
	require.True(t, ok)
	assert.Equal(t, a, batch[0].ID)
	c.setVersion(1)
	d, _ := c.admit() // generated at version 1, deadline 2
	finishAt(c, d, 1, true)
	// b (deadline 1) is still generating: batch 1 waits for it instead of taking d.
	_, _, ok = c.take(1)
	assert.False(t, ok, "the batch is withheld for the group at its deadline")
	finishAt(c, b, 0, true)
	batch, stale, ok := c.take(1)
	require.True(t, ok)
	assert.Empty(t, stale)
	assert.Equal(t, b, batch[0].ID, "oldest first")
}

func TestCoreWithholdsBatchForOlderGroupsDueLater(t *testing.T) {
	c := newCore(1, 2, 0, 0, 0)
	a, _ := c.admit() // deadline 2
	b, _ := c.admit() // deadline 2
	d, _ := c.admit() // deadline 2
	finishAt(c, a, 0, true)
	_, _, ok := c.take(0)
	require.True(t, ok, "b and d fit batches 1 and 2")
	c.setVersion(1)
	e, _ := c.admit() // generated at version 1, deadline 3
	finishAt(c, e, 1, true)
	// Taking e for batch 1 would leave b and d both for batch 2, which holds one.
	_, _, ok = c.take(1)
	assert.False(t, ok, "the batch waits for the older groups")
	finishAt(c, b, 0, true)
	var got []uint64
	for v := int64(1); v <= 3; v++ {
		if v == 2 {
			finishAt(c, d, 0, true)
		}
		batch, stale, ok := c.take(v)
		require.True(t, ok, "version %d", v)
		assert.Empty(t, stale)
		got = append(got, batch[0].ID)
	}
	assert.Equal(t, []uint64{b, d, e}, got)
}

func TestCoreTakeCostDoesNotFollowReportedVersions(t *testing.T) {
	// A server that reports tokens from a far-future version must not make take size its
	// bookkeeping by that version.
	c := newCore(1, 3, 0, 0, 0)
	a, _ := c.admit()
	b, _ := c.admit()
	finishAt(c, a, 1<<60, true)
	finishAt(c, b, 0, true)
	_, _ = c.admit() // in flight, due at 3
	batch, _, ok := c.take(0)
	require.True(t, ok)
	assert.Equal(t, b, batch[0].ID)
	allocs := testing.AllocsPerRun(10, func() { c.feasibleAfterBatch() })
	assert.LessOrEqual(t, allocs, 1.0)
}

func TestCoreFilteredGroupFreesItsPlace(t *testing.T) {
	c := newCore(2, 0, 0, 0, 0)
	a, _ := c.admit()
	b, _ := c.admit()
	assert.False(t, c.canAdmit())
	finishAt(c, a, 0, false) // zero variance: dropped
	require.True(t, c.canAdmit(), "a filtered group is refilled")
	r, _ := c.admit()
	finishAt(c, b, 0, true)
	finishAt(c, r, 0, true)
	batch, _, ok := c.take(0)
	require.True(t, ok)
	assert.Equal(t, []uint64{b, r}, []uint64{batch[0].ID, batch[1].ID})
}

func TestCoreOverSampledGroupsPrunedAfterTheirBatch(t *testing.T) {
	c := newCore(1, 0, 1, 0, 0)
	a, _ := c.admit()
	b, _ := c.admit()
	assert.False(t, c.canAdmit())
	finishAt(c, a, 0, true)
	finishAt(c, b, 0, true)
	batch, stale, ok := c.take(0)
	require.True(t, ok)
	assert.Equal(t, a, batch[0].ID)
	require.Len(t, stale, 1, "the spare group is too old for version 1")
	assert.Equal(t, b, stale[0].ID)
}

// TestCoreStalenessProperty drives the core through random interleavings of admissions,
// finishes (some filtered, some with tokens newer than requested), batches and fleet updates,
// and checks every batch from its history: each group is within the bound of the batch that
// took it, batches are oldest-first, a batch is never withheld once nothing is in flight, and
// without over-sampling no admitted group is dropped as stale.
func TestCoreStalenessProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		B := rapid.IntRange(1, 4).Draw(rt, "B")
		K := int64(rapid.IntRange(0, 3).Draw(rt, "K"))
		over := rapid.IntRange(0, 2).Draw(rt, "over")
		c := newCore(B, K, over, 0, 0)
		trainer := int64(0) // the trainer's version: the next batch's
		fleet := int64(0)
		type flight struct {
			id  uint64
			req int64
		}
		var inflight []flight
		stale := 0
		for range rapid.IntRange(1, 300).Draw(rt, "steps") {
			switch rapid.IntRange(0, 3).Draw(rt, "op") {
			case 0:
				if c.canAdmit() {
					id, minV := c.admit()
					require.Equal(rt, fleet, minV)
					inflight = append(inflight, flight{id, minV})
				}
			case 1:
				if len(inflight) > 0 {
					i := rapid.IntRange(0, len(inflight)-1).Draw(rt, "which")
					f := inflight[i]
					inflight = append(inflight[:i], inflight[i+1:]...)
					v := f.req + int64(rapid.IntRange(0, int(fleet-f.req)).Draw(rt, "newer"))
					finishAt(c, f.id, v, rapid.IntRange(0, 4).Draw(rt, "keep") > 0)
				}
			case 2:
				batch, st, ok := c.take(trainer)
				stale += len(st)
				if ok {
					require.Len(rt, batch, B)
					for j, g := range batch {
						require.GreaterOrEqual(rt, g.MinVersion+K, trainer, "group %d (tokens from %d) in the batch of version %d", g.ID, g.MinVersion, trainer)
						if j > 0 {
							require.LessOrEqual(rt, batch[j-1].MinVersion, g.MinVersion)
						}
					}
					trainer++
				}
			case 3:
				if fleet < trainer {
					fleet++
					c.setVersion(fleet)
				}
			}
			require.LessOrEqual(rt, c.live(), max(c.capacity(), c.live()))
		}
		// Liveness: once every group has finished, batches are never withheld.
		for _, f := range inflight {
			finishAt(c, f.id, f.req, true)
		}
		for {
			buffered := len(c.buffer)
			_, st, ok := c.take(trainer)
			stale += len(st)
			if !ok {
				require.Less(rt, buffered-len(st), B, "a batch is withheld with nothing in flight")
				break
			}
			trainer++
		}
		if over == 0 {
			require.Zero(rt, stale, "admission without over-sampling never makes a group miss its batch")
		}
	})
}
