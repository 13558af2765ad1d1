package trainer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/weights"
)

// Checkpoint layout: the model is a plain Hugging Face directory the engine loads (config.json
// and model.safetensors, float32), so a checkpoint can be served or published as it is; the
// optimizer state lives under StateDir beside it.
const (
	// StateDir is the subdirectory of a checkpoint holding the optimizer state.
	StateDir = "trainer_state"
	// StateFile is the JSON file in StateDir with the step count, version and config; it is
	// written last, so its presence marks a complete checkpoint.
	StateFile = "state.json"
	adamMDir  = "adam_m"
	adamVDir  = "adam_v"
)

type checkpointState struct {
	Steps   int    `json:"steps"`
	Version int64  `json:"version"`
	Config  Config `json:"config"`
}

// Save writes a checkpoint to dir: the current weights in the engine's HF safetensors layout
// (weights.SaveHF, float32) plus the AdamW moments and the step count under StateDir.
//
// A crash at any moment leaves a complete checkpoint, the new one or the one before: Save
// writes everything beside dir (dir+".tmp", the marker last), then moves the old checkpoint
// to dir+".prev", the new one to dir, and removes the old; HasCheckpoint and Resume fall
// back to dir+".prev" when dir is not complete. A loop killed mid-save (docker-compose's
// rl-loop, on a crash or a restart) so resumes instead of finding no checkpoint at all.
func (t *Trainer) Save(dir string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ErrClosed
	}
	tmp, prev := dir+".tmp", dir+".prev"
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("trainer: save: %w", err)
	}
	sd := filepath.Join(tmp, StateDir)
	if err := weights.SaveHF(tmp, t.p.weights(), weights.F32); err != nil {
		return fmt.Errorf("trainer: save weights: %w", err)
	}
	if err := weights.SaveHF(filepath.Join(sd, adamMDir), t.opt.m.weights(), weights.F32); err != nil {
		return fmt.Errorf("trainer: save optimizer: %w", err)
	}
	if err := weights.SaveHF(filepath.Join(sd, adamVDir), t.opt.v.weights(), weights.F32); err != nil {
		return fmt.Errorf("trainer: save optimizer: %w", err)
	}
	js, err := json.MarshalIndent(checkpointState{Steps: t.steps, Version: t.version, Config: t.cfg}, "", "  ")
	if err != nil {
		return fmt.Errorf("trainer: save: %w", err)
	}
	if err := os.WriteFile(filepath.Join(sd, StateFile), js, 0o644); err != nil {
		return fmt.Errorf("trainer: save: %w", err)
	}
	switch {
	case complete(dir):
		// The current checkpoint becomes the fallback until the new one is in place.
		if err := os.RemoveAll(prev); err != nil {
			return fmt.Errorf("trainer: save: %w", err)
		}
		if err := os.Rename(dir, prev); err != nil {
			return fmt.Errorf("trainer: save: %w", err)
		}
	default:
		// Nothing complete at dir (a first save, or a crash left prev as the only
		// checkpoint): keep prev until the new one is in place.
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("trainer: save: %w", err)
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("trainer: save: %w", err)
	}
	if err := os.RemoveAll(prev); err != nil {
		return fmt.Errorf("trainer: save: %w", err)
	}
	return nil
}

// complete reports whether dir holds a checkpoint whose marker Save wrote.
func complete(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, StateDir, StateFile))
	return err == nil
}

// checkpointDir is where the checkpoint named dir is: dir, or the previous one Save left
// at dir+".prev" when a crash stopped it between moving the old checkpoint and the new.
func checkpointDir(dir string) string {
	if !complete(dir) && complete(dir+".prev") {
		return dir + ".prev"
	}
	return dir
}

// HasCheckpoint reports whether dir holds a complete checkpoint written by Save (or its
// previous one, see Save).
func HasCheckpoint(dir string) bool {
	return complete(checkpointDir(dir))
}

// Resume starts a Trainer from a checkpoint written by Save: the weights, the AdamW moments,
// the step count (the schedule continues where it stopped) and the weight version. cfg
// configures the resumed run as for New; its Version is ignored in favour of the
// checkpoint's, and with KLCoef > 0 it must name the Reference. A missing or malformed
// checkpoint returns ErrBadCheckpoint, optimizer state or a reference of another shape than
// the weights ErrShapeMismatch.
func Resume(dir string, cfg Config) (*Trainer, error) {
	if cfg.KLCoef > 0 && cfg.Reference == nil {
		return nil, fmt.Errorf("%w: resuming with kl_coef %v needs Config.Reference (the checkpoint holds only the trained weights)", ErrInvalidConfig, cfg.KLCoef)
	}
	dir = checkpointDir(dir)
	js, err := os.ReadFile(filepath.Join(dir, StateDir, StateFile))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrBadCheckpoint, dir, err)
	}
	var st checkpointState
	if err := json.Unmarshal(js, &st); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrBadCheckpoint, StateFile, err)
	}
	if st.Steps < 0 {
		return nil, fmt.Errorf("%w: %s: steps %d", ErrBadCheckpoint, StateFile, st.Steps)
	}
	w, err := weights.LoadHF(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadCheckpoint, err)
	}
	load := func(name string) (*model.Weights, error) {
		m, err := weights.LoadHF(filepath.Join(dir, StateDir, name))
		if err != nil {
			return nil, fmt.Errorf("%w: optimizer state: %w", ErrBadCheckpoint, err)
		}
		if err := CheckShape(w.Config, m.Config); err != nil {
			return nil, fmt.Errorf("optimizer state %s: %w", name, err)
		}
		return m, nil
	}
	m, err := load(adamMDir)
	if err != nil {
		return nil, err
	}
	v, err := load(adamVDir)
	if err != nil {
		return nil, err
	}
	cfg.Version = st.Version
	t, err := New(w, cfg)
	if err != nil {
		return nil, err
	}
	t.opt.m, t.opt.v = paramsFrom[float32](m), paramsFrom[float32](v)
	t.steps = st.Steps
	return t, nil
}
