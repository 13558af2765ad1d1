//go:build amd64 && !goexperiment.simd && !purego

package kernels

// ClearUpper clears the upper halves of the AVX registers (VZEROUPPER). Scalar float code is
// legacy SSE; after the runtime preempts a goroutine its AVX state can stay dirty, and every
// SSE instruction then pays a transition penalty (measured 35-80x slower loops). Long scalar
// loops call it once per row. It does nothing on a CPU without AVX2+FMA, whose kernels are the
// portable ones.
func ClearUpper() {
	if hasAVX2FMA {
		clearUpperAsm()
	}
}
