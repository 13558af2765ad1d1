package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/x448/float16"

	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/tokenizer"
	"github.com/rolloutkit/rollout/engine/weights"
)

// ErrUnsupported is returned (wrapped) for a tensor type, model or vocabulary that has no GGUF
// form here.
var ErrUnsupported = errors.New("gguf: unsupported")

// Type is a ggml tensor type: the precision matrices are written in.
type Type uint32

// The tensor types Write produces (ggml's numbering).
const (
	F32  Type = 0
	F16  Type = 1
	Q8_0 Type = 8
	BF16 Type = 30
)

// Types lists the names ParseType accepts, in the order of increasing compression.
func Types() []string { return []string{"f32", "bf16", "f16", "q8_0"} }

// ParseType parses "f32", "bf16", "f16" or "q8_0".
func ParseType(s string) (Type, error) {
	switch strings.ToLower(s) {
	case "f32":
		return F32, nil
	case "bf16":
		return BF16, nil
	case "f16":
		return F16, nil
	case "q8_0":
		return Q8_0, nil
	}
	return 0, fmt.Errorf("%w: tensor type %q (want one of %v)", ErrUnsupported, s, Types())
}

// String is the type's name as ParseType takes it.
func (t Type) String() string {
	switch t {
	case F32:
		return "f32"
	case F16:
		return "f16"
	case BF16:
		return "bf16"
	case Q8_0:
		return "q8_0"
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// fileType is general.file_type: llama.cpp's LLAMA_FTYPE of a file whose matrices are t.
func (t Type) fileType() uint32 {
	switch t {
	case F16:
		return 1 // MOSTLY_F16
	case BF16:
		return 32 // MOSTLY_BF16
	case Q8_0:
		return 7 // MOSTLY_Q8_0
	}
	return 0 // ALL_F32
}

// q8Block is the number of weights sharing one Q8_0 scale.
const q8Block = 32

// rowBytes is the size of one row of cols weights stored as t.
func (t Type) rowBytes(cols int) int64 {
	switch t {
	case F16, BF16:
		return 2 * int64(cols)
	case Q8_0:
		return int64(cols/q8Block) * (2 + q8Block)
	}
	return 4 * int64(cols)
}

// alignment is GGUF's default general.alignment: the data section and every tensor in it
// start at a multiple of it.
const alignment = 32

// Architecture is the llama.cpp architecture c is written as: "qwen2" when it has q/k/v
// biases, else "llama".
func Architecture(c model.Config) string {
	if c.AttentionBias {
		return "qwen2"
	}
	return "llama"
}

// tensor is one tensor to write: its GGUF name, its ggml dims (innermost first) and type, and
// its rows in order (a 1-D tensor is one row).
type tensor struct {
	name string
	dims []uint64
	typ  Type
	rows int
	cols int
	row  func(r int) []float32
	off  uint64
}

func (t *tensor) bytes() int64 { return int64(t.rows) * t.typ.rowBytes(t.cols) }

// matrix is an [out][in] HF matrix as a tensor of type typ (F16 when its rows do not split
// into Q8_0 blocks); perm, when not nil, maps an output row to the source row.
func matrix(name string, data []float32, rows, cols int, typ Type, perm func(int) int) tensor {
	if typ == Q8_0 && cols%q8Block != 0 {
		typ = F16
	}
	return tensor{name: name, dims: []uint64{uint64(cols), uint64(rows)}, typ: typ, rows: rows, cols: cols,
		row: func(r int) []float32 {
			if perm != nil {
				r = perm(r)
			}
			return data[r*cols : (r+1)*cols]
		}}
}

// vector is a 1-D tensor, always F32.
func vector(name string, data []float32) tensor {
	return tensor{name: name, dims: []uint64{uint64(len(data))}, typ: F32, rows: 1, cols: len(data),
		row: func(int) []float32 { return data }}
}

// interleave maps a row of the llama-arch q or k matrix to the HF row it comes from:
// llama.cpp rotates adjacent pairs (2j, 2j+1) of a head where HF rotates (j, j+hd/2).
func interleave(hd int) func(int) int {
	return func(r int) int {
		h, i := r/hd, r%hd
		return h*hd + (i%2)*(hd/2) + i/2
	}
}

// tensors lists w's tensors under llama.cpp's names, in the order Write stores them.
func tensors(w *model.Weights, typ Type) []tensor {
	c := w.Config
	h, f, kvd, v, hd := c.HiddenSize, c.IntermediateSize, c.KVDim(), c.VocabSize, c.HeadDim()
	var perm func(int) int
	if Architecture(c) == "llama" {
		perm = interleave(hd)
	}
	ts := []tensor{matrix("token_embd.weight", w.Embed, v, h, typ, nil)}
	if c.RopeScaling != nil {
		base := c
		base.RopeScaling = nil
		plain, scaled := base.RopeInvFreq(), c.RopeInvFreq()
		div := make([]float32, len(plain))
		for i := range div {
			div[i] = float32(plain[i] / scaled[i])
		}
		ts = append(ts, vector("rope_freqs.weight", div))
	}
	for i := range w.Layers {
		l := &w.Layers[i]
		p := fmt.Sprintf("blk.%d.", i)
		ts = append(ts,
			vector(p+"attn_norm.weight", l.AttnNorm),
			matrix(p+"attn_q.weight", l.Wq, h, h, typ, perm),
			matrix(p+"attn_k.weight", l.Wk, kvd, h, typ, perm),
			matrix(p+"attn_v.weight", l.Wv, kvd, h, typ, nil),
		)
		if c.AttentionBias {
			ts = append(ts, vector(p+"attn_q.bias", l.Bq), vector(p+"attn_k.bias", l.Bk), vector(p+"attn_v.bias", l.Bv))
		}
		ts = append(ts,
			matrix(p+"attn_output.weight", l.Wo, h, h, typ, nil),
			vector(p+"ffn_norm.weight", l.FFNNorm),
			matrix(p+"ffn_gate.weight", l.WGate, f, h, typ, nil),
			matrix(p+"ffn_down.weight", l.WDown, h, f, typ, nil),
			matrix(p+"ffn_up.weight", l.WUp, f, h, typ, nil),
		)
	}
	ts = append(ts, vector("output_norm.weight", w.FinalNorm))
	if !c.TieWordEmbeddings {
		ts = append(ts, matrix("output.weight", w.LMHead, v, h, typ, nil))
	}
	return ts
}

// Write writes w and its vocabulary tok as GGUF v3 with matrices of type typ; name goes into
// general.name. Tensors are converted a row at a time, so memory use does not grow with the
// model.
func Write(out io.Writer, w *model.Weights, tok tokenizer.Tokenizer, typ Type, name string) error {
	if typ != F32 && typ != F16 && typ != BF16 && typ != Q8_0 {
		return fmt.Errorf("%w: tensor type %v", ErrUnsupported, typ)
	}
	if err := w.Check(); err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	c := w.Config
	voc, err := vocabulary(tok, c)
	if err != nil {
		return err
	}
	ts := tensors(w, typ)
	var off uint64
	for i := range ts {
		ts[i].off = off
		off += uint64(pad(ts[i].bytes()))
	}

	arch := Architecture(c)
	kv := []keyValue{
		{"general.architecture", arch},
		{"general.name", name},
		{"general.file_type", typ.fileType()},
		{"general.quantization_version", uint32(2)},
		{"general.alignment", uint32(alignment)},
		{arch + ".vocab_size", uint32(c.VocabSize)},
		{arch + ".context_length", uint32(c.MaxPositionEmbeddings)},
		{arch + ".embedding_length", uint32(c.HiddenSize)},
		{arch + ".block_count", uint32(c.NumHiddenLayers)},
		{arch + ".feed_forward_length", uint32(c.IntermediateSize)},
		{arch + ".rope.dimension_count", uint32(c.HeadDim())},
		{arch + ".attention.head_count", uint32(c.NumAttentionHeads)},
		{arch + ".attention.head_count_kv", uint32(c.NumKeyValueHeads)},
		{arch + ".attention.layer_norm_rms_epsilon", float32(c.RMSNormEps)},
		{arch + ".rope.freq_base", float32(c.RopeTheta)},
	}
	kv = append(kv, voc...)

	bw := bufio.NewWriterSize(out, 1<<20)
	e := &enc{w: bw}
	e.raw([]byte("GGUF"))
	e.u32(3)
	e.u64(uint64(len(ts)))
	e.u64(uint64(len(kv)))
	for _, p := range kv {
		e.str(p.key)
		e.value(p.val)
	}
	for _, t := range ts {
		e.str(t.name)
		e.u32(uint32(len(t.dims)))
		for _, d := range t.dims {
			e.u64(d)
		}
		e.u32(uint32(t.typ))
		e.u64(t.off)
	}
	e.zeros(pad(e.n) - e.n)
	buf := make([]byte, 0, 4*c.IntermediateSize+4*c.HiddenSize)
	for _, t := range ts {
		for r := range t.rows {
			buf = appendRow(buf[:0], t.typ, t.row(r))
			e.raw(buf)
		}
		e.zeros(pad(t.bytes()) - t.bytes())
	}
	if e.err != nil {
		return fmt.Errorf("gguf: writing: %w", e.err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("gguf: writing: %w", err)
	}
	return nil
}

// WriteFile writes the GGUF file at path through a temporary file and a rename, so that a
// reader never sees a partial file.
func WriteFile(path string, w *model.Weights, tok tokenizer.Tokenizer, typ Type, name string) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err = Write(f, w, tok, typ, name); err != nil {
		return err
	}
	if err = f.Chmod(0o644); err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("gguf: writing %s: %w", path, err)
	}
	if err = os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	return nil
}

func pad(n int64) int64 { return (n + alignment - 1) / alignment * alignment }

// appendRow appends x encoded as t.
func appendRow(dst []byte, t Type, x []float32) []byte {
	switch t {
	case F16:
		for _, v := range x {
			dst = binary.LittleEndian.AppendUint16(dst, float16.Fromfloat32(v).Bits())
		}
	case BF16:
		for _, v := range x {
			dst = binary.LittleEndian.AppendUint16(dst, weights.Float32ToBF16(v)) // ggml rounds alike
		}
	case Q8_0:
		for b := 0; b+q8Block <= len(x); b += q8Block {
			dst = appendQ8Block(dst, x[b:b+q8Block])
		}
	default:
		for _, v := range x {
			dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
		}
	}
	return dst
}

// appendQ8Block quantizes 32 weights as ggml's quantize_row_q8_0_ref: scale d = max|x|/127
// (stored as f16), each weight round(x/d) with the reciprocal taken in f32 from the unrounded d.
func appendQ8Block(dst []byte, x []float32) []byte {
	var amax float32
	for _, v := range x {
		amax = max(amax, float32(math.Abs(float64(v))))
	}
	d := amax / 127
	var id float32
	if d != 0 {
		id = 1 / d
	}
	dst = binary.LittleEndian.AppendUint16(dst, float16.Fromfloat32(d).Bits())
	for _, v := range x {
		dst = append(dst, byte(int8(math.Round(float64(v*id)))))
	}
	return dst
}

// Q8Dequantize returns the weights a Q8_0 row of x reads back as in llama.cpp: what a
// comparison against a q8_0 file must run on. len(x) must be a multiple of 32.
func Q8Dequantize(x []float32) []float32 {
	out := make([]float32, len(x))
	for b := 0; b+q8Block <= len(x); b += q8Block {
		blk := appendQ8Block(nil, x[b:b+q8Block])
		d := float16.Frombits(binary.LittleEndian.Uint16(blk)).Float32()
		for j := range q8Block {
			out[b+j] = float32(int8(blk[2+j])) * d
		}
	}
	return out
}
