package tokenizer

import "container/heap"

// mergeCand is a possible merge of the adjacent symbols at left and right, valid only while
// they still hold lid and rid.
type mergeCand struct {
	prio        float64 // lower merges first
	left, right int
	lid, rid    int
	id          int // the merged symbol
}

type candHeap []mergeCand

func (h candHeap) Len() int { return len(h) }
func (h candHeap) Less(i, j int) bool {
	if h[i].prio != h[j].prio {
		return h[i].prio < h[j].prio
	}
	return h[i].left < h[j].left
}
func (h candHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *candHeap) Push(x any)   { *h = append(*h, x.(mergeCand)) }
func (h *candHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// mergeSymbols repeatedly merges the adjacent pair with the lowest priority, the leftmost of
// equals, until pair finds none. That is both llama2.c's encode() loop (which rescans for the
// best score each round, strict > keeping the leftmost) and Hugging Face's BPE word merge, in
// O(n log n) instead of O(n²). The stale-entry check is sound because a merged symbol is
// always longer than either part, so a position never returns to an id it held before.
// ids is modified and its prefix returned.
func mergeSymbols(ids []int, pair func(a, b int) (id int, prio float64, ok bool)) []int {
	n := len(ids)
	if n < 2 {
		return ids
	}
	next := make([]int, n)
	prev := make([]int, n)
	for i := range ids {
		next[i], prev[i] = i+1, i-1
	}
	next[n-1] = -1
	h := make(candHeap, 0, n)
	push := func(l, r int) {
		if l < 0 || r < 0 {
			return
		}
		if id, p, ok := pair(ids[l], ids[r]); ok {
			heap.Push(&h, mergeCand{prio: p, left: l, right: r, lid: ids[l], rid: ids[r], id: id})
		}
	}
	for i := 0; i < n-1; i++ {
		if id, p, ok := pair(ids[i], ids[i+1]); ok {
			h = append(h, mergeCand{prio: p, left: i, right: i + 1, lid: ids[i], rid: ids[i+1], id: id})
		}
	}
	heap.Init(&h)
	for h.Len() > 0 {
		c := heap.Pop(&h).(mergeCand)
		if next[c.left] != c.right || ids[c.left] != c.lid || ids[c.right] != c.rid {
			continue
		}
		ids[c.left] = c.id
		ids[c.right] = -1
		nr := next[c.right]
		next[c.left] = nr
		if nr >= 0 {
			prev[nr] = c.left
		}
		push(prev[c.left], c.left)
		push(c.left, nr)
	}
	out := ids[:0]
	for i := 0; i >= 0; i = next[i] {
		out = append(out, ids[i])
	}
	return out
}
