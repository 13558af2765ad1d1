//go:build amd64 && !purego

package kernels

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

//go:generate go run gen_w8a8.go

//go:noescape
func w8a8T1(w unsafe.Pointer, nb int, x unsafe.Pointer, xs int, s unsafe.Pointer, ss int, y unsafe.Pointer, ys int)

//go:noescape
func w8a8T2(w unsafe.Pointer, nb int, x unsafe.Pointer, xs int, s unsafe.Pointer, ss int, y unsafe.Pointer, ys int)

//go:noescape
func w8a8T3(w unsafe.Pointer, nb int, x unsafe.Pointer, xs int, s unsafe.Pointer, ss int, y unsafe.Pointer, ys int)

//go:noescape
func w8a8T4(w unsafe.Pointer, nb int, x unsafe.Pointer, xs int, s unsafe.Pointer, ss int, y unsafe.Pointer, ys int)

// w8a8AVX2 are the AVX2 tiles (w8a8_avx2_amd64.s). Per block, for each group of 4 columns
// and each 8-row half, they take the 32 bytes of 8 rows × 4 weights: VPABSB gives |w|,
// VPSIGNB gives the input's 4 values (broadcast) with w's signs, VPMADDUBSW multiplies the
// two (u8 × s8) and adds pairs, VPMADDWD with ones adds those pairs into one int32 per row,
// VPADDD into the block's sums; at the block's end VCVTDQ2PS, VMULPS of the rows' scales by
// the token's, and VFMADD231PS into the row's accumulator. For a lone token two panels at a
// time, which streamed 25-28 GB/s of weights on the 2-core EPYC where one panel at a time
// streamed 18-24 (with or without software prefetch).
var w8a8AVX2 = w8a8Tiles{one: [w8a8MaxT + 1]w8a8Tile{1: w8a8T1, 2: w8a8T2, 3: w8a8T3, 4: w8a8T4}, two: [w8a8MaxT + 1]w8a8Tile{1: w8a8P2T1}}

// w8a8VNNI are the AVX-512 VNNI tiles (w8a8_vnni_amd64.s) this CPU runs: VPDPBUSD does a
// group of 4 columns of a whole panel for one token in one instruction, where the AVX2 tiles
// take eight. Two panels at a time share each token's broadcast input. The first two-panel
// tile of a token block, the one that streams the pair from memory, prefetches two blocks
// ahead (gen_w8a8.go's vnniPrefetch) where that helps (batch1Prefetches).
var w8a8VNNI = vnniTiles(prefetchBatch1)

// vnniTiles is the VNNI tile set, with the prefetching two-panel tiles or the plain ones.
func vnniTiles(prefetch bool) w8a8Tiles {
	k := w8a8Tiles{
		one: [w8a8MaxT + 1]w8a8Tile{1: w8a8VP1T1, 2: w8a8VP1T2, 3: w8a8VP1T3, 4: w8a8VP1T4},
		two: [w8a8MaxT + 1]w8a8Tile{1: w8a8VP2T1, 2: w8a8VP2T2, 3: w8a8VP2T3, 4: w8a8VP2T4},
	}
	if prefetch {
		k.first = [w8a8MaxT + 1]w8a8Tile{1: w8a8VP2T1PF, 2: w8a8VP2T2PF, 3: w8a8VP2T3PF, 4: w8a8VP2T4PF}
	}
	return k
}

// w8a8UseVNNI selects the VNNI tiles: AVX-512 with VNNI (Ice Lake and later Xeons, Zen 4),
// in both amd64 builds.
var w8a8UseVNNI = w8a8UseAVX2 && cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512VNNI

// matmulW8A8Panels runs panels [lo,hi) of a W8A8 MatMul: the AMX tile with the VNNI tiles
// where the CPU has both, else the VNNI tiles where it has them, else the AVX2 tiles where it
// has AVX2 and FMA, else the Go kernel.
func matmulW8A8Panels(m *Matrix, a *w8a8Acts, y []float32, n, lo, hi int) {
	switch {
	case w8a8UseAMX:
		runW8A8AMX(&w8a8VNNI, w8a8AMXMin, m, a, y, n, lo, hi)
	case w8a8UseVNNI:
		w8a8VNNI.run(m, a, y, n, lo, hi)
	case w8a8UseAVX2:
		w8a8AVX2.run(m, a, y, n, lo, hi)
	default:
		matmulW8A8Generic(m, a, y, n, lo, hi)
	}
}

// W8A8KernelName names the w8a8 precision's kernel on this CPU: "amx+vnni", "vnni", "avx2"
// or "generic".
func W8A8KernelName() string {
	switch {
	case w8a8UseAMX:
		return "amx+vnni"
	case w8a8UseVNNI:
		return "vnni"
	case w8a8UseAVX2:
		return "avx2"
	}
	return "generic"
}

// quantizeWholeBlock is quantizeActBlock of a whole block: in assembly where the AVX2 tiles
// run, bit for bit the same. For the 8192 inputs of the 1B shape's FFN down-projection the Go
// loop (a float64 division and a rounding call per value) took 31-34 µs and the assembly
// takes 4.6-5.1, beside about 570 µs for the batch-1 MatMul they feed (2-core EPYC).
func quantizeWholeBlock(q *[Int8Block]int8, x *[Int8Block]float32) float32 {
	if w8a8UseAVX2 {
		return quantBlockAVX2(q, x)
	}
	return quantizeActBlock(q[:], x[:])
}

// quantBlockAVX2 is quantizeActBlock of one whole block (w8a8_quant_amd64.s).
//
//go:noescape
func quantBlockAVX2(q *[Int8Block]int8, x *[Int8Block]float32) float32

// w8a8P2T1 is w8a8T1 over two consecutive whole panels (the second one nb blocks after the
// first, its outputs 16 after the first's): the batch-1 tile.
//
//go:noescape
func w8a8P2T1(w unsafe.Pointer, nb int, x unsafe.Pointer, xs int, s unsafe.Pointer, ss int, y unsafe.Pointer, ys int)

// The VNNI tiles: w8a8VP<P>T<T> is P consecutive whole panels × T tokens, with the
// arguments of w8a8Tile (gen_w8a8.go's vnniTile); none prefetches but those ending in PF.

//go:noescape
func w8a8VP1T1(w unsafe.Pointer, nb int, x unsafe.Pointer, xs int, s unsafe.Pointer, ss int, y unsafe.Pointer, ys int)

//go:noescape
func w8a8VP1T2(w unsafe.Pointer, nb int, x unsafe.Pointer, xs int, s unsafe.Pointer, ss int, y unsafe.Pointer, ys int)

//go:noescape
func w8a8VP1T3(w unsafe.Pointer, nb int, x unsafe.Pointer, xs int, s unsafe.Pointer, ss int, y unsafe.Pointer, ys int)

//go:noescape
func w8a8VP1T4(w unsafe.Pointer, nb int, x unsafe.Pointer, xs int, s unsafe.Pointer, ss int, y unsafe.Pointer, ys int)

//go:noescape
func w8a8VP2T1(w unsafe.Pointer, nb int, x unsafe.Pointer, xs int, s unsafe.Pointer, ss int, y unsafe.Pointer, ys int)

// w8a8VP2T1PF is w8a8VP2T1 prefetching two blocks ahead (see batch1Prefetches).
//
//go:noescape
func w8a8VP2T1PF(w unsafe.Pointer, nb int, x unsafe.Pointer, xs int, s unsafe.Pointer, ss int, y unsafe.Pointer, ys int)

//go:noescape
func w8a8VP2T2(w unsafe.Pointer, nb int, x unsafe.Pointer, xs int, s unsafe.Pointer, ss int, y unsafe.Pointer, ys int)

//go:noescape
func w8a8VP2T3(w unsafe.Pointer, nb int, x unsafe.Pointer, xs int, s unsafe.Pointer, ss int, y unsafe.Pointer, ys int)

//go:noescape
func w8a8VP2T4(w unsafe.Pointer, nb int, x unsafe.Pointer, xs int, s unsafe.Pointer, ss int, y unsafe.Pointer, ys int)

// w8a8VP2T2PF, w8a8VP2T3PF and w8a8VP2T4PF are w8a8VP2T2 to w8a8VP2T4 prefetching two blocks
// ahead, as w8a8VP2T1PF, for the first tile of a batch over each panel pair (w8a8Tiles.first).
// A batch of a few tokens reads each panel pair from memory once, as batch 1 does: on a Zen 5
// EPYC, 4 tokens streamed 17-31 GB/s of weights without the prefetch and 31-38 with it
// (BenchmarkW8A8Kernels, the 1B shape's matrices). The later tiles over the pair read it from
// cache: with the prefetch in every tile, 64 sequences decoded at 0.86-1.07 of the plain
// tiles' rate in five alternations (median 0.92), within the host's noise but not worth the risk.

//go:noescape
func w8a8VP2T2PF(w unsafe.Pointer, nb int, x unsafe.Pointer, xs int, s unsafe.Pointer, ss int, y unsafe.Pointer, ys int)

//go:noescape
func w8a8VP2T3PF(w unsafe.Pointer, nb int, x unsafe.Pointer, xs int, s unsafe.Pointer, ss int, y unsafe.Pointer, ys int)

//go:noescape
func w8a8VP2T4PF(w unsafe.Pointer, nb int, x unsafe.Pointer, xs int, s unsafe.Pointer, ss int, y unsafe.Pointer, ys int)
