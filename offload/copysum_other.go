//go:build !amd64

package offload

// copySum3 copies src into dst (dst at least as long) and returns the three part checksums of
// src's block checksum (see checksumUpdate).
func copySum3(dst, src []float32) (a, b, c uint32) {
	copy(dst, src)
	return sum3(src)
}
