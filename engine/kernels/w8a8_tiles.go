//go:build (amd64 || arm64) && !purego

package kernels

import "unsafe"

// w8a8Tile computes one whole panel (16 rows) × T tokens of a W8A8 MatMul over nb blocks (or
// two consecutive panels, the second nb blocks after the first, its outputs 16 after the
// first's): w is the panel, x the first token's quantized input (xs bytes between tokens), s
// its block scales (ss bytes between tokens), y the first token's first output (ys bytes
// between tokens). Every tile sums each block's integer products exactly, converts the sums
// to float32 (exact: |sum| ≤ 32·127·127 < 2^24), multiplies the rows' scales by the token's
// in float32 and adds the product into the row's float32 accumulator with one fma, block by
// block from zero: W8A8's definition, bit for bit. The instruction sets' tiles are described
// beside their tables (w8a8AVX2, w8a8VNNI, w8a8SDOT).
type w8a8Tile func(w unsafe.Pointer, nb int, x unsafe.Pointer, xs int, s unsafe.Pointer, ss int, y unsafe.Pointer, ys int)

// w8a8MaxT is the widest tile, in tokens: on AVX2, 4 tokens' integer sums of both halves (8
// registers), the weights, their absolute values, a product and the 4 broadcast inputs use
// 15 YMM registers and the int16 ones the 16th; from 3 tokens the float32 accumulators live
// in y (on every instruction set).
const w8a8MaxT = 4

// w8a8TokenBlock bounds the tokens swept per panel, so that their quantized inputs stay in
// L2 while the panels stream by (a panel is read from memory once per block of tokens).
const w8a8TokenBlock = 64

// w8a8Tiles is one instruction set's W8A8 tiles: one[T] computes one panel × T tokens,
// two[T] (where not nil) two consecutive whole panels × T tokens. first[T], where not nil,
// replaces two[T] for the first tile of a token block over each panel pair: the one that
// reads the pair from memory, and so the one worth a prefetching form.
type w8a8Tiles struct {
	one, two, first [w8a8MaxT + 1]w8a8Tile
}

// run runs panels [lo,hi) with these tiles: per token block (w8a8TokenBlock), panel by panel
// (two at a time where every tile the block needs has a two-panel form), each swept by
// tiles of up to w8a8MaxT tokens, so that a panel is read from memory once per block and
// from cache by its other tiles.
func (k *w8a8Tiles) run(m *Matrix, a *w8a8Acts, y []float32, n, lo, hi int) {
	if lo >= hi || n <= 0 {
		return
	}
	for b0 := 0; b0 < n; b0 += w8a8TokenBlock {
		k.block(m, a, y, b0, min(w8a8TokenBlock, n-b0), lo, hi)
	}
}

// block runs tokens [b0,b0+bn) of panels [lo,hi), as run does each token block.
func (k *w8a8Tiles) block(m *Matrix, a *w8a8Acts, y []float32, b0, bn, lo, hi int) {
	full := min(hi, m.Rows/PanelRows) // panels past full are partial (only the last one can be)
	pairs := k.two[min(bn, w8a8MaxT)] != nil && (bn%w8a8MaxT == 0 || k.two[bn%w8a8MaxT] != nil)
	for p := lo; p < hi; {
		tiles, np := &k.one, 1
		if pairs && p+2 <= full {
			tiles, np = &k.two, 2
		}
		k.panel(m, a, y, tiles, np == 2, b0, bn, p)
		p += np
	}
}

// panel runs tokens [b0,b0+bn) of panel p (and p+1 with the two-panel tiles, pair) through
// tiles of up to w8a8MaxT tokens.
func (k *w8a8Tiles) panel(m *Matrix, a *w8a8Acts, y []float32, tiles *[w8a8MaxT + 1]w8a8Tile, pair bool, b0, bn, p int) {
	rows, nb := m.Rows, a.nb
	xs, ss, ys := nb*Int8Block, nb*4, rows*4
	w := unsafe.Add(m.base(), p*m.panelBytes())
	xp := unsafe.Pointer(unsafe.SliceData(a.q))
	sp := unsafe.Pointer(unsafe.SliceData(a.s))
	yp := unsafe.Pointer(unsafe.SliceData(y))
	for t := b0; t < b0+bn; t += w8a8MaxT {
		nt := min(w8a8MaxT, b0+bn-t)
		x, s := unsafe.Add(xp, t*xs), unsafe.Add(sp, t*ss)
		if p < rows/PanelRows {
			tile := tiles[nt]
			if pair && t == b0 && k.first[nt] != nil {
				tile = k.first[nt]
			}
			tile(w, nb, x, xs, s, ss, unsafe.Add(yp, t*ys+p*PanelRows*4), ys)
			continue
		}
		// The last panel is partial: its padding rows would write past y (or over the next
		// token's outputs), so it goes through a scratch tile.
		var scratch [w8a8MaxT * PanelRows]float32
		tiles[nt](w, nb, x, xs, s, ss, unsafe.Pointer(&scratch), PanelRows*4)
		nr := rows - p*PanelRows
		for i := range nt {
			copy(y[(t+i)*rows+p*PanelRows:(t+i)*rows+rows], scratch[i*PanelRows:i*PanelRows+nr])
		}
	}
}
