package weights

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"math"
	"sort"
	"strconv"

	"github.com/nlpodyssey/safetensors"

	"github.com/rolloutkit/rollout/engine/model"
)

// maxHeaderBytes caps a safetensors JSON header (the reference implementation uses 100 MB).
const maxHeaderBytes = 100 << 20

// chunkBytes is the read/convert granularity, so conversion never needs a second copy of a
// whole tensor's bytes.
const chunkBytes = 1 << 20

// readBufBytes is the buffer of the reader a checkpoint file is parsed through. It is much
// smaller than chunkBytes on purpose: a read at least as large as the buffer, with the buffer
// empty, goes straight from the file into the tensor, so bulk data is copied once (by the
// kernel) instead of through the buffer; only the headers and small tails use it. With a
// 1 MB buffer every chunk was copied twice, which made reading slower than hashing.
const readBufBytes = 64 << 10

// stTensor is one validated header entry; offsets are relative to the data section.
type stTensor struct {
	name       string
	dtype      DType
	shape      []int
	begin, end int64
}

// stHeader is a validated safetensors header.
type stHeader struct {
	file      string // for error messages
	headerLen int64  // length of the JSON header (the value of the 8-byte prefix)
	tensors   []stTensor
	byName    map[string]int
}

func (h *stHeader) dataStart() int64 { return 8 + h.headerLen }

func badf(file, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrBadCheckpoint, file, fmt.Sprintf(format, args...))
}

// readSTHeader reads and validates the header of a safetensors file of the given total size
// from r, leaving r at the start of the data section. Every offset is checked against size
// before any tensor memory is allocated: entries must be known float dtypes, sizes must equal
// shape × element size, and the entries must tile the data section exactly (no overlaps, no
// holes, nothing past the end), as the format specification requires.
func readSTHeader(r io.Reader, size int64, file string) (*stHeader, error) {
	if size < 8 {
		return nil, badf(file, "truncated: %d bytes, need at least 8 for the header length", size)
	}
	var prefix [8]byte
	if _, err := io.ReadFull(r, prefix[:]); err != nil {
		return nil, badf(file, "reading header length: %v", err)
	}
	n := binary.LittleEndian.Uint64(prefix[:])
	if n > maxHeaderBytes {
		return nil, badf(file, "header length %d exceeds the %d byte limit", n, maxHeaderBytes)
	}
	if int64(n) > size-8 {
		return nil, badf(file, "header length %d beyond file size %d", n, size)
	}
	js := make([]byte, n)
	if _, err := io.ReadFull(r, js); err != nil {
		return nil, badf(file, "reading %d byte header: %v", n, err)
	}
	h, err := parseSTHeader(js, size-8-int64(n), file)
	if err != nil {
		return nil, err
	}
	h.headerLen = int64(n)
	return h, nil
}

// parseSTHeader validates the JSON header against a data section of dataLen bytes.
func parseSTHeader(js []byte, dataLen int64, file string) (*stHeader, error) {
	if t := bytes.TrimLeft(js, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return nil, badf(file, "header is not a JSON object")
	}
	var md safetensors.Metadata
	if err := json.Unmarshal(js, &md); err != nil {
		return nil, badf(file, "header: %v", err)
	}
	infos := md.Tensors()
	h := &stHeader{file: file, tensors: make([]stTensor, 0, len(infos)), byName: make(map[string]int, len(infos))}
	for name, info := range infos {
		var d DType
		switch info.DType {
		case safetensors.F32:
			d = F32
		case safetensors.F16:
			d = F16
		case safetensors.BF16:
			d = BF16
		default:
			return nil, badf(file, "tensor %q: unsupported dtype %s (want F32, F16 or BF16)", name, info.DType)
		}
		shape := make([]int, len(info.Shape))
		elems := uint64(1)
		for i, dim := range info.Shape {
			if dim > math.MaxInt32 {
				return nil, badf(file, "tensor %q: dimension %d is %d", name, i, dim)
			}
			shape[i] = int(dim)
			if dim != 0 && elems > (1<<62)/dim {
				return nil, badf(file, "tensor %q: shape %v overflows", name, info.Shape)
			}
			elems *= dim
		}
		b, e := info.DataOffsets[0], info.DataOffsets[1]
		switch {
		case e < b:
			return nil, badf(file, "tensor %q: data_offsets [%d,%d] end before start", name, b, e)
		case e > uint64(dataLen):
			return nil, badf(file, "tensor %q: data_offsets [%d,%d] beyond the %d byte data section", name, b, e, dataLen)
		case e-b != elems*uint64(d.Size()):
			return nil, badf(file, "tensor %q: data_offsets [%d,%d] hold %d bytes, shape %v of %s needs %d",
				name, b, e, e-b, shape, d, elems*uint64(d.Size()))
		}
		h.tensors = append(h.tensors, stTensor{name: name, dtype: d, shape: shape, begin: int64(b), end: int64(e)})
	}
	sort.Slice(h.tensors, func(i, j int) bool {
		a, b := h.tensors[i], h.tensors[j]
		if a.begin != b.begin {
			return a.begin < b.begin
		}
		if a.end != b.end {
			return a.end < b.end
		}
		return a.name < b.name
	})
	var pos int64
	for i, t := range h.tensors {
		switch {
		case t.begin < pos:
			return nil, badf(file, "tensor %q: data_offsets [%d,%d] overlap tensor %q", t.name, t.begin, t.end, h.tensors[i-1].name)
		case t.begin > pos:
			return nil, badf(file, "tensor %q: hole of %d bytes before its data_offsets [%d,%d]", t.name, t.begin-pos, t.begin, t.end)
		}
		pos = t.end
		h.byName[t.name] = i
	}
	if pos != dataLen {
		return nil, badf(file, "tensors cover %d bytes but the data section has %d", pos, dataLen)
	}
	return h, nil
}

// readSTData streams the data section of h from r (positioned at its start) into sum, decoding
// the tensors named in dst into the slice each already points at when that has the tensor's
// length (memory of a reused set, see Options.Reuse), else into a new one, and discarding the
// rest (which are still hashed). Shapes in dst must already have been checked against h. It then
// requires r to be at EOF. Hashing runs on its own goroutine (hashPipe), F32 data on a
// little-endian host is read straight into its tensor, and other dtypes go through a few
// recycled chunk buffers, so a load costs about one pass of the hash.
func readSTData(ctx context.Context, r io.Reader, sum hash.Hash, h *stHeader, dst map[string]*[]float32, sink Sink) error {
	hp := newHashPipe(sum)
	defer hp.wait()
	var largest int64
	for _, t := range h.tensors {
		largest = max(largest, t.end-t.begin)
	}
	// Three buffers: one being filled, one being hashed, one spare.
	const buffers = 3
	free := make(chan []byte, buffers)
	made := 0
	buffer := func() []byte {
		if made < buffers && len(free) == 0 {
			made++
			return make([]byte, min(chunkBytes, largest))
		}
		return <-free
	}
	direct := nativeLittleEndian()
	for _, t := range h.tensors {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := t.end - t.begin
		p, ok := dst[t.name]
		if !ok {
			for off := int64(0); off < n; {
				b := buffer()
				c := min(n-off, int64(len(b)))
				if err := hp.readFull(r, b[:c], free); err != nil {
					return badf(h.file, "tensor %q: reading data: %v", t.name, err)
				}
				off += c
			}
			continue
		}
		es := int64(t.dtype.Size())
		var out []float32
		if sink != nil {
			out = sink.Buffer(int(n / es))
		} else {
			out = tensorFor(*p, int(n/es))
		}
		raw := float32Bytes(out)
		for off := int64(0); off < n; {
			if err := ctx.Err(); err != nil {
				return err
			}
			c := min(n-off, chunkBytes)
			seg := out[off/es : (off+c)/es]
			if direct && t.dtype == F32 && sink == nil {
				// The tensor's own bytes: nothing writes them again, so they need no recycling.
				// Not into a sink's memory, which the sink reuses once it has the tensor,
				// maybe before the hash has read it.
				if err := hp.readFull(r, raw[off:off+c], nil); err != nil {
					return badf(h.file, "tensor %q: reading data: %v", t.name, err)
				}
			} else {
				b := buffer()[:c]
				if _, err := io.ReadFull(r, b); err != nil {
					return badf(h.file, "tensor %q: reading data: %v", t.name, err)
				}
				decode(seg, b, t.dtype)
				hp.write(b, free) // queued only after decode has read it
			}
			if i := firstNonFinite(seg); i >= 0 {
				return badf(h.file, "tensor %q: element %d is %v", t.name, off/es+int64(i), seg[i])
			}
			off += c
		}
		if sink != nil {
			if err := sink.Put(t.name, out); err != nil {
				return badf(h.file, "tensor %q: %v", t.name, err)
			}
			continue
		}
		*p = out
	}
	var one [1]byte
	if k, err := r.Read(one[:]); k > 0 || (err != nil && !errors.Is(err, io.EOF)) {
		return badf(h.file, "unexpected data after the last tensor (file changed while reading?)")
	}
	return nil
}

// writeST writes tensors as one safetensors file in dtype d, streaming the conversion.
// It returns the number of bytes written.
func writeST(w io.Writer, ts []model.Tensor, d DType) (int64, error) {
	var hdr bytes.Buffer
	hdr.WriteString(`{"__metadata__":{"format":"pt"}`)
	var off int64
	for _, t := range ts {
		name, err := json.Marshal(t.Name)
		if err != nil {
			return 0, err
		}
		end := off + int64(len(*t.Data))*int64(d.Size())
		hdr.WriteByte(',')
		hdr.Write(name)
		hdr.WriteString(`:{"dtype":"` + d.String() + `","shape":[`)
		for i, s := range t.Shape {
			if i > 0 {
				hdr.WriteByte(',')
			}
			hdr.WriteString(strconv.Itoa(s))
		}
		fmt.Fprintf(&hdr, `],"data_offsets":[%d,%d]}`, off, end)
		off = end
	}
	hdr.WriteByte('}')
	// Pad with spaces so the data section starts 8-byte aligned, as the reference writer does.
	for hdr.Len()%8 != 0 {
		hdr.WriteByte(' ')
	}
	bw := bufio.NewWriterSize(w, chunkBytes)
	var prefix [8]byte
	binary.LittleEndian.PutUint64(prefix[:], uint64(hdr.Len()))
	if _, err := bw.Write(prefix[:]); err != nil {
		return 0, err
	}
	if _, err := bw.Write(hdr.Bytes()); err != nil {
		return 0, err
	}
	buf := make([]byte, 0, chunkBytes)
	per := chunkBytes / d.Size()
	for _, t := range ts {
		data := *t.Data
		for i := 0; i < len(data); i += per {
			buf = encode(buf[:0], data[i:min(i+per, len(data))], d)
			if _, err := bw.Write(buf); err != nil {
				return 0, err
			}
		}
	}
	if err := bw.Flush(); err != nil {
		return 0, err
	}
	return 8 + int64(hdr.Len()) + off, nil
}
