package kernels

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestUnpackIsRowByRow: Unpack gives every row Row gives, at every precision, for row counts
// that do and do not fill the last panel.
func TestUnpackIsRowByRow(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	for _, prec := range []Precision{F32, BF16, Int8} {
		for _, rows := range []int{1, PanelRows, 3*PanelRows + 5} {
			const cols = 70
			m, err := PackStackedAs(prec, nil, rows, cols, randSlice(r, rows*cols))
			require.NoError(t, err)
			got := make([]float32, rows*cols)
			m.Unpack(got)
			want := make([]float32, cols)
			for i := range rows {
				m.Row(want, i)
				require.Equal(t, want, got[i*cols:(i+1)*cols], "%s rows %d row %d", prec, rows, i)
			}
		}
	}
}
