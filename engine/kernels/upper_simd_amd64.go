//go:build goexperiment.simd && amd64 && !purego

package kernels

import "simd/archsimd"

// ClearUpper clears the upper halves of the AVX registers (VZEROUPPER). Scalar float code is
// legacy SSE; after the runtime preempts a goroutine its AVX state can stay dirty, and every
// SSE instruction then pays a transition penalty (measured 35-80x slower loops). Long scalar
// loops call it once per row.
func ClearUpper() { archsimd.ClearAVXUpperBits() }
