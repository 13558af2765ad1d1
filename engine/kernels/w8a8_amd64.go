//go:build amd64 && !purego

package kernels

import "unsafe"

//go:generate go run gen_w8a8.go

// w8a8Tile computes one whole panel (16 rows) × T tokens of a W8A8 MatMul over nb blocks:
// w is the panel, x the first token's quantized input (xs bytes between tokens), s its block
// scales (ss bytes between tokens), y the first token's first output (ys bytes between
// tokens). Per block it takes, for each group of 4 columns and each 8-row half, the 32 bytes
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

// w8a8AVX2Tiles[T] is the T-token tile.
var w8a8AVX2Tiles = [w8a8MaxT + 1]w8a8Tile{1: w8a8T1, 2: w8a8T2, 3: w8a8T3, 4: w8a8T4}

// matmulW8A8Panels runs panels [lo,hi) of a W8A8 MatMul: the AVX2 tiles where the CPU has
// AVX2 and FMA (AVX-512 CPUs too: there is no AVX-512 tile), else the Go kernel.
func matmulW8A8Panels(m *Matrix, a *w8a8Acts, y []float32, n, lo, hi int) {
	if w8a8UseAVX2 {
		matmulW8A8AVX2(m, a, y, n, lo, hi)
		return
	}
	matmulW8A8Generic(m, a, y, n, lo, hi)
}

// matmulW8A8AVX2 runs panels [lo,hi) with the AVX2 tiles: per token block (tokenBlock), panel
// by panel, each panel swept by tiles of up to w8a8MaxT tokens, so that a panel is read from
// memory once per block and from cache by its other tiles; a lone token takes two panels at
// a time (w8a8P2T1), which streamed 25-28 GB/s of weights on the 2-core EPYC where one panel
// at a time streamed 18-24 (with or without software prefetch).
func matmulW8A8AVX2(m *Matrix, a *w8a8Acts, y []float32, n, lo, hi int) {
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
		p := lo
		if bn == 1 {
			// One token: two panels at a time, two streams for the hardware prefetcher.
			x, s := unsafe.Add(xp, b0*xs), unsafe.Add(sp, b0*ss)
			for ; p+2 <= full; p += 2 {
				w8a8P2T1(unsafe.Add(wp, p*ws), nb, x, xs, s, ss, unsafe.Add(yp, b0*ys+p*PanelRows*4), ys)
			}
		}
		for ; p < hi; p++ {
			w := unsafe.Add(wp, p*ws)
			for t := b0; t < b0+bn; t += w8a8MaxT {
				nt := min(w8a8MaxT, b0+bn-t)
				x, s := unsafe.Add(xp, t*xs), unsafe.Add(sp, t*ss)
				if p < full {
					w8a8AVX2Tiles[nt](w, nb, x, xs, s, ss, unsafe.Add(yp, t*ys+p*PanelRows*4), ys)
					continue
				}
				// The last panel is partial: its padding rows would write past y (or over
				// the next token's outputs), so it goes through a scratch tile.
				var scratch [w8a8MaxT * PanelRows]float32
				w8a8AVX2Tiles[nt](w, nb, x, xs, s, ss, unsafe.Pointer(&scratch), PanelRows*4)
				nr := rows - p*PanelRows
				for i := range nt {
					copy(y[(t+i)*rows+p*PanelRows:(t+i)*rows+rows], scratch[i*PanelRows:i*PanelRows+nr])
				}
			}
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
