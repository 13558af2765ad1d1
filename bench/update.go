package bench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/weights"
)

// UpdateResult times a weight update the way an RL step does it on a rollout server, with
// requests decoding throughout: the new checkpoint is loaded (read, SHA-256, decode) and
// staged (packed) while the old weights keep serving, then the cut is
// Pause(keep, clear_cache) → CommitWeights → Resume. ReadGBs and SHA256GBs are the
// baselines for the load, measured on the same file in the same run: the load cannot beat
// reading the bytes once and hashing them once.
type UpdateResult struct {
	CPU     *CPUInfo `json:"cpu,omitempty"` // set by the bench command that reports it
	Preset  string   `json:"preset"`
	Running int      `json:"running"`
	Bytes   int64    `json:"checkpoint_bytes"`
	DType   string   `json:"dtype"`

	LoadMs    float64 `json:"load_ms"`
	LoadGBs   float64 `json:"load_gb_per_s"`
	ReadGBs   float64 `json:"read_gb_per_s"`
	SHA256GBs float64 `json:"sha256_gb_per_s"`
	StageMs   float64 `json:"stage_ms"`
	// FirstStageMs is the first update's stage, which packs into the spare a server prepares
	// at start-up (engine.Engine.PrepareSpare) rather than into a set a commit retired.
	FirstStageMs float64 `json:"first_stage_ms"`
	// Rounds are every update's figures, the first included.
	Rounds []UpdateRound `json:"rounds"`
	// ServedSteps is the engine steps run while the checkpoint loaded and staged: serving
	// does not stop for a weight update until the cut.
	ServedSteps int64 `json:"steps_served_during_load_and_stage"`

	// CutMs spans Pause(keep, clear_cache) to Resume returning, the only time generation
	// stops; CutSteps counts the engine steps the pause waited for (engine DrainSteps: not
	// the steps run before the engine took the call, which depend on how the OS scheduled the
	// caller).
	CutMs      float64 `json:"cut_ms"`
	CutSteps   int64   `json:"cut_steps"`
	StepMillis float64 `json:"mean_step_ms"`
	Version    int64   `json:"version_after"`
	// NewVersionTokens reports that the running requests went on, with tokens of the new
	// version, after the cut.
	NewVersionTokens bool `json:"new_version_tokens"`
}

// UpdateRound is one update's load and stage, with the single-stream SHA-256 rate of the
// checkpoint's bytes (already in memory) measured just before the load: the load reads, hashes
// and decodes the same bytes, so it cannot beat hashing them once.
type UpdateRound struct {
	Version   int64   `json:"version"`
	LoadMs    float64 `json:"load_ms"`
	LoadGBs   float64 `json:"load_gb_per_s"`
	SHA256GBs float64 `json:"sha256_gb_per_s"`
	StageMs   float64 `json:"stage_ms"`
}

// LoadVsSHA256 is the load rate as a share of the hash rate (goal >= 0.9).
func (u UpdateRound) LoadVsSHA256() float64 { return u.LoadGBs / u.SHA256GBs }

// StageVsLoad is the stage time as a share of the load time (goal <= 0.5).
func (u UpdateRound) StageVsLoad() float64 { return u.StageMs / u.LoadMs }

// ErrNotEnoughMemory reports a figure that would not fit in the machine's available memory:
// measuring it anyway would end with the kernel killing the process.
var ErrNotEnoughMemory = errors.New("bench: not enough memory")

// updateSets is how many float32 copies of the weights WeightUpdate holds at its peak: the
// served set (unpacked and packed), the checkpoint's bytes, and the spare a server prepares
// (unpacked and packed), which later updates load and stage into.
const updateSets = 5

// updateMemory is the memory WeightUpdate needs for c: updateSets copies of its float32
// weights and the KV pool (at most 1 GiB, engine.Config.NumBlocks).
func updateMemory(c model.Config) int64 { return updateSets*4*c.NumParams() + 1<<30 }

// availableMemory is MemAvailable from meminfo (Linux's /proc/meminfo), and false where it
// cannot be read.
func availableMemory(meminfo string) (int64, bool) {
	b, err := os.ReadFile(meminfo)
	if err != nil {
		return 0, false
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) == 3 && string(f[0]) == "MemAvailable:" && string(f[2]) == "kB" {
			kb, err := strconv.ParseInt(string(f[1]), 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}

// checkUpdateMemory fails with ErrNotEnoughMemory when WeightUpdate of c would not fit in
// the available memory read from meminfo.
func checkUpdateMemory(c model.Config, preset, meminfo string) error {
	need := updateMemory(c)
	if avail, ok := availableMemory(meminfo); ok && need > avail {
		return fmt.Errorf("%w: a weight update of %s holds %d float32 copies of its weights and a KV pool, about %.1f GB, and %.1f GB are available",
			ErrNotEnoughMemory, preset, updateSets, float64(need)/1e9, float64(avail)/1e9)
	}
	return nil
}

// WeightUpdate writes preset's seed-2 weights as an HF checkpoint of dtype d under dir and
// measures UpdateResult over updates updates (at least two) with running requests (0: none)
// decoding on the seed-1 weights.
func WeightUpdate(ctx context.Context, preset string, running, updates, workers int, d weights.DType, dir string) (UpdateResult, error) {
	r := UpdateResult{Preset: preset, Running: running, DType: d.String()}
	updates = max(updates, 2)
	c, err := model.PresetConfig(preset)
	if err != nil {
		return r, err
	}
	if err := checkUpdateMemory(c, preset, "/proc/meminfo"); err != nil {
		return r, err
	}
	w1, err := model.Preset(preset, 1)
	if err != nil {
		return r, err
	}
	ckpt := filepath.Join(dir, preset+"-v2")
	if err := writeCheckpoint(ckpt, preset, 2, d); err != nil {
		return r, err
	}
	raw, err := os.ReadFile(filepath.Join(ckpt, weights.SafetensorsFile))
	if err != nil {
		return r, err
	}
	// Read raw once before any round hashes it as the baseline: on a KVM guest the first user
	// access to a 4 KB page the kernel filled costs about 5 µs (see hugepage.Make), which put
	// update 1's baseline at a third of the others' and its load/SHA-256 ratio at 3x.
	_ = sha256.Sum256(raw)
	if r.ReadGBs, r.SHA256GBs, err = readAndHash(filepath.Join(ckpt, weights.SafetensorsFile)); err != nil {
		return r, err
	}

	e, stop, err := runEngine(ctx, engine.Config{Weights: w1, MaxNumSeqs: max(running, 1), MaxBatchedTokens: 2048, Workers: workers})
	if err != nil {
		return r, err
	}
	defer stop()
	// The server's update path (server/api fetchAndStage): the sets it loaded, the initial
	// one included, are recycled into later loads once the engine no longer reads them.
	var sets weights.Recycler
	sets.Keep(w1, e.Version())
	// Start the first update from a fresh server's heap: writing the checkpoint freed
	// hundreds of MB the runtime would hand the first load already faulted in, which made
	// update 1 look faster than a fresh server's. Then make the spare sets a server prepares
	// in the background at start-up (api.Config.NoSpareWeights), an unpacked one and the
	// engine's packed one; seconds after start they are ready, so the first update decodes
	// and packs into touched memory as every later one does.
	freshHeap()
	spare, err := weights.Prefault(w1.Config)
	if err != nil {
		return r, err
	}
	if err := e.PrepareSpare(ctx, spare); err != nil {
		return r, err
	}
	sets.KeepFree(spare)
	streams, err := startDecoding(ctx, e, "u", running, w1.Config.VocabSize, w1.Config.MaxPositionEmbeddings-8)
	if err != nil {
		return r, err
	}
	defer func() {
		e.Abort(streamIDs(streams)...)
		for _, s := range streams {
			_, _ = s.Collect(context.Background())
		}
	}()

	// Versions 2, 3, ... (the same file): the first update loads into the spare set and packs
	// into new memory, the later ones load and pack into the sets the one before retired, as
	// every later update of an RL run does. The summary figures are the last update's; load
	// is the best of all.
	r.NewVersionTokens = true
	for v := int64(2); v < int64(2+updates); v++ {
		t0 := time.Now()
		_ = sha256.Sum256(raw)
		round := UpdateRound{Version: v, SHA256GBs: float64(len(raw)) / time.Since(t0).Seconds() / 1e9}
		steps0 := e.Metrics().Steps
		t0 = time.Now()
		reuse := sets.Take(e.VersionsInUse()...)
		w, info, err := weights.LoadWithInfo(ctx, weights.Ref{Version: v, URI: ckpt}, weights.Options{Reuse: reuse})
		if err != nil {
			return r, err
		}
		round.LoadMs = time.Since(t0).Seconds() * 1e3
		round.LoadGBs = float64(info.Bytes) / round.LoadMs / 1e6
		if r.LoadMs == 0 || round.LoadMs < r.LoadMs {
			r.Bytes, r.LoadMs, r.LoadGBs = info.Bytes, round.LoadMs, round.LoadGBs
		}
		t0 = time.Now()
		err = e.StageWeights(ctx, w, v)
		sets.Keep(w, v)
		if err != nil {
			return r, err
		}
		round.StageMs = time.Since(t0).Seconds() * 1e3
		r.Rounds = append(r.Rounds, round)
		r.FirstStageMs, r.StageMs = r.Rounds[0].StageMs, round.StageMs
		r.ServedSteps = e.Metrics().Steps - steps0

		if running > 0 {
			r.StepMillis = meanStepMillis(e)
		}

		before := e.Metrics().DrainSteps
		t0 = time.Now()
		if _, err := e.Pause(ctx, engine.PauseKeep, true); err != nil {
			return r, err
		}
		if r.Version, err = e.CommitWeights(ctx, v); err != nil {
			return r, err
		}
		// Read while still paused: after Resume the engine steps on at once, and a read then
		// would count steps of the resumed generation (dozens on tiny).
		r.CutSteps = e.Metrics().DrainSteps - before
		if err := e.Resume(ctx); err != nil {
			return r, err
		}
		r.CutMs = time.Since(t0).Seconds() * 1e3

		// Each request's next tokens carry the new version (drain what was produced before).
		// Waiting for them also lets the cut's recompute prefill (clear_cache preempted the
		// running requests) finish before the next round measures load and stage.
		for _, s := range streams {
			for {
				o, err := s.Recv(ctx)
				if err != nil {
					return r, err
				}
				if len(o.Tokens) > 0 && o.Tokens[len(o.Tokens)-1].WeightVersion == r.Version {
					break
				}
				if o.Finished {
					r.NewVersionTokens = false
					break
				}
			}
		}
	}
	return r, nil
}

// writeCheckpoint saves preset's seed weights as an HF checkpoint in dir.
func writeCheckpoint(dir, preset string, seed uint64, d weights.DType) error {
	w, err := model.Preset(preset, seed)
	if err != nil {
		return err
	}
	return weights.SaveHF(dir, w, d)
}

// readAndHash reads path and hashes the bytes, returning the best rates (GB/s) of three
// rounds. The reads also warm the page cache, so a load measured after them measures memory,
// not the disk.
func readAndHash(path string) (readGBs, hashGBs float64, err error) {
	for range 3 {
		t0 := time.Now()
		raw, err := os.ReadFile(path)
		if err != nil {
			return 0, 0, err
		}
		readDur := time.Since(t0)
		t0 = time.Now()
		_ = sha256.Sum256(raw)
		hashDur := time.Since(t0)
		n := float64(len(raw))
		readGBs, hashGBs = max(readGBs, n/readDur.Seconds()/1e9), max(hashGBs, n/hashDur.Seconds()/1e9)
	}
	return readGBs, hashGBs, nil
}
