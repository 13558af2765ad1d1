//go:build amd64 && !purego

package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// TestEveryTileMatchesGeneric calls each tile of each kernel this CPU runs directly, whether or
// not the kernel's shape function picks it today, over enough panels and tokens for its shape:
// every generated tile must give the portable kernel's bits.
func TestEveryTileMatchesGeneric(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, k := range tileKernels() {
		for P := 1; P <= maxTileP; P++ {
			for T := 1; T <= maxTileT; T++ {
				fn := k.tiles[P][T]
				if fn == nil {
					continue
				}
				for _, cols := range []int{1, 2, 7, 64} {
					rows := P * PanelRows
					m, err := NewMatrix(randSlice(r, rows*cols), rows, cols)
					if err != nil {
						t.Fatal(err)
					}
					x := randSlice(r, T*cols)
					want := make([]float32, T*rows)
					matmulGeneric(m, want, x, T, 0, P)
					got := make([]float32, T*rows)
					fn(unsafe.Pointer(&m.data[0]), PanelRows*cols*4, unsafe.Pointer(&x[0]), cols*4, cols,
						unsafe.Pointer(&got[0]), rows*4)
					requireSameBits(t, want, got, "%s", fmt.Sprintf("%s P%dT%d cols=%d", k.name, P, T, cols))
					if k.pf != nil && P == k.pfP && T == k.pfT {
						// The prefetching variant of the main tile: same bits, whatever it prefetches.
						clear(got)
						k.pf(unsafe.Pointer(&m.data[0]), PanelRows*cols*4, unsafe.Pointer(&x[0]), cols*4, cols,
							unsafe.Pointer(&got[0]), rows*4, unsafe.Pointer(&m.data[0]), 32)
						requireSameBits(t, want, got, "%s", fmt.Sprintf("%s P%dT%d prefetching cols=%d", k.name, P, T, cols))
					}
				}
			}
		}
	}
}

// TestEveryBatchSizeMatchesGeneric runs every batch size from 1 past three token blocks, and
// the largest step the engine's default token budget allows, through each kernel and pool size:
// the tile mix (full, tail and partial-panel tiles, block edges) changes with n, the bits not.
func TestEveryBatchSizeMatchesGeneric(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	const rows, cols = 37 + 4*PanelRows, 19 // five full panels and a partial one
	m, err := NewMatrix(randSlice(r, rows*cols), rows, cols)
	if err != nil {
		t.Fatal(err)
	}
	sizes := []int{2048}
	for n := 1; n <= 3*tokenBlock+2; n++ {
		sizes = append(sizes, n)
	}
	impls := allImpls()
	for _, workers := range []int{1, 2, 3} {
		pool := NewPool(workers)
		for _, n := range sizes {
			x := randSlice(r, n*cols)
			want := make([]float32, n*rows)
			matMulWith(impls[0], nil, m, want, x, n)
			for _, k := range impls[1:] {
				got := make([]float32, n*rows)
				matMulWith(k, pool, m, got, x, n)
				requireSameBits(t, want, got, "%s workers=%d n=%d", k.name, workers, n)
			}
		}
		pool.Close()
	}
}

// TestKCPrefetchCoversTheNextBlock checks the column-block prefetch's targets, for each
// precision's panel layout: over one block of a panel group, the tiles that prefetch start
// inside the matrix and cover the group's next block (or, at the last block, the next group's
// first) as far as their steps reach.
func TestKCPrefetchCoversTheNextBlock(t *testing.T) {
	const P = 4
	for _, prec := range []Precision{F32, BF16, Int8} {
		for _, c := range []struct{ cols, kc, panels, spread int }{
			{2048, 128, 12, 1}, {2048, 128, 12, 2}, {200, 128, 9, 2}, {130, 128, 8, 2}, {2048, 128, 8, 3}, {300, 128, 8, 2},
		} {
			m := &Matrix{Rows: c.panels * PanelRows, Cols: c.cols, Prec: prec}
			ws := m.panelBytes()
			for p := 0; p+P <= c.panels; p += P {
				for k0 := 0; k0 < c.cols; k0 += c.kc {
					kl := min(c.kc, c.cols-k0)
					reach := m.colBytes(k0+kl) - m.colBytes(k0) // bytes of each panel the tile reads
					covered := map[int]bool{}                   // 64-byte lines
					nb := kcNextBlock(m.colBytes, p, P, k0, c.kc, kl, c.cols, c.spread)
					for i := range P * c.spread {
						at, ok := nb.tile(i, ws, c.panels)
						if !ok {
							continue
						}
						pfs := nb.pfs
						if at < 0 || at >= c.panels*ws {
							t.Fatalf("%s %+v p=%d k0=%d tile %d: prefetch from %d, outside the matrix", prec, c, p, k0, i, at)
						}
						for s := range (reach + 63) / 64 {
							covered[(at+s*pfs)/64] = true
						}
					}
					next, from, to := p, m.colBytes(k0+c.kc), m.colBytes(min(k0+2*c.kc, c.cols))
					if k0+c.kc >= c.cols {
						next, from, to = p+P, 0, m.colBytes(min(c.kc, c.cols))
					}
					for j := range P {
						if next+j >= c.panels {
							continue
						}
						for a := from; a < min(to, from+reach); a += 64 {
							if b := (next+j)*ws + a; !covered[b/64] {
								t.Fatalf("%s %+v p=%d k0=%d: byte %d of panel %d not prefetched", prec, c, p, k0, a, next+j)
							}
						}
					}
				}
			}
		}
	}
}
