package weights

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/model"
)

// runc is an independent transcription of llama2.c's run.c forward pass over the raw,
// unconverted tensors of a .bin file: RoPE rotates adjacent pairs (2i, 2i+1), exactly as
// run.c does. It shares nothing with the loader except the file bytes.
type runc struct {
	dim, hidden, layers, heads, kvHeads, vocab, seqLen int
	shared                                             bool
	emb, rmsAtt, wq, wk, wv, wo, rmsFFN, w1, w2, w3    []float32
	rmsFinal, wcls                                     []float32
	keyCache, valCache                                 []float32
}

func parseRunc(t *testing.T, b []byte) *runc {
	t.Helper()
	var h [7]int32
	for i := range h {
		h[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
	}
	m := &runc{dim: int(h[0]), hidden: int(h[1]), layers: int(h[2]), heads: int(h[3]), kvHeads: int(h[4]),
		vocab: int(h[5]), seqLen: int(h[6]), shared: h[5] > 0}
	if m.vocab < 0 {
		m.vocab = -m.vocab
	}
	off := 28
	take := func(n int) []float32 {
		out := make([]float32, n)
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[off+4*i:]))
		}
		off += 4 * n
		return out
	}
	hs := m.dim / m.heads
	kvDim := m.dim * m.kvHeads / m.heads
	l := m.layers
	m.emb = take(m.vocab * m.dim)
	m.rmsAtt = take(l * m.dim)
	m.wq = take(l * m.dim * m.dim)
	m.wk = take(l * m.dim * kvDim)
	m.wv = take(l * m.dim * kvDim)
	m.wo = take(l * m.dim * m.dim)
	m.rmsFFN = take(l * m.dim)
	m.w1 = take(l * m.dim * m.hidden)
	m.w2 = take(l * m.hidden * m.dim)
	m.w3 = take(l * m.dim * m.hidden)
	m.rmsFinal = take(m.dim)
	off += 4 * m.seqLen * hs / 2 // freq_cis_real
	off += 4 * m.seqLen * hs / 2 // freq_cis_imag
	if m.shared {
		m.wcls = m.emb
	} else {
		m.wcls = take(m.vocab * m.dim)
	}
	require.Equal(t, len(b), off)
	m.keyCache = make([]float32, l*m.seqLen*kvDim)
	m.valCache = make([]float32, l*m.seqLen*kvDim)
	return m
}

func runcRMSNorm(o, x, w []float32) {
	var ss float32
	for _, v := range x {
		ss += v * v
	}
	ss /= float32(len(x))
	ss += 1e-5
	ss = 1 / float32(math.Sqrt(float64(ss)))
	for j := range o {
		o[j] = w[j] * (ss * x[j])
	}
}

// runcMatmul is W (d,n) @ x (n,) -> xout (d,).
func runcMatmul(xout, x, w []float32, n, d int) {
	for i := 0; i < d; i++ {
		var val float32
		for j := 0; j < n; j++ {
			val += w[i*n+j] * x[j]
		}
		xout[i] = val
	}
}

func runcSoftmax(x []float32) {
	maxVal := x[0]
	for _, v := range x[1:] {
		maxVal = max(maxVal, v)
	}
	var sum float32
	for i := range x {
		x[i] = float32(math.Exp(float64(x[i] - maxVal)))
		sum += x[i]
	}
	for i := range x {
		x[i] /= sum
	}
}

// forward is run.c's forward(transformer, token, pos), appending to the KV cache.
func (m *runc) forward(token, pos int) []float32 {
	dim, hs := m.dim, m.dim/m.heads
	kvDim := m.dim * m.kvHeads / m.heads
	kvMul := m.heads / m.kvHeads
	x := append([]float32(nil), m.emb[token*dim:(token+1)*dim]...)
	xb := make([]float32, dim)
	xb2 := make([]float32, dim)
	hb := make([]float32, m.hidden)
	hb2 := make([]float32, m.hidden)
	q := make([]float32, dim)
	att := make([]float32, m.seqLen)
	for l := 0; l < m.layers; l++ {
		runcRMSNorm(xb, x, m.rmsAtt[l*dim:(l+1)*dim])
		loff := l * m.seqLen * kvDim
		k := m.keyCache[loff+pos*kvDim : loff+(pos+1)*kvDim]
		v := m.valCache[loff+pos*kvDim : loff+(pos+1)*kvDim]
		runcMatmul(q, xb, m.wq[l*dim*dim:], dim, dim)
		runcMatmul(k, xb, m.wk[l*dim*kvDim:], dim, kvDim)
		runcMatmul(v, xb, m.wv[l*dim*kvDim:], dim, kvDim)
		// RoPE relative positional encoding: complex-valued rotate q and k in each head.
		for i := 0; i < dim; i += 2 {
			headDim := i % hs
			freq := 1 / float32(math.Pow(10000, float64(float32(headDim)/float32(hs))))
			val := float32(pos) * freq
			fcr := float32(math.Cos(float64(val)))
			fci := float32(math.Sin(float64(val)))
			rotn := 1
			if i < kvDim {
				rotn = 2
			}
			for r := 0; r < rotn; r++ {
				vec := q
				if r == 1 {
					vec = k
				}
				v0, v1 := vec[i], vec[i+1]
				vec[i] = v0*fcr - v1*fci
				vec[i+1] = v0*fci + v1*fcr
			}
		}
		for h := 0; h < m.heads; h++ {
			qh := q[h*hs : (h+1)*hs]
			a := att[:pos+1]
			for t := 0; t <= pos; t++ {
				kt := m.keyCache[loff+t*kvDim+(h/kvMul)*hs:]
				var score float32
				for i := 0; i < hs; i++ {
					score += qh[i] * kt[i]
				}
				a[t] = score / float32(math.Sqrt(float64(hs)))
			}
			runcSoftmax(a)
			xbh := xb[h*hs : (h+1)*hs]
			clear(xbh)
			for t := 0; t <= pos; t++ {
				vt := m.valCache[loff+t*kvDim+(h/kvMul)*hs:]
				for i := 0; i < hs; i++ {
					xbh[i] += a[t] * vt[i]
				}
			}
		}
		runcMatmul(xb2, xb, m.wo[l*dim*dim:], dim, dim)
		for i := range x {
			x[i] += xb2[i]
		}
		runcRMSNorm(xb, x, m.rmsFFN[l*dim:(l+1)*dim])
		runcMatmul(hb, xb, m.w1[l*dim*m.hidden:], dim, m.hidden)
		runcMatmul(hb2, xb, m.w3[l*dim*m.hidden:], dim, m.hidden)
		for i := range hb {
			val := hb[i]
			val *= 1 / (1 + float32(math.Exp(float64(-val))))
			hb[i] = val * hb2[i]
		}
		runcMatmul(xb, hb, m.w2[l*dim*m.hidden:], m.hidden, dim)
		for i := range x {
			x[i] += xb[i]
		}
	}
	runcRMSNorm(x, x, m.rmsFinal)
	logits := make([]float32, m.vocab)
	runcMatmul(logits, x, m.wcls, dim, m.vocab)
	return logits
}

func argmax(v []float32) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}

// rawLlama2C writes a .bin of seeded random tensors directly in llama2.c layout (not through
// SaveLlama2C), so the loader's conversion is checked against run.c on its own.
func rawLlama2C(t *testing.T, path string, h [7]int32, seed uint64) {
	t.Helper()
	dim, hidden, l, heads, kvh, vocab, seq := int(h[0]), int(h[1]), int(h[2]), int(h[3]), int(h[4]), int(h[5]), int(h[6])
	shared := vocab > 0
	if !shared {
		vocab = -vocab
	}
	kvDim := dim * kvh / heads
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, 0, 1<<16)
	for _, v := range h {
		b = binary.LittleEndian.AppendUint32(b, uint32(v))
	}
	put := func(n int, std, mean float64) {
		for range n {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(mean+r.NormFloat64()*std)))
		}
	}
	lin := func(n, fanIn int) { put(n, 1/math.Sqrt(float64(fanIn)), 0) }
	put(vocab*dim, 1, 0)
	put(l*dim, 0.1, 1)
	lin(l*dim*dim, dim)
	lin(l*kvDim*dim, dim)
	lin(l*kvDim*dim, dim)
	lin(l*dim*dim, dim)
	put(l*dim, 0.1, 1)
	lin(l*hidden*dim, dim)
	lin(l*dim*hidden, hidden)
	lin(l*hidden*dim, dim)
	put(dim, 0.1, 1)
	put(seq*dim/heads, 1, 0) // freq_cis: unused, so garbage is fine
	if !shared {
		put(vocab*dim, 1, 0)
	}
	writeFile(t, path, b)
}

// requireMatchesRunc checks model.Reference on the loaded weights against run.c on the raw
// file: logits at every position of a prompt, then greedy continuation.
func requireMatchesRunc(t *testing.T, w *model.Weights, file []byte, prompt []int, steps int) {
	t.Helper()
	m := parseRunc(t, file)
	ref, err := model.Reference(w, prompt)
	require.NoError(t, err)
	for pos, tok := range prompt {
		got := m.forward(tok, pos)
		for i := range got {
			d := math.Abs(float64(got[i] - ref[pos][i]))
			require.LessOrEqual(t, d, 1e-4*math.Max(1, math.Abs(float64(ref[pos][i]))),
				"pos %d logit %d: run.c %v, Reference %v", pos, i, got[i], ref[pos][i])
		}
	}
	// Greedy decoding: run.c incrementally, Reference over the whole sequence each step.
	seq := append([]int(nil), prompt...)
	next := argmax(ref[len(prompt)-1])
	for range steps {
		seq = append(seq, next)
		lr := m.forward(next, len(seq)-1)
		ref, err := model.Reference(w, seq)
		require.NoError(t, err)
		a, b := argmax(lr), argmax(ref[len(seq)-1])
		require.Equal(t, a, b, "greedy token at position %d", len(seq))
		next = a
	}
}

func TestLlama2CMatchesRunC(t *testing.T) {
	headers := map[string][7]int32{
		"gqa untied": {16, 40, 2, 4, 2, -37, 32},
		"mha tied":   {24, 64, 3, 3, 3, 50, 32},
	}
	for name, h := range headers {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "model.bin")
			rawLlama2C(t, path, h, 42)
			w, err := LoadLlama2C(path)
			require.NoError(t, err)
			requireMatchesRunc(t, w, readFile(t, path), []int{1, 5, 9, 3, 7, 2, 11, 4}, 8)

			// Saving the loaded weights reproduces the file's tensors byte for byte (the
			// unused freq_cis tables are regenerated, so they are excluded).
			out := filepath.Join(t.TempDir(), "again.bin")
			require.NoError(t, SaveLlama2C(out, w))
			a, b := readFile(t, path), readFile(t, out)
			require.Len(t, b, len(a))
			c := w.Config
			fcStart := int(llama2cSize(c)) - 4*c.MaxPositionEmbeddings*c.HeadDim()
			if !c.TieWordEmbeddings {
				fcStart -= 4 * c.VocabSize * c.HiddenSize
			}
			fcEnd := fcStart + 4*c.MaxPositionEmbeddings*c.HeadDim()
			require.Equal(t, a[:fcStart], b[:fcStart])
			require.Equal(t, a[fcEnd:], b[fcEnd:])
		})
	}
}

func TestPresetThroughLlama2CMatchesRunC(t *testing.T) {
	// HF-layout weights saved as .bin: run.c on that file must agree with Reference on the
	// original weights, which checks SaveLlama2C's conversion independently of the loader.
	w, err := model.Preset("tiny", 5)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "tiny.bin")
	require.NoError(t, SaveLlama2C(path, w))
	requireMatchesRunc(t, w, readFile(t, path), []int{256, 72, 101, 108, 108, 111}, 6)
}
