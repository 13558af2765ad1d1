//go:build amd64 && !purego

package kernels

import "unsafe"

// The tile driver is shared by the archsimd build (GOEXPERIMENT=simd) and the default assembly
// build; they differ only in the tile functions their simdKernel tables point at.

// tileFunc computes a tile of P whole panels × T tokens over all cols:
//
//	y[t*ys + j*64 + 4*i] = Σ_k W[panel j][k][i] · x[t*xs + 4*k]   (byte offsets)
//
// w points at the first panel and ws is the byte stride between panels; x points at the first
// token and xs is the byte stride between tokens; y points at the output of the first panel's
// first row for the first token and ys is the byte stride between tokens. Each lane is one
// sequential FMA chain over k from zero, whatever P and T, so every tile shape gives the same
// bits (see the package doc).
type tileFunc func(w unsafe.Pointer, ws int, x unsafe.Pointer, xs int, cols int, y unsafe.Pointer, ys int)

// pfTileFunc is a tileFunc that also prefetches (PREFETCHT0) weights the caller reads next, so
// that they come from cache rather than memory: one cache line per 64 bytes of its own panel
// read (each step k of a float32 tile), at pf, pf+pfs, pf+2·pfs, ... With pfs = 64 that is a
// whole panel's worth of bytes; with pfs = 32 half of it, at half the rate.
type pfTileFunc func(w unsafe.Pointer, ws int, x unsafe.Pointer, xs int, cols int, y unsafe.Pointer, ys int, pf unsafe.Pointer, pfs int)

// maxTileP and maxTileT bound the generated tile shapes.
const (
	maxTileP = 4
	maxTileT = 7
)

// simdKernel is one instruction set's tile kernels and the shapes it prefers.
type simdKernel struct {
	name  string
	tiles *[maxTileP + 1][maxTileT + 1]tileFunc
	// shape returns the main tile for a batch of n tokens: as many accumulators as fit in
	// registers, and several panels when n is small so that independent FMA chains hide the
	// FMA latency.
	shape func(n int) (p, t int)
	// t1 is the widest single-panel tile, used for leftover and partial panels.
	t1 int
	// pf, when set, is the pfP×pfT tile with a prefetch (see pfTileFunc). Without column
	// blocks, the first pfP token tiles of a panel group each prefetch one panel of the next
	// group.
	pf       pfTileFunc
	pfP, pfT int
	// kc, when set, splits the columns of each main-tile panel group into blocks of kc, every
	// token tile sweeping one block before the next: the group's block then stays in L1
	// across the token tiles instead of streaming from L2 once per tile. acc and pfAcc are the
	// tiles that continue the chains a block left in y, so the bits do not change. The full
	// token tiles over a block prefetch the next block (kcNextBlock), spread over as many of
	// them as the block has, unless kcPrefetchDense keeps it to one line a step in the first
	// P (what the benchmarks compare the spread with).
	kc              int
	kcPrefetchDense bool
	acc             *[maxTileP + 1][maxTileT + 1]tileFunc
	pfAcc           pfTileFunc
}

// avx2Shape is the AVX2 main tile for n tokens: from three tokens up the 1×6 tile (12
// accumulators, BLIS's Haswell shape), which is assembly in both builds: twice the FLOP/s of
// the compiler's best spill-free archsimd tile, 1×4.
func avx2Shape(n int) (p, t int) {
	switch {
	case n == 1:
		return 3, 1
	case n == 2:
		return 2, 2
	}
	return 1, min(n, 6)
}

// tokenBlock bounds the tokens swept per panel group, so that the block of x stays in L2 while
// the panels stream by (W is read once per block). 64 tokens of up to 2048 columns are 512 KB;
// at 48, a 64-sequence decode step read every matrix from memory twice (stories110m at 64
// concurrent: 7% fewer tokens/s than at 64, AVX-512).
const tokenBlock = 64

// matmulSIMD runs panels [lo,hi) of MatMul with kernel k. Callers have checked len(x), len(y).
func matmulSIMD(k *simdKernel, m *Matrix, y, x []float32, n, lo, hi int) {
	if lo >= hi || n <= 0 {
		return
	}
	cols, rows := m.Cols, m.Rows
	ws := m.panelBytes()
	xs, ys := cols*4, rows*4
	full := min(hi, rows/PanelRows) // panels past full are partial (only the last one can be)
	panels := m.Panels()
	wp := m.base()
	xp := unsafe.Pointer(unsafe.SliceData(x))
	yp := unsafe.Pointer(unsafe.SliceData(y))
	panel := func(p int) unsafe.Pointer { return unsafe.Add(wp, p*ws) }
	tok := func(t int) unsafe.Pointer { return unsafe.Add(xp, t*xs) }
	out := func(t, p int) unsafe.Pointer { return unsafe.Add(yp, t*ys+p*PanelRows*4) }

	for b0 := 0; b0 < n; b0 += tokenBlock {
		bn := min(tokenBlock, n-b0)
		P, T := k.shape(bn)
		p := lo
		pf := k.pf != nil && P == k.pfP && T == k.pfT
		kc := cols
		if k.kc > 0 && bn > T {
			kc = k.kc
		}
		spread := 1 // token tiles sharing one panel's prefetch, in column blocks
		if kc < cols && !k.kcPrefetchDense {
			spread = max(1, bn/T/P)
		}
		for ; p+P <= full; p += P {
			for k0 := 0; k0 < cols; k0 += kc {
				kl := min(kc, cols-k0)
				fn, pft := &k.tiles[P], k.pf
				if k0 > 0 {
					fn, pft = &k.acc[P], k.pfAcc
				}
				w := unsafe.Add(panel(p), m.colBytes(k0))
				var nb nextBlock
				if pf && kc < cols {
					nb = kcNextBlock(m.colBytes, p, P, k0, kc, kl, cols, spread)
				}
				for t, i := b0, 0; t < b0+bn; t, i = t+T, i+1 {
					nt := min(T, b0+bn-t)
					xt := unsafe.Add(tok(t), k0*4)
					if pf && nt == T && i < P*spread {
						var at unsafe.Pointer
						pfs := 64
						if kc < cols {
							if off, ok := nb.tile(i, ws, panels); ok {
								at, pfs = unsafe.Add(wp, off), nb.pfs
							}
						} else if p+P+i < panels {
							at = unsafe.Add(panel(p+P+i), m.colBytes(k0))
						}
						if at != nil {
							pft(w, ws, xt, xs, kl, out(t, p), ys, at, pfs)
							continue
						}
					}
					fn[nt](w, ws, xt, xs, kl, out(t, p), ys)
				}
			}
		}
		fn := &k.tiles[1]
		for ; p < full; p++ {
			for t := b0; t < b0+bn; t += k.t1 {
				nt := min(k.t1, b0+bn-t)
				fn[nt](panel(p), ws, tok(t), xs, cols, out(t, p), ys)
			}
		}
		if p < hi {
			// The last panel is partial: its padding rows would write past y (or over the next
			// token's outputs), so it goes through a scratch tile.
			var scratch [maxTileT * PanelRows]float32
			nr := rows - p*PanelRows
			for t := b0; t < b0+bn; t += k.t1 {
				nt := min(k.t1, b0+bn-t)
				fn[nt](panel(p), ws, tok(t), xs, cols, unsafe.Pointer(&scratch), PanelRows*4)
				for i := range nt {
					copy(y[(t+i)*rows+p*PanelRows:(t+i)*rows+rows], scratch[i*PanelRows:i*PanelRows+nr])
				}
			}
		}
	}
}

// nextBlock is what the token tiles over one column block of a panel group prefetch (see
// kcNextBlock): the block starting at byte at of panels group to group+P-1. Per panel, spread
// tiles share its first lines (as many as one tile's steps reach), chunk lines each, the
// prefetch advancing pfs bytes a line (see pfTileFunc).
type nextBlock struct {
	group, at            int
	lines, chunk, spread int
	pfs                  int
}

// kcNextBlock is what the token tiles over column block k0 (kl columns) of panel group p
// prefetch: the group's next column block, or at its last block the next group's first, each
// of the P panels shared by spread tiles. The block then comes from L2 rather than DRAM when
// the first tile reaches it. A line takes DRAM's latency to arrive: at a line a step, four
// tiles each prefetching a whole panel of a 64-token block kept about 28 lines in flight on an
// AVX-512 Xeon, past its 16 fill buffers, and stalled the loads the tiles compute on; half a
// line a step, over eight tiles, made the batched 8192×2048 matmul 5-10% faster there
// (docs/perf.md).
func kcNextBlock(colBytes func(int) int, p, P, k0, kc, kl, cols, spread int) nextBlock {
	nb := nextBlock{group: p, at: colBytes(k0 + kc), spread: spread, pfs: (64 + spread - 1) / spread}
	end := colBytes(min(k0+2*kc, cols))
	if k0+kc >= cols {
		nb.group, nb.at, end = p+P, 0, colBytes(min(kc, cols))
	}
	// A tile prefetches a line per 64 bytes it reads of its own panels.
	nb.lines = (min(colBytes(k0+kl)-colBytes(k0), end-nb.at) + 63) / 64
	nb.chunk = (nb.lines + spread - 1) / spread
	return nb
}

// tile is where token tile i prefetches, as a byte offset into the panels (ws bytes apart):
// its share of its panel's lines. ok is false past the last panel or past the block's end, so
// that every prefetch starts inside the matrix.
func (nb nextBlock) tile(i, ws, panels int) (off int, ok bool) {
	j, start := nb.group+i/nb.spread, i%nb.spread*nb.chunk
	if j >= panels || start >= nb.lines {
		return 0, false
	}
	return j*ws + nb.at + start*64, true
}
