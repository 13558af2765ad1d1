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

	fwd, bwd       *kernels.Matrix
	fwdOK, bwdOK   bool
	tbuf           []float32 // Wᵀ, row-major, before packing
	gx             *kernels.Matrix
	xT, dyT, gdst  []float32
	gxRows, gxCols int
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

// transpose writes src [rows][cols] transposed into dst [cols][rows], in tiles so that both
// sides stay in cache.
func transpose[F float](dst, src []F, rows, cols int) { transposeInto(dst, rows, 0, src, rows, cols) }

// transposeInto writes src [rows][cols] transposed into columns off..off+rows of dst, a
// row-major matrix with rows of stride values.
func transposeInto[F float](dst []F, stride, off int, src []F, rows, cols int) {
	const b = 32
	for r0 := 0; r0 < rows; r0 += b {
		r1 := min(r0+b, rows)
		for c0 := 0; c0 < cols; c0 += b {
			c1 := min(c0+b, cols)
			for r := r0; r < r1; r++ {
				s := src[r*cols : r*cols+cols]
				for c := c0; c < c1; c++ {
					dst[c*stride+off+r] = s[c]
				}
			}
		}
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
			m32.tbuf = grow(m32.tbuf, m.rows*m.cols)
			off := 0
			for _, p := range m32.parts {
				pr := len(p) / m.cols
				// Part by part: the rows of part p are columns off..off+pr of Wᵀ.
				transposeInto(m32.tbuf, m.rows, off, p, pr, m.cols)
				off += pr
			}
			m32.bwd = mustPack(m32.bwd, m.cols, m.rows, m32.tbuf)
			m32.bwdOK = true
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

// addGrad adds dW[r][k] += Σ_t dy[t][r]·x[t][k] into the gradient parts g (stacked like m's).
// float32 runs it as one packed kernel matmul: Xᵀ [cols][n] is the "weight", dyᵀ [rows][n] the
// batch of rows, which yields dW row-major.
func addGrad[F float](pool *kernels.Pool, m *mat[F], g [][]F, dy, x []F, n int) {
	if n == 0 {
		return
	}
	if m32, ok := any(m).(*mat[float32]); ok {
		x32, dy32 := any(x).([]float32), any(dy).([]float32)
		m32.xT = grow(m32.xT, m.cols*n)
		transpose(m32.xT, x32[:n*m.cols], n, m.cols)
		if m32.gx == nil || m32.gxRows != m.cols || m32.gxCols != n {
			m32.gx, m32.gxRows, m32.gxCols = nil, m.cols, n
		}
		m32.gx = mustPack(m32.gx, m.cols, n, m32.xT)
		m32.dyT = grow(m32.dyT, m.rows*n)
		transpose(m32.dyT, dy32[:n*m.rows], n, m.rows)
		m32.gdst = grow(m32.gdst, m.rows*m.cols)
		m32.gx.MatMul(pool, m32.gdst, m32.dyT, m.rows)
		kernels.ClearUpper()
		off := 0
		for _, p := range any(g).([][]float32) {
			src := m32.gdst[off : off+len(p)]
			for i, v := range src {
				p[i] += v
			}
			off += len(p)
		}
		return
	}
	r := 0
	for _, p := range g {
		for pr := 0; pr < len(p)/m.cols; pr, r = pr+1, r+1 {
			gr := p[pr*m.cols : (pr+1)*m.cols]
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
