package offload_test

import (
	"context"
	"io"
	"log/slog"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/rolloutkit/rollout/engine/kvcache"
	"github.com/rolloutkit/rollout/engine/kvconnector"
	"github.com/rolloutkit/rollout/engine/sched"
	"github.com/rolloutkit/rollout/offload"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	eos   = 0
	vocab = 50
)

// harness is vLLM's RequestRunner in Go: the real scheduler and block pool, the connector's
// two sides, and a clock-free fake model runner whose KV and sampled tokens are functions of
// the KV it actually reads, so wrong KV (a bad load, a stale prefix hit) changes the outputs.
type harness struct {
	t       *testing.T
	layout  kvcache.Layout
	pool    *kvcache.Manager
	storage *kvcache.Storage
	sched   *sched.Scheduler
	conn    *offload.Connector // nil: no connector
	worker  kvconnector.Worker
	metas   []kvconnector.Metadata
	outs    map[string][]int
	reasons map[string]sched.FinishReason
	cached  map[string]int
	// eosAt makes a request sample EOS as its n-th output token (1-based).
	eosAt map[string]int
	// checked counts fresh requests whose cached prefix (engine hit or load) was verified.
	checked int
	gate    *xferGate
}

type harnessCfg struct {
	blockSize, numBlocks, bpc int
	cpuChunks                 int // CPU tier size in chunks (0: 64)
	policy                    string
	delay                     time.Duration
	noConnector               bool
	maxTokens                 int // per step budget (default 1000)
	maxSeqs                   int
	quiet                     bool // discard the connector's logs (tests that provoke violations)
	recordEvents              bool
	// hold keeps every transfer in flight until harness.release (instead of a delay).
	hold bool
}

// xferGate holds transfers before they copy until it is opened.
type xferGate struct {
	mu   sync.Mutex
	open bool
	ch   chan struct{}
}

func (g *xferGate) wait(*offload.Transfer) {
	g.mu.Lock()
	ch, open := g.ch, g.open
	g.mu.Unlock()
	if !open {
		<-ch
	}
}

// hold makes transfers that start from now on wait again.
func (g *xferGate) hold() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.open {
		g.open, g.ch = false, make(chan struct{})
	}
}

func (g *xferGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.open {
		g.open = true
		close(g.ch)
	}
}

func newHarness(t *testing.T, c harnessCfg) *harness {
	t.Helper()
	if c.bpc == 0 {
		c.bpc = 1
	}
	if c.cpuChunks == 0 {
		c.cpuChunks = 64
	}
	if c.maxTokens == 0 {
		c.maxTokens = 1000
	}
	if c.maxSeqs == 0 {
		c.maxSeqs = 16
	}
	h := &harness{t: t, outs: map[string][]int{}, reasons: map[string]sched.FinishReason{}, cached: map[string]int{}, eosAt: map[string]int{}}
	var gate func(*offload.Transfer)
	if c.hold {
		h.gate = &xferGate{ch: make(chan struct{})}
		gate = h.gate.wait
	}
	h.layout = kvcache.Layout{NumLayers: 2, NumBlocks: c.numBlocks, BlockSize: c.blockSize, KVDim: 4}
	var err error
	h.pool, err = kvcache.New(kvcache.Config{NumBlocks: c.numBlocks, BlockSize: c.blockSize, PrefixCaching: true})
	require.NoError(t, err)
	h.storage, err = kvcache.NewStorage(h.layout)
	require.NoError(t, err)
	var sc kvconnector.Scheduler = kvconnector.Noop{}
	h.worker = kvconnector.Noop{}
	var logger *slog.Logger
	if c.quiet {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if !c.noConnector {
		h.conn, err = offload.New(offload.Config{
			CPUBytes: int64(c.cpuChunks * c.bpc * h.layout.BlockBytes()), BlockSize: c.blockSize, BlocksPerChunk: c.bpc,
			Policy: c.policy, Delay: c.delay, Logger: logger, RecordEvents: c.recordEvents, TransferGate: gate,
			// Every transfer of two blocks or more is split across helpers, so the scenarios and
			// the random interleavings run the split path with its tiny blocks.
			CopyThreads: 3, SplitBytes: 1,
		})
		require.NoError(t, err)
		sc, h.worker = h.conn.Scheduler(), h.conn.Worker()
	}
	maxLen := (c.numBlocks - 1) * c.blockSize
	h.sched, err = sched.New(sched.Config{MaxNumBatchedTokens: c.maxTokens, MaxNumSeqs: c.maxSeqs, MaxModelLen: maxLen, EOSTokenIDs: []int{eos}}, h.pool, sc)
	require.NoError(t, err)
	if b, ok := h.worker.(kvconnector.StorageBinder); ok {
		require.NoError(t, b.BindKVStorage(h.storage))
	}
	t.Cleanup(func() { _ = h.worker.WaitIdle(context.Background()) })
	if h.gate != nil {
		t.Cleanup(h.gate.release) // runs first: nothing may stay held
	}
	return h
}

// release lets the held transfers (harnessCfg.hold) copy, and all later ones until hold.
func (h *harness) release() { h.gate.release() }

// hold makes transfers submitted from now on wait for the next release.
func (h *harness) hold() { h.gate.hold() }

func (h *harness) add(id string, prompt []int, maxTokens int) {
	h.t.Helper()
	require.NoError(h.t, h.sched.Add(&sched.Request{ID: id, PromptTokenIDs: prompt, Params: sched.Params{MaxTokens: maxTokens}}))
}

// kvValue is the fake model's K or V entry at one position: a function of the prefix hash.
func kvValue(prefix uint64, layer, j int) float32 {
	x := prefix ^ uint64(layer*1315423911+j*2654435761)
	x ^= x >> 29
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 32
	return float32(x&0xffffff) / 1024
}

func prefixHashes(tokens []int) []uint64 {
	out := make([]uint64, len(tokens))
	var h uint64 = 1469598103934665603
	for i, t := range tokens {
		h = (h ^ uint64(t+1)) * 1099511628211
		out[i] = h
	}
	return out
}

func (h *harness) writePos(blocks []int, pos int, prefix uint64) {
	b := blocks[pos/h.layout.BlockSize]
	slot := pos % h.layout.BlockSize
	for l := 0; l < h.layout.NumLayers; l++ {
		k, v := h.storage.KV(b, l)
		for j := 0; j < h.layout.KVDim; j++ {
			k[slot*h.layout.KVDim+j] = kvValue(prefix, l, j)
			v[slot*h.layout.KVDim+j] = kvValue(prefix, l, j+100)
		}
	}
}

// readSum folds the KV the model reads for positions [0, n) into a token: any wrong entry
// changes the sampled token with high probability.
func (h *harness) readSum(blocks []int, n int) uint64 {
	var acc uint64 = 7
	for pos := range n {
		b := blocks[pos/h.layout.BlockSize]
		slot := pos % h.layout.BlockSize
		for l := 0; l < h.layout.NumLayers; l++ {
			k, v := h.storage.KV(b, l)
			for j := 0; j < h.layout.KVDim; j++ {
				acc = acc*31 + uint64(math.Float32bits(k[slot*h.layout.KVDim+j]))
				acc = acc*31 + uint64(math.Float32bits(v[slot*h.layout.KVDim+j]))
			}
		}
	}
	return acc
}

func (h *harness) forward(so *sched.SchedulerOutput, mo *sched.ModelOutput) {
	for _, sr := range so.Scheduled {
		toks := sr.Req.TokenIDs()
		ph := prefixHashes(toks)
		if sr.Fresh && sr.StartPos > 0 {
			// The cached prefix (engine prefix hit or connector load) must be exactly the KV this
			// model computes for it: loaded KV is bit-identical to what was stored.
			for pos := 0; pos < sr.StartPos; pos++ {
				b := sr.BlockIDs[pos/h.layout.BlockSize]
				k, _ := h.storage.KV(b, 0)
				got := k[(pos%h.layout.BlockSize)*h.layout.KVDim]
				require.Equal(h.t, kvValue(ph[pos], 0, 0), got, "request %s: cached KV at position %d is wrong", sr.ReqID, pos)
			}
			h.checked++
		}
		for k := range sr.TokenIDs {
			h.writePos(sr.BlockIDs, sr.StartPos+k, ph[sr.StartPos+k])
		}
		if sr.Sample {
			n := len(toks)
			tok := 1 + int(h.readSum(sr.BlockIDs, n)%uint64(vocab-1))
			if at := h.eosAt[sr.ReqID]; at > 0 && len(sr.Req.OutputTokenIDs())+1 == at {
				tok = eos
			}
			mo.Sampled[sr.ReqID] = sched.Sample{TokenID: tok}
		}
	}
}

// step runs one engine step: schedule, the worker's step around the fake forward, update.
func (h *harness) step() *sched.SchedulerOutput {
	h.t.Helper()
	so, err := h.sched.Schedule()
	require.NoError(h.t, err)
	h.metas = append(h.metas, so.ConnectorMeta)
	mo := &sched.ModelOutput{Step: so.Step, Sampled: map[string]sched.Sample{}}
	var fwd func(context.Context) error
	if so.NumScheduledTokens > 0 {
		fwd = func(context.Context) error { h.forward(so, mo); return nil }
	}
	out, err := kvconnector.RunStep(context.Background(), h.worker, so.ConnectorMeta, so.FinishedReqIDs, fwd)
	require.NoError(h.t, err)
	mo.KVConnector = out
	outs, err := h.sched.UpdateFromOutput(so, mo)
	require.NoError(h.t, err)
	for _, o := range outs {
		h.outs[o.ReqID] = append(h.outs[o.ReqID], o.NewTokenIDs...)
		if o.Finished {
			h.reasons[o.ReqID] = o.FinishReason
		}
		h.cached[o.ReqID] = o.NumCachedTokens
	}
	h.check()
	return so
}

func (h *harness) check() {
	h.t.Helper()
	require.NoError(h.t, h.sched.CheckInvariants())
	if h.conn != nil {
		require.NoError(h.t, h.conn.CheckInvariants())
		require.Zero(h.t, h.conn.Violations(), "safety violations")
	}
}

// runIdle steps while the engine would have work.
func (h *harness) runIdle() {
	h.t.Helper()
	for i := 0; h.sched.HasRequests(); i++ {
		require.Less(h.t, i, 100000, "engine never went idle")
		h.step()
	}
}

// stored returns the chunk indices of every store job for req in the recorded metadata.
func (h *harness) stored(req string) []int {
	var out []int
	for _, m := range h.metas {
		if p, ok := h.payload(m); ok {
			for _, t := range p.Stores {
				if t.ReqID == req {
					for _, c := range t.Chunks {
						out = append(out, c.Index)
					}
				}
			}
		}
	}
	return out
}

// loaded returns the chunk indices loaded for req.
func (h *harness) loaded(req string) []int {
	var out []int
	for _, m := range h.metas {
		if p, ok := h.payload(m); ok {
			for _, t := range p.Loads {
				if t.ReqID == req {
					for _, c := range t.Chunks {
						out = append(out, c.Index)
					}
				}
			}
		}
	}
	return out
}

// payload opens the connector's payload of a recorded step.
func (h *harness) payload(m kvconnector.Metadata) (*offload.Payload, bool) {
	return kvconnector.Open[*offload.Payload](m.Payload, h.conn.Scheduler())
}

// mustPayload is payload for a step that must carry one.
func (h *harness) mustPayload(m kvconnector.Metadata) *offload.Payload {
	h.t.Helper()
	p, ok := h.payload(m)
	require.True(h.t, ok, "step %d carries no offload payload", m.Step)
	return p
}

func (h *harness) flushed() [][]int64 {
	var out [][]int64
	for _, m := range h.metas {
		if len(m.FlushJobIDs) > 0 {
			out = append(out, m.FlushJobIDs)
		}
	}
	return out
}

func (h *harness) stat(name string) float64 {
	h.t.Helper()
	v, ok := h.conn.Stats()[name]
	require.True(h.t, ok, "stat %s", name)
	return v
}

// gpuReset drops the engine's prefix cache (what the CPU tier then serves).
func (h *harness) gpuReset() {
	h.t.Helper()
	ok, d := h.sched.ResetPrefixCache(context.Background(), false, false)
	require.True(h.t, ok, d.Reason)
}

func seq(n, salt int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = 1 + (i*7+salt*13)%(vocab-1)
	}
	return out
}
