package kernels

import (
	"fmt"
	"math"
	"sync"

	"github.com/rolloutkit/rollout/engine/hugepage"
)

// PanelRows is the number of weight rows interleaved in one packed panel: one AVX-512 vector
// (or two AVX2 vectors) of outputs.
const PanelRows = 16

// Matrix is a weight matrix W[Rows][Cols] packed into panels of PanelRows rows: panel p holds,
// for k = 0..Cols-1, the PanelRows values W[p*PanelRows+i][k] contiguously (rows past Rows are
// zero). A mat-vec therefore streams each panel once, front to back. Prec says how the
// weights are stored: float32 in data, or bfloat16 or int8 in the layouts of PackStackedAs.
type Matrix struct {
	Rows, Cols int
	Prec       Precision
	data       []float32 // F32
	half       []uint16  // BF16
	q8         []byte    // Int8, W8A8
}

// NewMatrix packs w, a row-major [rows][cols] matrix.
func NewMatrix(w []float32, rows, cols int) (*Matrix, error) { return NewStackedMatrix(rows, cols, w) }

// NewStackedMatrix packs the row-major parts stacked on top of each other (e.g. Wq, Wk, Wv into
// one QKV matrix) as one [rows][cols] matrix, without first concatenating them.
func NewStackedMatrix(rows, cols int, parts ...[]float32) (*Matrix, error) {
	return PackStacked(nil, rows, cols, parts...)
}

// packTarget checks that parts hold rows×cols values in whole runs of unit values and returns
// the matrix to pack them into: reuse when it has the shape, else new zeroed memory.
func packTarget(reuse *Matrix, prec Precision, rows, cols, unit int, what string, parts [][]float32) (*Matrix, error) {
	if rows <= 0 || cols <= 0 {
		return nil, fmt.Errorf("kernels: matrix %dx%d: rows and cols must be positive", rows, cols)
	}
	if err := prec.checkShape(cols); err != nil {
		return nil, fmt.Errorf("kernels: matrix %dx%d: %w", rows, cols, err)
	}
	n := 0
	for i, p := range parts {
		if len(p)%unit != 0 {
			return nil, fmt.Errorf("kernels: %s %d has %d values, not whole rows of %d", what, i, len(p), unit)
		}
		n += len(p)
	}
	if n != rows*cols {
		return nil, fmt.Errorf("kernels: matrix %dx%d needs %d values, got %d", rows, cols, rows*cols, n)
	}
	if reuse != nil && reuse.Rows == rows && reuse.Cols == cols && reuse.Prec == prec {
		return reuse, nil
	}
	if prec != F32 {
		return newLowMatrix(prec, rows, cols), nil
	}
	data := hugepage.Make[float32](m0(rows) * cols)
	return &Matrix{Rows: rows, Cols: cols, data: data}, nil
}

// PackStacked is NewStackedMatrix packing into reuse's memory when reuse has the same shape
// (and is no longer read by anyone), else into new memory. A weight update repacks every
// matrix; reusing the retired set's memory saves allocating, faulting in and zeroing it.
func PackStacked(reuse *Matrix, rows, cols int, parts ...[]float32) (*Matrix, error) {
	return PackStackedAs(F32, reuse, rows, cols, parts...)
}

// PackStackedAs is PackStacked storing the weights at precision prec, rounded (BF16) or
// quantized (Int8) once, here. A BF16 panel holds, for each pair of columns k, k+1, the
// PanelRows pairs (W[r][k], W[r][k+1]) as 32-bit words, so one load yields both steps of 16
// rows; an Int8 panel holds, for each block of Int8Block columns, the 16 rows' float32 scales
// and then the block's steps of 16 int8 weights; a W8A8 panel holds the same values, with the
// scales as float16 (they are float16 values) and each block's weights in groups of 4 columns
// × 16 rows (see q8Offset), a short last block padded with zeros. reuse is taken only with the
// same precision.
func PackStackedAs(prec Precision, reuse *Matrix, rows, cols int, parts ...[]float32) (*Matrix, error) {
	m, err := packTarget(reuse, prec, rows, cols, cols, "matrix part", parts)
	if err != nil {
		return nil, err
	}
	if prec != F32 {
		if err := packLow(m, parts); err != nil {
			return nil, fmt.Errorf("kernels: matrix %dx%d: %w", rows, cols, err)
		}
		return m, nil
	}
	// Every real row is overwritten below; the padding rows of the last panel stay zero.
	r := 0
	for _, part := range parts {
		for off := 0; off < len(part); off, r = off+cols, r+1 {
			p, i := r/PanelRows, r%PanelRows
			base := p * PanelRows * cols
			for k, v := range part[off : off+cols] {
				m.data[base+k*PanelRows+i] = v
			}
		}
	}
	return m, nil
}

// m0 rounds rows up to whole panels.
func m0(rows int) int { return (rows + PanelRows - 1) / PanelRows * PanelRows }

// Panels is the number of packed panels.
func (m *Matrix) Panels() int { return m0(m.Rows) / PanelRows }

// Bytes is the size of the packed weights.
func (m *Matrix) Bytes() int64 { return int64(m.Panels()) * int64(m.panelBytes()) }

// Row copies row r of W into dst (len Cols), the effective weights for a low precision; for
// tests and conversions, not hot paths.
func (m *Matrix) Row(dst []float32, r int) {
	p, i := r/PanelRows, r%PanelRows
	if m.Prec != F32 {
		panel := make([]float32, PanelRows*m.Cols)
		m.widenPanel(panel, p)
		for k := range m.Cols {
			dst[k] = panel[k*PanelRows+i]
		}
		return
	}
	base := p * PanelRows * m.Cols
	for k := range m.Cols {
		dst[k] = m.data[base+k*PanelRows+i]
	}
}

// Unpack writes W's effective weights into dst, row-major [Rows][Cols], widening each panel
// once (Row per row would widen a panel PanelRows times): the float32 set a low-precision
// model computes with, rebuilt on demand instead of kept.
func (m *Matrix) Unpack(dst []float32) {
	cols := m.Cols
	panel := make([]float32, PanelRows*cols)
	for p := range m.Panels() {
		m.widenPanel(panel, p)
		for i := range min(PanelRows, m.Rows-p*PanelRows) {
			row := dst[(p*PanelRows+i)*cols : (p*PanelRows+i+1)*cols]
			for k := range cols {
				row[k] = panel[k*PanelRows+i]
			}
		}
	}
}

// MatMul computes y[t][r] = Σ_k W[r][k]·x[t][k] for t < n: x is row-major [n][Cols], y is
// row-major [n][Rows]. Work is split across pool by panels (load-balanced, see
// ParallelChunks); the result does not depend on n, on the split or on which SIMD path runs
// (see the package doc; a W8A8 matrix computes W8A8's definition instead of the float32
// chain, with the same guarantees).
func (m *Matrix) MatMul(pool *Pool, y, x []float32, n int) {
	if n <= 0 {
		return
	}
	if len(x) < n*m.Cols || len(y) < n*m.Rows {
		panic(fmt.Sprintf("kernels: MatMul %dx%d with n=%d: len(x)=%d len(y)=%d", m.Rows, m.Cols, n, len(x), len(y)))
	}
	if m.Prec == W8A8 {
		matmulW8A8(pool, m, y, x, n, matmulW8A8Panels)
		return
	}
	c := matmulCalls.Get().(*matmulCall)
	c.m, c.y, c.x, c.n, c.panels = m, y, x, n, matmulPanels
	if m.Prec != F32 {
		c.panels = matmulLow
	}
	np := m.Panels()
	pool.ParallelChunks(np, matmulChunk(np, pool.Workers()), c.run)
	c.m, c.y, c.x, c.panels = nil, nil, nil, nil
	matmulCalls.Put(c)
}

// matmulCall is one MatMul's arguments for the pool's workers, reused through matmulCalls with
// its run func, so that a MatMul allocates nothing in steady state (a closure over the
// arguments would escape to the pool, one allocation a call).
type matmulCall struct {
	m      *Matrix
	y, x   []float32
	n      int
	panels func(m *Matrix, y, x []float32, n, lo, hi int)
	run    func(lo, hi int) // runs panels [lo,hi)
}

// matmulCalls holds idle matmulCalls; MatMuls may run concurrently (on different pools).
var matmulCalls = sync.Pool{New: func() any {
	c := &matmulCall{}
	c.run = func(lo, hi int) { c.panels(c.m, c.y, c.x, c.n, lo, hi) }
	return c
}}

// matmulChunk is the panels per load-balancing chunk: about four per worker, in multiples of
// four panels (the widest tile), so chunks cost no tile efficiency.
func matmulChunk(panels, workers int) int {
	return max(4, (panels/workers/4+3)/4*4)
}

// matmulGeneric is the portable kernel, also the reference the SIMD kernels are tested against.
// It walks each panel eight rows at a time (chain8) so that the accumulators stay in registers;
// the reduction order per output is still the FMA chain over k of the package doc.
func matmulGeneric(m *Matrix, y, x []float32, n, lo, hi int) {
	cols, rows := m.Cols, m.Rows
	for p := lo; p < hi; p++ {
		panel := m.data[p*PanelRows*cols : (p+1)*PanelRows*cols]
		r0 := p * PanelRows
		nr := min(PanelRows, rows-r0)
		for t := range n {
			xt := x[t*cols : (t+1)*cols]
			yt := y[t*rows+r0 : t*rows+r0+nr]
			for i := 0; i < nr; i += 8 {
				var acc [8]float32
				for k := 0; k < cols; k++ {
					if k += chain8(panel[k*PanelRows:], xt[k:], &acc, i); k == cols {
						break
					}
					// Step k may need the exact rounding in some lane: fma32 does the whole
					// step, and the fast path resumes at k+1.
					w, xv := (*[8]float32)(panel[k*PanelRows+i:]), xt[k]
					for j := range acc {
						acc[j] = fma32(w[j], xv, acc[j])
					}
				}
				copy(yt[i:], acc[:])
			}
		}
	}
}

// chain8 advances the FMA chains of the eight rows off..off+7 (off is 0 or 8) of a panel, whose
// steps are w[0:PanelRows], w[PanelRows:2*PanelRows], ..., against the inputs x, from the
// partial sums in acc. Each lane is fma32 inline: the sum s in float64, whose float32 rounding
// is the single one unless the low bits test of roundsOnce fails and roundsOnceRare does too.
// chain8 stops before the first step in which some lane's rounding is in doubt (in practice a
// float32 halfway point: about one lane-step in 2^29) and returns the steps completed, all
// of whose lanes are committed to acc; fma32 does that step. A step commits its eight sums only at its
// end, so a stop needs no bookkeeping per lane. The loop calls nothing, so the accumulators live
// in registers, and it has no bounds checks.
func chain8(w, x []float32, acc *[8]float32, off int) (steps int) {
	off &= 8
	a0, a1, a2, a3, a4, a5, a6, a7 := acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]
	for len(w) >= PanelRows && len(x) > 0 {
		ww := (*[PanelRows]float32)(w)
		xv := float64(x[0])
		p0 := float64(ww[off+0]) * xv
		s0 := p0 + float64(a0)
		if math.Float64bits(s0)<<36 == 0 && !roundsOnceRare(p0, float64(a0), s0) {
			break
		}
		p1 := float64(ww[off+1]) * xv
		s1 := p1 + float64(a1)
		if math.Float64bits(s1)<<36 == 0 && !roundsOnceRare(p1, float64(a1), s1) {
			break
		}
		p2 := float64(ww[off+2]) * xv
		s2 := p2 + float64(a2)
		if math.Float64bits(s2)<<36 == 0 && !roundsOnceRare(p2, float64(a2), s2) {
			break
		}
		p3 := float64(ww[off+3]) * xv
		s3 := p3 + float64(a3)
		if math.Float64bits(s3)<<36 == 0 && !roundsOnceRare(p3, float64(a3), s3) {
			break
		}
		p4 := float64(ww[off+4]) * xv
		s4 := p4 + float64(a4)
		if math.Float64bits(s4)<<36 == 0 && !roundsOnceRare(p4, float64(a4), s4) {
			break
		}
		p5 := float64(ww[off+5]) * xv
		s5 := p5 + float64(a5)
		if math.Float64bits(s5)<<36 == 0 && !roundsOnceRare(p5, float64(a5), s5) {
			break
		}
		p6 := float64(ww[off+6]) * xv
		s6 := p6 + float64(a6)
		if math.Float64bits(s6)<<36 == 0 && !roundsOnceRare(p6, float64(a6), s6) {
			break
		}
		p7 := float64(ww[off+7]) * xv
		s7 := p7 + float64(a7)
		if math.Float64bits(s7)<<36 == 0 && !roundsOnceRare(p7, float64(a7), s7) {
			break
		}
		a0, a1, a2, a3, a4, a5, a6, a7 = float32(s0), float32(s1), float32(s2), float32(s3), float32(s4), float32(s5), float32(s6), float32(s7)
		w, x = w[PanelRows:], x[1:]
		steps++
	}
	acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7] = a0, a1, a2, a3, a4, a5, a6, a7
	return steps
}

// fma32 is a*b+c rounded once to float32, bit for bit what VFMADD does per lane, so the
// portable kernel matches the SIMD ones exactly. The product is exact in float64 (24+24 bits);
// the float64 sum s is then rounded a second time to float32, which gives the single rounding
// unless s is a float32 halfway point (see roundsOnce). The hot loops use fmaFast, which
// inlines, and call fma32Slow themselves in the rare case. (No math.FMA: below GOAMD64=v3 it
// is a feature check with a call behind it, which spills the accumulators. A compiler that
// fuses p+c into one FMA, as arm64 or GOAMD64=v3 do, gives the same s, the product being exact.)
func fma32(a, b, c float32) float32 {
	if f, ok := fmaFast(a, b, c); ok {
		return f
	}
	return fma32Slow(a, b, c)
}

// fmaFast is fma32 without the slow path, small enough to inline: float32(a·b+c) with the
// product and sum in float64, and whether that is fma32's result; when not (about one step in
// 2^29 on random data), fma32Slow is.
func fmaFast(a, b, c float32) (float32, bool) {
	p := float64(a) * float64(b)
	s := p + float64(c)
	return float32(s), math.Float64bits(s)<<36 != 0 || roundsOnceRare(p, float64(c), s)
}

// roundsOnce reports whether f = float32(s), with s the float64 rounding of some exact value v,
// is also the single rounding of v to float32. Every float32 halfway point (midway between two
// adjacent float32 values, or between MaxFloat32 and the overflow to infinity) is a float64, so
// rounding v to float64 cannot carry it across one: the two roundings differ only if s is a
// halfway point. A halfway point has the low 28 of float64's 52 mantissa bits zero: in float32's
// normal range the low 29 bits are exactly 1<<28, and in its subnormal range (spacing 2^-149,
// halfway points odd multiples of 2^-150, s below 2^-126 with a float64 spacing of 2^-179 or
// finer) the low 29 bits are zero. So a nonzero low part proves the single rounding with one
// shift and test, which is all the hot loops pay; the rare rest is settled by whether s is a
// float32 (a float32 is never a halfway point: this admits the zeros, infinities and exact sums
// that structured inputs such as zero weights or inputs produce every step). What remains,
// halfway points and the odd NaN or non-float32 with a zero low part, goes to the slow path.
func roundsOnce(s float64, f float32) bool {
	return math.Float64bits(s)<<36 != 0 || float64(f) == s
}

// roundsOnceRare is the hot loops' test for a sum s = p+c rounded to float64 whose low bits
// roundsOnce found zero: the float32 rounding of s is the single one if s is a float32 (see
// roundsOnce), or if s is p+c exactly (the TwoSum error is zero). So structured inputs whose
// sums are float32 values or short (zero weights or inputs, inputs of 1) take the fast path on,
// and only an inexact halfway point (or a NaN) is left to fma32.
func roundsOnceRare(p, c, s float64) bool {
	if float64(float32(s)) == s {
		return true
	}
	bb := s - p
	return (p-(s-bb))+(c-bb) == 0
}

// fma32Slow is fma32 for every input, the rare ones included: when the float64 sum s = p+c
// is in doubt it rounds to float32 via round-to-odd: if s is inexact, replace it by its odd
// neighbour on the side of the exact sum. A round-to-odd result with at least two more bits
// than the target rounds correctly (Boldo & Melquiond, 2008).
//
//go:noinline
func fma32Slow(a, b, cf float32) float32 {
	p, c := float64(a)*float64(b), float64(cf)
	s := p + c
	if f := float32(s); roundsOnce(s, f) {
		return f
	}
	// TwoSum: e is the exact error p+c-s.
	bb := s - p
	e := (p - (s - bb)) + (c - bb)
	bits := math.Float64bits(s)
	if e != 0 && !math.IsNaN(e) && bits&1 == 0 {
		if (e > 0) == (s > 0) {
			bits++
		} else {
			bits--
		}
		s = math.Float64frombits(bits)
	}
	return float32(s)
}
