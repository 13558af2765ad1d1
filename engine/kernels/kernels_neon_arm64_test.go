//go:build arm64 && !purego

package kernels

import (
	"math/rand/v2"
	"testing"
	"unsafe"
)

// TestNEONTilesMatchGeneric runs every generated tile shape directly, including those
// neonShape does not pick today, against the portable kernel: each must give its bits.
func TestNEONTilesMatchGeneric(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, cols := range []int{1, 2, 7, 64, 301} {
		const panels, tokens = 4, neonT1
		rows := panels * PanelRows
		m, err := NewMatrix(randSlice(r, rows*cols), rows, cols)
		if err != nil {
			t.Fatal(err)
		}
		x := randSlice(r, tokens*cols)
		want := make([]float32, tokens*rows)
		matmulGeneric(m, want, x, tokens, 0, panels)
		for p, row := range neonTiles {
			for nt, fn := range row {
				if fn == nil {
					continue
				}
				got := make([]float32, tokens*rows)
				fn(unsafe.Pointer(&m.data[0]), PanelRows*cols*4, unsafe.Pointer(&x[0]), cols*4, cols, unsafe.Pointer(&got[0]), rows*4)
				for tok := range nt {
					lo, hi := tok*rows, tok*rows+p*PanelRows
					requireSameBits(t, want[lo:hi], got[lo:hi], "tile P%dT%d cols=%d token %d", p, nt, cols, tok)
				}
			}
		}
	}
}
