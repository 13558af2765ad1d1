package weights

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBF16Conversion(t *testing.T) {
	// Every bfloat16 bit pattern widens and narrows back to itself (NaNs stay NaN).
	for b := 0; b < 1<<16; b++ {
		f := BF16ToFloat32(uint16(b))
		got := Float32ToBF16(f)
		if math.IsNaN(float64(f)) {
			require.True(t, math.IsNaN(float64(BF16ToFloat32(got))), "NaN %#04x became %#04x", b, got)
			continue
		}
		require.Equal(t, uint16(b), got, "bf16 %#04x", b)
	}
	cases := []struct {
		in   float32
		want uint16
	}{
		{1, 0x3f80},
		{-2, 0xc000},
		{float32(math.Inf(1)), 0x7f80},
		{float32(math.Inf(-1)), 0xff80},
		{math.Float32frombits(0x3f808000), 0x3f80}, // exact tie, even below: rounds down
		{math.Float32frombits(0x3f818000), 0x3f82}, // exact tie, odd below: rounds up
		{math.Float32frombits(0x3f808001), 0x3f81}, // just above the tie
		{math.Float32frombits(0x7f7fffff), 0x7f80}, // max float32 rounds to +Inf
		{math.Float32frombits(0x00000001), 0x0000}, // smallest subnormal rounds to 0
		{math.Float32frombits(0x00010000), 0x0001}, // smallest bf16 subnormal is exact
	}
	for _, c := range cases {
		assert.Equal(t, c.want, Float32ToBF16(c.in), "%v (%#08x)", c.in, math.Float32bits(c.in))
	}
	// A signalling-looking NaN whose payload is only in the low bits must not become Inf.
	nan := math.Float32frombits(0x7f800001)
	assert.True(t, math.IsNaN(float64(BF16ToFloat32(Float32ToBF16(nan)))))
}

func TestF16Conversion(t *testing.T) {
	for b := 0; b < 1<<16; b++ {
		f := F16ToFloat32(uint16(b))
		got := Float32ToF16(f)
		if math.IsNaN(float64(f)) {
			require.True(t, math.IsNaN(float64(F16ToFloat32(got))), "NaN %#04x", b)
			continue
		}
		require.Equal(t, uint16(b), got, "f16 %#04x (%v)", b, f)
	}
	assert.Equal(t, float32(math.Ldexp(1, -24)), F16ToFloat32(0x0001), "smallest subnormal")
	assert.Equal(t, float32(65504), F16ToFloat32(0x7bff))
	assert.Equal(t, uint16(0x7c00), Float32ToF16(1e6), "overflow is +Inf")
	assert.Equal(t, uint16(0xfc00), Float32ToF16(float32(math.Inf(-1))))
	assert.Equal(t, uint16(0x3c00), Float32ToF16(1+1.0/2048), "tie rounds to even (down)")
	assert.Equal(t, uint16(0x3c02), Float32ToF16(1+3.0/2048), "tie rounds to even (up)")
}

func TestEncodeDecode(t *testing.T) {
	vals := []float32{0, 1, -1, 0.1, 3.14159, -1e-3, 65504, 1e-6}
	for _, d := range []DType{F32, F16, BF16} {
		b := encode(nil, vals, d)
		require.Len(t, b, len(vals)*d.Size())
		got := make([]float32, len(vals))
		decode(got, b, d)
		for i, v := range vals {
			switch d {
			case F32:
				assert.Equal(t, v, got[i])
			case F16:
				assert.Equal(t, F16ToFloat32(Float32ToF16(v)), got[i])
			case BF16:
				assert.Equal(t, BF16ToFloat32(Float32ToBF16(v)), got[i])
				assert.InEpsilon(t, v+1e-30, got[i]+1e-30, 1.0/128)
			}
		}
	}
}

func TestParseDType(t *testing.T) {
	for s, want := range map[string]DType{"F32": F32, "float16": F16, "bf16": BF16, "BF16": BF16} {
		d, err := ParseDType(s)
		require.NoError(t, err)
		assert.Equal(t, want, d)
	}
	_, err := ParseDType("int8")
	require.ErrorIs(t, err, ErrUnsupportedFormat)
}

func TestFirstNonFinite(t *testing.T) {
	// Every position of a block and the scalar tail, each kind of non-finite value,
	// and the largest finite values around them (exponent 0xfe: not a hit).
	big := math.Float32frombits(0x7f7fffff)
	// Sizes around the blocks of sixteen, from an 8-byte aligned start and from one past it.
	for _, c := range []struct{ n, off int }{{0, 0}, {1, 0}, {7, 0}, {8, 0}, {9, 0}, {16, 0}, {23, 0}, {24, 0}, {31, 0},
		{32, 0}, {33, 0}, {47, 0}, {48, 0}, {1, 1}, {16, 1}, {17, 1}, {33, 1}, {50, 1}} {
		n := c.n
		v := make([]float32, n+1)[c.off:][:n]
		for i := range v {
			v[i] = big
			if i%2 == 1 {
				v[i] = -big
			}
		}
		require.Equal(t, -1, firstNonFinite(v), "n=%d all finite", n)
		for p := range n {
			for _, bad := range []float32{float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), math.Float32frombits(0xffc00001)} {
				w := make([]float32, n+1)[c.off:][:n]
				copy(w, v)
				w[p] = bad
				if p+1 < n {
					w[n-1] = float32(math.NaN()) // a later hit must not win
				}
				require.Equal(t, p, firstNonFinite(w), "n=%d hit at %d (%#x)", n, p, math.Float32bits(bad))
			}
		}
	}
}
