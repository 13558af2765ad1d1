//go:build (amd64 || arm64) && !purego

package kernels

import "unsafe"

// base is the address of the first panel.
func (m *Matrix) base() unsafe.Pointer {
	switch m.Prec {
	case BF16:
		return unsafe.Pointer(unsafe.SliceData(m.half))
	case Int8, W8A8:
		return unsafe.Pointer(unsafe.SliceData(m.q8))
	}
	return unsafe.Pointer(unsafe.SliceData(m.data))
}
