//go:build (amd64 || arm64) && !purego

package kernels

// prefetchRows hints lines 64-byte lines of each of n > 0 rows rs bytes apart, from p, into L1
// (PREFETCHT0 on amd64, PRFM PLDL1KEEP on arm64). lines > 0.
//
//go:noescape
func prefetchRows(p *float32, rs, n, lines int)
