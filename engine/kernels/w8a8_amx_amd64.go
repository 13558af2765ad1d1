//go:build amd64 && !purego

package kernels

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

//go:generate go run gen_amx.go

// w8a8AMXBuf is the AMX tiles' scratch: two tiles of up to 16 tokens × 16 int32 sums.
const w8a8AMXBuf = 2 * w8a8AMXTokens * PanelRows * 4

// The AMX tiles, w8a8AMXT1 to w8a8AMXT16 (gen_amx.go; w8a8AMX calls them), are each one
// whole panel × M tokens of a W8A8 MatMul: w is the panel, x and s the M tokens' inputs and
// scales packed by block (w8a8Acts.qa, sa), y the first token's first output (ys bytes
// between tokens), buf w8a8AMXBuf bytes of scratch and far, when not 0, asks the tile to
// prefetch the weights into L2 from further ahead too (gen_amx.go's prefetchFar). Per block, TDPBSSD multiplies the M
// tokens' 32 int8 inputs (a tile of M rows × 32 bytes) by the block's weights as packed (8
// rows of 4 columns × 16 rows) into M × 16 exact int32 sums, signed by signed, so no bias
// correction is needed; the vector units then add them into the float32 accumulators as the
// VNNI tiles do. A tile configures the tiles on entry and releases them before it returns: Go
// may move the goroutine to another thread between calls, and assembly is not preempted
// within one.

// w8a8UseAMX selects the AMX tiles: a CPU with AMX-INT8 beside the VNNI tiles (Sapphire
// Rapids and later Xeons), whose kernel lets this process use it.
var w8a8UseAMX = w8a8UseVNNI && cpu.X86.HasAMXTile && cpu.X86.HasAMXInt8 && requestAMX()

// w8a8AMXMin is the fewest tokens that go through an AMX tile; fewer take the VNNI tiles. A
// tile's cost per block hardly shrinks with its tokens: on a 2-vCPU Xeon with W from memory, 8
// tokens ran at 259-280 GOP/s through AMX against 211-249 through VNNI, 4 tokens at 135
// against 188.
const w8a8AMXMin = 8

// runW8A8AMX runs panels [lo,hi) of a W8A8 MatMul with the AMX tiles for each group of 16
// tokens, and for the last group, shorter, if it has at least fewest tokens; the VNNI tiles k
// take a shorter group and the partial last panel. The tiles give the same bits (W8A8's
// definition), so how a batch splits between them changes nothing.
func runW8A8AMX(k *w8a8Tiles, fewest int, m *Matrix, a *w8a8Acts, y []float32, n, lo, hi int) {
	if lo >= hi || n <= 0 {
		return
	}
	var raw [w8a8AMXBuf + 64]byte
	buf := unsafe.Add(unsafe.Pointer(&raw), -uintptr(unsafe.Pointer(&raw))&63) // 64-byte aligned
	const g = w8a8AMXTokens
	rows, nb := m.Rows, a.nb
	ys := rows * 4
	full := min(hi, rows/PanelRows)
	ws := m.panelBytes()
	wp := m.base()
	xp := unsafe.Pointer(unsafe.SliceData(a.qa))
	sp := unsafe.Pointer(unsafe.SliceData(a.sa))
	yp := unsafe.Pointer(unsafe.SliceData(y))
	for b0 := 0; b0 < n; b0 += w8a8TokenBlock {
		bn := min(w8a8TokenBlock, n-b0)
		amx := bn // tokens of the block through AMX tiles, whole groups first
		if r := bn % g; r < fewest {
			amx -= r
		}
		if amx == 0 {
			k.block(m, a, y, b0, bn, lo, hi)
			continue
		}
		for p := lo; p < full; p++ {
			w := unsafe.Add(wp, p*ws)
			for t := b0; t < b0+amx; t += g {
				mt := min(g, b0+amx-t)
				far := 0 // the first tile over the panel reads it from memory
				if t == b0 {
					far = 1
				}
				w8a8AMX(mt, w, nb, unsafe.Add(xp, t*nb*Int8Block), unsafe.Add(sp, t*nb*4), unsafe.Add(yp, t*ys+p*PanelRows*4), ys, buf, far)
			}
			if amx < bn {
				k.panel(m, a, y, &k.one, false, b0+amx, bn-amx, p)
			}
		}
		if full < hi {
			k.panel(m, a, y, &k.one, false, b0, bn, full)
		}
	}
}
