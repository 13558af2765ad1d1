package pipeline

import "slices"

// core is the pipeline's scheduling logic as a deterministic state machine: admission under
// the staleness bound, the buffer of finished groups and oldest-first batch assembly. It holds
// no goroutine, lock or clock; the loop in pipeline.go drives it, and core_test.go drives it
// step by step.
type core struct {
	batch     int   // groups per batch (B)
	staleness int64 // K: a group whose oldest token is version v may train at version <= v+K
	over      int   // groups admitted beyond the bound's capacity (dynamic sampling)
	maxFlight int   // bound on groups in flight (0: only the staleness bound)

	version int64 // the fleet's version: new groups are generated at it or above
	next    int64 // trainer version of the next batch to be taken

	nextID   uint64
	inflight map[uint64]int64 // group id -> its deadline (the last trainer version that may take it)
	buffer   []*Group         // finished groups waiting for a batch, oldest token first, then by admission
}

func newCore(batch int, staleness int64, over, maxFlight int, version int64) *core {
	return &core{batch: batch, staleness: staleness, over: over, maxFlight: maxFlight,
		version: version, next: version, inflight: map[uint64]int64{}}
}

// capacity is how many groups may be in flight or buffered: every group the trainer can take
// by version version+K (one batch per version from next on), plus the over-sampling margin.
// Groups admitted at version v are taken oldest-first, so admitting no more than this makes
// each group reach a batch within its bound unless a later group overtakes it (which take
// resolves by waiting for it).
func (c *core) capacity() int {
	n := int(c.version+c.staleness+1-c.next) * c.batch
	if n <= 0 {
		return 0
	}
	return n + c.over
}

// canAdmit reports whether another group may start now.
func (c *core) canAdmit() bool {
	if c.maxFlight > 0 && len(c.inflight) >= c.maxFlight {
		return false
	}
	return c.live() < c.capacity()
}

// admit starts a group: its id and the minimum weight version to generate it at (the fleet's
// current version, so every token is at least that fresh).
func (c *core) admit() (id uint64, minVersion int64) {
	c.nextID++
	c.inflight[c.nextID] = c.version + c.staleness
	return c.nextID, c.version
}

// setVersion records that the fleet serves version v (never goes down).
func (c *core) setVersion(v int64) {
	c.version = max(c.version, v)
}

// finish takes a group out of flight. A group that is kept (scored, not filtered, not
// failed) joins the buffer, which is ordered by the oldest token's version and then by
// admission: the groups nearest their deadline first.
func (c *core) finish(g *Group, keep bool) {
	delete(c.inflight, g.ID)
	if !keep {
		return
	}
	i, _ := slices.BinarySearchFunc(c.buffer, g, compareAge)
	c.buffer = slices.Insert(c.buffer, i, g)
}

func compareAge(a, b *Group) int {
	switch {
	case a.MinVersion != b.MinVersion:
		return cmpInt64(a.MinVersion, b.MinVersion)
	case a.ID < b.ID:
		return -1
	case a.ID > b.ID:
		return 1
	}
	return 0
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// prune removes the buffered groups no batch may take any more (their oldest token is more
// than K versions behind the next batch) and returns them. Admission keeps this rare: it
// happens to groups a batch could not wait for (over-sampled ones, or more groups due at one
// version than a batch holds).
func (c *core) prune() (stale []*Group) {
	keep := c.buffer[:0]
	for _, g := range c.buffer {
		if g.MinVersion+c.staleness < c.next {
			stale = append(stale, g)
		} else {
			keep = append(keep, g)
		}
	}
	clear(c.buffer[len(keep):])
	c.buffer = keep
	return stale
}

// take assembles the batch for trainer version t: the B buffered groups nearest their
// deadline, oldest first. It withholds the batch (ok false) while fewer than B groups are
// buffered, or while taking it would leave more groups due by some version than the batches
// up to that version can hold, counting groups in flight at the deadline they were admitted
// with: waiting for them is what keeps admitted work from being dropped. stale are the
// groups pruned for version t and, after a batch, for t+1.
func (c *core) take(t int64) (batch, stale []*Group, ok bool) {
	if t != c.next {
		c.next = t
	}
	stale = c.prune()
	if len(c.buffer) < c.batch || !c.feasibleAfterBatch() {
		return nil, stale, false
	}
	batch = slices.Clone(c.buffer[:c.batch])
	c.buffer = slices.Delete(c.buffer, 0, c.batch)
	c.next++
	stale = append(stale, c.prune()...)
	return batch, stale, true
}

// feasibleAfterBatch reports whether, once the next batch takes the B oldest buffered groups,
// the batches from next+1 on can still take every live group by its deadline: for each
// version d, at most (d-next)·B + over groups are due by d (the over-sampling margin may go
// stale by design). Admission keeps this true of every state before a batch, so once nothing
// is in flight it always holds (taking the oldest B lowers every count by B or leaves it
// below B); a batch is withheld only while waiting for a group in flight can help, and a
// take never waits on groups that cannot finish.
//
// Checking only the groups due at next would let a younger group overtake older ones due at
// a later version: with B = 1, two groups due at v+1 in flight and a group due at v+2
// finished, batch v taking it leaves two groups for the one batch at v+1.
func (c *core) feasibleAfterBatch() bool {
	if len(c.inflight) == 0 {
		return true
	}
	// Only versions before next+L can fail, L the groups counted (L ≤ (d-next)·B past it), so
	// the counts stop there whatever versions the groups report.
	rest := c.buffer[c.batch:]
	due := make([]int, len(c.inflight)+len(rest)+1) // due[i]: groups, not in the batch, due at next+i
	count := func(d int64) {
		if i := d - c.next; i >= 0 && i < int64(len(due)) {
			due[i]++
		}
	}
	for _, d := range c.inflight {
		count(d)
	}
	for _, g := range rest {
		count(g.MinVersion + c.staleness)
	}
	n := 0
	for i, k := range due {
		n += k
		if n > i*c.batch+c.over {
			return false
		}
	}
	return true
}

// live is the number of groups in flight or buffered.
func (c *core) live() int { return len(c.inflight) + len(c.buffer) }
