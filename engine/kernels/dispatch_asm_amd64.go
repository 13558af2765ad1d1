//go:build amd64 && !goexperiment.simd && !purego

package kernels

// This build forwards to the portable kernels until the amd64 assembly kernels land.

// KernelName names the MatMul implementation this process uses.
func KernelName() string { return "generic" }

func matmulPanels(m *Matrix, y, x []float32, n, lo, hi int) { matmulGeneric(m, y, x, n, lo, hi) }

func streamRead(buf []uint64) uint64 { return streamReadGeneric(buf) }
