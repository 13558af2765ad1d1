//go:build !amd64

package offload

// copySum copies src into dst (equal lengths) and extends crc by src's block checksum (see
// checksumUpdate).
func copySum(dst, src []float32, crc uint32) uint32 { return copyThenSum(dst, src, crc) }
