package kernels

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/rolloutkit/rollout/engine/hugepage"
	"github.com/x448/float16"
)

// Precision is how a Matrix stores its weights. Whatever F32, BF16 or Int8 store, a MatMul
// reads the weights in that form, widens each one in registers to the float32 value it stands
// for (its effective weight) and runs the float32 FMA chain of the package doc on it: such a
// MatMul gives bit for bit what an F32 MatMul of the effective weights gives, on every kernel
// path. W8A8 gives that identity up on purpose (it also quantizes the activations, for integer
// dot products); it has its own definition, as exact and batch invariant (see W8A8).
type Precision uint8

// The precisions a Matrix can store.
const (
	// F32 stores float32 weights: 4 bytes a weight.
	F32 Precision = iota
	// BF16 stores bfloat16 weights (the high half of a float32, rounded to nearest even): 2
	// bytes a weight. The effective weight is the bfloat16 value, exactly.
	BF16
	// Int8 stores blocks of Int8Block weights along a row (the last one shorter when Cols is
	// not a multiple) as int8 with one scale per block, as q8_0 does (symmetric: scale =
	// max|w|/127 rounded up to a float16 value, see QuantizeInt8), held as a float32: 1.125
	// bytes a weight. The effective weight is float32(q)·scale, one float32 multiply.
	Int8
	// W8A8 stores the weights as Int8 does (the same int8 values and scales, in a panel layout
	// made for integer dot products, with the scales as the float16 values they are: 1.0625
	// bytes a weight, q8_0's size), and its MatMul also quantizes each token's input the
	// same way, per block of Int8Block along the row (scale max|x|/127, round to even, clamp
	// to ±127; a zero block has scale 0; a block holding a NaN or an infinity gets scale NaN
	// and zero values). For output row r and token t, with qw, ws the weights and their
	// scales and qx, xs the input's:
	//
	//	acc = 0
	//	for each block b in order:
	//		isum = Σ_{k in b} qw[r][k]·qx[t][k]   (exact, int32)
	//		d    = ws_b[r] · xs_b[t]                (one float32 multiply)
	//		acc  = fma(float32(isum), d, acc)       (one rounding)
	//	y[t][r] = acc
	//
	// Integer sums are exact, so every kernel keeping that per-block order gives the same
	// bits, at any batch size and pool split: the result is batch invariant like F32's, but
	// it is not the F32 MatMul of any effective weights (the input is rounded too). It is
	// opt-in, for batch-1 decode speed: an int8 dot product costs a few vector instructions
	// per 32 weights where Int8 widens every weight to float32.
	W8A8
)

// Int8Block is the number of weights of a row that share one Int8 scale.
const Int8Block = 32

// int8BlockBytes is the bytes of one Int8 panel's whole block: 16 float32 scales, then
// Int8Block steps of PanelRows int8 weights.
const int8BlockBytes = PanelRows*4 + Int8Block*PanelRows

// w8a8ScaleBytes and w8a8BlockBytes are the bytes of one W8A8 panel's block's scales (16
// float16) and of the whole block: the scales, then Int8Block/4 groups of PanelRows rows × 4
// int8 weights. A W8A8 panel pads a short last block to whole Int8Block columns.
const (
	w8a8ScaleBytes = PanelRows * 2
	w8a8BlockBytes = w8a8ScaleBytes + Int8Block*PanelRows
)

// ErrPrecision is returned (wrapped) for an unknown precision name, or a matrix shape or value
// a precision cannot store.
var ErrPrecision = errors.New("kernels: precision")

// String is the precision's name, as ParsePrecision reads it: "f32", "bf16", "int8" or "w8a8".
func (p Precision) String() string {
	switch p {
	case F32:
		return "f32"
	case BF16:
		return "bf16"
	case Int8:
		return "int8"
	case W8A8:
		return "w8a8"
	}
	return fmt.Sprintf("precision(%d)", uint8(p))
}

// ParsePrecision reads a precision name: "f32" (or "" and "float32"), "bf16" ("bfloat16"),
// "int8" ("q8_0") or "w8a8" ("int8-dot").
func ParsePrecision(s string) (Precision, error) {
	switch s {
	case "", "f32", "float32":
		return F32, nil
	case "bf16", "bfloat16":
		return BF16, nil
	case "int8", "q8_0":
		return Int8, nil
	case "w8a8", "int8-dot":
		return W8A8, nil
	}
	return F32, fmt.Errorf("%w: unknown precision %q (want f32, bf16, int8 or w8a8)", ErrPrecision, s)
}

// BytesPerWeight is the storage a precision takes per weight, scales included (for whole
// blocks: W8A8 pads a row's short last block).
func (p Precision) BytesPerWeight() float64 {
	switch p {
	case BF16:
		return 2
	case Int8:
		return float64(int8BlockBytes) / float64(Int8Block*PanelRows)
	case W8A8:
		return float64(w8a8BlockBytes) / float64(Int8Block*PanelRows)
	}
	return 4
}

// checkShape reports whether a matrix of cols columns can be stored at p: bfloat16 weights are
// read in pairs along a row.
func (p Precision) checkShape(cols int) error {
	switch p {
	case F32:
		return nil
	case BF16:
		if cols%2 != 0 {
			return fmt.Errorf("%w: bf16 needs an even number of columns, got %d", ErrPrecision, cols)
		}
		return nil
	case Int8, W8A8:
		return nil
	}
	return fmt.Errorf("%w: unknown precision %d", ErrPrecision, uint8(p))
}

// ToBF16 rounds f to the nearest bfloat16, ties to even; NaN stays NaN (quiet).
func ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// FromBF16 is the float32 value of a bfloat16, exactly.
func FromBF16(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// RoundBF16 is f rounded to the nearest bfloat16 value, as a float32.
func RoundBF16(f float32) float32 { return FromBF16(ToBF16(f)) }

// QuantizeInt8 quantizes one block of weights: scale = max|w|/127 in float32, rounded up to
// a float16 value, and q[i] = round(w[i]/scale) (ties to even), so that float32(q[i])·scale is
// the effective weight, within half a step of w[i]. Rounded up, the scale never puts a weight
// past ±127; a float16 scale lets W8A8 store it in 2 bytes, as q8_0 does. A block of zeros
// has scale 0. Non-finite weights, and weights beyond float16's largest value times 127
// (about 8.3e6), cannot be quantized.
func QuantizeInt8(q []int8, w []float32) (scale float32, err error) {
	amax, err := finiteMax(w)
	if err != nil {
		return 0, err
	}
	scale = float16Above(amax / 127)
	if math.IsInf(float64(scale), 0) {
		return 0, fmt.Errorf("%w: int8 cannot hold the weight %v (its block's scale is beyond float16)", ErrPrecision, amax)
	}
	quantizeWith(q, w, scale)
	return scale, nil
}

// float16Above is the least float16 value at or above f (finite, not negative), as a float32:
// +Inf past the largest float16.
func float16Above(f float32) float32 {
	h := float16.Fromfloat32(f)
	if h.Float32() < f {
		h = float16.Frombits(h.Bits() + 1) // the next float16 up (0x7bff's next is +Inf)
	}
	return h.Float32()
}

// finiteMax is max|w|, or an error for a non-finite weight.
func finiteMax(w []float32) (float32, error) {
	var amax float32
	for _, v := range w {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return 0, fmt.Errorf("%w: int8 cannot hold the non-finite weight %v", ErrPrecision, v)
		}
		amax = max(amax, float32(math.Abs(float64(v))))
	}
	return amax, nil
}

// quantizeWith sets q[i] = round(w[i]/scale), ties to even, clamped to ±127; all zeros when
// scale is 0.
func quantizeWith(q []int8, w []float32, scale float32) {
	if scale == 0 {
		clear(q[:len(w)])
		return
	}
	for i, v := range w {
		r := math.RoundToEven(float64(v) / float64(scale))
		q[i] = int8(min(127, max(-127, r)))
	}
}

// packLow packs the row-major parts into m (of precision BF16, Int8 or W8A8).
func packLow(m *Matrix, parts [][]float32) error {
	cols := m.Cols
	var q [Int8Block]int8
	r := 0
	for _, part := range parts {
		for off := 0; off < len(part); off, r = off+cols, r+1 {
			row := part[off : off+cols]
			p, i := r/PanelRows, r%PanelRows
			switch m.Prec {
			case BF16:
				panel := m.half[p*PanelRows*cols : (p+1)*PanelRows*cols]
				for k, v := range row {
					panel[(k/2)*2*PanelRows+2*i+k%2] = ToBF16(v)
				}
			case Int8, W8A8:
				base := p * m.panelBytes()
				for b := 0; b*Int8Block < cols; b++ {
					k0, k1 := b*Int8Block, min(cols, (b+1)*Int8Block)
					scale, err := QuantizeInt8(q[:], row[k0:k1])
					if err != nil {
						return fmt.Errorf("row %d, columns %d..%d: %w", r, k0, k1-1, err)
					}
					blk := m.q8[base+b*m.q8BlockBytes():]
					m.putScale(blk, i, scale)
					for k, v := range q[:k1-k0] {
						blk[m.q8Offset(k, i)] = byte(v)
					}
				}
			}
		}
	}
	return nil
}

// q8BlockBytes is the bytes of one block of an Int8 or W8A8 panel.
func (m *Matrix) q8BlockBytes() int {
	if m.Prec == W8A8 {
		return w8a8BlockBytes
	}
	return int8BlockBytes
}

// putScale stores row i's scale in blk, a block of an Int8 panel (float32) or a W8A8 one
// (float16: QuantizeInt8's scales are float16 values, so nothing is lost), little-endian as
// every supported GOARCH is.
func (m *Matrix) putScale(blk []byte, i int, s float32) {
	if m.Prec == W8A8 {
		binary.LittleEndian.PutUint16(blk[2*i:], float16.Fromfloat32(s).Bits())
		return
	}
	binary.LittleEndian.PutUint32(blk[4*i:], math.Float32bits(s))
}

// scale reads what putScale stored.
func (m *Matrix) scale(blk []byte, i int) float32 {
	if m.Prec == W8A8 {
		return float16.Frombits(binary.LittleEndian.Uint16(blk[2*i:])).Float32()
	}
	return math.Float32frombits(binary.LittleEndian.Uint32(blk[4*i:]))
}

// PackedBytes is Bytes of a rows×cols matrix packed at prec, without packing one.
func PackedBytes(prec Precision, rows, cols int) int64 {
	return (&Matrix{Rows: rows, Cols: cols, Prec: prec}).Bytes()
}

// newLowMatrix allocates a zeroed matrix of precision p.
func newLowMatrix(p Precision, rows, cols int) *Matrix {
	m := &Matrix{Rows: rows, Cols: cols, Prec: p}
	switch p {
	case BF16:
		m.half = hugepage.Make[uint16](m0(rows) * cols)
	case Int8, W8A8:
		m.q8 = hugepage.Make[byte](m.Panels() * m.panelBytes())
	}
	return m
}

// q8Offset is where, in a block of an Int8 or W8A8 panel, the weight of column k (of the
// block) and row i (of the panel) is stored. Int8: step k's 16 rows, one byte each, so a
// 16-byte load is one step. W8A8: group k/4's 16 rows × 4 columns, row i's four weights at
// i*4, so a 32-byte load is 8 rows × 4 columns, the operand of a 4-way byte dot product
// (VPMADDUBSW then VPMADDWD) against the input's 4 values broadcast.
func (m *Matrix) q8Offset(k, i int) int {
	if m.Prec == W8A8 {
		return w8a8ScaleBytes + (k/4)*PanelRows*4 + i*4 + k%4
	}
	return PanelRows*4 + k*PanelRows + i
}

// panelBytes is the size of one packed panel.
func (m *Matrix) panelBytes() int {
	if m.Prec == W8A8 {
		return (m.Cols + Int8Block - 1) / Int8Block * w8a8BlockBytes
	}
	return m.colBytes(m.Cols)
}

// colBytes is how many bytes a float32, bf16 or int8 panel of m holds for its first k columns:
// where column k starts when k is even (bf16) or a multiple of Int8Block (int8), and what a
// tile over those columns reads.
func (m *Matrix) colBytes(k int) int {
	switch m.Prec {
	case BF16:
		return PanelRows * k * 2
	case Int8:
		return (k+Int8Block-1)/Int8Block*PanelRows*4 + k*PanelRows
	}
	return PanelRows * k * 4
}

// widenPanel writes panel p's effective weights into dst (PanelRows·Cols values) in the
// float32 panel layout.
func (m *Matrix) widenPanel(dst []float32, p int) {
	cols := m.Cols
	switch m.Prec {
	case F32:
		copy(dst, m.data[p*PanelRows*cols:(p+1)*PanelRows*cols])
	case BF16:
		panel := m.half[p*PanelRows*cols : (p+1)*PanelRows*cols]
		for k := range cols {
			pair := panel[(k/2)*2*PanelRows : (k/2+1)*2*PanelRows]
			for i := range PanelRows {
				dst[k*PanelRows+i] = FromBF16(pair[2*i+k%2])
			}
		}
	case Int8, W8A8:
		base := p * m.panelBytes()
		for b := 0; b*Int8Block < cols; b++ {
			blk := m.q8[base+b*m.q8BlockBytes():]
			var scale [PanelRows]float32
			for i := range scale {
				scale[i] = m.scale(blk, i)
			}
			for k := range min(Int8Block, cols-b*Int8Block) {
				out := dst[(b*Int8Block+k)*PanelRows : (b*Int8Block+k+1)*PanelRows]
				for i := range PanelRows {
					out[i] = float32(int8(blk[m.q8Offset(k, i)])) * scale[i]
				}
			}
		}
	}
}

// widenScratch is matmulWidened's float32 panel and outputs, reused through widenScratches so
// that the fallback allocates nothing in steady state either; workers run chunks at once, so
// each takes its own.
type widenScratch struct {
	tmp       Matrix
	panel, yt []float32
}

var widenScratches = sync.Pool{New: func() any { return &widenScratch{} }}

// matmulWidened runs panels [lo,hi) of a low-precision MatMul with the float32 kernel f32: each
// panel is widened into a float32 scratch panel, which f32 multiplies. The bits are those of
// the float32 kernel on the effective weights; the cost is a pass over every weight in Go, so
// this is the fallback of builds and CPUs without a kernel reading the precision directly.
func matmulWidened(f32 func(m *Matrix, y, x []float32, n, lo, hi int), m *Matrix, y, x []float32, n, lo, hi int) {
	if lo >= hi || n <= 0 {
		return
	}
	cols, rows := m.Cols, m.Rows
	sc := widenScratches.Get().(*widenScratch)
	defer widenScratches.Put(sc)
	if cap(sc.panel) < PanelRows*cols {
		sc.panel = make([]float32, PanelRows*cols)
	}
	if cap(sc.yt) < n*PanelRows {
		sc.yt = make([]float32, n*PanelRows)
	}
	tmp := &sc.tmp
	*tmp = Matrix{Cols: cols, data: sc.panel[:PanelRows*cols]}
	yt := sc.yt[:n*PanelRows]
	for p := lo; p < hi; p++ {
		r0 := p * PanelRows
		tmp.Rows = min(PanelRows, rows-r0)
		m.widenPanel(tmp.data, p)
		f32(tmp, yt, x, n, 0, 1)
		for t := range n {
			copy(y[t*rows+r0:t*rows+r0+tmp.Rows], yt[t*tmp.Rows:(t+1)*tmp.Rows])
		}
	}
}
