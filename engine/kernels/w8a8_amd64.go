//go:build amd64 && !purego

package kernels

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

//go:generate go run gen_w8a8.go

// w8a8Tile computes one whole panel (16 rows) × T tokens of a W8A8 MatMul over nb blocks:
// w is the panel, x the first token's quantized input (xs bytes between tokens), s its block
// scales (ss bytes between tokens), y the first token's first output (ys bytes between
// tokens). The AVX2 tiles take per block, for each group of 4 columns and each 8-row half, the 32 bytes
// of 8 rows × 4 weights: VPABSB gives |w|, VPSIGNB gives the input's 4 values (broadcast)
// with w's signs, VPMADDUBSW multiplies the two (u8 × s8) and adds pairs, VPMADDWD with ones
// adds those pairs into one int32 per row, VPADDD into the block's sums; at the block's end
// VCVTDQ2PS (exact: |sum| ≤ 32·127·127 < 2^24), VMULPS of the rows' scales by the token's,
// and VFMADD231PS into the row's float32 accumulator: W8A8's definition, bit for bit.
type w8a8Tile func(w unsafe.Pointer, nb int, x unsafe.Pointer, xs int, s unsafe.Pointer, ss int, y unsafe.Pointer, ys int)

//go:noescape
func w8a8T1(w unsafe.Pointer, nb int, x unsafe.Pointer, xs int, s unsafe.Pointer, ss int, y unsafe.Pointer, ys int)

//go:noescape
func w8a8T2(w unsafe.Pointer, nb int, x unsafe.Pointer, xs int, s unsafe.Pointer, ss int, y unsafe.Pointer, ys int)

//go:noescape
func w8a8T3(w unsafe.Pointer, nb int, x unsafe.Pointer, xs int, s unsafe.Pointer, ss int, y unsafe.Pointer, ys int)

//go:noescape
func w8a8T4(w unsafe.Pointer, nb int, x unsafe.Pointer, xs int, s unsafe.Pointer, ss int, y unsafe.Pointer, ys int)

// w8a8MaxT is the widest tile: 4 tokens' integer sums of both halves (8 registers), the
// weights, their absolute values, a product and the 4 broadcast inputs use 15 YMM registers
// and the int16 ones the 16th; from 3 tokens the float32 accumulators live in y.
const w8a8MaxT = 4

// w8a8Tiles is one instruction set's W8A8 tiles: one[T] computes one panel × T tokens,
// two[T] (where not nil) two consecutive whole panels × T tokens.
type w8a8Tiles struct {
	one, two [w8a8MaxT + 1]w8a8Tile
}

// w8a8AVX2 are the AVX2 tiles (w8a8_avx2_amd64.s); for a lone token two panels at a time,
// which streamed 25-28 GB/s of weights on the 2-core EPYC where one panel at a time
// streamed 18-24 (with or without software prefetch).
var w8a8AVX2 = w8a8Tiles{one: [w8a8MaxT + 1]w8a8Tile{1: w8a8T1, 2: w8a8T2, 3: w8a8T3, 4: w8a8T4}, two: [w8a8MaxT + 1]w8a8Tile{1: w8a8P2T1}}

// w8a8VNNI are the AVX-512 VNNI tiles (w8a8_vnni_amd64.s): VPDPBUSD does a group of 4
// columns of a whole panel for one token in one instruction, where the AVX2 tiles take
// eight. Two panels at a time share each token's broadcast input; the one-token tile
// prefetches two blocks ahead (gen_w8a8.go's vnniPrefetch).
var w8a8VNNI = w8a8Tiles{
	one: [w8a8MaxT + 1]w8a8Tile{1: w8a8VP1T1, 2: w8a8VP1T2, 3: w8a8VP1T3, 4: w8a8VP1T4},
	two: [w8a8MaxT + 1]w8a8Tile{1: w8a8VP2T1, 2: w8a8VP2T2, 3: w8a8VP2T3, 4: w8a8VP2T4},
}

// w8a8UseVNNI selects the VNNI tiles: AVX-512 with VNNI (Ice Lake and later Xeons, Zen 4),
// in both amd64 builds.
var w8a8UseVNNI = w8a8UseAVX2 && cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512VNNI

// matmulW8A8Panels runs panels [lo,hi) of a W8A8 MatMul: the VNNI tiles where the CPU has
// them, else the AVX2 tiles where it has AVX2 and FMA, else the Go kernel.
func matmulW8A8Panels(m *Matrix, a *w8a8Acts, y []float32, n, lo, hi int) {
	switch {
	case w8a8UseVNNI:
		w8a8VNNI.run(m, a, y, n, lo, hi)
	case w8a8UseAVX2:
		w8a8AVX2.run(m, a, y, n, lo, hi)
	default:
		matmulW8A8Generic(m, a, y, n, lo, hi)
	}
}

// W8A8KernelName names the w8a8 precision's kernel on this CPU: "vnni", "avx2" or "generic".
func W8A8KernelName() string {
	switch {
	case w8a8UseVNNI:
		return "vnni"
	case w8a8UseAVX2:
		return "avx2"
	}
	return "generic"
}

// run runs panels [lo,hi) with these tiles: per token block (tokenBlock), panel by panel
// (two at a time where every tile the block needs has a two-panel form), each swept by
// tiles of up to w8a8MaxT tokens, so that a panel is read from memory once per block and
// from cache by its other tiles.
func (k *w8a8Tiles) run(m *Matrix, a *w8a8Acts, y []float32, n, lo, hi int) {
	if lo >= hi || n <= 0 {
		return
	}
	rows, nb := m.Rows, a.nb
	ws := m.panelBytes()
	xs, ss, ys := nb*Int8Block, nb*4, rows*4
	full := min(hi, rows/PanelRows) // panels past full are partial (only the last one can be)
	wp := m.base()
	xp := unsafe.Pointer(unsafe.SliceData(a.q))
	sp := unsafe.Pointer(unsafe.SliceData(a.s))
	yp := unsafe.Pointer(unsafe.SliceData(y))
	for b0 := 0; b0 < n; b0 += tokenBlock {
		bn := min(tokenBlock, n-b0)
		pairs := k.two[min(bn, w8a8MaxT)] != nil && (bn%w8a8MaxT == 0 || k.two[bn%w8a8MaxT] != nil)
		for p := lo; p < hi; {
			tiles, np := &k.one, 1
			if pairs && p+2 <= full {
				tiles, np = &k.two, 2
			}
			w := unsafe.Add(wp, p*ws)
			for t := b0; t < b0+bn; t += w8a8MaxT {
				nt := min(w8a8MaxT, b0+bn-t)
				x, s := unsafe.Add(xp, t*xs), unsafe.Add(sp, t*ss)
				if p < full {
					tiles[nt](w, nb, x, xs, s, ss, unsafe.Add(yp, t*ys+p*PanelRows*4), ys)
					continue
				}
				// The last panel is partial: its padding rows would write past y (or over
				// the next token's outputs), so it goes through a scratch tile.
				var scratch [w8a8MaxT * PanelRows]float32
				tiles[nt](w, nb, x, xs, s, ss, unsafe.Pointer(&scratch), PanelRows*4)
				nr := rows - p*PanelRows
				for i := range nt {
					copy(y[(t+i)*rows+p*PanelRows:(t+i)*rows+rows], scratch[i*PanelRows:i*PanelRows+nr])
				}
			}
			p += np
		}
	}
}

// quantizeWholeBlock is quantizeActBlock of a whole block: in assembly where the AVX2 tiles
// run (the Go loop, with a float64 division per value, cost as much as the batch-1 MatMul it
// feeds on the 1B shape's FFN), bit for bit the same.
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
// arguments of w8a8Tile (gen_w8a8.go's vnniTile); the one-token ones prefetch.

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

//go:noescape
func w8a8VP2T2(w unsafe.Pointer, nb int, x unsafe.Pointer, xs int, s unsafe.Pointer, ss int, y unsafe.Pointer, ys int)

//go:noescape
func w8a8VP2T3(w unsafe.Pointer, nb int, x unsafe.Pointer, xs int, s unsafe.Pointer, ss int, y unsafe.Pointer, ys int)

//go:noescape
func w8a8VP2T4(w unsafe.Pointer, nb int, x unsafe.Pointer, xs int, s unsafe.Pointer, ss int, y unsafe.Pointer, ys int)
