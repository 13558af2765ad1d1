package offload

import (
	"encoding/binary"
	"hash/crc32"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// refBlockSum is the block checksum spelled out with hash/crc32: the CRC-32C of each third
// (whole 64-byte lines, the last part taking the rest), then the CRC-32C of the three values.
func refBlockSum(crc uint32, b []byte) uint32 {
	t := len(b) / 192 * 64
	var buf []byte
	for _, p := range [][]byte{b[:t], b[t : 2*t], b[2*t:]} {
		buf = binary.LittleEndian.AppendUint32(buf, crc32.Checksum(p, crc32.MakeTable(crc32.Castagnoli)))
	}
	return crc32.Update(crc, crc32.MakeTable(crc32.Castagnoli), buf)
}

// TestCopySumIsBlockCRC32C: the fused copy+checksum copies exactly and gives the reference
// checksum for lengths around every boundary (the 192-byte three-line step, the 8- and 4-byte
// tails) and at unaligned starts, and so do checksumUpdate and the portable copyThenSum.
func TestCopySumIsBlockCRC32C(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	src := make([]float32, 60000)
	for i := range src {
		src[i] = r.Float32()*2 - 1
	}
	bytesOf := func(f []float32) []byte { return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), 4*len(f)) }
	lengths := []int{}
	for n := 0; n <= 200; n++ {
		lengths = append(lengths, n)
	}
	lengths = append(lengths, 4096, 4096+5, 55296, 59999) // 55296 floats: a stories15m block
	for _, off := range []int{0, 1} {
		for _, n := range lengths {
			for _, seed := range []uint32{0, 0xdeadbeef} {
				s := src[off : off+n]
				want := seed
				if n > 0 {
					want = refBlockSum(seed, bytesOf(s))
				}
				dst := make([]float32, n+1)
				dst[n] = 42 // a guard past the end
				require.Equal(t, want, copySum(dst[:n], s, seed), "off=%d n=%d", off, n)
				require.Equal(t, s, dst[:n])
				require.Equal(t, float32(42), dst[n], "wrote past the end")
				require.Equal(t, want, checksumUpdate(seed, s), "checksumUpdate n=%d", n)
				require.Equal(t, want, copyThenSum(make([]float32, n), s, seed), "portable n=%d", n)
			}
		}
	}
	// A flipped bit anywhere changes the checksum.
	s := append([]float32(nil), src[:4096]...)
	base := checksumUpdate(0, s)
	for _, i := range []int{0, 1000, 1365, 1366, 2731, 4095} {
		s[i] = -s[i]
		require.NotEqual(t, base, copySum(make([]float32, len(s)), s, 0), "sign flip at %d", i)
		s[i] = -s[i]
	}
}

func BenchmarkCopySum(b *testing.B) {
	// 56 MB in stories15m-sized blocks: past L3, as the offload bandwidth bench.
	const block, blocks = 55296, 256
	src, dst := make([]float32, block*blocks), make([]float32, block*blocks)
	for i := range src {
		src[i] = float32(i)
	}
	for _, c := range []struct {
		name string
		f    func(dst, src []float32, crc uint32) uint32
	}{{"fused", copySum}, {"copy-then-sum", copyThenSum}, {"copy-only", func(d, s []float32, _ uint32) uint32 { copy(d, s); return 0 }}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(4 * block * blocks)
			for b.Loop() {
				for i := range blocks {
					c.f(dst[i*block:(i+1)*block], src[i*block:(i+1)*block], 0)
				}
			}
		})
	}
}
