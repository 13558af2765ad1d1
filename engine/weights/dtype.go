package weights

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"github.com/x448/float16"
)

// DType is the element type of tensors in a safetensors file.
type DType int

// The dtypes SaveHF writes and LoadHF reads.
const (
	F32 DType = iota
	F16
	BF16
)

// String returns the safetensors name ("F32", "F16", "BF16").
func (d DType) String() string {
	switch d {
	case F32:
		return "F32"
	case F16:
		return "F16"
	case BF16:
		return "BF16"
	}
	return fmt.Sprintf("DType(%d)", int(d))
}

// TorchName returns the torch_dtype name written to config.json.
func (d DType) TorchName() string {
	switch d {
	case F16:
		return "float16"
	case BF16:
		return "bfloat16"
	}
	return "float32"
}

// Size is the number of bytes of one element.
func (d DType) Size() int {
	if d == F32 {
		return 4
	}
	return 2
}

func (d DType) valid() bool { return d == F32 || d == F16 || d == BF16 }

// ParseDType accepts a safetensors name (F32, F16, BF16) or a torch name (float32, float16,
// bfloat16, fp32, fp16, bf16), case-sensitively as written here.
func ParseDType(s string) (DType, error) {
	switch s {
	case "F32", "float32", "fp32", "f32":
		return F32, nil
	case "F16", "float16", "fp16", "f16":
		return F16, nil
	case "BF16", "bfloat16", "bf16":
		return BF16, nil
	}
	return 0, fmt.Errorf("%w: dtype %q (want F32, F16 or BF16)", ErrUnsupportedFormat, s)
}

// BF16ToFloat32 widens a bfloat16 bit pattern; every bfloat16 value is exactly representable.
func BF16ToFloat32(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// Float32ToBF16 rounds to the nearest bfloat16, ties to even, as torch does. NaNs stay NaN
// (quieted, sign kept) instead of rounding into infinity.
func Float32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 { // NaN: keep sign and top payload bits, force quiet bit
		return uint16(u>>16) | 0x0040
	}
	// Round to nearest even: add 0x7fff plus the lowest kept bit; overflow carries into the
	// exponent, which correctly rounds the largest finite values up to infinity.
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// F16ToFloat32 widens an IEEE half bit pattern (exact, subnormals included).
func F16ToFloat32(b uint16) float32 { return float16.Frombits(b).Float32() }

// Float32ToF16 rounds to the nearest IEEE half, ties to even; overflow becomes infinity.
func Float32ToF16(f float32) uint16 { return float16.Fromfloat32(f).Bits() }

// decode converts little-endian elements of dtype d from src into dst (len(dst) elements).
func decode(dst []float32, src []byte, d DType) {
	switch d {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case F16:
		for i := range dst {
			dst[i] = F16ToFloat32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case BF16:
		for i := range dst {
			dst[i] = BF16ToFloat32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	}
}

// encode appends src converted to dtype d, little-endian, to dst.
func encode(dst []byte, src []float32, d DType) []byte {
	switch d {
	case F32:
		for _, v := range src {
			dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
		}
	case F16:
		for _, v := range src {
			dst = binary.LittleEndian.AppendUint16(dst, Float32ToF16(v))
		}
	case BF16:
		for _, v := range src {
			dst = binary.LittleEndian.AppendUint16(dst, Float32ToBF16(v))
		}
	}
	return dst
}

// firstNonFinite returns the index of the first NaN or ±Inf in v, or -1. Every loaded weight
// passes through here, so the scan runs sixteen values at a time on their bits in pairs
// (finiteBlocks), and only a block that holds a non-finite value is walked one by one.
func firstNonFinite(v []float32) int {
	i := 0
	// A head value, if needed, so that the pairs are 8-byte aligned uint64 words.
	if len(v) > 0 && uintptr(unsafe.Pointer(unsafe.SliceData(v)))%8 != 0 {
		if !finite(v[0]) {
			return 0
		}
		i = 1
	}
	i += finiteBlocks(v[i:])
	for ; i < len(v); i++ {
		if !finite(v[i]) {
			return i
		}
	}
	return -1
}

func finite(x float32) bool { return math.Float32bits(x)&0x7f800000 != 0x7f800000 }

// finiteBlocks returns how many leading values of v (8-byte aligned) are in whole blocks of
// sixteen that are all finite. Each uint64 holds two values: its exponent fields XOR all ones
// are zero in a lane exactly when that value is NaN or ±Inf, and since a lane is then below
// 1<<31, subtracting one from each lane sets the lane's top bit only for a zero lane (a borrow
// into the next lane comes only from a zero lane too), so one test per block decides.
func finiteBlocks(v []float32) int {
	const (
		exp = 0x7f8000007f800000
		one = 0x0000000100000001
		top = 0x8000000080000000
	)
	if len(v) < 16 {
		return 0
	}
	w := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(v))), len(v)/2)
	i := 0
	for ; i+8 <= len(w); i += 8 {
		b := w[i : i+8 : i+8]
		if ((b[0]&exp^exp-one)|(b[1]&exp^exp-one)|(b[2]&exp^exp-one)|(b[3]&exp^exp-one)|
			(b[4]&exp^exp-one)|(b[5]&exp^exp-one)|(b[6]&exp^exp-one)|(b[7]&exp^exp-one))&top != 0 {
			break
		}
	}
	return 2 * i
}
