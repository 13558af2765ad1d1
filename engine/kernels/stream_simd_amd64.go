//go:build goexperiment.simd && amd64 && !purego

package kernels

import (
	"simd/archsimd"
	"unsafe"
)

func streamRead(buf []uint64) uint64 {
	if len(buf) < streamBlock/8 {
		return streamReadGeneric(buf)
	}
	var out [16]uint32
	p, blocks := unsafe.Pointer(unsafe.SliceData(buf)), len(buf)*8/streamBlock
	switch {
	case archsimd.X86.AVX512():
		streamRead512(p, blocks, &out)
	case archsimd.X86.AVX2():
		streamRead256(p, blocks, &out)
	default:
		return streamReadGeneric(buf)
	}
	var s uint64
	for _, v := range out {
		s += uint64(v)
	}
	return s
}

// streamRead512 sums blocks×512 bytes at p as uint32 lanes (integer adds: float adds of
// arbitrary bits could hit denormal assists) into out, eight independent vectors per step.
func streamRead512(p unsafe.Pointer, blocks int, out *[16]uint32) {
	var a0, a1, a2, a3, a4, a5, a6, a7 archsimd.Uint32x16
	ld := func(q unsafe.Pointer, off int) archsimd.Uint32x16 {
		return archsimd.LoadUint32x16((*[16]uint32)(unsafe.Add(q, off)))
	}
	for i := 1; i < blocks; i++ {
		a0 = a0.Add(ld(p, 0))
		a1 = a1.Add(ld(p, 64))
		a2 = a2.Add(ld(p, 128))
		a3 = a3.Add(ld(p, 192))
		a4 = a4.Add(ld(p, 256))
		a5 = a5.Add(ld(p, 320))
		a6 = a6.Add(ld(p, 384))
		a7 = a7.Add(ld(p, 448))
		p = unsafe.Add(p, streamBlock)
	}
	// The last block is peeled so p never points past the end of buf.
	a0 = a0.Add(ld(p, 0)).Add(ld(p, 64))
	a2 = a2.Add(ld(p, 128)).Add(ld(p, 192))
	a4 = a4.Add(ld(p, 256)).Add(ld(p, 320))
	a6 = a6.Add(ld(p, 384)).Add(ld(p, 448))
	a0.Add(a1).Add(a2.Add(a3)).Add(a4.Add(a5).Add(a6.Add(a7))).Store(out)
	archsimd.ClearAVXUpperBits()
}

// streamRead256 is streamRead512 with AVX2 vectors, 256 bytes per step: the compiler hoists
// a step's loads, so eight loads and four accumulators is what fits in registers.
func streamRead256(p unsafe.Pointer, blocks int, out *[16]uint32) {
	var a0, a1, a2, a3 archsimd.Uint32x8
	ld := func(q unsafe.Pointer, off int) archsimd.Uint32x8 {
		return archsimd.LoadUint32x8((*[8]uint32)(unsafe.Add(q, off)))
	}
	for i := 1; i < 2*blocks; i++ {
		a0 = a0.Add(ld(p, 0)).Add(ld(p, 128))
		a1 = a1.Add(ld(p, 32)).Add(ld(p, 160))
		a2 = a2.Add(ld(p, 64)).Add(ld(p, 192))
		a3 = a3.Add(ld(p, 96)).Add(ld(p, 224))
		p = unsafe.Add(p, streamBlock/2)
	}
	// The last step is peeled so p never points past the end of buf.
	a0 = a0.Add(ld(p, 0)).Add(ld(p, 128))
	a1 = a1.Add(ld(p, 32)).Add(ld(p, 160))
	a2 = a2.Add(ld(p, 64)).Add(ld(p, 192))
	a3 = a3.Add(ld(p, 96)).Add(ld(p, 224))
	a0.Add(a1).Add(a2.Add(a3)).Store((*[8]uint32)(unsafe.Pointer(&out[0])))
	archsimd.ClearAVXUpperBits()
}
