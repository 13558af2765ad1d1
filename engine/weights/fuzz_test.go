package weights

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"math"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzSafetensorsHeader feeds arbitrary bytes to the safetensors header validator and data
// reader: they must return an error or a header whose entries tile the data section exactly,
// and never panic or allocate beyond what the input's size allows.
func FuzzSafetensorsHeader(f *testing.F) {
	dir := f.TempDir()
	require.NoError(f, SaveHF(dir, randomWeights(f, smallConfig(), 1), BF16))
	valid, err := osReadFile(filepath.Join(dir, SafetensorsFile))
	require.NoError(f, err)
	f.Add(valid)
	f.Add(valid[:len(valid)/2])
	f.Add([]byte{})
	f.Add(joinRawST([]byte(`{}`), nil))
	f.Add(joinRawST([]byte(`{"__metadata__":{"format":"pt"}}`), nil))
	f.Add(joinRawST([]byte(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`), make([]byte, 8)))
	f.Add(joinRawST([]byte(`{"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},"b":{"dtype":"BF16","shape":[1],"data_offsets":[2,4]}}`), make([]byte, 4)))
	f.Add(joinRawST([]byte(`{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}`), nil))
	f.Add(joinRawST([]byte(`{"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}`), []byte{0, 0, 0xc0, 0x7f}))
	f.Add(binary.LittleEndian.AppendUint64(nil, 1<<62))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := readSTHeader(bytes.NewReader(data), int64(len(data)), "fuzz")
		if err != nil {
			require.ErrorIs(t, err, ErrBadCheckpoint)
			return
		}
		dataLen := int64(len(data)) - h.dataStart()
		var pos int64
		dst := map[string]*[]float32{}
		for _, e := range h.tensors {
			require.Equal(t, pos, e.begin)
			pos = e.end
			dst[e.name] = new([]float32)
		}
		require.Equal(t, dataLen, pos)
		r := bytes.NewReader(data[h.dataStart():])
		if err := readSTData(context.Background(), r, sha256.New(), h, dst); err != nil {
			require.ErrorIs(t, err, ErrBadCheckpoint)
			return
		}
		for _, e := range h.tensors {
			n := 1
			for _, d := range e.shape {
				n *= d
			}
			require.Len(t, *dst[e.name], n, e.name)
		}
	})
}

// FuzzLlama2CHeader feeds arbitrary bytes to the llama2.c loader: it must return an error or
// weights that pass Check, and never panic or allocate from an unchecked header.
func FuzzLlama2CHeader(f *testing.F) {
	path := filepath.Join(f.TempDir(), "m.bin")
	require.NoError(f, SaveLlama2C(path, randomWeights(f, smallConfig(), 2)))
	valid, err := osReadFile(path)
	require.NoError(f, err)
	f.Add(valid)
	f.Add(valid[:28])
	f.Add(valid[:len(valid)-1])
	f.Add([]byte{})
	hdr := func(h ...int32) []byte {
		var b []byte
		for _, v := range h {
			b = binary.LittleEndian.AppendUint32(b, uint32(v))
		}
		return b
	}
	f.Add(hdr(8, 12, 1, 2, 1, -10, 16))
	f.Add(hdr(-8, 12, 1, 2, 1, 10, 16))
	f.Add(hdr(1<<30, 1<<30, 1<<30, 1, 1, 1<<30, 1<<30))
	f.Add(hdr(2, 2, 1, 1, 1, -2147483648, 1))
	f.Add(hdr(2, 1, 1, 1, 1, 3, 1))
	f.Fuzz(func(t *testing.T, data []byte) {
		w, err := readLlama2C(context.Background(), bytes.NewReader(data), int64(len(data)), "fuzz", nil)
		if err != nil {
			require.ErrorIs(t, err, ErrBadCheckpoint)
			return
		}
		require.NoError(t, w.Check())
		require.EqualValues(t, len(data), llama2cSize(w.Config))
	})
}

// FuzzParseHFConfig: any config.json is refused with an error or yields a config the model
// accepts, whose RoPE frequencies (the llama3 scaling's arithmetic included) are finite and
// not negative (an extreme rope_theta may underflow one to 0: no rotation, still a model).
func FuzzParseHFConfig(f *testing.F) {
	f.Add([]byte(llama32Config))
	f.Add([]byte(qwen25Config))
	f.Add([]byte(`{"hidden_size":8,"intermediate_size":12,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":10,` +
		`"rope_scaling":{"rope_type":"llama3","factor":1e308,"low_freq_factor":1e-300,"high_freq_factor":2,"original_max_position_embeddings":1}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := parseHFConfig(data)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("accepted a config Validate refuses: %v", err)
		}
		for i, v := range c.RopeInvFreq() {
			if !(v >= 0) || math.IsInf(v, 0) {
				t.Fatalf("inverse frequency %d is %v", i, v)
			}
		}
	})
}
