package model

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/kvcache"
)

// harness gives each sequence its own consecutive blocks and runs chunks through Forward.
type harness struct {
	m      *Model
	kv     *kvcache.Storage
	tables [][]int32
	next   int32
}

func newHarness(t *testing.T, m *Model, blocks, blockSize int) *harness {
	t.Helper()
	kv, err := kvcache.NewStorage(m.KVLayout(blocks, blockSize))
	require.NoError(t, err)
	return &harness{m: m, kv: kv, next: 1}
}

func (h *harness) newSeq(maxTokens int) int32 {
	nb := (maxTokens + h.kv.BlockSize - 1) / h.kv.BlockSize
	table := make([]int32, nb)
	// Allocate from the top down in a permuted way so block ids are not the identity.
	for i := range table {
		table[i] = h.next
		h.next++
	}
	h.tables = append(h.tables, table)
	return int32(len(h.tables) - 1)
}

type piece struct {
	seq    int32
	tokens []int
	start  int
}

// step runs the pieces as one batch and returns the logits of each piece's last token.
func (h *harness) step(t *testing.T, pieces []piece) [][]float32 {
	t.Helper()
	var b Batch
	b.BlockTables = h.tables
	for _, p := range pieces {
		for i, id := range p.tokens {
			b.Tokens = append(b.Tokens, int32(id))
			b.Positions = append(b.Positions, int32(p.start+i))
			b.Seq = append(b.Seq, p.seq)
		}
		b.Logits = append(b.Logits, int32(len(b.Tokens)-1))
	}
	v := h.m.Config.VocabSize
	out := make([]float32, len(pieces)*v)
	require.NoError(t, h.m.Forward(&b, h.kv, out))
	rows := make([][]float32, len(pieces))
	for i := range rows {
		rows[i] = out[i*v : (i+1)*v]
	}
	return rows
}

func randomTokens(r *rand.Rand, n, vocab int) []int {
	ts := make([]int, n)
	for i := range ts {
		ts[i] = r.IntN(vocab)
	}
	return ts
}

func maxAbsDiff(a, b []float32) float64 {
	d := 0.0
	for i := range a {
		d = math.Max(d, math.Abs(float64(a[i])-float64(b[i])))
	}
	return d
}

// tinyShapes are the tiny preset and its variants with each feature of the larger presets:
// Qwen2's q/k/v biases and Llama 3's RoPE scaling (its window shrunk so that every band of the
// formula applies to the tiny head width).
func tinyShapes(t *testing.T) map[string]Config {
	t.Helper()
	c, err := PresetConfig("tiny")
	require.NoError(t, err)
	qwen := c
	qwen.AttentionBias = true
	l3 := c
	l3.RopeScaling = &RopeScaling{RopeType: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 64}
	return map[string]Config{"tiny": c, "qwen2": qwen, "llama3": l3}
}

func TestForwardMatchesReference(t *testing.T) {
	for name, c := range tinyShapes(t) {
		t.Run(name, func(t *testing.T) {
			w, err := Random(c, 1)
			require.NoError(t, err)
			testForwardMatchesReference(t, w)
		})
	}
}

func testForwardMatchesReference(t *testing.T, w *Weights) {
	pool := kernels.NewPool(2)
	defer pool.Close()
	m, err := New(w, pool)
	require.NoError(t, err)
	r := rand.New(rand.NewPCG(7, 7))
	for trial := range 6 {
		// Several sequences of different lengths, prefilled in random chunk sizes, interleaved.
		h := newHarness(t, m, 256, 16)
		type seq struct {
			id     int32
			toks   []int
			done   int
			logits map[int][]float32 // position -> logits
		}
		var seqs []*seq
		for range 1 + trial%4 {
			n := 1 + r.IntN(60)
			seqs = append(seqs, &seq{id: h.newSeq(n), toks: randomTokens(r, n, w.Config.VocabSize), logits: map[int][]float32{}})
		}
		for {
			var pieces []piece
			var owners []*seq
			for _, s := range seqs {
				if s.done == len(s.toks) || r.IntN(3) == 0 {
					continue
				}
				k := min(len(s.toks)-s.done, 1+r.IntN(9))
				pieces = append(pieces, piece{seq: s.id, tokens: s.toks[s.done : s.done+k], start: s.done})
				owners = append(owners, s)
				s.done += k
			}
			if len(pieces) == 0 {
				left := false
				for _, s := range seqs {
					left = left || s.done < len(s.toks)
				}
				if !left {
					break
				}
				continue
			}
			for i, row := range h.step(t, pieces) {
				owners[i].logits[owners[i].done-1] = append([]float32(nil), row...)
			}
		}
		for _, s := range seqs {
			ref, err := Reference(w, s.toks)
			require.NoError(t, err)
			require.NotEmpty(t, s.logits)
			for pos, got := range s.logits {
				require.LessOrEqual(t, maxAbsDiff(got, ref[pos]), 1e-4, "trial %d seq %d pos %d", trial, s.id, pos)
			}
		}
	}
}

// TestBatchInvariance: a sequence's logits are bitwise identical whatever else is in the
// batch and however its prompt was chunked, at every weight precision.
func TestBatchInvariance(t *testing.T) {
	for name, c := range tinyShapes(t) {
		t.Run(name, func(t *testing.T) {
			for _, prec := range allPrecisions {
				for _, workers := range []int{1, 2, 3} {
					batchInvariance(t, c, prec, workers)
				}
			}
		})
	}
}

func batchInvariance(t *testing.T, c Config, prec kernels.Precision, workers int) {
	{
		w, err := Random(c, 3)
		require.NoError(t, err)
		pool := kernels.NewPool(workers)
		m, err := NewAs(w, pool, nil, prec)
		require.NoError(t, err)
		r := rand.New(rand.NewPCG(11, uint64(workers)))
		target := randomTokens(r, 40, w.Config.VocabSize)
		decode := randomTokens(r, 8, w.Config.VocabSize)

		// Baseline: the target alone, whole prompt in one chunk, then one token per step.
		run := func(chunk int, noise int) [][]float32 {
			h := newHarness(t, m, 512, 16)
			id := h.newSeq(len(target) + len(decode))
			var others []int32
			var otherToks [][]int
			for range noise {
				others = append(others, h.newSeq(200))
				otherToks = append(otherToks, randomTokens(r, 200, w.Config.VocabSize))
			}
			otherDone := make([]int, noise)
			var outs [][]float32
			all := append(append([]int(nil), target...), decode...)
			for done := 0; done < len(all); {
				k := 1 // decode
				if done < len(target) {
					k = min(chunk, len(target)-done)
				}
				pieces := []piece{}
				// Noise before and after the target, of random sizes.
				for j, o := range others {
					if r.IntN(2) == 0 && otherDone[j] < 150 {
						n := 1 + r.IntN(7)
						pieces = append(pieces, piece{seq: o, tokens: otherToks[j][otherDone[j] : otherDone[j]+n], start: otherDone[j]})
						otherDone[j] += n
					}
				}
				at := r.IntN(len(pieces) + 1)
				pieces = append(pieces[:at], append([]piece{{seq: id, tokens: all[done : done+k], start: done}}, pieces[at:]...)...)
				rows := h.step(t, pieces)
				done += k
				if done >= len(target) {
					outs = append(outs, append([]float32(nil), rows[at]...))
				}
			}
			return outs
		}
		base := run(len(target), 0)
		for _, cfg := range []struct{ chunk, noise int }{{1, 0}, {7, 2}, {16, 3}, {40, 4}, {3, 1}} {
			got := run(cfg.chunk, cfg.noise)
			require.Equal(t, len(base), len(got))
			for i := range base {
				require.Equal(t, base[i], got[i], "%s workers %d chunk %d noise %d step %d", prec, workers, cfg.chunk, cfg.noise, i)
			}
		}
		pool.Close()
	}
}

func TestForwardRejectsBadBatch(t *testing.T) {
	w, err := Preset("tiny", 1)
	require.NoError(t, err)
	m, err := New(w, nil)
	require.NoError(t, err)
	kv, err := kvcache.NewStorage(m.KVLayout(8, 16))
	require.NoError(t, err)
	out := make([]float32, 2*w.Config.VocabSize)
	good := func() *Batch {
		return &Batch{Tokens: []int32{1, 2}, Positions: []int32{0, 1}, Seq: []int32{0, 0}, BlockTables: [][]int32{{1}}, Logits: []int32{1}}
	}
	cases := map[string]func(b *Batch){
		"empty":          func(b *Batch) { *b = Batch{} },
		"token range":    func(b *Batch) { b.Tokens[0] = int32(w.Config.VocabSize) },
		"negative token": func(b *Batch) { b.Tokens[0] = -1 },
		"position":       func(b *Batch) { b.Positions[1] = int32(w.Config.MaxPositionEmbeddings) },
		"beyond blocks":  func(b *Batch) { b.Positions[1] = 16 },
		"null block":     func(b *Batch) { b.BlockTables[0][0] = 0 },
		"block range":    func(b *Batch) { b.BlockTables[0][0] = 8 },
		"seq":            func(b *Batch) { b.Seq[0] = 3 },
		"logits index":   func(b *Batch) { b.Logits[0] = 2 },
		"lengths":        func(b *Batch) { b.Positions = b.Positions[:1] },
	}
	for name, mut := range cases {
		t.Run(name, func(t *testing.T) {
			b := good()
			mut(b)
			require.ErrorIs(t, m.Forward(b, kv, out), ErrBadBatch)
		})
	}
	require.NoError(t, m.Forward(good(), kv, out))
}

func TestPresetsDeterministic(t *testing.T) {
	a, err := Preset("tiny", 5)
	require.NoError(t, err)
	b, err := Preset("tiny", 5)
	require.NoError(t, err)
	c, err := Preset("tiny", 6)
	require.NoError(t, err)
	require.Equal(t, a.Layers[1].Wq, b.Layers[1].Wq)
	require.NotEqual(t, a.Layers[1].Wq, c.Layers[1].Wq)
	_, err = Preset("nope", 1)
	require.ErrorIs(t, err, ErrUnknownPreset)
	for _, name := range Presets() {
		cfg, err := PresetConfig(name)
		require.NoError(t, err)
		require.NoError(t, cfg.Validate())
	}
	s, _ := PresetConfig("stories110m")
	require.EqualValues(t, 109529856, s.NumParams(), "stories110m parameter count as in llama2.c (tied)")
}

// TestAllocateGivesEachTensorItsOwnPart: one allocation for the whole set, but every tensor
// has exactly its shape's values and cannot grow into its neighbour.
func TestAllocateGivesEachTensorItsOwnPart(t *testing.T) {
	for _, tied := range []bool{true, false} {
		c, err := PresetConfig("tiny")
		require.NoError(t, err)
		c.TieWordEmbeddings = tied
		w := &Weights{Config: c}
		w.Allocate()
		require.NoError(t, w.Check())
		ts := w.Tensors()
		for i, tt := range ts {
			d := *tt.Data
			require.Equal(t, tt.Len(), len(d), tt.Name)
			require.Equal(t, len(d), cap(d), "%s: a full slice expression, so append copies", tt.Name)
			for j := range d {
				d[j] = float32(i + 1)
			}
		}
		for i, tt := range ts {
			for _, v := range *tt.Data {
				require.Equal(t, float32(i+1), v, "%s was overwritten by another tensor", tt.Name)
			}
		}
	}
}

// TestNewReusingEqualsNew: packing a new weight set into a retired model's memory gives the
// same logits, bit for bit, as packing it fresh; a model of another shape is not reused.
func TestNewReusingEqualsNew(t *testing.T) {
	w1, err := Preset("tiny", 1)
	require.NoError(t, err)
	w2, err := Preset("tiny", 2)
	require.NoError(t, err)
	m1, err := New(w1, nil)
	require.NoError(t, err)
	fresh, err := New(w2, nil)
	require.NoError(t, err)
	reused, err := NewReusing(w2, nil, m1)
	require.NoError(t, err)
	require.Same(t, m1.cls, reused.cls, "the retired model's memory was used")
	toks := randomTokens(rand.New(rand.NewPCG(3, 3)), 20, w2.Config.VocabSize)
	run := func(m *Model) []float32 {
		h := newHarness(t, m, 8, 16)
		return h.step(t, []piece{{seq: h.newSeq(len(toks)), tokens: toks}})[0]
	}
	want, got := run(fresh), run(reused)
	for i := range want {
		require.Equal(t, math.Float32bits(want[i]), math.Float32bits(got[i]), "logit %d", i)
	}

	cfg := w2.Config
	cfg.NumHiddenLayers++
	w3, err := Random(cfg, 1)
	require.NoError(t, err)
	m3, err := NewReusing(w3, nil, reused)
	require.NoError(t, err)
	require.NotSame(t, reused.cls, m3.cls, "another shape packs into new memory")
}

// TestRopeInvFreqLlama3 checks each band of Llama 3's scaling against values worked out by
// hand from transformers' formula, for Llama-3.2-1B's settings (theta 500000, head dim 64,
// factor 32, window 8192, low 1, high 4).
func TestRopeInvFreqLlama3(t *testing.T) {
	c, err := PresetConfig("llama3.2-1b-shape")
	require.NoError(t, err)
	inv := c.RopeInvFreq()
	require.Len(t, inv, 32)
	base := func(i int) float64 { return math.Pow(500000, -float64(2*i)/64) }
	// Pair 0 turns every 2π positions: shorter than 8192/4, kept.
	require.Equal(t, base(0), inv[0])
	// Pair 31's wavelength is ~2.1M positions, beyond 8192: divided by the factor.
	require.InDelta(t, base(31)/32, inv[31], 1e-18)
	// Pair 16: wavelength 2π·500000^0.5 ≈ 4443, between 2048 and 8192: interpolated.
	wave := 2 * math.Pi / base(16)
	smooth := (8192/wave - 1) / (4 - 1)
	require.InDelta(t, (1-smooth)*base(16)/32+smooth*base(16), inv[16], 1e-15)
	require.Less(t, inv[16], base(16))
	require.Greater(t, inv[16], base(16)/32)

	c.RopeScaling = nil
	for i, f := range c.RopeInvFreq() {
		require.Equal(t, base(i), f)
	}
}

// TestBiasChangesLogits: the q/k/v biases reach the logits (a forward that dropped them would
// still match itself), and a bias-free checkpoint claiming them is refused.
func TestBiasChangesLogits(t *testing.T) {
	c := tinyShapes(t)["qwen2"]
	w, err := Random(c, 4)
	require.NoError(t, err)
	toks := []int{1, 2, 3, 4, 5}
	with, err := Reference(w, toks)
	require.NoError(t, err)
	for i := range w.Layers {
		clear(w.Layers[i].Bk)
		clear(w.Layers[i].Bq)
		clear(w.Layers[i].Bv)
	}
	without, err := Reference(w, toks)
	require.NoError(t, err)
	require.Greater(t, maxAbsDiff(with[4], without[4]), 1e-2)

	w.Layers[0].Bq = nil
	require.Error(t, w.Check())
	plain, err := Preset("tiny", 1)
	require.NoError(t, err)
	plain.Layers[0].Bq = make([]float32, c.HiddenSize)
	require.ErrorContains(t, plain.Check(), "attention_bias")
}

// TestLargePresetShapes: the realistic presets have the published parameter counts (their
// weights are not generated here: 1.2B floats are a benchmark's business, not a unit test's).
func TestLargePresetShapes(t *testing.T) {
	l, err := PresetConfig("llama3.2-1b-shape")
	require.NoError(t, err)
	require.EqualValues(t, 1235814400, l.NumParams(), "Llama-3.2-1B, tied")
	require.Equal(t, "LlamaForCausalLM", l.Architectures[0])
	q, err := PresetConfig("qwen2.5-0.5b-shape")
	require.NoError(t, err)
	require.EqualValues(t, 494032768, q.NumParams(), "Qwen2.5-0.5B, tied")
	require.Equal(t, "qwen2", q.ModelType)
	require.True(t, q.AttentionBias)
	q.Architectures[0] = "changed"
	q2, _ := PresetConfig("qwen2.5-0.5b-shape")
	require.Equal(t, "Qwen2ForCausalLM", q2.Architectures[0], "callers get their own copy")
}
