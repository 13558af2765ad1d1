package trainer

import (
	"fmt"
	"math"

	"github.com/rolloutkit/rollout/engine/kernels"
)

// mat is a weight matrix W[rows][cols] made of row-major parts stacked on top of each other
// (Wq, Wk, Wv as one QKV matrix, as the engine packs them). In float32 it caches the engine's
// packed form of W (for y = x·Wᵀ) and of Wᵀ (for the input gradient dx = dy·W); invalidate
// after the parts change.
type mat[F float] struct {
	rows, cols int
	parts      [][]F

	fwd, bwd     *kernels.Matrix
	fwdOK, bwdOK bool
	gx           *kernels.Matrix // Xᵀ of the last gradient product
	dyT, gdst    []float32

	// For a matrix taller than wide (the LM head above all), the gradient is accumulated
	// transposed in gT over a step's micro-batches and added to gTarget by grads.flush.
	gy        *kernels.Matrix
	xT, gT    []float32
	gTPending bool
	gTarget   []float32
}

func newMat[F float](rows, cols int, parts ...[]F) *mat[F] {
	return &mat[F]{rows: rows, cols: cols, parts: parts}
}

func (m *mat[F]) invalidate() { m.fwdOK, m.bwdOK = false, false }

// row returns row r of W.
func (m *mat[F]) row(r int) []F {
	for _, p := range m.parts {
		n := len(p) / m.cols
		if r < n {
			return p[r*m.cols : (r+1)*m.cols]
		}
		r -= n
	}
	panic(fmt.Sprintf("trainer: row %d outside matrix of %d rows", r, m.rows))
}

func mustPack(reuse *kernels.Matrix, rows, cols int, parts ...[]float32) *kernels.Matrix {
	m, err := kernels.PackStacked(reuse, rows, cols, parts...)
	if err != nil {
		panic(fmt.Sprintf("trainer: packing a %dx%d matrix: %v", rows, cols, err)) // shapes are checked up front
	}
	return m
}

// transpose writes src [rows][cols] transposed into dst [cols][rows]. It moves 16×8 tiles,
// so that each destination row gets a whole cache line per tile and the inner loops have no
// bounds checks.
func transpose(dst, src []float32, rows, cols int) { transposeOp(dst, src, rows, cols, false) }

// transposeAdd adds src [rows][cols] transposed into dst [cols][rows].
func transposeAdd(dst, src []float32, rows, cols int) { transposeOp(dst, src, rows, cols, true) }

func transposeOp(dst, src []float32, rows, cols int, add bool) {
	kernels.ClearUpper()
	const br, bc = 16, 8
	r0 := 0
	for ; r0+br <= rows; r0 += br {
		c0 := 0
		for ; c0+bc <= cols; c0 += bc {
			var t [br][bc]float32
			for i := range br {
				t[i] = [bc]float32(src[(r0+i)*cols+c0:][:bc])
			}
			for j := range bc {
				d := (*[br]float32)(dst[(c0+j)*rows+r0:][:br])
				if add {
					for i := range br {
						d[i] += t[i][j]
					}
				} else {
					for i := range br {
						d[i] = t[i][j]
					}
				}
			}
		}
		for r := r0; r < r0+br; r++ {
			for c := c0; c < cols; c++ {
				put(dst, c*rows+r, src[r*cols+c], add)
			}
		}
	}
	for r := r0; r < rows; r++ {
		for c := range cols {
			put(dst, c*rows+r, src[r*cols+c], add)
		}
	}
}

func put(dst []float32, i int, v float32, add bool) {
	if add {
		dst[i] += v
	} else {
		dst[i] = v
	}
}

func grow[F float](b []F, n int) []F {
	if cap(b) < n {
		return make([]F, n)
	}
	return b[:n]
}

// mul computes y[t][r] = Σ_k W[r][k]·x[t][k] for t < n: the engine's projection. float32 runs
// the engine's packed kernel (bit-identical to the servers' forward); float64 a plain loop.
func mul[F float](pool *kernels.Pool, m *mat[F], y, x []F, n int) {
	if n == 0 {
		return
	}
	if m32, ok := any(m).(*mat[float32]); ok {
		if !m32.fwdOK {
			m32.fwd = mustPack(m32.fwd, m.rows, m.cols, m32.parts...)
			m32.fwdOK = true
		}
		m32.fwd.MatMul(pool, any(y).([]float32), any(x).([]float32), n)
		return
	}
	for r := range m.rows {
		w := m.row(r)
		for t := range n {
			xt := x[t*m.cols : (t+1)*m.cols]
			var s F
			for k, v := range w {
				s += v * xt[k]
			}
			y[t*m.rows+r] = s
		}
	}
}

// mulT computes dx[t][k] = Σ_r dy[t][r]·W[r][k] for t < n (the gradient of mul's input).
func mulT[F float](pool *kernels.Pool, m *mat[F], dx, dy []F, n int) {
	if n == 0 {
		return
	}
	if m32, ok := any(m).(*mat[float32]); ok {
		if !m32.bwdOK {
			p, err := kernels.PackTransposed(m32.bwd, m.cols, m.rows, m32.parts...)
			if err != nil {
				panic(fmt.Sprintf("trainer: packing a %dx%d transpose: %v", m.cols, m.rows, err)) // shapes are checked up front
			}
			m32.bwd, m32.bwdOK = p, true
		}
		m32.bwd.MatMul(pool, any(dx).([]float32), any(dy).([]float32), n)
		return
	}
	clear(dx[:n*m.cols])
	for r := range m.rows {
		w := m.row(r)
		for t := range n {
			g := dy[t*m.rows+r]
			if g == 0 {
				continue
			}
			dt := dx[t*m.cols : (t+1)*m.cols]
			for k, v := range w {
				dt[k] += g * v
			}
		}
	}
}

// addGrad adds dW[r][k] += Σ_t dy[t][r]·x[t][k] into g, the gradient of m laid out like W
// (row-major [rows][cols], stacked parts contiguous); with overwrite it stores the product
// instead (g's first product of a step). float32 runs it as one packed kernel matmul: Xᵀ
// [cols][n] is the "weight", dyᵀ [rows][n] the batch, which yields dW row-major.
func addGrad[F float](pool *kernels.Pool, m *mat[F], g, dy, x []F, n int, overwrite bool) {
	if n == 0 {
		return
	}
	if m32, ok := any(m).(*mat[float32]); ok {
		x32, dy32, g32 := any(x).([]float32), any(dy).([]float32), any(g).([]float32)
		if m.rows > m.cols {
			m32.addGradTransposed(pool, g32, dy32, x32, n, overwrite)
			return
		}
		gx, err := kernels.PackTransposed(m32.gx, m.cols, n, x32[:n*m.cols])
		if err != nil {
			panic(fmt.Sprintf("trainer: packing a %dx%d transpose: %v", m.cols, n, err))
		}
		m32.gx = gx
		m32.dyT = grow(m32.dyT, m.rows*n)
		transpose(m32.dyT, dy32[:n*m.rows], n, m.rows)
		if overwrite {
			gx.MatMul(pool, g32, m32.dyT, m.rows)
			return
		}
		m32.gdst = grow(m32.gdst, m.rows*m.cols)
		gx.MatMul(pool, m32.gdst, m32.dyT, m.rows)
		kernels.ClearUpper()
		for i, v := range m32.gdst {
			g32[i] += v
		}
		return
	}
	if overwrite {
		clear(g[:m.rows*m.cols])
	}
	for r := range m.rows {
		gr := g[r*m.cols : (r+1)*m.cols]
		for t := range n {
			d := dy[t*m.rows+r]
			if d == 0 {
				continue
			}
			xt := x[t*m.cols : (t+1)*m.cols]
			for k, v := range xt {
				gr[k] += d * v
			}
		}
	}
}

// addGradTransposed is addGrad for a matrix taller than wide (QKV, gate-up, and above all the
// LM head with its vocabulary of rows): it computes dWᵀ = Xᵀ·dy, with dyᵀ packed as the weight
// straight from dy (PackTransposed) and only the narrower X transposed, instead of
// transposing dy [n][rows] (for the LM head that transpose cost as much as the product). The
// result accumulates in gT until grads.flush adds it, transposed once per step, to g.
func (m *mat[F]) addGradTransposed(pool *kernels.Pool, g, dy, x []float32, n int, overwrite bool) {
	gy, err := kernels.PackTransposed(m.gy, m.rows, n, dy[:n*m.rows])
	if err != nil {
		panic(fmt.Sprintf("trainer: packing a %dx%d transpose: %v", m.rows, n, err))
	}
	m.gy = gy
	m.xT = grow(m.xT, m.cols*n)
	transpose(m.xT, x[:n*m.cols], n, m.cols)
	if overwrite || !m.gTPending {
		m.gT = grow(m.gT, m.rows*m.cols)
		gy.MatMul(pool, m.gT, m.xT, m.cols)
		if overwrite {
			clear(g[:m.rows*m.cols])
		}
		m.gTPending, m.gTarget = true, g
		return
	}
	m.gdst = grow(m.gdst, m.rows*m.cols)
	gy.MatMul(pool, m.gdst, m.xT, m.cols)
	kernels.ClearUpper()
	for i, v := range m.gdst {
		m.gT[i] += v
	}
}

// flushTransposed adds a pending transposed gradient to its target.
func (m *mat[F]) flushTransposed() {
	if m.gTPending {
		transposeAdd(m.gTarget, m.gT, m.cols, m.rows)
		m.gTPending = false
	}
}

// dotRows writes out[s] = scale·(q · rows[s*stride+off:][:len(q)]) for s < n: the engine's
// attention-score kernel in float32.
func dotRows[F float](out, q, rows []F, stride, off, n int, scale F) {
	if q32, ok := any(q).([]float32); ok {
		kernels.AttnScores(any(out).([]float32), q32, any(rows).([]float32), stride, off, n, float32(scale))
		return
	}
	for s := range n {
		r := rows[s*stride+off : s*stride+off+len(q)]
		var d F
		for i, v := range q {
			d += v * r[i]
		}
		out[s] = d * scale
	}
}

// accumRows adds Σ_s p[s]·rows[s*stride+off:][:len(out)] into out: the engine's attention
// value kernel in float32.
func accumRows[F float](out, p, rows []F, stride, off, n int) {
	if o32, ok := any(out).([]float32); ok {
		kernels.AttnAccum(o32, any(p).([]float32), any(rows).([]float32), stride, off, n)
		kernels.ClearUpper()
		return
	}
	for s := range n {
		ps := p[s]
		r := rows[s*stride+off : s*stride+off+len(out)]
		for i := range out {
			out[i] += ps * r[i]
		}
	}
}

// expShifted writes dst[i] = exp(x[i]-shift) and returns the float64 sum, with the engine's
// vector exponential in float32.
func expShifted[F float](dst, x []F, shift F) float64 {
	if x32, ok := any(x).([]float32); ok {
		s := kernels.ExpShifted(any(dst).([]float32), x32, float32(shift))
		kernels.ClearUpper()
		return s
	}
	sum := 0.0
	for i, v := range x {
		e := math.Exp(float64(v - shift))
		dst[i] = F(e)
		sum += float64(F(e))
	}
	return sum
}

// maxOf is the largest element (the engine's MaxF32 in float32).
func maxOf[F float](x []F) F {
	if x32, ok := any(x).([]float32); ok {
		return F(kernels.MaxF32(x32))
	}
	m := F(math.Inf(-1))
	for _, v := range x {
		m = max(m, v)
	}
	return m
}

// logSumExpShifted returns log Σ exp(x[i]-shift) as the engine's sampler computes it for raw
// logprobs.
func logSumExpShifted[F float](x []F, shift F) float64 {
	if x32, ok := any(x).([]float32); ok {
		s := math.Log(kernels.SumExpShifted(x32, float32(shift)))
		kernels.ClearUpper()
		return s
	}
	sum := 0.0
	for _, v := range x {
		sum += math.Exp(float64(v - shift))
	}
	return math.Log(sum)
}
