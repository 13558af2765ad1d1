package kernels

import "fmt"

// PackTransposed is PackStacked for W = Sᵀ, with S given row-major [cols][rows] as parts
// stacked on top of each other (the parts hold whole rows of S). A panel's PanelRows values for
// one k are then PanelRows consecutive values of S's row k, so packing is a strided copy rather
// than a transpose: what a backward pass needs to multiply by a weight's transpose, or to use
// an activation matrix as the weight of a gradient product.
func PackTransposed(reuse *Matrix, rows, cols int, parts ...[]float32) (*Matrix, error) {
	if rows <= 0 || cols <= 0 {
		return nil, fmt.Errorf("kernels: matrix %dx%d: rows and cols must be positive", rows, cols)
	}
	n := 0
	for i, p := range parts {
		if len(p)%rows != 0 {
			return nil, fmt.Errorf("kernels: transposed part %d has %d values, not whole rows of %d", i, len(p), rows)
		}
		n += len(p)
	}
	if n != rows*cols {
		return nil, fmt.Errorf("kernels: matrix %dx%d needs %d values, got %d", rows, cols, rows*cols, n)
	}
	m := reuse
	if m == nil || m.Rows != rows || m.Cols != cols {
		m = &Matrix{Rows: rows, Cols: cols, data: make([]float32, m0(rows)*cols)}
	}
	panels := m.Panels()
	tail := rows - (panels-1)*PanelRows // real rows of the last panel; its padding stays zero
	k := 0
	for _, part := range parts {
		for off := 0; off < len(part); off, k = off+rows, k+1 {
			src := part[off : off+rows]
			for p := range panels - 1 {
				copy(m.data[p*PanelRows*cols+k*PanelRows:][:PanelRows], src[p*PanelRows:])
			}
			p := panels - 1
			copy(m.data[p*PanelRows*cols+k*PanelRows:][:tail], src[p*PanelRows:])
		}
	}
	return m, nil
}
