package weights

import (
	"os"
	"slices"
	"sync"

	"github.com/rolloutkit/rollout/engine/model"
)

// Recycler keeps the weight sets a caller loaded and handed to an engine, so that a later
// load can decode into one the engine no longer reads (Options.Reuse) instead of faulting in
// a whole new set. The rule: a set kept under version v is free once v is none of the
// versions the engine still reads (engine.Engine.VersionsInUse, the staged and the serving
// one); versions only grow, so it stays free. A set kept with KeepFree (a spare made by
// Prefault, or one whose stage failed) is free at once.
//
// The caller must own every set it keeps: nothing else may read it once it is free, and only
// the caller may stage it. A copy by engine.Engine.Weights in progress keeps its version in
// VersionsInUse, so a set being copied is not free. Take is meant to be called by one update at a time (a server serialises its
// updates); the methods are safe for concurrent use anyway. At most one free set is held at
// rest: Take drops the other free ones, so memory stays at the engine's sets plus one.
type Recycler struct {
	mu   sync.Mutex
	sets []recycled
}

type recycled struct {
	w       *model.Weights
	version int64
	free    bool // free regardless of version
}

// Keep records w, just handed to the engine as version.
func (r *Recycler) Keep(w *model.Weights, version int64) {
	if w == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sets = append(r.sets, recycled{w: w, version: version})
}

// KeepFree records w as free now: nothing reads it (a set made by Prefault, or a loaded set
// the engine refused to stage).
func (r *Recycler) KeepFree(w *model.Weights) {
	if w == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sets = append(r.sets, recycled{w: w, free: true})
}

// Take removes and returns a free set (see Recycler) given the versions still in use, or nil,
// and forgets the other free sets. The caller passes it as Options.Reuse and, whatever the
// outcome, must not use it again: on success the loaded set owns its memory (Keep that one),
// on failure its contents are undefined.
func (r *Recycler) Take(inUse ...int64) *model.Weights {
	r.mu.Lock()
	defer r.mu.Unlock()
	var got *model.Weights
	r.sets = slices.DeleteFunc(r.sets, func(s recycled) bool {
		if !s.free && slices.Contains(inUse, s.version) {
			return false
		}
		if got == nil {
			got = s.w
		}
		return true
	})
	return got
}

// Release forgets every set not in use (see Take), giving its memory back; a server calls it
// when the engine sleeps, which gives up its own spare memory too.
func (r *Recycler) Release(inUse ...int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sets = slices.DeleteFunc(r.sets, func(s recycled) bool { return s.free || !slices.Contains(inUse, s.version) })
}

// Sets returns the sets held, in use or not, in the order kept, for inspection: the caller
// must not write them.
func (r *Recycler) Sets() []*model.Weights {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*model.Weights, len(r.sets))
	for i, s := range r.sets {
		out[i] = s.w
	}
	return out
}

// Prefault allocates a weight set of c's shape and writes to every page of it, so that a load
// into it (Options.Reuse) pays no first-touch page faults: a set's worth of faults costs about
// as much as the load itself on a virtual machine (0.35 GB of stories110m took 1.3 s). Its
// contents are zeros.
func Prefault(c model.Config) (*model.Weights, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	w := &model.Weights{Config: c}
	w.Allocate()
	// A large allocation gets fresh pages the runtime knows are zero and does not clear;
	// one write per page faults each in.
	page := max(os.Getpagesize()/4, 1)
	for _, t := range w.Tensors() {
		s := *t.Data
		for i := 0; i < len(s); i += page {
			s[i] = 0
		}
	}
	return w, nil
}
