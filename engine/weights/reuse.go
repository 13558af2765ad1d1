package weights

import (
	"unsafe"

	"github.com/rolloutkit/rollout/engine/hugepage"
	"github.com/rolloutkit/rollout/engine/model"
)

// reuseTensors returns the tensors of old by name, for a load to decode into instead of
// allocating: writing a tensor into memory a process has used before costs no page faults,
// while a fresh multi-hundred-megabyte set faults every page in (about 15 µs each on a
// virtual machine, which made a steady-state load 3-6× slower than its hash). A tensor that
// starts where one already listed does (an alias, such as a head tied by hand) is left out,
// so that two tensors of one load never share memory. Nil old gives nil.
func reuseTensors(old *model.Weights) map[string][]float32 {
	if old == nil {
		return nil
	}
	ts := old.Tensors()
	byName := make(map[string][]float32, len(ts))
	seen := make(map[*float32]bool, len(ts))
	for _, t := range ts {
		d := *t.Data
		if len(d) == 0 || seen[unsafe.SliceData(d)] {
			continue
		}
		seen[unsafe.SliceData(d)] = true
		byName[t.Name] = d
	}
	return byName
}

// fill points every tensor of w (whose Config is set) at the same-named tensor of reuse when
// its length is the one the tensor's shape needs; the others stay nil and are allocated by
// the decoder. Without reuse, w gets a new set (model.Weights.Allocate): one allocation in
// huge pages, which a load faults in in a fraction of the time 4 KB pages take.
func fill(w *model.Weights, reuse map[string][]float32) {
	if reuse == nil {
		w.Allocate()
		return
	}
	for _, t := range w.Tensors() {
		if r, ok := reuse[t.Name]; ok && len(r) == t.Len() {
			*t.Data = r
		}
	}
}

// tensorFor returns cur when it has n elements (memory of a reused set), else a new slice.
func tensorFor(cur []float32, n int) []float32 {
	if len(cur) == n {
		return cur
	}
	return hugepage.Make[float32](n)
}
