package kernels

import (
	"slices"
	"testing"
)

// TestPackTransposed checks that PackTransposed of S equals PackStacked of Sᵀ, with stacked
// parts and a partial last panel.
func TestPackTransposed(t *testing.T) {
	const rows, cols = 37, 5
	s := make([]float32, cols*rows) // S is [cols][rows]
	for i := range s {
		s[i] = float32(i%97) - 40
	}
	w := make([]float32, rows*cols)
	for r := range rows {
		for k := range cols {
			w[r*cols+k] = s[k*rows+r]
		}
	}
	want, err := NewMatrix(w, rows, cols)
	if err != nil {
		t.Fatal(err)
	}
	got, err := PackTransposed(nil, rows, cols, s[:2*rows], s[2*rows:])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(want.data, got.data) {
		t.Fatal("PackTransposed differs from PackStacked of the transpose")
	}
	if _, err := PackTransposed(nil, rows, cols, s[:rows+1]); err == nil {
		t.Fatal("a part of partial rows must fail")
	}
}
