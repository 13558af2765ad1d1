package kernels

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// impl is one MatMul kernel, run over panels [lo,hi).
type impl struct {
	name string
	run  func(m *Matrix, y, x []float32, n, lo, hi int)
}

// allImpls is the portable kernel followed by every SIMD kernel the CPU supports.
func allImpls() []impl { return append([]impl{{"generic", matmulGeneric}}, simdImpls()...) }

// matMulWith is MatMul through a chosen kernel.
func matMulWith(k impl, pool *Pool, m *Matrix, y, x []float32, n int) {
	panels := m.Panels()
	pool.ParallelChunks(panels, matmulChunk(panels, pool.Workers()), func(lo, hi int) { k.run(m, y, x, n, lo, hi) })
}
