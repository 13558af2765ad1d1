//go:build amd64 && !purego

package kernels

// The bf16 and int8 tiles (kernels_low_*_amd64.s) read the stored weights and widen them in
// registers; the AVX-512 main tiles have a prefetching variant, as the float32 one has. They
// are Go assembly in both amd64 builds: the archsimd build has no vector widening of its own.
var (
	avx512BF16Kernel = simdKernel{name: "avx512", tiles: batch1Table(&a512bf16Tiles, a512bf16P4T1Plain, prefetchBatch1), t1: 7, shape: avx512LowShape, pf: a512bf16P4T6PF, pfP: 4, pfT: 6,
		kc: avx512BF16KC, acc: &a512bf16TilesAcc, pfAcc: a512bf16P4T6PFAcc}
	avx512Int8Kernel = simdKernel{name: "avx512", tiles: batch1Table(&a512i8Tiles, a512i8P4T1Plain, prefetchBatch1), t1: 7, shape: avx512LowShape, pf: a512i8P4T6PF, pfP: 4, pfT: 6}
	avx2BF16Kernel   = simdKernel{name: "avx2", tiles: &a256bf16Tiles, t1: 5, shape: avx2BF16Shape}
	avx2Int8Kernel   = simdKernel{name: "avx2", tiles: &a256i8Tiles, t1: 6, shape: avx2Shape}
)

// avx512BF16KC is the AVX-512 bf16 main tile's column block: 4 panels × 256 columns are 32 KB,
// as the float32 block. On a 2-vCPU AVX-512 Xeon, 64 tokens through the 2048×8192 matrix went
// from 207-233 GFLOP/s without column blocks to 263-282 (128 columns: 257-264; 512: 267-281).
// int8 has none: its tile is bound by the three widening instructions per 16 weights, and
// column blocks of 128 to 512 made both FFN shapes 1-6% slower.
const avx512BF16KC = 256

// avx512LowShape is the AVX-512 bf16 and int8 main tile for n tokens: 4 panels × up to 6
// tokens, the assembly float32 tile's shape (24 accumulators, 4 weight, 2 broadcast and the
// bf16 mask registers of 32).
func avx512LowShape(n int) (p, t int) { return 4, min(n, 6) }

// avx2BF16Shape is avx2Shape with the widest tile 1×5: the bf16 tiles hold a mask register.
func avx2BF16Shape(n int) (p, t int) {
	if n <= 2 {
		return avx2Shape(n)
	}
	return 1, min(n, 5)
}

// lowKernel is the kernel for a bf16 or int8 matrix on a CPU with (or without) AVX-512 and
// AVX2+FMA, nil for the portable one.
func lowKernel(prec Precision, avx512, avx2 bool) *simdKernel {
	switch {
	case avx512 && prec == BF16:
		return &avx512BF16Kernel
	case avx512 && prec == Int8:
		return &avx512Int8Kernel
	case avx2 && prec == BF16:
		return &avx2BF16Kernel
	case avx2 && prec == Int8:
		return &avx2Int8Kernel
	}
	return nil
}
