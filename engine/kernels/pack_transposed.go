package kernels

// PackTransposed is PackStacked for W = Sᵀ, with S given row-major [cols][rows] as parts
// stacked on top of each other (the parts hold whole rows of S). A panel's PanelRows values for
// one k are then PanelRows consecutive values of S's row k, so packing is a strided copy rather
// than a transpose: what a backward pass needs to multiply by a weight's transpose, or to use
// an activation matrix as the weight of a gradient product.
func PackTransposed(reuse *Matrix, rows, cols int, parts ...[]float32) (*Matrix, error) {
	m, err := packTarget(reuse, F32, rows, cols, rows, "transposed part", parts)
	if err != nil {
		return nil, err
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
