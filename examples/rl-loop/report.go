package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/schollz/progressbar/v3"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// record is one step of the run, as the JSON-lines log holds it.
type record struct {
	Step    int     `json:"step"`
	Version int64   `json:"version"`
	Reward  float64 `json:"reward_mean"`
	Max     float64 `json:"reward_max"`
	Loss    float64 `json:"loss"`
	// Times in seconds: the step's phases and the update's.
	GenerateSec float64 `json:"generate_s"`
	ScoreSec    float64 `json:"score_s"`
	TrainSec    float64 `json:"train_s"`
	PublishSec  float64 `json:"publish_s"`
	StageSec    float64 `json:"stage_s"`
	CommitSec   float64 `json:"commit_s"`
	StepSec     float64 `json:"step_s"`
	// BubbleMs is the longest per-server generation gap of the update that landed during
	// this step (last token before its pause to first token after its resume).
	BubbleMs float64 `json:"bubble_ms"`
	// GenTokensPerSec is completion tokens per second of the generate phase.
	GenTokensPerSec float64 `json:"gen_tokens_per_s"`
	// Mismatch is the mean |trainer logprob − rollout logprob| over on-policy tokens.
	Mismatch    float64 `json:"logprob_mismatch"`
	MismatchMax float64 `json:"logprob_mismatch_max"`
	StaleTokens int     `json:"stale_tokens"`
	Tokens      int     `json:"tokens"`
	// Versions seen in this step's samples (min and max), and the violations reported by the
	// servers so far.
	MinVersion int64  `json:"min_token_version"`
	MaxVersion int64  `json:"max_token_version"`
	Violations int64  `json:"safety_violations"`
	Example    string `json:"example"`
}

// reporter prints the run: a progress bar on a terminal (plain lines otherwise), a table row
// per step, and the JSON-lines log.
type reporter struct {
	out   io.Writer
	tty   bool
	bar   *progressbar.ProgressBar
	log   *json.Encoder
	first bool
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func newReporter(out *os.File, log io.Writer, steps int) *reporter {
	r := &reporter{out: out, tty: isTerminal(out), log: json.NewEncoder(log), first: true}
	if r.tty {
		r.bar = progressbar.NewOptions(steps, progressbar.OptionSetWriter(out), progressbar.OptionSetDescription("training"),
			progressbar.OptionShowCount(), progressbar.OptionSetWidth(30), progressbar.OptionClearOnFinish())
	}
	return r
}

func (r *reporter) step(rec record) error {
	if r.bar != nil {
		_ = r.bar.Clear()
	}
	if r.first {
		fmt.Fprintf(r.out, "%5s %7s %6s %9s %8s %8s %9s %9s %9s %6s %8s  %s\n", "step", "reward", "max", "gen tok/s",
			"train s", "stage s", "commit s", "bubble ms", "mismatch", "stale", "versions", "sample")
		r.first = false
	}
	fmt.Fprintf(r.out, "%5d %7.3f %6.3f %9.0f %8.3f %8.3f %9.3f %9.1f %9.1e %6d %8s  %s\n", rec.Step, rec.Reward, rec.Max,
		rec.GenTokensPerSec, rec.TrainSec, rec.StageSec, rec.CommitSec, rec.BubbleMs, rec.Mismatch, rec.StaleTokens,
		fmt.Sprintf("%d-%d", rec.MinVersion, rec.MaxVersion), rec.Example)
	if r.bar != nil {
		r.bar.Describe(fmt.Sprintf("reward %.3f", rec.Reward))
		_ = r.bar.Add(1)
	}
	return r.log.Encode(rec)
}

func (r *reporter) finish() {
	if r.bar != nil {
		_ = r.bar.Finish()
	}
}

// plotRewards writes the reward curve (mean and max per step) as a PNG.
func plotRewards(path string, recs []record) error {
	p := plot.New()
	p.Title.Text = "GRPO on builtin:tiny: reward per step"
	p.X.Label.Text = "step"
	p.Y.Label.Text = "reward"
	p.Y.Min, p.Y.Max = 0, 1
	mean := make(plotter.XYs, len(recs))
	maxs := make(plotter.XYs, len(recs))
	for i, r := range recs {
		mean[i] = plotter.XY{X: float64(r.Step), Y: r.Reward}
		maxs[i] = plotter.XY{X: float64(r.Step), Y: r.Max}
	}
	lm, err := plotter.NewLine(mean)
	if err != nil {
		return err
	}
	lm.Width = vg.Points(2)
	lx, err := plotter.NewLine(maxs)
	if err != nil {
		return err
	}
	lx.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(plotter.NewGrid(), lm, lx)
	p.Legend.Add("mean", lm)
	p.Legend.Add("max", lx)
	p.Legend.Top, p.Legend.Left = false, false // bottom right, below the curve once it has risen
	return p.Save(8*vg.Inch, 4.5*vg.Inch, path)
}
