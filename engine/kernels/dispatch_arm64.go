//go:build arm64 && !purego

package kernels

import "unsafe"

//go:generate go run gen_neon.go

// Every arm64 CPU has NEON (Advanced SIMD is mandatory in ARMv8-A), so this build always runs
// the NEON tiles; there is no feature to detect.

// KernelName names the MatMul implementation this process uses: "neon" on arm64.
func KernelName() string { return "neon" }

// neonTile computes a tile of P whole panels × T tokens over all cols:
//
//	y[t*ys + j*64 + 4*i] = Σ_k W[panel j][k][i] · x[t*xs + 4*k]   (byte offsets)
//
// w points at the first panel and ws is the byte stride between panels; x points at the first
// token and xs is the byte stride between tokens; y points at the output of the first panel's
// first row for the first token and ys is the byte stride between tokens. Each lane is one
// sequential VFMLA chain over k from zero, whatever P and T, so every tile shape gives the
// bits of matmulGeneric (see the package doc).
type neonTile func(w unsafe.Pointer, ws int, x unsafe.Pointer, xs int, cols int, y unsafe.Pointer, ys int)

// neonT1 is the widest single-panel tile (6 tokens: 24 accumulators, 4 weight vectors, 2
// broadcasts), used for leftover and partial panels.
const neonT1 = 6

// neonShape returns the main tile for a batch of n tokens: 16 to 24 accumulators, the panels
// spread wide when n is small so that independent VFMLA chains hide the FMA latency.
func neonShape(n int) (p, t int) {
	switch {
	case n == 1:
		return 4, 1
	case n == 2:
		return 3, 2
	default:
		return 1, min(n, neonT1)
	}
}

func matmulPanels(m *Matrix, y, x []float32, n, lo, hi int) { matmulNEON(m, y, x, n, lo, hi) }

// neonTokenBlock bounds the tokens swept per panel group, so that the block of x stays in L2
// while the panels stream by (W is read once per block).
const neonTokenBlock = 48

// matmulNEON runs panels [lo,hi) of MatMul with the NEON tiles. Callers have checked len(x),
// len(y).
func matmulNEON(m *Matrix, y, x []float32, n, lo, hi int) {
	matmulNEONTiles(&neonTiles, neonShape, neonT1, m, y, x, n, lo, hi)
}

// neonBF16Shape is the bf16 main tile for n tokens: the bf16 tiles hold their weights and a
// mask in registers, so one token spreads over 3 panels, two over 2, and more take 1×6.
func neonBF16Shape(n int) (p, t int) {
	switch {
	case n == 1:
		return 3, 1
	case n == 2:
		return 2, 2
	default:
		return 1, min(n, neonT1)
	}
}

// matmulNEONTiles is matmulNEON with a tile table and its shape function: the float32 tiles,
// or the bf16 ones on a bf16 matrix.
func matmulNEONTiles(tiles *[5][7]neonTile, shape func(int) (int, int), t1 int, m *Matrix, y, x []float32, n, lo, hi int) {
	if lo >= hi || n <= 0 {
		return
	}
	cols, rows := m.Cols, m.Rows
	ws := m.panelBytes()
	xs, ys := cols*4, rows*4
	full := min(hi, rows/PanelRows) // panels past full are partial (only the last one can be)
	wp := m.base()
	xp := unsafe.Pointer(unsafe.SliceData(x))
	yp := unsafe.Pointer(unsafe.SliceData(y))
	panel := func(p int) unsafe.Pointer { return unsafe.Add(wp, p*ws) }
	tok := func(t int) unsafe.Pointer { return unsafe.Add(xp, t*xs) }
	out := func(t, p int) unsafe.Pointer { return unsafe.Add(yp, t*ys+p*PanelRows*4) }

	for b0 := 0; b0 < n; b0 += neonTokenBlock {
		bn := min(neonTokenBlock, n-b0)
		P, T := shape(bn)
		p := lo
		for ; p+P <= full; p += P {
			fn := &tiles[P]
			for t := b0; t < b0+bn; t += T {
				nt := min(T, b0+bn-t)
				fn[nt](panel(p), ws, tok(t), xs, cols, out(t, p), ys)
			}
		}
		fn := &tiles[1]
		for ; p < full; p++ {
			for t := b0; t < b0+bn; t += t1 {
				nt := min(t1, b0+bn-t)
				fn[nt](panel(p), ws, tok(t), xs, cols, out(t, p), ys)
			}
		}
		if p < hi {
			// The last panel is partial: its padding rows would write past y (or over the next
			// token's outputs), so it goes through a scratch tile.
			var scratch [neonT1 * PanelRows]float32
			nr := rows - p*PanelRows
			for t := b0; t < b0+bn; t += t1 {
				nt := min(t1, b0+bn-t)
				fn[nt](panel(p), ws, tok(t), xs, cols, unsafe.Pointer(&scratch), PanelRows*4)
				for i := range nt {
					copy(y[(t+i)*rows+p*PanelRows:(t+i)*rows+rows], scratch[i*PanelRows:i*PanelRows+nr])
				}
			}
		}
	}
}

// streamRead folds buf (whole streamBlocks) into a checksum with 64-byte VLD1 loads, the load
// width of the NEON tiles, so StreamReadBandwidth is the ceiling a memory-bound decode can reach
// in this build.
func streamRead(buf []uint64) uint64 {
	blocks := len(buf) * 8 / streamBlock
	if blocks == 0 {
		return streamReadGeneric(buf)
	}
	var out [4]uint32
	streamReadNEON(unsafe.Pointer(unsafe.SliceData(buf)), blocks, &out)
	return uint64(out[0]) + uint64(out[1]) + uint64(out[2]) + uint64(out[3])
}

// streamReadNEON sums blocks×512 bytes at p as uint32 lanes into out (word i into lane i mod
// 4); blocks >= 1.
//
//go:noescape
func streamReadNEON(p unsafe.Pointer, blocks int, out *[4]uint32)

// neonI8Shape is the int8 main tile for n tokens: the int8 tiles also hold four scale
// registers, so three tokens or more take 1×5.
func neonI8Shape(n int) (p, t int) {
	if n <= 2 {
		return neonBF16Shape(n)
	}
	return 1, min(n, neonI8T1)
}

// neonI8T1 is the widest single-panel int8 tile.
const neonI8T1 = 5

// matmulLow runs a bf16 or int8 MatMul with the NEON tiles that read the format
// (kernels_neon_bf16_arm64.s, kernels_neon_i8_arm64.s).
func matmulLow(m *Matrix, y, x []float32, n, lo, hi int) {
	if m.Prec == BF16 {
		matmulNEONTiles(&neonBF16Tiles, neonBF16Shape, neonT1, m, y, x, n, lo, hi)
		return
	}
	matmulNEONTiles(&neonI8Tiles, neonI8Shape, neonI8T1, m, y, x, n, lo, hi)
}
