package gguf

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
)

// keyValue is one metadata pair; val is a uint32, int32, float32, bool, string, []string,
// []float32 or []int32.
type keyValue struct {
	key string
	val any
}

// GGUF metadata value types.
const (
	tUint32  = 4
	tInt32   = 5
	tFloat32 = 6
	tBool    = 7
	tString  = 8
	tArray   = 9
)

// enc writes little-endian GGUF values, keeping the first error and the byte count.
type enc struct {
	w   io.Writer
	n   int64
	err error
	b   [8]byte
}

func (e *enc) raw(p []byte) {
	if e.err != nil {
		return
	}
	var k int
	k, e.err = e.w.Write(p)
	e.n += int64(k)
}

func (e *enc) u32(v uint32) {
	binary.LittleEndian.PutUint32(e.b[:4], v)
	e.raw(e.b[:4])
}

func (e *enc) u64(v uint64) {
	binary.LittleEndian.PutUint64(e.b[:], v)
	e.raw(e.b[:])
}

func (e *enc) str(s string) {
	e.u64(uint64(len(s)))
	e.raw([]byte(s))
}

func (e *enc) zeros(n int64) { e.raw(make([]byte, n)) }

// value writes a typed value: its type tag, then the value.
func (e *enc) value(v any) {
	switch x := v.(type) {
	case uint32:
		e.u32(tUint32)
		e.u32(x)
	case int32:
		e.u32(tInt32)
		e.u32(uint32(x))
	case float32:
		e.u32(tFloat32)
		e.u32(math.Float32bits(x))
	case bool:
		e.u32(tBool)
		b := byte(0)
		if x {
			b = 1
		}
		e.raw([]byte{b})
	case string:
		e.u32(tString)
		e.str(x)
	case []string:
		e.u32(tArray)
		e.u32(tString)
		e.u64(uint64(len(x)))
		for _, s := range x {
			e.str(s)
		}
	case []float32:
		e.u32(tArray)
		e.u32(tFloat32)
		e.u64(uint64(len(x)))
		for _, f := range x {
			e.u32(math.Float32bits(f))
		}
	case []int32:
		e.u32(tArray)
		e.u32(tInt32)
		e.u64(uint64(len(x)))
		for _, i := range x {
			e.u32(uint32(i))
		}
	default:
		if e.err == nil {
			e.err = fmt.Errorf("metadata value of type %T", v)
		}
	}
}
