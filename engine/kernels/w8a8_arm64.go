//go:build arm64 && !purego

package kernels

import "golang.org/x/sys/cpu"

// w8a8UseSDOT selects the SDOT tiles (w8a8_sdot_arm64.s, written by gen_neon.go): the
// dot-product extension is optional before ARMv8.4 (Apple M1 and later, Graviton 2 and later,
// Neoverse and Cortex-A76 onwards have it; Cortex-A72 does not), so it is detected.
var w8a8UseSDOT = cpu.ARM64.HasASIMDDP

// w8a8UseAMX is false: the AMX tile is amd64 assembly.
const w8a8UseAMX = false

// matmulW8A8Panels runs panels [lo,hi) of a W8A8 MatMul: the SDOT tiles where the CPU has
// them, else the Go kernel.
func matmulW8A8Panels(m *Matrix, a *w8a8Acts, y []float32, n, lo, hi int) {
	if w8a8UseSDOT {
		w8a8SDOT.run(m, a, y, n, lo, hi)
		return
	}
	matmulW8A8Generic(m, a, y, n, lo, hi)
}

// W8A8KernelName names the w8a8 precision's kernel on this CPU: "sdot" or "generic".
func W8A8KernelName() string {
	if w8a8UseSDOT {
		return "sdot"
	}
	return "generic"
}

// quantizeWholeBlock is quantizeActBlock of a whole block, in NEON (every arm64 CPU has it)
// with the Go code's operations, bit for bit the same, for the reason the amd64 build's is in
// assembly.
func quantizeWholeBlock(q *[Int8Block]int8, x *[Int8Block]float32) float32 {
	return quantBlockNEON(q, x)
}

// quantBlockNEON is quantizeActBlock of one whole block (vec_neon_arm64.s, written by
// gen_neon.go).
//
//go:noescape
func quantBlockNEON(q *[Int8Block]int8, x *[Int8Block]float32) float32
