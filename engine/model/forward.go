package model

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/kvcache"
)

// ErrBadBatch is returned (wrapped) when a Batch is inconsistent with the model or the pool.
var ErrBadBatch = errors.New("model: bad batch")

// Batch is one step's flat list of tokens from any number of sequences. Token i belongs to
// sequence Seq[i], sits at position Positions[i] and has its K/V written to the block
// BlockTables[Seq[i]][pos/BlockSize] at slot pos%BlockSize. Tokens of one sequence must appear
// in increasing position order, and every earlier position of that sequence must already be in
// the pool or earlier in this batch (attention reads positions 0..pos from the pool).
type Batch struct {
	Tokens      []int32
	Positions   []int32
	Seq         []int32
	BlockTables [][]int32
	// Logits lists the indices of the tokens whose logits are wanted (usually the last token
	// of each sequence); the output rows follow this order.
	Logits []int32
}

// Model is a loaded, packed model ready for the paged forward. Forward calls are serialised
// (the engine has one stepping goroutine); the weights themselves are read-only and may be
// shared by Reference or by a second Model.
type Model struct {
	Config Config
	// Precision is how the matrices store their weights (see kernels.Precision); the
	// embedding and the norms stay float32.
	Precision kernels.Precision
	pool      *kernels.Pool

	embed     embedding
	layers    []packedLayer
	finalNorm []float32
	cls       *kernels.Matrix
	ropeCos   []float32 // [maxPos][headDim/2]
	ropeSin   []float32

	mu sync.Mutex
	ws workspace
}

type packedLayer struct {
	attnNorm, ffnNorm []float32
	qkv               *kernels.Matrix // q, k, v projections stacked: rows hidden+2*kvdim
	qkvBias           []float32       // their biases stacked alike; nil without attention_bias
	wo                *kernels.Matrix
	gateUp            *kernels.Matrix // gate then up: rows 2*intermediate
	down              *kernels.Matrix
}

// New packs w for the paged forward. pool splits the kernels across cores; nil runs them on
// the caller alone.
func New(w *Weights, pool *kernels.Pool) (*Model, error) { return NewReusing(w, pool, nil) }

// NewReusing is New packing into the memory of reuse, a model nobody runs any more (the one a
// weight swap retired), when it has w's shape; with nil or another shape it allocates. reuse
// must not be used again by anyone: its matrices become the new model's.
func NewReusing(w *Weights, pool *kernels.Pool, reuse *Model) (*Model, error) {
	return NewAs(w, pool, reuse, kernels.F32)
}

// NewAs is NewReusing storing the matrices at precision prec: w's float32 values are rounded
// (bf16) or quantized (int8) once, here. reuse is packed into only at the same precision.
func NewAs(w *Weights, pool *kernels.Pool, reuse *Model, prec kernels.Precision) (*Model, error) {
	if err := w.Check(); err != nil {
		return nil, err
	}
	c := w.Config
	h, f, kvd := c.HiddenSize, c.IntermediateSize, c.KVDim()
	if pool == nil {
		pool = kernels.NewPool(1)
	}
	m := &Model{Config: c, Precision: prec, pool: pool, finalNorm: w.FinalNorm}
	var err error
	if m.embed, err = newEmbedding(w.Embed, h, prec); err != nil {
		return nil, err
	}
	if reuse != nil && (len(reuse.layers) != len(w.Layers) || reuse.Precision != prec) {
		reuse = nil // each matrix checks its own shape; the layer lists must line up
	}
	// Every matrix is packed by its own job, and the jobs run on all cores (largest first, so
	// the classifier does not come last): a weight update packs while the old weights serve,
	// and the sooner it is done the sooner the new ones can.
	var jobs []packJob
	pack := func(dst **kernels.Matrix, old *kernels.Matrix, rows, cols int, parts ...[]float32) {
		jobs = append(jobs, packJob{dst: dst, old: old, prec: prec, rows: rows, cols: cols, parts: parts})
	}
	var old packedLayer
	m.layers = make([]packedLayer, len(w.Layers))
	for i := range w.Layers {
		l := &w.Layers[i]
		if reuse != nil {
			old = reuse.layers[i]
		}
		pl := &m.layers[i]
		pl.attnNorm, pl.ffnNorm = l.AttnNorm, l.FFNNorm
		if c.AttentionBias {
			pl.qkvBias = slices.Concat(l.Bq, l.Bk, l.Bv)
		}
		pack(&pl.qkv, old.qkv, h+2*kvd, h, l.Wq, l.Wk, l.Wv)
		pack(&pl.wo, old.wo, h, h, l.Wo)
		pack(&pl.gateUp, old.gateUp, 2*f, h, l.WGate, l.WUp)
		pack(&pl.down, old.down, h, f, l.WDown)
	}
	var oldCls *kernels.Matrix
	if reuse != nil {
		oldCls = reuse.cls
	}
	pack(&m.cls, oldCls, c.VocabSize, h, w.Classifier())
	if err := runPackJobs(jobs, runtime.GOMAXPROCS(0)); err != nil {
		return nil, fmt.Errorf("model: packing weights: %w", err)
	}
	invFreq := c.RopeInvFreq()
	if r := reuse; r != nil && r.Config.MaxPositionEmbeddings == c.MaxPositionEmbeddings &&
		slices.Equal(r.Config.RopeInvFreq(), invFreq) {
		m.ropeCos, m.ropeSin = r.ropeCos, r.ropeSin // the same tables
		return m, nil
	}
	half := c.HeadDim() / 2
	m.ropeCos = make([]float32, c.MaxPositionEmbeddings*half)
	m.ropeSin = make([]float32, c.MaxPositionEmbeddings*half)
	for p := range c.MaxPositionEmbeddings {
		for i, freq := range invFreq {
			s, co := math.Sincos(float64(p) * freq)
			m.ropeCos[p*half+i], m.ropeSin[p*half+i] = float32(co), float32(s)
		}
	}
	return m, nil
}

// packJob packs one matrix into *dst (into old's memory when it has the shape).
type packJob struct {
	dst        **kernels.Matrix
	old        *kernels.Matrix
	prec       kernels.Precision
	rows, cols int
	parts      [][]float32
}

// runPackJobs runs jobs on up to workers goroutines, the largest first, and returns the first
// error (jobs after it may still have run; the model is dropped either way).
func runPackJobs(jobs []packJob, workers int) error {
	slices.SortStableFunc(jobs, func(a, b packJob) int { return cmp.Compare(b.rows*b.cols, a.rows*a.cols) })
	var (
		next atomic.Int64
		mu   sync.Mutex
		err  error
		wg   sync.WaitGroup
	)
	work := func() {
		for {
			i := int(next.Add(1) - 1)
			if i >= len(jobs) {
				return
			}
			j := &jobs[i]
			mat, e := kernels.PackStackedAs(j.prec, j.old, j.rows, j.cols, j.parts...)
			if e != nil {
				mu.Lock()
				err = cmp.Or(err, e)
				mu.Unlock()
				continue
			}
			*j.dst = mat
		}
	}
	for range min(workers, len(jobs)) - 1 {
		wg.Go(work)
	}
	work()
	wg.Wait()
	return err
}

// WeightBytes is the number of weight bytes one decode step streams (the packed matrices and
// the norms), the numerator of the bandwidth ratio the engine benchmark reports.
func (m *Model) WeightBytes() int64 {
	n := m.cls.Bytes()
	for _, l := range m.layers {
		n += l.qkv.Bytes() + l.wo.Bytes() + l.gateUp.Bytes() + l.down.Bytes()
		n += int64(len(l.attnNorm)+len(l.ffnNorm)) * 4
	}
	return n
}

// ResidentBytes is the memory the packed model holds: WeightBytes, the embedding table (at
// the model's precision; float32 shares the checkpoint's) and the RoPE tables.
func (m *Model) ResidentBytes() int64 {
	return m.WeightBytes() + m.embed.bytes() + int64(len(m.ropeCos)+len(m.ropeSin))*4
}

// KVLayout returns the pool layout this model needs for numBlocks blocks of blockSize tokens.
func (m *Model) KVLayout(numBlocks, blockSize int) kvcache.Layout {
	return m.Config.KVLayout(numBlocks, blockSize)
}

type workspace struct {
	x, xn, qkv, att, o, gu, act, last []float32
	scores                            []float32
}

func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

// Forward runs one step over b, writing the K/V of every token into kv and the logits of the
// tokens listed in b.Logits into logits (len(b.Logits) rows of VocabSize).
func (m *Model) Forward(b *Batch, kv *kvcache.Storage, logits []float32) error {
	if err := m.checkBatch(b, kv, logits); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.Config
	n := len(b.Tokens)
	h, f, kvd, hd := c.HiddenSize, c.IntermediateSize, c.KVDim(), c.HeadDim()
	qkvW := h + 2*kvd
	ws := &m.ws
	ws.x = grow(ws.x, n*h)
	ws.xn = grow(ws.xn, n*h)
	ws.qkv = grow(ws.qkv, n*qkvW)
	ws.att = grow(ws.att, n*h)
	ws.o = grow(ws.o, n*h)
	ws.gu = grow(ws.gu, n*2*f)
	ws.act = grow(ws.act, n*f)
	for t, id := range b.Tokens {
		m.embed.row(ws.x[t*h:(t+1)*h], int(id))
	}
	maxPos := 0
	for _, p := range b.Positions {
		maxPos = max(maxPos, int(p)+1)
	}
	// Per worker: the scores of every head of one token (heads × positions), then one
	// normaliser per head.
	ws.scores = grow(ws.scores, m.pool.Workers()*c.NumAttentionHeads*(maxPos+1))
	eps := float32(c.RMSNormEps)
	// The per-token work between the matmuls (norms, RoPE and the KV writes, residual adds,
	// SwiGLU) runs split by token across the pool too: a token's values depend only on its own
	// row, and on the caller alone it left the other workers idle long enough to park between
	// matmuls (a few ms of a 64-token step).
	m.perToken(n, func(t int) { rmsNorm(ws.xn[t*h:(t+1)*h], ws.x[t*h:(t+1)*h], m.layers[0].attnNorm, eps) })
	for li := range m.layers {
		l := &m.layers[li]
		l.qkv.MatMul(m.pool, ws.qkv, ws.xn, n)
		// Distinct tokens of a batch write distinct KV slots (no two share a sequence and position).
		m.perToken(n, func(t int) {
			row := ws.qkv[t*qkvW : (t+1)*qkvW]
			if l.qkvBias != nil {
				addInto(row, l.qkvBias)
			}
			pos := int(b.Positions[t])
			m.rope(row[:h+kvd], pos, hd)
			table := b.BlockTables[b.Seq[t]]
			k, v := kv.KV(int(table[pos/kv.BlockSize]), li)
			slot := pos % kv.BlockSize
			copy(k[slot*kvd:(slot+1)*kvd], row[h:h+kvd])
			copy(v[slot*kvd:(slot+1)*kvd], row[h+kvd:])
		})
		m.attention(b, kv, li, n)
		l.wo.MatMul(m.pool, ws.o, ws.att, n)
		m.perToken(n, func(t int) {
			x := ws.x[t*h : (t+1)*h]
			addInto(x, ws.o[t*h:(t+1)*h])
			rmsNorm(ws.xn[t*h:(t+1)*h], x, l.ffnNorm, eps)
		})
		l.gateUp.MatMul(m.pool, ws.gu, ws.xn, n)
		m.perToken(n, func(t int) {
			swiglu(ws.act[t*f:(t+1)*f], ws.gu[t*2*f:t*2*f+f], ws.gu[t*2*f+f:(t+1)*2*f])
		})
		l.down.MatMul(m.pool, ws.o, ws.act, n)
		// The residual add, fused with the next layer's attention norm.
		m.perToken(n, func(t int) {
			x := ws.x[t*h : (t+1)*h]
			addInto(x, ws.o[t*h:(t+1)*h])
			if li+1 < len(m.layers) {
				rmsNorm(ws.xn[t*h:(t+1)*h], x, m.layers[li+1].attnNorm, eps)
			}
		})
	}
	nl := len(b.Logits)
	ws.last = grow(ws.last, nl*h)
	m.perToken(nl, func(i int) {
		t := int(b.Logits[i])
		rmsNorm(ws.last[i*h:(i+1)*h], ws.x[t*h:(t+1)*h], m.finalNorm, eps)
	})
	m.cls.MatMul(m.pool, logits, ws.last, nl)
	return nil
}

func (m *Model) checkBatch(b *Batch, kv *kvcache.Storage, logits []float32) error {
	c := m.Config
	n := len(b.Tokens)
	if n == 0 || len(b.Positions) != n || len(b.Seq) != n {
		return fmt.Errorf("%w: %d tokens, %d positions, %d seq ids", ErrBadBatch, n, len(b.Positions), len(b.Seq))
	}
	if kv == nil || kv.NumLayers != c.NumHiddenLayers || kv.KVDim != c.KVDim() {
		return fmt.Errorf("%w: kv storage does not match the model", ErrBadBatch)
	}
	for i := range n {
		id, pos, s := b.Tokens[i], b.Positions[i], b.Seq[i]
		if id < 0 || int(id) >= c.VocabSize {
			return fmt.Errorf("%w: token %d: id %d outside vocab %d", ErrBadBatch, i, id, c.VocabSize)
		}
		if pos < 0 || int(pos) >= c.MaxPositionEmbeddings {
			return fmt.Errorf("%w: token %d: position %d outside context %d", ErrBadBatch, i, pos, c.MaxPositionEmbeddings)
		}
		if s < 0 || int(s) >= len(b.BlockTables) {
			return fmt.Errorf("%w: token %d: sequence %d without block table", ErrBadBatch, i, s)
		}
		table := b.BlockTables[s]
		if int(pos)/kv.BlockSize >= len(table) {
			return fmt.Errorf("%w: token %d: position %d beyond its %d blocks", ErrBadBatch, i, pos, len(table))
		}
		for _, blk := range table[:int(pos)/kv.BlockSize+1] {
			if blk <= 0 || int(blk) >= kv.NumBlocks {
				return fmt.Errorf("%w: token %d: block %d outside pool (1..%d)", ErrBadBatch, i, blk, kv.NumBlocks-1)
			}
		}
	}
	for _, t := range b.Logits {
		if t < 0 || int(t) >= n {
			return fmt.Errorf("%w: logits index %d outside batch of %d", ErrBadBatch, t, n)
		}
	}
	if len(logits) < len(b.Logits)*c.VocabSize {
		return fmt.Errorf("%w: logits buffer %d < %d", ErrBadBatch, len(logits), len(b.Logits)*c.VocabSize)
	}
	return nil
}

// rope rotates every query and key head of row (q heads then k heads) in place.
func (m *Model) rope(row []float32, pos, hd int) {
	half := hd / 2
	kernels.ClearUpper()
	cs := m.ropeCos[pos*half : (pos+1)*half]
	sn := m.ropeSin[pos*half : (pos+1)*half]
	for h0 := 0; h0+hd <= len(row); h0 += hd {
		a, b := row[h0:h0+half], row[h0+half:h0+hd]
		for i := range half {
			x, y := a[i], b[i]
			a[i] = x*cs[i] - y*sn[i]
			b[i] = y*cs[i] + x*sn[i]
		}
	}
}

// attention computes, for every token and head, softmax(q·K/sqrt(d))·V over positions
// 0..pos of the token's sequence, read from the pool. Work items (token, head) are
// independent, so the split across workers does not change any result. A worker takes its
// items a token at a time and sweeps each cached block once for all of that token's heads it
// holds (heads inner): the block's K (or V) rows then stay in cache while every head reads its
// slice of them, instead of one strided pass over the whole context per head.
func (m *Model) attention(b *Batch, kv *kvcache.Storage, layer, n int) {
	c := m.Config
	h, kvd, hd := c.HiddenSize, c.KVDim(), c.HeadDim()
	heads := c.NumAttentionHeads
	group := heads / c.NumKeyValueHeads
	qkvW := h + 2*kvd
	scale := float32(1 / math.Sqrt(float64(hd)))
	ws := &m.ws
	stride := len(ws.scores) / m.pool.Workers()
	chunks := m.pool.Workers()
	items := n * heads
	bs := kv.BlockSize
	m.pool.Parallel(chunks, func(lo, hi int) {
		for w := lo; w < hi; w++ {
			buf := ws.scores[w*stride : (w+1)*stride]
			end := (w + 1) * items / chunks
			for it := w * items / chunks; it < end; {
				t, h0 := it/heads, it%heads
				h1 := min(heads, h0+end-it)
				it += h1 - h0
				pos := int(b.Positions[t])
				table := b.BlockTables[b.Seq[t]]
				span := pos + 1
				// Per head: the scores block by block, then the softmax over all of them, then
				// the weighted sum of V block by block, normalised once at the end. Every step
				// has one fixed order per (token, head), so the result does not depend on the
				// batch or on the order heads are visited in.
				nb := pos/bs + 1
				// Each kernel call first hints the rows of the call after it (kernels.PrefetchRows),
				// so that they arrive from DRAM while this one computes; not when the token before
				// is of the same sequence (a prefill), whose rows it has just brought into cache.
				calls := attnCalls{kv: kv, table: table, layer: layer, pos: pos, hd: hd, group: group, h0: h0, nh: h1 - h0, nb: nb,
					off: t > 0 && b.Seq[t-1] == b.Seq[t]}
				calls.hint(0)
				for bi := range nb {
					k, _ := kv.KV(int(table[bi]), layer)
					rows := min(bs, pos+1-bi*bs)
					for head := h0; head < h1; head++ {
						calls.next()
						q := ws.qkv[t*qkvW+head*hd : t*qkvW+(head+1)*hd]
						kernels.AttnScores(buf[(head-h0)*span+bi*bs:], q, k, kvd, (head/group)*hd, rows, scale)
					}
				}
				for head := h0; head < h1; head++ {
					sc := buf[(head-h0)*span : (head-h0+1)*span]
					sum := kernels.ExpShifted(sc, sc, kernels.MaxF32(sc))
					clear(ws.att[t*h+head*hd : t*h+(head+1)*hd])
					buf[heads*span+head-h0] = float32(1 / sum)
				}
				for bi := range nb {
					_, v := kv.KV(int(table[bi]), layer)
					rows := min(bs, pos+1-bi*bs)
					for head := h0; head < h1; head++ {
						calls.next()
						out := ws.att[t*h+head*hd : t*h+(head+1)*hd]
						kernels.AttnAccum(out, buf[(head-h0)*span+bi*bs:], v, kvd, (head/group)*hd, rows)
					}
				}
				for head := h0; head < h1; head++ {
					inv := buf[heads*span+head-h0]
					out := ws.att[t*h+head*hd : t*h+(head+1)*hd]
					for i := range out {
						out[i] *= inv
					}
				}
			}
		}
	})
}

// attnCalls is the sequence of attention kernel calls of one work item (a token and the heads
// h0..h0+nh-1 of it a worker holds): call c < nb·nh is AttnScores on K block c/nh for head
// h0+c%nh, and the next nb·nh calls are AttnAccum on the V blocks in the same order.
type attnCalls struct {
	kv                                *kvcache.Storage
	table                             []int32
	layer, pos, hd, group, h0, nh, nb int
	off                               bool // no hints: the rows are in cache already
	c                                 int  // the call about to run
}

// next is called before each call: it hints the call after it.
func (a *attnCalls) next() {
	a.c++
	a.hint(a.c)
}

// hint prefetches the K or V rows that call c reads (kernels.PrefetchRows). A many-sequence
// step reads most of its K/V from DRAM in strips the hardware prefetchers do not follow; a
// hint one call ahead took the attention of a 64-sequence stories110m step from about 8 to 5
// ms (BenchmarkAttentionBatch). When off, past the last call, or for a head that shares the
// previous call's KV head (grouped-query attention), it does nothing: on rows in cache a hint
// costs more than it saves (hinting every token of a 1032-token prefill made it 26% slower,
// BenchmarkPrefill1K).
func (a *attnCalls) hint(c int) {
	n := a.nb * a.nh
	if a.off || c >= 2*n {
		return
	}
	i := c % n
	bi, head := i/a.nh, a.h0+i%a.nh
	if i%a.nh > 0 && head/a.group == (head-1)/a.group {
		return
	}
	k, v := a.kv.KV(int(a.table[bi]), a.layer)
	if c >= n {
		k = v
	}
	bs := a.kv.BlockSize
	kernels.PrefetchRows(k, a.kv.KVDim, (head/a.group)*a.hd, min(bs, a.pos+1-bi*bs), a.hd)
}

func addInto(y, x []float32) {
	kernels.ClearUpper()
	x = x[:len(y)]
	for i := range y {
		y[i] += x[i]
	}
}

// swiglu writes a = silu(g)·u: kernels.SwiGLU, after the scalar code before it (see
// kernels.ClearUpper).
func swiglu(a, g, u []float32) {
	kernels.ClearUpper()
	kernels.SwiGLU(a, g, u)
	kernels.ClearUpper()
}

func rmsNorm(dst, x, g []float32, eps float32) {
	kernels.ClearUpper()
	kernels.RMSNorm(dst, x, g, eps)
	kernels.ClearUpper()
}

// perToken runs fn(t) for every token t < n, split across the pool's workers in contiguous
// ranges.
func (m *Model) perToken(n int, fn func(t int)) {
	m.pool.Parallel(n, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			fn(t)
		}
	})
}
