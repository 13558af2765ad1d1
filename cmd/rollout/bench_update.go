package main

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/rolloutkit/rollout/bench"
	"github.com/rolloutkit/rollout/engine/weights"
)

func newBenchUpdateCmd() *cobra.Command {
	var (
		asJSON  bool
		preset  string
		running int
		updates int
		dtype   string
		workers int
	)
	cmd := &cobra.Command{
		Use:   "update",
		Short: "Weight updates: load (read, SHA-256, decode) vs the SHA-256 of the same bytes, stage (pack) vs load, every update",
		Long: "Writes the preset's random weights as a Hugging Face checkpoint in a temporary directory and\n" +
			"updates a running engine from it --updates times. Each update's load is shown beside the\n" +
			"single-stream SHA-256 rate of the same bytes measured just before it (goal >= 0.9x), and its\n" +
			"stage (packing into the kernels' layout, while the old weights serve) beside its load\n" +
			"(goal <= 0.5x), the first update included.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d, err := weights.ParseDType(dtype)
			if err != nil {
				return err
			}
			dir, err := os.MkdirTemp("", "rollout-bench-update-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			r, err := bench.WeightUpdate(cmd.Context(), preset, running, updates, workers, d, dir)
			if err != nil {
				return err
			}
			c := bench.DescribeCPU()
			r.CPU = &c
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(r)
			}
			fmt.Fprintf(out, "cpu: %s\n", c)
			fmt.Fprintf(out, "weight updates of %s (%.0f MB %s checkpoint), %d requests decoding, %d workers\n",
				r.Preset, float64(r.Bytes)/1e6, r.DType, r.Running, workers)
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "update\tload ms\tload GB/s\tsha256 GB/s\tload/sha256\tstage ms\tstage/load")
			for i, u := range r.Rounds {
				name := fmt.Sprint(i + 1)
				if i == 0 {
					name += " (first)"
				}
				fmt.Fprintf(tw, "%s\t%.0f\t%.2f\t%.2f\t%.2fx\t%.0f\t%.2fx\n", name, u.LoadMs, u.LoadGBs, u.SHA256GBs, u.LoadVsSHA256(), u.StageMs, u.StageVsLoad())
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(out, "goals: load >= 0.9x sha256, stage <= 0.5x load on every update; cut %.1f ms (%d steps)\n", r.CutMs, r.CutSteps)
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, "print JSON")
	f.StringVar(&preset, "preset", "stories110m", "model preset (tiny, stories15m, stories110m)")
	f.IntVar(&running, "running", 0, "requests decoding throughout (0: an idle engine)")
	f.IntVar(&updates, "updates", 3, "updates to run (at least 2)")
	f.StringVar(&dtype, "dtype", "F32", "checkpoint dtype: F32, F16 or BF16")
	f.IntVar(&workers, "workers", runtime.GOMAXPROCS(0), "kernel workers")
	return cmd
}
