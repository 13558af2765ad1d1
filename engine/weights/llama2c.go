package weights

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/rolloutkit/rollout/engine/model"
)

// llama2cHeaderBytes is the size of the seven int32 fields of a legacy llama2.c checkpoint.
const llama2cHeaderBytes = 7 * 4

// Values llama2.c's run.c hard-codes, which its .bin header therefore cannot carry.
const (
	llama2cRopeTheta = 10000
	llama2cEps       = 1e-5
	llama2cBOS       = 1
	llama2cEOS       = 2
)

// llama2cConfig validates the seven header fields (dim, hidden_dim, n_layers, n_heads,
// n_kv_heads, vocab_size, seq_len; a negative vocab_size marks an untied classifier).
func llama2cConfig(h [7]int32, file string) (model.Config, error) {
	names := [7]string{"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"}
	for i, v := range h {
		if v == 0 || (v < 0 && i != 5) {
			return model.Config{}, badf(file, "header field %s is %d", names[i], v)
		}
	}
	vocab := int64(h[5])
	tied := vocab > 0
	if !tied {
		vocab = -vocab // int64, so -MinInt32 does not overflow
	}
	c := model.Config{
		HiddenSize:            int(h[0]),
		IntermediateSize:      int(h[1]),
		NumHiddenLayers:       int(h[2]),
		NumAttentionHeads:     int(h[3]),
		NumKeyValueHeads:      int(h[4]),
		VocabSize:             int(vocab),
		MaxPositionEmbeddings: int(h[6]),
		RopeTheta:             llama2cRopeTheta,
		RMSNormEps:            llama2cEps,
		TieWordEmbeddings:     tied,
		ModelType:             "llama",
		Architectures:         []string{"LlamaForCausalLM"},
		BOSTokenID:            llama2cBOS,
		EOSTokenID:            llama2cEOS,
		TorchDtype:            "float32",
	}
	// Validate bounds every field (and the parameter count), so llama2cSize cannot overflow.
	if err := c.Validate(); err != nil {
		return model.Config{}, badf(file, "header: %v", err)
	}
	return c, nil
}

// llama2cSize is the exact size of a legacy .bin file for c.
func llama2cSize(c model.Config) int64 {
	d, f, l, v := int64(c.HiddenSize), int64(c.IntermediateSize), int64(c.NumHiddenLayers), int64(c.VocabSize)
	kv, hs, seq := int64(c.KVDim()), int64(c.HeadDim()), int64(c.MaxPositionEmbeddings)
	n := v*d + l*(d+d*d+2*kv*d+d*d+d+3*f*d) + d + seq*hs // freq_cis real+imag: 2 × seq×hs/2
	if !c.TieWordEmbeddings {
		n += v * d
	}
	return llama2cHeaderBytes + 4*n
}

// LoadLlama2C loads a legacy llama2.c .bin checkpoint, converting q/k rows from llama2.c's
// interleaved RoPE pairs to the HF rotate-half layout. The header carries no RoPE base,
// epsilon or special tokens, so the config gets run.c's fixed values: rope_theta 10000,
// rms_norm_eps 1e-5, bos 1, eos 2.
func LoadLlama2C(path string) (*model.Weights, error) {
	w, _, err := loadLlama2C(context.Background(), osOpener{}, path, nil)
	return w, err
}

// loadLlama2C loads path through op, into reuse's tensors where they fit (see
// Options.Reuse), and returns the weights and the SHA-256 of the file.
func loadLlama2C(ctx context.Context, op fileOpener, path string, reuse *model.Weights) (*model.Weights, Info, error) {
	f, err := op.Open(path)
	if err != nil {
		return nil, Info{}, fmt.Errorf("%w: %w", ErrBadCheckpoint, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, Info{}, fmt.Errorf("%w: %w", ErrBadCheckpoint, err)
	}
	if !st.Mode().IsRegular() {
		return nil, Info{}, badf(path, "not a regular file")
	}
	h := sha256.New()
	hp := newHashPipe(h) // hashing overlaps reading, as for safetensors
	w, err := readLlama2C(ctx, &pipeReader{r: bufio.NewReaderSize(f, readBufBytes), hp: hp}, st.Size(), path, reuse)
	hp.wait()
	if err != nil {
		return nil, Info{}, err
	}
	return w, Info{Format: FormatLlama2C, Digest: fmt.Sprintf("%x", h.Sum(nil)), Bytes: st.Size()}, nil
}

// readLlama2C parses a .bin of the given total size from r, into reuse's tensors where they
// fit. The header is validated and the exact expected size compared with size before any
// tensor is allocated.
func readLlama2C(ctx context.Context, r io.Reader, size int64, file string, reuse *model.Weights) (*model.Weights, error) {
	if size < llama2cHeaderBytes {
		return nil, badf(file, "truncated: %d bytes, the header alone is %d", size, llama2cHeaderBytes)
	}
	var hdr [7]int32
	if err := binary.Read(r, binary.LittleEndian, &hdr); err != nil {
		return nil, badf(file, "reading header: %v", err)
	}
	c, err := llama2cConfig(hdr, file)
	if err != nil {
		return nil, err
	}
	if want := llama2cSize(c); size != want {
		return nil, badf(file, "size %d bytes, header %v implies %d", size, hdr, want)
	}
	d, f, kv, hs := c.HiddenSize, c.IntermediateSize, c.KVDim(), c.HeadDim()
	w := &model.Weights{Config: c}
	w.Tensors() // allocates w.Layers
	fill(w, reuseTensors(reuse))
	buf := make([]byte, min(chunkBytes, size))
	// read fills into (a tensor of reuse, or a new slice when it has not n elements) and
	// checks it.
	read := func(name string, into []float32, n int) ([]float32, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		out := tensorFor(into, n)
		if err := readF32(r, out, buf); err != nil {
			return nil, badf(file, "%s: %v", name, err)
		}
		if i := firstNonFinite(out); i >= 0 {
			return nil, badf(file, "%s: element %d is %v", name, i, out[i])
		}
		return out, nil
	}
	// The q and k rows arrive in llama2.c's order and are permuted into the layer's tensor,
	// through one scratch tensor for all of them. It is read straight from the file and hashed
	// from there, so it is only overwritten once the hasher is done with it (syncHash).
	var scratch []float32
	permuted := func(name string, dst []float32, heads, rows int) ([]float32, error) {
		if len(scratch) < rows*d {
			scratch = make([]float32, max(d, kv)*d)
		}
		syncHash(r)
		t, err := read(name, scratch[:rows*d], rows*d)
		if err != nil {
			return nil, err
		}
		return fromInterleaved(tensorFor(dst, rows*d), t, heads, hs, d), nil
	}
	// perLayer reads one [L][rows][cols] block into the tensor get gives of each layer.
	perLayer := func(name string, rows, cols int, get func(*model.Layer) *[]float32) error {
		for i := range w.Layers {
			p := get(&w.Layers[i])
			var t []float32
			var err error
			switch name {
			case "wq":
				t, err = permuted(fmt.Sprintf("%s[%d]", name, i), *p, c.NumAttentionHeads, rows)
			case "wk":
				t, err = permuted(fmt.Sprintf("%s[%d]", name, i), *p, c.NumKeyValueHeads, rows)
			default:
				t, err = read(fmt.Sprintf("%s[%d]", name, i), *p, rows*cols)
			}
			if err != nil {
				return err
			}
			*p = t
		}
		return nil
	}
	if w.Embed, err = read("token_embedding_table", w.Embed, c.VocabSize*d); err != nil {
		return nil, err
	}
	steps := []struct {
		name       string
		rows, cols int
		get        func(*model.Layer) *[]float32
	}{
		{"rms_att_weight", 1, d, func(y *model.Layer) *[]float32 { return &y.AttnNorm }},
		{"wq", d, d, func(y *model.Layer) *[]float32 { return &y.Wq }},
		{"wk", kv, d, func(y *model.Layer) *[]float32 { return &y.Wk }},
		{"wv", kv, d, func(y *model.Layer) *[]float32 { return &y.Wv }},
		{"wo", d, d, func(y *model.Layer) *[]float32 { return &y.Wo }},
		{"rms_ffn_weight", 1, d, func(y *model.Layer) *[]float32 { return &y.FFNNorm }},
		{"w1", f, d, func(y *model.Layer) *[]float32 { return &y.WGate }},
		{"w2", d, f, func(y *model.Layer) *[]float32 { return &y.WDown }},
		{"w3", f, d, func(y *model.Layer) *[]float32 { return &y.WUp }},
	}
	for _, s := range steps {
		if err := perLayer(s.name, s.rows, s.cols, s.get); err != nil {
			return nil, err
		}
	}
	if w.FinalNorm, err = read("rms_final_weight", w.FinalNorm, d); err != nil {
		return nil, err
	}
	// run.c skips the precomputed freq_cis tables; they are still read (and hashed).
	if _, err := io.CopyN(io.Discard, r, 4*int64(c.MaxPositionEmbeddings)*int64(hs)); err != nil {
		return nil, badf(file, "freq_cis: %v", err)
	}
	if !c.TieWordEmbeddings {
		if w.LMHead, err = read("wcls", w.LMHead, c.VocabSize*d); err != nil {
			return nil, err
		}
	}
	var one [1]byte
	if k, err := r.Read(one[:]); k > 0 || (err != nil && !errors.Is(err, io.EOF)) {
		return nil, badf(file, "unexpected data after wcls (file changed while reading?)")
	}
	if err := w.Check(); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrBadCheckpoint, file, err)
	}
	return w, nil
}

// syncHash waits until r, when it is a pipeReader, has hashed every byte read so far.
func syncHash(r io.Reader) {
	if pr, ok := r.(*pipeReader); ok {
		pr.hp.sync()
	}
}

// readF32 fills out with little-endian float32s from r, through buf; from a pipeReader on a
// little-endian host, straight into out.
func readF32(r io.Reader, out []float32, buf []byte) error {
	if pr, ok := r.(*pipeReader); ok && nativeLittleEndian() {
		raw := float32Bytes(out)
		for off := 0; off < len(raw); off += chunkBytes {
			if err := pr.readInto(raw[off:min(off+chunkBytes, len(raw))]); err != nil {
				return err
			}
		}
		return nil
	}
	per := len(buf) / 4
	for i := 0; i < len(out); i += per {
		n := min(per, len(out)-i)
		if _, err := io.ReadFull(r, buf[:4*n]); err != nil {
			return err
		}
		decode(out[i:i+n], buf[:4*n], F32)
	}
	return nil
}

// fromInterleaved converts the rows of a q or k projection ([heads×hd][cols]) from
// llama2.c's RoPE layout, which rotates adjacent rows (2j, 2j+1) of each head, to HF's
// rotate-half layout, which rotates (j, j+hd/2): HF row j ← row 2j, HF row j+hd/2 ← row 2j+1.
// This is the inverse of permute() in transformers' convert_llama_weights_to_hf.py. The rows
// are written into out (len(t) elements, not overlapping t), which is returned.
func fromInterleaved(out, t []float32, heads, hd, cols int) []float32 {
	half := hd / 2
	for h := range heads {
		base := h * hd
		for j := range half {
			copy(out[(base+j)*cols:(base+j+1)*cols], t[(base+2*j)*cols:(base+2*j+1)*cols])
			copy(out[(base+j+half)*cols:(base+j+half+1)*cols], t[(base+2*j+1)*cols:(base+2*j+2)*cols])
		}
	}
	return out
}

// toInterleaved is the inverse of fromInterleaved.
func toInterleaved(t []float32, heads, hd, cols int) []float32 {
	out := make([]float32, len(t))
	half := hd / 2
	for h := range heads {
		base := h * hd
		for j := range half {
			copy(out[(base+2*j)*cols:(base+2*j+1)*cols], t[(base+j)*cols:(base+j+1)*cols])
			copy(out[(base+2*j+1)*cols:(base+2*j+2)*cols], t[(base+j+half)*cols:(base+j+half+1)*cols])
		}
	}
	return out
}

// SaveLlama2C writes w as a legacy llama2.c .bin (q/k rows converted to interleaved pairs,
// freq_cis tables filled as llama2.c's exporter does). The format has no fields for the RoPE
// base or the norm epsilon, so weights whose rope_theta is not 10000 or whose rms_norm_eps is
// not 1e-5 are refused with ErrUnsupportedFormat rather than written to load differently. It
// has no fields for bos/eos either: LoadLlama2C always reports llama2.c's 1 and 2.
func SaveLlama2C(path string, w *model.Weights) error {
	if err := w.Check(); err != nil {
		return fmt.Errorf("weights: save %s: %w", path, err)
	}
	c := w.Config
	if c.RopeTheta != llama2cRopeTheta || c.RMSNormEps != llama2cEps {
		return fmt.Errorf("%w: llama2.c .bin fixes rope_theta=10000 and rms_norm_eps=1e-5, weights have %v and %v",
			ErrUnsupportedFormat, c.RopeTheta, c.RMSNormEps)
	}
	if c.AttentionBias || c.RopeScaling != nil {
		return fmt.Errorf("%w: llama2.c .bin has no q/k/v biases and no RoPE scaling", ErrUnsupportedFormat)
	}
	if c.MaxPositionEmbeddings > math.MaxInt32 || c.VocabSize > math.MaxInt32 {
		return fmt.Errorf("%w: shape does not fit the int32 header", ErrUnsupportedFormat)
	}
	return writeFileAtomic(path, func(out io.Writer) error {
		bw := bufio.NewWriterSize(out, chunkBytes)
		vocab := int32(c.VocabSize)
		if !c.TieWordEmbeddings {
			vocab = -vocab
		}
		hdr := [7]int32{int32(c.HiddenSize), int32(c.IntermediateSize), int32(c.NumHiddenLayers),
			int32(c.NumAttentionHeads), int32(c.NumKeyValueHeads), vocab, int32(c.MaxPositionEmbeddings)}
		if err := binary.Write(bw, binary.LittleEndian, hdr); err != nil {
			return err
		}
		buf := make([]byte, 0, chunkBytes)
		put := func(t []float32) error {
			for i := 0; i < len(t); i += chunkBytes / 4 {
				buf = encode(buf[:0], t[i:min(i+chunkBytes/4, len(t))], F32)
				if _, err := bw.Write(buf); err != nil {
					return err
				}
			}
			return nil
		}
		hs, d := c.HeadDim(), c.HiddenSize
		get := []func(*model.Layer) []float32{
			func(y *model.Layer) []float32 { return y.AttnNorm },
			func(y *model.Layer) []float32 { return toInterleaved(y.Wq, c.NumAttentionHeads, hs, d) },
			func(y *model.Layer) []float32 { return toInterleaved(y.Wk, c.NumKeyValueHeads, hs, d) },
			func(y *model.Layer) []float32 { return y.Wv },
			func(y *model.Layer) []float32 { return y.Wo },
			func(y *model.Layer) []float32 { return y.FFNNorm },
			func(y *model.Layer) []float32 { return y.WGate },
			func(y *model.Layer) []float32 { return y.WDown },
			func(y *model.Layer) []float32 { return y.WUp },
		}
		if err := put(w.Embed); err != nil {
			return err
		}
		for _, g := range get {
			for i := range w.Layers {
				if err := put(g(&w.Layers[i])); err != nil {
					return err
				}
			}
		}
		if err := put(w.FinalNorm); err != nil {
			return err
		}
		// freq_cis_real then freq_cis_imag, [seq_len][head_size/2], as export.py wrote them.
		half := hs / 2
		row := make([]float32, half)
		for _, part := range []func(float64) float64{math.Cos, math.Sin} {
			for pos := range c.MaxPositionEmbeddings {
				for i := range half {
					freq := 1 / math.Pow(llama2cRopeTheta, float64(2*i)/float64(hs))
					row[i] = float32(part(float64(pos) * freq))
				}
				if err := put(row); err != nil {
					return err
				}
			}
		}
		if !c.TieWordEmbeddings {
			if err := put(w.LMHead); err != nil {
				return err
			}
		}
		return bw.Flush()
	})
}
