package bench

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/kvcache"
	"github.com/rolloutkit/rollout/engine/kvconnector"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/sched"
	"github.com/rolloutkit/rollout/offload"
	"github.com/rolloutkit/rollout/offload/cpu"
)

// OffloadReport gathers the offloading connector's figures.
type OffloadReport struct {
	CPU       *CPUInfo                `json:"cpu,omitempty"`
	Bandwidth *OffloadBandwidthResult `json:"bandwidth,omitempty"`
	TTFT      *OffloadTTFTResult      `json:"ttft,omitempty"`
	Reset     *OffloadResetResult     `json:"reset_drain,omitempty"`
}

// OffloadBandwidthResult compares the worker's store and load copies (generation checks and
// CRC-32C included) with a plain copy() of the same bytes on one goroutine and with the
// machine's multi-threaded copy bandwidth (CopyThreads goroutines copying disjoint parts of
// the same number of bytes), in the same run.
type OffloadBandwidthResult struct {
	Shape          string  `json:"shape"`
	BlockBytes     int     `json:"block_bytes"`
	Blocks         int     `json:"blocks"`
	ChunksPerJob   int     `json:"chunks_per_job"`
	CopyThreads    int     `json:"copy_threads"`
	StoreGBs       float64 `json:"store_gb_per_s"`
	LoadGBs        float64 `json:"load_gb_per_s"`
	PlainCopyGBs   float64 `json:"plain_copy_gb_per_s"`
	ParallelGBs    float64 `json:"parallel_copy_gb_per_s"`
	StoreRatio     float64 `json:"store_vs_copy"`
	LoadRatio      float64 `json:"load_vs_copy"`
	StoreShare     float64 `json:"store_vs_parallel_copy"`
	LoadShare      float64 `json:"load_vs_parallel_copy"`
	Violations     int64   `json:"safety_violations"`
	StoredVerified bool    `json:"loaded_bytes_identical"`
}

// parallelCopy copies src into dst (equal lengths) on threads goroutines, each a contiguous
// part, and returns the time from their start to the last one's end: the machine's
// multi-threaded memcpy bandwidth, the ceiling for a split offload copy.
func parallelCopy(dst, src []float32, threads int) time.Duration {
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	part := (len(src) + threads - 1) / threads
	for i := range threads {
		lo, hi := min(i*part, len(src)), min((i+1)*part, len(src))
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			ready.Done()
			<-start
			copy(dst[lo:hi], src[lo:hi])
		}()
	}
	ready.Wait()
	t0 := time.Now()
	close(start)
	done.Wait()
	return time.Since(t0)
}

// stories15mKV is the KV layout of blocks stories15m blocks (plus the null block) of the
// engine's default block size.
func stories15mKV(blocks int) (kvcache.Layout, error) {
	cfg, err := model.PresetConfig("stories15m")
	if err != nil {
		return kvcache.Layout{}, err
	}
	return cfg.KVLayout(blocks+1, engine.DefaultBlockSize), nil
}

type offloadRig struct {
	pool    *kvcache.Manager
	storage *kvcache.Storage
	conn    *offload.Connector
}

func newOffloadRig(l kvcache.Layout, delay time.Duration) (*offloadRig, error) {
	pool, err := kvcache.New(kvcache.Config{NumBlocks: l.NumBlocks, BlockSize: l.BlockSize, PrefixCaching: true})
	if err != nil {
		return nil, err
	}
	st, err := kvcache.NewStorage(l)
	if err != nil {
		return nil, err
	}
	conn, err := offload.New(offload.Config{CPUBytes: int64(l.NumBlocks) * int64(l.BlockBytes()), BlockSize: l.BlockSize, Test: &offload.TestHooks{Delay: delay}})
	if err != nil {
		return nil, err
	}
	conn.Scheduler().(kvconnector.PoolBinder).BindBlockPool(pool)
	if err := conn.Worker().(kvconnector.StorageBinder).BindKVStorage(st); err != nil {
		return nil, err
	}
	return &offloadRig{pool: pool, storage: st, conn: conn}, nil
}

// OffloadBandwidth stores blocks pool blocks of stories15m's KV shape into CPU slots and loads
// them back through the worker side, in jobs of chunksPerJob chunks, and times a plain copy()
// of the same bytes and the same copy split across GOMAXPROCS goroutines; each figure is the
// best of rounds.
func OffloadBandwidth(ctx context.Context, blocks, chunksPerJob, rounds int) (OffloadBandwidthResult, error) {
	l, err := stories15mKV(blocks)
	if err != nil {
		return OffloadBandwidthResult{}, err
	}
	rig, err := newOffloadRig(l, 0)
	if err != nil {
		return OffloadBandwidthResult{}, err
	}
	_, w := rig.conn.TypedSides()
	defer func() { _ = w.WaitIdle(context.Background()) }()
	ids, ok := rig.pool.AllocateSlots("bench", blocks*l.BlockSize, nil)
	if !ok {
		return OffloadBandwidthResult{}, fmt.Errorf("bench: cannot allocate %d blocks", blocks)
	}
	for i, b := range ids {
		blk := rig.storage.Block(b)
		for j := range blk {
			blk[j] = float32((i*7919+j)%65521) * 0.5
		}
	}
	orig := make([]float32, blocks*l.BlockFloats())
	for i, b := range ids {
		copy(orig[i*l.BlockFloats():], rig.storage.Block(b))
	}
	var nextID int64
	jobs := func(store bool) []*offload.Transfer {
		var out []*offload.Transfer
		for i := 0; i < blocks; i += chunksPerJob {
			t := &offload.Transfer{ID: nextID, Store: store}
			nextID++
			for c := i; c < min(i+chunksPerJob, blocks); c++ {
				t.Chunks = append(t.Chunks, offload.ChunkTransfer{Index: c, Slot: cpu.Slot{ID: c, Gen: uint64(c + 1)},
					Blocks: []int{ids[c]}, Gens: []uint64{rig.pool.Generation(ids[c])}})
			}
			out = append(out, t)
		}
		return out
	}
	bytes := float64(blocks * l.BlockBytes())
	runStep := func(p *offload.Payload, flush []int64) (time.Duration, error) {
		start := time.Now()
		w.BindMetadata(kvconnector.TypedMetadata[*offload.Payload]{FlushJobIDs: flush, Payload: p})
		defer w.ClearMetadata()
		if err := w.HandlePreemptions(ctx); err != nil {
			return 0, err
		}
		if err := w.StartLoadKV(ctx); err != nil {
			return 0, err
		}
		if err := w.WaitIdle(ctx); err != nil {
			return 0, err
		}
		el := time.Since(start)
		_, _ = w.GetFinished(nil)
		if wm := w.BuildWorkerMeta(); wm != nil {
			for id, ok := range wm.Completed {
				if !ok {
					return 0, fmt.Errorf("bench: transfer %d failed", id)
				}
			}
		}
		return el, nil
	}
	res := OffloadBandwidthResult{Shape: "stories15m (6 layers, kv dim 288, 16-token blocks)", BlockBytes: l.BlockBytes(), Blocks: blocks,
		ChunksPerJob: chunksPerJob, CopyThreads: runtime.GOMAXPROCS(0)}
	plain := make([]float32, len(orig))
	par := make([]float32, len(orig))
	for range rounds {
		st := jobs(true)
		var flush []int64
		for _, t := range st {
			flush = append(flush, t.ID)
		}
		ds, err := runStep(&offload.Payload{Stores: st}, flush)
		if err != nil {
			return res, err
		}
		for _, b := range ids { // loads must write what the stores read
			clear(rig.storage.Block(b))
		}
		dl, err := runStep(&offload.Payload{Loads: jobs(false)}, nil)
		if err != nil {
			return res, err
		}
		start := time.Now()
		for i, b := range ids {
			copy(plain[i*l.BlockFloats():(i+1)*l.BlockFloats()], rig.storage.Block(b))
		}
		dp := time.Since(start)
		dm := parallelCopy(par, orig, res.CopyThreads)
		res.StoreGBs = max(res.StoreGBs, bytes/ds.Seconds()/1e9)
		res.LoadGBs = max(res.LoadGBs, bytes/dl.Seconds()/1e9)
		res.PlainCopyGBs = max(res.PlainCopyGBs, bytes/dp.Seconds()/1e9)
		res.ParallelGBs = max(res.ParallelGBs, bytes/dm.Seconds()/1e9)
	}
	res.StoredVerified = true
	for i, b := range ids {
		blk := rig.storage.Block(b)
		for j, v := range blk {
			if v != orig[i*l.BlockFloats()+j] {
				res.StoredVerified = false
			}
		}
	}
	res.StoreRatio, res.LoadRatio = res.StoreGBs/res.PlainCopyGBs, res.LoadGBs/res.PlainCopyGBs
	res.StoreShare, res.LoadShare = res.StoreGBs/res.ParallelGBs, res.LoadGBs/res.ParallelGBs
	res.Violations = rig.conn.Violations()
	return res, nil
}

// OffloadTTFTResult is the time to first token of a long prompt whose KV sits in CPU slots but
// not in the engine's pool, against recomputing it.
type OffloadTTFTResult struct {
	Preset          string  `json:"preset"`
	PromptTokens    int     `json:"prompt_tokens"`
	RecomputeTTFTms float64 `json:"recompute_ttft_ms"`
	LoadTTFTms      float64 `json:"cpu_load_ttft_ms"`
	CachedTokens    int     `json:"cached_tokens"`
	Ratio           float64 `json:"ratio"`
	Violations      int64   `json:"safety_violations"`
}

// OffloadTTFT runs a prompt of promptLen tokens cold (recompute), waits for its KV to reach the
// CPU tier, drops the engine's prefix cache only, and runs the same prompt again (CPU load).
// The model needs a context longer than promptLen.
func OffloadTTFT(ctx context.Context, w *model.Weights, preset string, promptLen, workers int) (OffloadTTFTResult, error) {
	blockSize := engine.DefaultBlockSize
	blocks := w.Config.MaxPositionEmbeddings/blockSize + 2
	bb := w.Config.KVBlockBytes(blockSize)
	conn, err := offload.New(offload.Config{CPUBytes: int64(blocks) * bb, BlockSize: blockSize, BlockBytes: bb})
	if err != nil {
		return OffloadTTFTResult{}, err
	}
	e, stop, err := runEngine(ctx, engine.Config{Weights: w, MaxNumSeqs: 2, MaxBatchedTokens: 2048, Workers: workers,
		NumBlocks: blocks, BlockSize: blockSize, Connector: conn.Scheduler(), ConnectorWorker: conn.Worker()})
	if err != nil {
		return OffloadTTFTResult{}, err
	}
	defer stop()
	v := w.Config.VocabSize
	ttft := func(id string, p []int) (float64, int, error) {
		s, err := e.Add(ctx, engine.Request{ID: id, PromptTokenIDs: p, Sampling: greedyParams(1)})
		if err != nil {
			return 0, 0, err
		}
		r, err := s.Collect(ctx)
		if err != nil {
			return 0, 0, err
		}
		return r.Timings.FirstToken.Sub(r.Timings.Arrival).Seconds() * 1e3, r.NumCachedTokens, nil
	}
	settle := func() error {
		deadline := time.Now().Add(30 * time.Second)
		for conn.Stats()["offload_jobs_inflight"] > 0 || conn.Stats()["offload_transfers_inflight"] > 0 {
			if time.Now().After(deadline) {
				return fmt.Errorf("bench: offload stores did not drain")
			}
			time.Sleep(time.Millisecond)
		}
		_, err := e.ResetPrefixCache(ctx, false, false) // the engine's cache only; the CPU tier stays
		return err
	}
	if _, _, err := ttft("warm", benchPrompt(promptLen, 77, v)); err != nil {
		return OffloadTTFTResult{}, err
	}
	if err := settle(); err != nil {
		return OffloadTTFTResult{}, err
	}
	p := benchPrompt(promptLen, 5, v)
	cold, _, err := ttft("cold", p)
	if err != nil {
		return OffloadTTFTResult{}, err
	}
	if err := settle(); err != nil {
		return OffloadTTFTResult{}, err
	}
	hit, cached, err := ttft("hit", p)
	if err != nil {
		return OffloadTTFTResult{}, err
	}
	return OffloadTTFTResult{Preset: preset, PromptTokens: promptLen, RecomputeTTFTms: cold, LoadTTFTms: hit, CachedTokens: cached,
		Ratio: hit / cold, Violations: conn.Violations()}, nil
}

// OffloadResetResult times a double reset with store jobs tracked by the connector.
type OffloadResetResult struct {
	StoresInFlight   int     `json:"stores_in_flight"`
	BytesInFlight    int64   `json:"bytes_in_flight"`
	DelayPerJobMs    float64 `json:"delay_per_job_ms"`
	FlushDeliveredMs float64 `json:"flush_delivered_and_waited_ms"`
	IdleMs           float64 `json:"engine_idle_ms"`
	FlushedJobs      int     `json:"flushed_job_ids"`
	Steps            int     `json:"steps_to_idle"`
	Violations       int64   `json:"safety_violations"`
}

// OffloadResetDrain drives the real scheduler and connector (no model: the runner samples a
// fixed token) with n requests whose one-chunk stores are tracked when ResetCache runs twice
// back to back; it times the step that delivers the flush (the worker submits and waits on every
// job) and the time until the engine has no work.
func OffloadResetDrain(ctx context.Context, n int, delay time.Duration) (OffloadResetResult, error) {
	l, err := stories15mKV(n*2 + 1)
	if err != nil {
		return OffloadResetResult{}, err
	}
	rig, err := newOffloadRig(l, delay)
	if err != nil {
		return OffloadResetResult{}, err
	}
	w := rig.conn.Worker()
	defer func() { _ = w.WaitIdle(context.Background()) }()
	s, err := sched.New(sched.Config{MaxNumBatchedTokens: 32 * n, MaxNumSeqs: n, MaxModelLen: 32}, rig.pool, rig.conn.Scheduler())
	if err != nil {
		return OffloadResetResult{}, err
	}
	step := func() (kvconnector.Metadata, error) {
		so, err := s.Schedule()
		if err != nil {
			return kvconnector.Metadata{}, err
		}
		mo := &sched.ModelOutput{Step: so.Step, Sampled: map[string]sched.Sample{}}
		for _, sr := range so.Scheduled {
			if sr.Sample {
				mo.Sampled[sr.ReqID] = sched.Sample{TokenID: 1}
			}
		}
		out, err := kvconnector.RunStep(ctx, w, so.ConnectorMeta, so.FinishedReqIDs, func(context.Context) error { return nil })
		if err != nil {
			return kvconnector.Metadata{}, err
		}
		mo.KVConnector = out
		_, err = s.UpdateFromOutput(so, mo)
		return so.ConnectorMeta, err
	}
	for i := range n {
		if err := s.Add(&sched.Request{ID: fmt.Sprintf("r%d", i), PromptTokenIDs: benchPrompt(16, i, 1000), Params: sched.Params{MaxTokens: 1}}); err != nil {
			return OffloadResetResult{}, err
		}
	}
	if _, err := step(); err != nil { // prefill: one store job per request; all finish
		return OffloadResetResult{}, err
	}
	res := OffloadResetResult{StoresInFlight: int(rig.conn.Stats()["offload_jobs_inflight"]), DelayPerJobMs: float64(delay) / 1e6}
	res.BytesInFlight = int64(res.StoresInFlight) * int64(l.BlockBytes())
	start := time.Now()
	_, _ = s.ResetPrefixCache(context.Background(), true, true)
	_, _ = s.ResetPrefixCache(context.Background(), true, true)
	meta, err := step()
	if err != nil {
		return res, err
	}
	res.FlushDeliveredMs = time.Since(start).Seconds() * 1e3
	res.FlushedJobs = len(meta.FlushJobIDs)
	res.Steps = 1
	for s.HasRequests() {
		if _, err := step(); err != nil {
			return res, err
		}
		res.Steps++
	}
	res.IdleMs = time.Since(start).Seconds() * 1e3
	res.Violations = rig.conn.Violations()
	return res, nil
}

// Offload runs the three offload figures; the bandwidth figures are the best of bwRounds
// rounds, and ttftPrompt is the prompt length of the TTFT figure (on the stories15m shape with
// a context of ttftPrompt+64 tokens).
func Offload(ctx context.Context, bwBlocks, bwRounds, ttftPrompt, resetJobs, workers int) (OffloadReport, error) {
	var rep OffloadReport
	bw, err := OffloadBandwidth(ctx, bwBlocks, engine.DefaultBlockSize, max(bwRounds, 1))
	if err != nil {
		return rep, err
	}
	rep.Bandwidth = &bw
	if ttftPrompt > 0 {
		cfg, err := model.PresetConfig("stories15m")
		if err != nil {
			return rep, err
		}
		cfg.MaxPositionEmbeddings = ttftPrompt + 64
		wts, err := model.Random(cfg, 1)
		if err != nil {
			return rep, err
		}
		tt, err := OffloadTTFT(ctx, wts, fmt.Sprintf("stories15m shape, random weights, context %d", cfg.MaxPositionEmbeddings), ttftPrompt, workers)
		if err != nil {
			return rep, err
		}
		rep.TTFT = &tt
	}
	rs, err := OffloadResetDrain(ctx, resetJobs, 0)
	if err != nil {
		return rep, err
	}
	rep.Reset = &rs
	return rep, nil
}
