//go:build amd64

package offload

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// copyCRC32C3 is in copysum_amd64.s.
//
//go:noescape
func copyCRC32C3(dst, src unsafe.Pointer, n, third int) (a, b, c uint32)

// copySum3 copies src into dst (dst at least as long) and returns the three part checksums of
// src's block checksum (see checksumUpdate), in one pass: fused in assembly where SSE4.2 has
// the CRC32 instruction (every x86-64 of the last fifteen years).
func copySum3(dst, src []float32) (a, b, c uint32) {
	if len(src) == 0 || !cpu.X86.HasSSE42 {
		copy(dst, src)
		return sum3(src)
	}
	_ = dst[len(src)-1] // dst must hold src
	n := 4 * len(src)
	return copyCRC32C3(unsafe.Pointer(unsafe.SliceData(dst)), unsafe.Pointer(unsafe.SliceData(src)), n, sumThird(n))
}
