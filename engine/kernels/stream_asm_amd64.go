//go:build amd64 && !goexperiment.simd && !purego

package kernels

import "unsafe"

// streamRead folds buf into a checksum with the widest vector loads the CPU has: the same load
// widths as the MatMul tiles, so StreamReadBandwidth is the ceiling a memory-bound decode can
// reach in this build.
func streamRead(buf []uint64) uint64 {
	if len(buf) < streamBlock/8 || !hasAVX2FMA {
		return streamReadGeneric(buf)
	}
	var out [16]uint32
	p, blocks := unsafe.Pointer(unsafe.SliceData(buf)), len(buf)*8/streamBlock
	if hasAVX512 {
		streamRead512(p, blocks, &out)
	} else {
		streamRead256(p, blocks, &out)
	}
	var s uint64
	for _, v := range out {
		s += uint64(v)
	}
	return s
}

// streamRead512 sums blocks×512 bytes at p as uint32 lanes into out (AVX-512).
//
//go:noescape
func streamRead512(p unsafe.Pointer, blocks int, out *[16]uint32)

// streamRead256 sums blocks×512 bytes at p as uint32 lanes into out[0:8] (AVX2).
//
//go:noescape
func streamRead256(p unsafe.Pointer, blocks int, out *[16]uint32)
