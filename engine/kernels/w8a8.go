package kernels

import (
	"math"
	"sync"
)

// w8a8Acts is a W8A8 MatMul's quantized input: for each of n tokens, nb blocks of Int8Block
// int8 values (a short last block padded with zeros, so the padded weights meet zeros) and one
// float32 scale per block. It is scratch, reused across calls through w8a8Scratch, together
// with the closures the pool runs, so that a MatMul allocates nothing in steady state.
type w8a8Acts struct {
	q  []int8    // [n][nb*Int8Block]
	s  []float32 // [n][nb]
	nb int
	// The same inputs and scales of each group of w8a8AMXTokens tokens (the last one
	// shorter if n is not a multiple) packed by block, [group][nb][tokens][Int8Block] and
	// [group][nb][tokens], where the AMX tiles run (see packAMX).
	qa []int8
	sa []float32

	// The current call, for quant and run.
	m      *Matrix
	x, y   []float32
	n      int
	panels func(m *Matrix, a *w8a8Acts, y []float32, n, lo, hi int)
	quant  func(lo, hi int) // quantizes tokens [lo,hi) of x
	pack   func(lo, hi int) // packs token groups [lo,hi) into qa and sa
	run    func(lo, hi int) // runs panels [lo,hi)
}

// w8a8AMXTokens is the AMX tile's width in tokens: the 16 rows of its input and sum tiles.
const w8a8AMXTokens = 16

// w8a8Scratch holds idle w8a8Acts; a MatMul takes one for the call. MatMuls may run
// concurrently (on different pools), so a single buffer would not do.
var w8a8Scratch = sync.Pool{New: func() any {
	a := &w8a8Acts{}
	a.quant = func(lo, hi int) {
		cols, bw := a.m.Cols, a.nb*Int8Block
		for t := lo; t < hi; t++ {
			quantizeActs(a.q[t*bw:(t+1)*bw], a.s[t*a.nb:(t+1)*a.nb], a.x[t*cols:(t+1)*cols])
		}
	}
	a.pack = func(lo, hi int) { packAMX(a, lo, hi) }
	a.run = func(lo, hi int) { a.panels(a.m, a, a.y, a.n, lo, hi) }
	return a
}}

// packAMX copies token groups [lo,hi) of a's inputs and scales into qa and sa, block by
// block: the AMX tile then loads a block's inputs (16 tokens × 32) from contiguous bytes and
// its scales from one cache line. Read in place, the inputs' rows would lie a whole row apart
// (8 KB for 8192 columns). The last group holds the tokens past a multiple of 16, if any.
func packAMX(a *w8a8Acts, lo, hi int) {
	const g = w8a8AMXTokens
	nb, bw := a.nb, a.nb*Int8Block
	for grp := lo; grp < hi; grp++ {
		m := min(g, a.n-grp*g)
		qa, sa := a.qa[grp*g*bw:], a.sa[grp*g*nb:]
		for t := range m {
			q, s := a.q[(grp*g+t)*bw:], a.s[(grp*g+t)*nb:]
			for b := range nb {
				copy(qa[(b*m+t)*Int8Block:(b*m+t+1)*Int8Block], q[b*Int8Block:(b+1)*Int8Block])
				sa[b*m+t] = s[b]
			}
		}
	}
}

// quantizeActs quantizes one token's input x into q (len(s)·Int8Block values) and s, one
// scale per block of Int8Block, as W8A8 defines (QuantizeInt8 with a float32 scale; a
// non-finite block gets scale NaN and zero values, so that its outputs are NaN as a float32
// MatMul's would be NaN or infinite). q's padding past len(x) is zeroed.
func quantizeActs(q []int8, s []float32, x []float32) {
	for b := range s {
		k0 := b * Int8Block
		qb := q[k0 : k0+Int8Block]
		if k0 >= len(x) {
			clear(qb)
			s[b] = 0
			continue
		}
		if len(x)-k0 >= Int8Block {
			s[b] = quantizeWholeBlock((*[Int8Block]int8)(qb), (*[Int8Block]float32)(x[k0:]))
			continue
		}
		xb := x[k0:]
		s[b] = quantizeActBlock(qb, xb)
		clear(qb[len(xb):])
	}
}

// quantizeActBlock is QuantizeInt8 for inputs, which cannot fail: scale = max|x|/127 in
// float32, q[i] = round(x[i]/scale) to even, clamped to ±127, a zero block has scale 0; a
// block with a NaN or infinity gets scale NaN and zero values.
func quantizeActBlock(q []int8, x []float32) float32 {
	// max|x| from the bits without the sign: as unsigned integers they order finite values by
	// magnitude, with the infinities and NaNs above them.
	var bits uint32
	for _, v := range x {
		bits = max(bits, math.Float32bits(v)&0x7fffffff)
	}
	if bits >= 0x7f800000 {
		clear(q[:len(x)])
		return float32(math.NaN())
	}
	scale := math.Float32frombits(bits) / 127
	quantizeWith(q, x, scale)
	return scale
}

// matmulW8A8 is MatMul of a W8A8 matrix: it quantizes the n tokens of x (split across pool by
// tokens when there are several), then runs panels over pool's panel split (the kernel is the
// build's matmulW8A8Panels, or a test's choice).
func matmulW8A8(pool *Pool, m *Matrix, y, x []float32, n int, panels func(m *Matrix, a *w8a8Acts, y []float32, n, lo, hi int)) {
	a := w8a8Scratch.Get().(*w8a8Acts)
	nb := (m.Cols + Int8Block - 1) / Int8Block
	if need := n * nb * Int8Block; cap(a.q) < need {
		a.q = make([]int8, need)
		a.s = make([]float32, n*nb)
	}
	a.q, a.s = a.q[:n*nb*Int8Block], a.s[:n*nb]
	a.nb, a.m, a.x, a.y, a.n, a.panels = nb, m, x, y, n, panels
	if n > 1 {
		pool.Parallel(n, a.quant)
	} else {
		a.quant(0, n)
	}
	// Packed whenever the AMX tiles may run, whatever n (the tests send every width through
	// them); below w8a8AMXMin it is a copy of n rows of quantized input, next to nothing
	// beside the MatMul it feeds.
	if w8a8UseAMX {
		if need := n * nb * Int8Block; cap(a.qa) < need {
			a.qa = make([]int8, need)
			a.sa = make([]float32, n*nb)
		}
		a.qa, a.sa = a.qa[:n*nb*Int8Block], a.sa[:n*nb]
		pool.Parallel((n+w8a8AMXTokens-1)/w8a8AMXTokens, a.pack)
	}
	np := m.Panels()
	pool.ParallelChunks(np, matmulChunk(np, pool.Workers()), a.run)
	a.m, a.x, a.y, a.panels = nil, nil, nil, nil
	w8a8Scratch.Put(a)
}

// matmulW8A8Generic runs panels [lo,hi) of a W8A8 MatMul in Go: W8A8's definition as written,
// the portable kernel and the reference the assembly one is tested against.
func matmulW8A8Generic(m *Matrix, a *w8a8Acts, y []float32, n, lo, hi int) {
	rows, nb := m.Rows, a.nb
	pb := m.panelBytes()
	for p := lo; p < hi; p++ {
		panel := m.q8[p*pb : (p+1)*pb]
		r0 := p * PanelRows
		nr := min(PanelRows, rows-r0)
		for t := range n {
			qx := a.q[t*nb*Int8Block : (t+1)*nb*Int8Block]
			xs := a.s[t*nb : (t+1)*nb]
			var acc [PanelRows]float32
			for b := range nb {
				blk := panel[b*w8a8BlockBytes : (b+1)*w8a8BlockBytes]
				xb := qx[b*Int8Block : (b+1)*Int8Block]
				var isum [PanelRows]int32
				for g := range Int8Block / 4 {
					grp := (*[PanelRows * 4]byte)(blk[w8a8ScaleBytes+g*PanelRows*4:])
					x0, x1, x2, x3 := int32(xb[4*g]), int32(xb[4*g+1]), int32(xb[4*g+2]), int32(xb[4*g+3])
					for i := range PanelRows {
						w := grp[4*i : 4*i+4]
						isum[i] += int32(int8(w[0]))*x0 + int32(int8(w[1]))*x1 + int32(int8(w[2]))*x2 + int32(int8(w[3]))*x3
					}
				}
				for i := range nr {
					d := float32(m.scale(blk, i) * xs[b])
					acc[i] = fma32(float32(isum[i]), d, acc[i])
				}
			}
			copy(y[t*rows+r0:t*rows+r0+nr], acc[:nr])
		}
	}
}
