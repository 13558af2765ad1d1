//go:build purego || !(amd64 || arm64)

package kernels

// w8a8UseAMX is false: the AMX tile is amd64 assembly.
const w8a8UseAMX = false

// matmulW8A8Panels runs panels [lo,hi) of a W8A8 MatMul with the Go kernel: this build has no
// integer dot-product tiles.
func matmulW8A8Panels(m *Matrix, a *w8a8Acts, y []float32, n, lo, hi int) {
	matmulW8A8Generic(m, a, y, n, lo, hi)
}

// W8A8KernelName names the w8a8 precision's kernel: always "generic" in this build.
func W8A8KernelName() string { return "generic" }

// quantizeWholeBlock is quantizeActBlock of a whole block.
func quantizeWholeBlock(q *[Int8Block]int8, x *[Int8Block]float32) float32 {
	return quantizeActBlock(q[:], x[:])
}
