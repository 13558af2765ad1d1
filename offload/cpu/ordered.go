package cpu

import (
	"container/list"

	"github.com/rolloutkit/rollout/engine/kvcache"
)

// Key identifies one chunk: the block hash at the chunk's end.
type Key = kvcache.BlockHash

// ordered is an insertion/recency-ordered set of keys: front is least recently used.
type ordered struct {
	l *list.List
	m map[Key]*list.Element
}

func newOrdered() *ordered { return &ordered{l: list.New(), m: map[Key]*list.Element{}} }

func (o *ordered) has(k Key) bool { _, ok := o.m[k]; return ok }

func (o *ordered) len() int { return len(o.m) }

// pushBack adds k at the MRU end, or moves it there.
func (o *ordered) pushBack(k Key) {
	if e, ok := o.m[k]; ok {
		o.l.MoveToBack(e)
		return
	}
	o.m[k] = o.l.PushBack(k)
}

func (o *ordered) remove(k Key) bool {
	e, ok := o.m[k]
	if !ok {
		return false
	}
	o.l.Remove(e)
	delete(o.m, k)
	return true
}

// popFront removes and returns the LRU key.
func (o *ordered) popFront() (Key, bool) {
	e := o.l.Front()
	if e == nil {
		return Key{}, false
	}
	k := e.Value.(Key)
	o.remove(k)
	return k, true
}

// each calls fn from front to back until it returns false.
func (o *ordered) each(fn func(Key) bool) {
	for e := o.l.Front(); e != nil; e = e.Next() {
		if !fn(e.Value.(Key)) {
			return
		}
	}
}

func (o *ordered) clear() {
	o.l.Init()
	clear(o.m)
}
