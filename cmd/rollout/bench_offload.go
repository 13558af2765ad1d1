package main

import (
	"encoding/json"
	"fmt"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/rolloutkit/rollout/bench"
)

func newBenchOffloadCmd() *cobra.Command {
	var (
		asJSON     bool
		bwBlocks   int
		bwRounds   int
		ttftPrompt int
		resetJobs  int
		workers    int
	)
	cmd := &cobra.Command{
		Use:   "offload",
		Short: "KV offloading: store/load bandwidth vs the multi-threaded copy(), TTFT from CPU slots vs recompute, reset drain time",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := bench.Offload(cmd.Context(), bwBlocks, bwRounds, ttftPrompt, resetJobs, workers)
			if err != nil {
				return err
			}
			c := bench.DescribeCPU()
			rep.CPU = &c
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			fmt.Fprintf(out, "cpu: %s\n", c)
			if b := rep.Bandwidth; b != nil {
				fmt.Fprintf(out, "offload bandwidth, %s, %d blocks of %d bytes, %d chunks per job (generation checks and CRC-32C on):\n",
					b.Shape, b.Blocks, b.BlockBytes, b.ChunksPerJob)
				fmt.Fprintf(out, "  %d-thread copy() %.2f GB/s, one copy() %.2f GB/s\n", b.CopyThreads, b.ParallelGBs, b.PlainCopyGBs)
				fmt.Fprintf(out, "  store %.2f GB/s (%.2fx the %d-thread copy, %.2fx one copy), load %.2f GB/s (%.2fx, %.2fx); goal >= 0.6x the %d-thread copy; loaded bytes identical: %v\n",
					b.StoreGBs, b.StoreShare, b.CopyThreads, b.StoreRatio, b.LoadGBs, b.LoadShare, b.LoadRatio, b.CopyThreads, b.StoredVerified)
			}
			if t := rep.TTFT; t != nil {
				fmt.Fprintf(out, "TTFT of a %d-token prompt on %s: recompute %.1f ms, from CPU slots %.1f ms (%d cached tokens) = %.3fx (goal <= 0.2x)\n",
					t.PromptTokens, t.Preset, t.RecomputeTTFTms, t.LoadTTFTms, t.CachedTokens, t.Ratio)
			}
			if r := rep.Reset; r != nil {
				fmt.Fprintf(out, "double ResetCache with %d stores tracked (%.1f MB): flush delivered and waited %.2f ms, engine idle %.2f ms (%d steps, %d job ids flushed)\n",
					r.StoresInFlight, float64(r.BytesInFlight)/1e6, r.FlushDeliveredMs, r.IdleMs, r.Steps, r.FlushedJobs)
			}
			fmt.Fprintf(out, "safety violations: %d\n", violations(rep))
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, "print JSON")
	f.IntVar(&bwBlocks, "blocks", 256, "stories15m-shaped blocks moved by the bandwidth figure")
	f.IntVar(&bwRounds, "rounds", 3, "rounds of the bandwidth figure; each figure is the best round (more rounds see through a busy machine)")
	f.IntVar(&ttftPrompt, "ttft-prompt", 2048, "prompt tokens of the TTFT figure (0: skip)")
	f.IntVar(&resetJobs, "reset-stores", 64, "store jobs tracked when the reset figure resets")
	f.IntVar(&workers, "workers", runtime.GOMAXPROCS(0), "kernel workers")
	return cmd
}

func violations(r bench.OffloadReport) int64 {
	var n int64
	if r.Bandwidth != nil {
		n += r.Bandwidth.Violations
	}
	if r.TTFT != nil {
		n += r.TTFT.Violations
	}
	if r.Reset != nil {
		n += r.Reset.Violations
	}
	return n
}
