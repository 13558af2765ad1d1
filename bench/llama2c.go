package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"

	"github.com/rolloutkit/rollout/engine/load"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/tokenizer"
	"github.com/rolloutkit/rollout/engine/weights"
)

// ErrLlama2COutput means the llama2.c binary ran but printed no "achieved tok/s" line.
var ErrLlama2COutput = errors.New("bench: llama2.c printed no achieved tok/s")

var achieved = regexp.MustCompile(`achieved tok/s: ([0-9.]+)`)

// Llama2C is a llama2.c `run` binary (built by the user, e.g. `gcc -Ofast -march=native
// -fopenmp run.c -lm`) run on the same random preset as Decode, so that the baseline is
// measured on this machine in the same run rather than taken from a table.
type Llama2C struct {
	bin string
	dir string // the preset's model.bin and tokenizer.bin
}

// NewLlama2C writes preset (seed 1, as Decode uses) in llama2.c's format to a temporary
// directory for bin. Close removes it.
func NewLlama2C(bin, preset string) (*Llama2C, error) {
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("bench: llama2.c binary: %w", err)
	}
	if path, err = filepath.Abs(path); err != nil {
		return nil, err
	}
	w, err := model.Preset(preset, 1)
	if err != nil {
		return nil, err
	}
	tok, err := load.BuiltinTokenizer(w.Config)
	if err != nil {
		return nil, err
	}
	if tok.Kind() == "byte" {
		return nil, fmt.Errorf("bench: llama2.c needs a sentencepiece-style tokenizer.bin; preset %s is byte-level", preset)
	}
	dir, err := os.MkdirTemp("", "rollout-llama2c-")
	if err != nil {
		return nil, err
	}
	l := &Llama2C{bin: path, dir: dir}
	if err := weights.SaveLlama2C(filepath.Join(dir, "model.bin"), w); err != nil {
		l.Close()
		return nil, err
	}
	var buf bytes.Buffer
	if err := tokenizer.WriteLlama2C(tok, &buf); err != nil {
		l.Close()
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.bin"), buf.Bytes(), 0o644); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// Run decodes tokens greedy tokens with OMP_NUM_THREADS=threads and returns run.c's own
// "achieved tok/s" (timed from the second token, as run.c does).
func (l *Llama2C) Run(ctx context.Context, tokens, threads int) (float64, error) {
	cmd := exec.CommandContext(ctx, l.bin, "model.bin", "-t", "0", "-n", strconv.Itoa(tokens))
	cmd.Dir = l.dir // run.c opens tokenizer.bin in the working directory by default
	cmd.Env = append(os.Environ(), "OMP_NUM_THREADS="+strconv.Itoa(threads))
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = nil, &stderr
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("bench: %s: %w: %s", l.bin, err, bytes.TrimSpace(stderr.Bytes()))
	}
	m := achieved.FindSubmatch(stderr.Bytes())
	if m == nil {
		return 0, fmt.Errorf("%w: %q", ErrLlama2COutput, stderr.String())
	}
	return strconv.ParseFloat(string(m[1]), 64)
}

// Close removes the checkpoint.
func (l *Llama2C) Close() { _ = os.RemoveAll(l.dir) }
