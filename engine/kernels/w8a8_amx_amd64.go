//go:build amd64 && !purego

package kernels

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

//go:generate go run gen_amx.go

// w8a8AMXBuf is the AMX tile's scratch: two tiles of 16 tokens × 16 int32 sums.
const w8a8AMXBuf = 2 * w8a8AMXTokens * PanelRows * 4

// w8a8AMXT16 is one whole panel × 16 tokens of a W8A8 MatMul (gen_amx.go): w is the panel,
// x and s the group's inputs and scales packed by block (w8a8Acts.qa, sa), y the first
// token's first output (ys bytes between tokens) and buf w8a8AMXBuf bytes of scratch. Per
// block, TDPBSSD multiplies the 16 tokens' 32 int8 inputs (a tile of 16 rows × 32 bytes) by the
// block's weights as packed (8 rows of 4 columns × 16 rows) into 16 × 16 exact int32 sums,
// signed by signed, so no bias correction is needed; the vector units then add them into the
// float32 accumulators as the VNNI tiles do. It configures the tiles on entry and
// releases them before it returns: Go may move the goroutine to another thread between calls,
// and assembly is not preempted within one.
//
//go:noescape
func w8a8AMXT16(w unsafe.Pointer, nb int, x unsafe.Pointer, s unsafe.Pointer, y unsafe.Pointer, ys int, buf unsafe.Pointer)

// w8a8UseAMX selects the AMX tile for each whole 16 tokens: a CPU with AMX-INT8 beside the
// VNNI tiles (Sapphire Rapids and later Xeons), whose kernel lets this process use it.
var w8a8UseAMX = w8a8UseVNNI && cpu.X86.HasAMXTile && cpu.X86.HasAMXInt8 && requestAMX()

// runW8A8AMX runs panels [lo,hi) of a W8A8 MatMul with the AMX tile for each whole 16 tokens
// of a token block on a full panel and the VNNI tiles k for the rest: a block of fewer than
// 16 tokens, its last tokens past a multiple of 16, and the partial last panel. The tiles
// give the same bits (W8A8's definition), so how a batch splits between them changes nothing.
func runW8A8AMX(k *w8a8Tiles, m *Matrix, a *w8a8Acts, y []float32, n, lo, hi int) {
	if lo >= hi || n <= 0 {
		return
	}
	var raw [w8a8AMXBuf + 64]byte
	buf := unsafe.Add(unsafe.Pointer(&raw), -uintptr(unsafe.Pointer(&raw))&63) // 64-byte aligned
	rows, nb := m.Rows, a.nb
	gq, gs, ys := w8a8AMXTokens*nb*Int8Block, w8a8AMXTokens*nb*4, rows*4
	full := min(hi, rows/PanelRows)
	ws := m.panelBytes()
	wp := m.base()
	xp := unsafe.Pointer(unsafe.SliceData(a.qa))
	sp := unsafe.Pointer(unsafe.SliceData(a.sa))
	yp := unsafe.Pointer(unsafe.SliceData(y))
	for b0 := 0; b0 < n; b0 += w8a8TokenBlock {
		bn := min(w8a8TokenBlock, n-b0)
		n16 := bn / w8a8AMXTokens * w8a8AMXTokens
		if n16 == 0 {
			k.block(m, a, y, b0, bn, lo, hi)
			continue
		}
		for p := lo; p < full; p++ {
			w := unsafe.Add(wp, p*ws)
			for t := b0; t < b0+n16; t += w8a8AMXTokens {
				g := t / w8a8AMXTokens
				w8a8AMXT16(w, nb, unsafe.Add(xp, g*gq), unsafe.Add(sp, g*gs), unsafe.Add(yp, t*ys+p*PanelRows*4), ys, buf)
			}
			if n16 < bn {
				k.panel(m, a, y, &k.one, false, b0+n16, bn-n16, p)
			}
		}
		if full < hi {
			k.panel(m, a, y, &k.one, false, b0, bn, full)
		}
	}
}
