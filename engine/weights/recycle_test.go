package weights

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/model"
)

// TestRecyclerRule: a set is handed out only once its version is not in use (or it was kept
// free), never one in use; Take forgets the other free sets, Release every free one.
func TestRecyclerRule(t *testing.T) {
	var r Recycler
	set := func() *model.Weights { return &model.Weights{} }
	w1, w2, w3, spare := set(), set(), set(), set()
	r.Keep(w1, 1)
	assert.Nil(t, r.Take(1), "the serving set is never handed out")
	r.Keep(w2, 2) // staged
	assert.Nil(t, r.Take(2, 1))
	assert.Same(t, w1, r.Take(2), "1 was retired by the commit of 2")
	assert.Equal(t, []*model.Weights{w2}, r.Sets())

	r.Keep(w3, 3)
	r.KeepFree(spare)
	assert.Same(t, spare, r.Take(3, 2), "a free set regardless of versions")
	assert.Equal(t, []*model.Weights{w2, w3}, r.Sets())

	// Two free sets (2 and 3 retired): one is handed out, the other forgotten.
	got := r.Take(4)
	assert.Same(t, w2, got)
	assert.Empty(t, r.Sets())

	r.Keep(w1, 0) // version 0 is a version like any other
	assert.Nil(t, r.Take(0))
	r.Keep(w2, 5)
	r.KeepFree(spare)
	r.Release(5)
	assert.Equal(t, []*model.Weights{w2}, r.Sets(), "release keeps only what is in use")
	r.Keep(nil, 6)
	r.KeepFree(nil)
	assert.Len(t, r.Sets(), 1)
}

// TestPrefault: the spare has the config's shape, zeros, and loads into it in place.
func TestPrefault(t *testing.T) {
	f := newFixture(t)
	w, err := Prefault(smallConfig())
	require.NoError(t, err)
	require.NoError(t, w.Check())
	for _, tn := range w.Tensors() {
		for _, v := range *tn.Data {
			require.Zero(t, v)
		}
	}
	addr := backing(w)
	got, err := LoadHF(f.hf)
	require.NoError(t, err)
	reused, err := Load(t.Context(), Ref{URI: f.hf}, Options{Reuse: w})
	require.NoError(t, err)
	requireSameWeights(t, got, reused)
	assert.Equal(t, addr, backing(reused))
	_, err = Prefault(model.Config{})
	require.Error(t, err)
}
