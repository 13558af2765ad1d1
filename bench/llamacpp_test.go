package bench

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/engine/gguf"
	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/tokenizer"
)

// findPeer returns the llama.cpp peer or skips: CI does not install node-llama-cpp (it is a
// download of prebuilt binaries), so this runs where a developer did (make peer-install).
func findPeer(t *testing.T) *LlamaCpp {
	t.Helper()
	module := os.Getenv(LlamaCppModuleEnv)
	if module == "" {
		module = filepath.Join("peer", "node_modules", "node-llama-cpp")
	}
	l, err := FindLlamaCpp(module)
	if errors.Is(err, ErrNoLlamaCpp) {
		t.Skipf("skipping the llama.cpp comparison: %v", err)
	}
	require.NoError(t, err)
	return l
}

// peerModels are tiny models of each architecture and vocabulary form the GGUF writer has.
// Their embeddings are scaled down to HF's initializer range so that attention, not the input
// token, decides the next token: a model that only repeated its input would pass with RoPE or
// the q/k row order wrong.
func peerModels(t *testing.T) map[string]struct {
	w   *model.Weights
	tok tokenizer.Tokenizer
} {
	t.Helper()
	tc, err := model.PresetConfig("tiny")
	require.NoError(t, err)
	qc := tc
	qc.VocabSize, qc.AttentionBias, qc.TieWordEmbeddings = 512, true, false
	lc := tc
	lc.VocabSize = 512
	lc.RopeScaling = &model.RopeScaling{RopeType: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 16}
	syn, err := tokenizer.Synthetic(512)
	require.NoError(t, err)
	out := map[string]struct {
		w   *model.Weights
		tok tokenizer.Tokenizer
	}{}
	for name, m := range map[string]struct {
		c   model.Config
		tok tokenizer.Tokenizer
	}{"llama": {tc, tokenizer.NewByte()}, "qwen2": {qc, syn}, "llama3": {lc, syn.Llama2C()}} {
		w, err := model.Random(m.c, 7)
		require.NoError(t, err)
		for i := range w.Embed {
			w.Embed[i] *= 0.1
		}
		out[name] = struct {
			w   *model.Weights
			tok tokenizer.Tokenizer
		}{w, m.tok}
	}
	return out
}

// TestLlamaCppGreedyMatches: llama.cpp, loading rollout's f32 GGUF export, picks the same
// greedy tokens as rollout's reference forward, from BOS and after every prefix of a random
// prompt (so every position's attention and RoPE take part). Positions where rollout's top
// two logits are within 1e-3 are near ties that float summation order may flip; the sequence
// stops being compared there.
func TestLlamaCppGreedyMatches(t *testing.T) {
	peer := findPeer(t)
	for name, m := range peerModels(t) {
		t.Run(name, func(t *testing.T) {
			w := m.w
			path := filepath.Join(t.TempDir(), "m.gguf")
			require.NoError(t, gguf.WriteFile(path, w, m.tok, gguf.F32, name))
			r := rand.New(rand.NewPCG(1, 2))
			bos := w.Config.BOSTokenID
			prompts := [][]int{{bos}}
			long := []int{bos}
			for range 11 {
				long = append(long, 3+r.IntN(250))
			}
			for k := 2; k <= len(long); k++ {
				prompts = append(prompts, long[:k])
			}
			const tokens = 6
			got, err := peer.Run(t.Context(), path, prompts, tokens, 1)
			require.NoError(t, err)
			compared, firsts := 0, map[int]bool{}
			for i, p := range prompts {
				toks := append([]int(nil), p...)
				for j := range tokens {
					lg, err := model.Reference(w, toks)
					require.NoError(t, err)
					last := lg[len(lg)-1]
					best, gap := top2(last)
					if gap < 1e-3 {
						break
					}
					require.Equal(t, best, got.Tokens[i][j], "prompt %v, token %d (rollout's margin %.4f)", p, j, gap)
					if j == 0 {
						firsts[best] = true
					}
					compared++
					toks = append(toks, best)
				}
			}
			require.Greater(t, compared, len(prompts)*tokens/2, "too many near ties: the comparison says little")
			require.Greater(t, len(firsts), 2, "the next token must depend on the context")
		})
	}
}

// TestLlamaCppLoadsEveryType: the bf16, f16 and q8_0 files load and decode too; their tokens are
// not rollout's f32 ones, so only their count is checked.
func TestLlamaCppLoadsEveryType(t *testing.T) {
	peer := findPeer(t)
	m := peerModels(t)["qwen2"]
	for _, typ := range []gguf.Type{gguf.BF16, gguf.F16, gguf.Q8_0} {
		path := filepath.Join(t.TempDir(), typ.String()+".gguf")
		require.NoError(t, gguf.WriteFile(path, m.w, m.tok, typ, "qwen2"))
		got, err := peer.Run(t.Context(), path, [][]int{{m.w.Config.BOSTokenID}, {m.w.Config.BOSTokenID}}, 4, 1)
		require.NoError(t, err, typ)
		require.Len(t, got.Tokens, 2)
		require.Len(t, got.Tokens[1], 4)
	}
}

// top2 returns the argmax of x (lowest id on ties) and its margin over the runner-up.
func top2(x []float32) (int, float64) {
	best := argmax(x)
	second := -1
	for i, v := range x {
		if i != best && (second < 0 || v > x[second]) {
			second = i
		}
	}
	return best, float64(x[best] - x[second])
}

// TestSideBySide: the side-by-side figures of a preset in two rounds, with the f32 peer
// reproducing rollout's greedy tokens from BOS and every rollout row held against its peer row.
func TestSideBySide(t *testing.T) {
	peer := findPeer(t)
	w, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	var steps []string
	cfg := SideBySideConfig{
		Preset: "tiny", Precs: []kernels.Precision{kernels.F32, kernels.W8A8, kernels.BF16}, Types: []gguf.Type{gguf.F32, gguf.Q8_0},
		Tokens: 8, Seqs: 2, Threads: 1, Workers: 1, Rounds: 2,
		Step: func(format string, args ...any) { steps = append(steps, fmt.Sprintf(format, args...)) },
	}
	rs, err := SideBySide(t.Context(), nil, peer, w, tokenizer.NewByte(), cfg)
	require.NoError(t, err)
	require.Len(t, steps, 20, "each of the 5 rows' batch 1 and aggregate once per round")
	require.Equal(t, len(steps), cfg.Runs(), "Runs counts the steps")
	rows := func(from int) []string {
		var r []string
		for _, s := range steps[from : from+5] {
			r = append(r, strings.Split(s, ", ")[1])
		}
		return r
	}
	want := []string{"tiny: rollout f32", "tiny: llama.cpp f32", "tiny: rollout w8a8", "tiny: llama.cpp q8_0", "tiny: rollout bf16"}
	require.Equal(t, want, rows(0), "each peer run right after its rollout row")
	require.Equal(t, want, rows(5))
	require.Contains(t, steps[0], "batch 1, round 1 of 2")
	require.Contains(t, steps[5], "2 sequences, round 1 of 2")
	require.Contains(t, steps[10], "batch 1, round 2 of 2", "rounds alternate the rows")
	require.Len(t, rs, 5)
	byName := map[string]PeerResult{}
	for _, r := range rs {
		byName[r.Engine+" "+r.Precision] = r
		require.Len(t, r.Batch1Runs, 2, r.Precision)
		require.Len(t, r.AggregateRuns, 2, r.Precision)
		require.Positive(t, r.Batch1TokensPerSec)
		require.Positive(t, r.AggregateTokensPerSec)
		require.Equal(t, 2, r.Sequences)
		require.Equal(t, 8, r.GreedyTokens)
	}
	require.Equal(t, 8, byName["rollout f32"].GreedyMatch)
	require.Equal(t, 8, byName["llama.cpp f32"].GreedyMatch, "llama.cpp's f32 greedy tokens are rollout's")
	for prec, typ := range map[string]string{"f32": "f32", "w8a8": "q8_0"} {
		r, p := byName["rollout "+prec], byName["llama.cpp "+typ]
		require.Equal(t, typ, r.VsPeerType)
		require.InDelta(t, Median([]float64{r.Batch1Runs[0] / p.Batch1Runs[0], r.Batch1Runs[1] / p.Batch1Runs[1]}), r.VsPeer, 1e-12)
		require.InDelta(t, Median([]float64{r.AggregateRuns[0] / p.AggregateRuns[0], r.AggregateRuns[1] / p.AggregateRuns[1]}), r.VsPeerAggregate, 1e-12)
	}
	require.Zero(t, byName["rollout bf16"].VsPeer, "no bf16 peer row ran")
	require.Empty(t, byName["rollout bf16"].VsPeerType)
}

func TestSideBySideRejectsBadConfig(t *testing.T) {
	w, err := model.Preset("tiny", 1)
	require.NoError(t, err)
	_, err = SideBySide(t.Context(), nil, &LlamaCpp{}, w, tokenizer.NewByte(), SideBySideConfig{Preset: "tiny", Tokens: 8, Threads: 1})
	require.ErrorContains(t, err, "0 precisions")
}

func TestSideBySideOrderPairsRuns(t *testing.T) {
	f32, bf16, i8, w8 := kernels.F32, kernels.BF16, kernels.Int8, kernels.W8A8
	for _, c := range []struct {
		precs []kernels.Precision
		types []gguf.Type
		want  []int
	}{
		{[]kernels.Precision{f32, bf16, i8, w8}, []gguf.Type{gguf.F32, gguf.BF16, gguf.F16, gguf.Q8_0}, []int{0, 4, 1, 5, 2, 7, 3, 6}},
		{[]kernels.Precision{w8, i8}, []gguf.Type{gguf.Q8_0}, []int{0, 2, 1}},
		{[]kernels.Precision{bf16}, []gguf.Type{gguf.F16, gguf.Q8_0}, []int{0, 1, 2}},
		{[]kernels.Precision{f32}, nil, []int{0}},
	} {
		require.Equal(t, c.want, sideBySideOrder(c.precs, c.types), "%v %v", c.precs, c.types)
	}
}

func TestMedianRatioPairsRounds(t *testing.T) {
	require.InDelta(t, 2.0, MedianRatio([]float64{2, 9, 4}, []float64{1, 3, 2}), 1e-12, "ratios 2, 3, 2")
	require.InDelta(t, 3.0, MedianRatio([]float64{2, 9}, []float64{0, 3}), 1e-12, "a zero round is skipped")
	require.Zero(t, MedianRatio(nil, []float64{1}))
	require.Equal(t, gguf.Q8_0, SameBytes(kernels.W8A8))
	require.Equal(t, gguf.Q8_0, SameBytes(kernels.Int8))
	require.Equal(t, gguf.BF16, SameBytes(kernels.BF16))
	require.Equal(t, gguf.F32, SameBytes(kernels.F32))
	two := SideBySideConfig{Precs: []kernels.Precision{kernels.F32, kernels.W8A8}, Types: []gguf.Type{gguf.Q8_0}, Rounds: 3}
	require.Equal(t, 9, two.Runs(), "3 rows, 3 rounds, batch 1 only")
	two.Seqs = 4
	require.Equal(t, 18, two.Runs(), "and the aggregate")
	two.Rounds = 0
	require.Equal(t, 6, two.Runs(), "at least one round")
}

func TestFindLlamaCppMissing(t *testing.T) {
	_, err := FindLlamaCpp(filepath.Join(t.TempDir(), "node-llama-cpp"))
	require.ErrorIs(t, err, ErrNoLlamaCpp)
	require.ErrorContains(t, err, LlamaCppModuleEnv, "the error says how to point at an install")
}

// TestLlamaCppGreedyLargeShapes runs the realistic presets themselves through llama.cpp (f32
// GGUF, greedy from BOS) when ROLLOUT_PEER_LARGE=1: 2 and 5 GB files and a few GB of memory
// each, so only on request.
//
//	ROLLOUT_PEER_LARGE=1 go test -run LargeShapes -v -timeout 30m ./bench/
func TestLlamaCppGreedyLargeShapes(t *testing.T) {
	if os.Getenv("ROLLOUT_PEER_LARGE") != "1" {
		t.Skip("set ROLLOUT_PEER_LARGE=1 to export the 0.5B and 1B presets to llama.cpp")
	}
	peer := findPeer(t)
	for _, preset := range []string{"qwen2.5-0.5b-shape", "llama3.2-1b-shape"} {
		t.Run(preset, func(t *testing.T) {
			w, err := model.Preset(preset, 1)
			require.NoError(t, err)
			tok, err := tokenizer.Synthetic(w.Config.VocabSize)
			require.NoError(t, err)
			rs, err := SideBySide(t.Context(), nil, peer, w, tok, SideBySideConfig{Preset: preset, Precs: []kernels.Precision{kernels.F32},
				Types: []gguf.Type{gguf.F32}, Tokens: 6, Threads: 1, Workers: 1})
			require.NoError(t, err)
			require.Equal(t, 6, rs[1].GreedyTokens)
			require.Equal(t, 6, rs[1].GreedyMatch, "llama.cpp's greedy tokens from BOS are rollout's")
		})
	}
}
