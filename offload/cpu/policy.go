package cpu

// entry is one key's slot and state.
type entry struct {
	slot int
	gen  uint64
	ref  int // -1: write pending; 0: idle, evictable; > 0: that many loads in flight
}

// policy orders the stored keys for eviction (as vLLM's cache policies do). The manager owns the
// entries; a policy only decides recency and which idle keys go first.
type policy interface {
	get(k Key) *entry
	insert(k Key, e *entry)
	remove(k Key)
	touch(keys []Key)
	// loaded is called when a key's last load completes (ref count back to 0).
	loaded(k Key)
	// evict picks n idle keys outside protected, removes them (calling freed with each entry, in
	// eviction order) and returns them; nil (and no change) when it cannot.
	evict(n int, protected map[Key]bool, freed func(*entry)) []Key
	clear()
	len() int
}

// lru is vLLM's LRU policy: eviction from the least recently used idle key.
type lru struct {
	blocks map[Key]*entry
	order  *ordered
}

func newLRU() *lru { return &lru{blocks: map[Key]*entry{}, order: newOrdered()} }

func (p *lru) get(k Key) *entry { return p.blocks[k] }

func (p *lru) len() int { return len(p.blocks) }

func (p *lru) insert(k Key, e *entry) {
	p.blocks[k] = e
	p.order.pushBack(k)
}

func (p *lru) remove(k Key) {
	delete(p.blocks, k)
	p.order.remove(k)
}

// touch iterates in reverse so the request's first key ends up most recently used and its tail
// keys are evicted first.
func (p *lru) touch(keys []Key) {
	for i := len(keys) - 1; i >= 0; i-- {
		if e := p.blocks[keys[i]]; e != nil && e.ref >= 0 {
			p.order.pushBack(keys[i])
		}
	}
}

func (p *lru) loaded(k Key) { p.order.pushBack(k) }

func (p *lru) evict(n int, protected map[Key]bool, freed func(*entry)) []Key {
	var out []Key
	p.order.each(func(k Key) bool {
		if len(out) == n {
			return false
		}
		if e := p.blocks[k]; e.ref == 0 && !protected[k] {
			out = append(out, k)
		}
		return true
	})
	if len(out) < n {
		return nil
	}
	for _, k := range out {
		freed(p.blocks[k])
		p.remove(k)
	}
	return out
}

func (p *lru) clear() {
	clear(p.blocks)
	p.order.clear()
}

// arc is vLLM's ARC policy: T1 holds keys seen once, T2 keys seen again; the ghost lists B1 and
// B2 remember recently evicted keys and steer the target size of T1.
type arc struct {
	blocks   map[Key]*entry
	t1, t2   *ordered
	b1, b2   *ordered
	target   float64
	capacity int
}

func newARC(capacity int) *arc {
	return &arc{blocks: map[Key]*entry{}, t1: newOrdered(), t2: newOrdered(), b1: newOrdered(), b2: newOrdered(), capacity: capacity}
}

func (p *arc) get(k Key) *entry { return p.blocks[k] }

func (p *arc) len() int { return len(p.blocks) }

func (p *arc) insert(k Key, e *entry) {
	p.blocks[k] = e
	p.t1.pushBack(k)
	p.b1.remove(k)
	p.b2.remove(k)
}

func (p *arc) remove(k Key) {
	delete(p.blocks, k)
	p.t1.remove(k)
	p.t2.remove(k)
}

func (p *arc) touch(keys []Key) {
	for i := len(keys) - 1; i >= 0; i-- {
		k := keys[i]
		switch {
		case p.t1.has(k):
			if p.blocks[k].ref >= 0 {
				p.t1.remove(k)
				p.t2.pushBack(k)
			} else {
				p.t1.pushBack(k)
			}
		case p.t2.has(k):
			p.t2.pushBack(k)
		case p.b1.has(k):
			d := 1.0
			if p.b1.len() > 0 {
				d = max(1, float64(p.b2.len())/float64(p.b1.len()))
			}
			p.target = min(p.target+d, float64(p.capacity))
		case p.b2.has(k):
			d := 1.0
			if p.b2.len() > 0 {
				d = max(1, float64(p.b1.len())/float64(p.b2.len()))
			}
			p.target = max(p.target-d, 0)
		}
	}
}

func (p *arc) loaded(Key) {}

// evict collects all n candidates first so a failure changes nothing: while the virtual size of
// T1 is at least the target it takes T1's next idle key, otherwise (or once T1 has none left)
// T2's, falling back to T1 when T2 is exhausted.
func (p *arc) evict(n int, protected map[Key]bool, freed func(*entry)) []Key {
	idle := func(o *ordered, taken map[Key]bool) []Key {
		var out []Key
		o.each(func(k Key) bool {
			if p.blocks[k].ref == 0 && !protected[k] && !taken[k] {
				out = append(out, k)
			}
			return true
		})
		return out
	}
	c1, c2 := idle(p.t1, nil), idle(p.t2, nil)
	var fromT1, fromT2 []Key
	vt1 := p.t1.len()
	for range n {
		useT1 := vt1 >= int(p.target)
		switch {
		case useT1 && len(fromT1) < len(c1):
			fromT1 = append(fromT1, c1[len(fromT1)])
			vt1--
		case len(fromT2) < len(c2):
			fromT2 = append(fromT2, c2[len(fromT2)])
		case len(fromT1) < len(c1):
			fromT1 = append(fromT1, c1[len(fromT1)])
			vt1--
		default:
			return nil
		}
	}
	for _, k := range fromT1 {
		freed(p.blocks[k])
		p.remove(k)
		p.b1.pushBack(k)
	}
	for _, k := range fromT2 {
		freed(p.blocks[k])
		p.remove(k)
		p.b2.pushBack(k)
	}
	for p.b1.len() > p.capacity {
		p.b1.popFront()
	}
	for p.b2.len() > p.capacity {
		p.b2.popFront()
	}
	return append(fromT1, fromT2...)
}

func (p *arc) clear() {
	clear(p.blocks)
	p.t1.clear()
	p.t2.clear()
	p.b1.clear()
	p.b2.clear()
	p.target = 0
}
