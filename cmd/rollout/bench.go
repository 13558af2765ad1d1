package main

import (
	"encoding/json"
	"fmt"
	"runtime"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/rolloutkit/rollout/bench"
	"github.com/rolloutkit/rollout/engine/kernels"
)

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "bench", Short: "Run benchmarks, each figure beside its baseline measured in the same run"}
	cmd.AddCommand(newBenchEngineCmd())
	return cmd
}

func newBenchEngineCmd() *cobra.Command {
	var (
		asJSON  bool
		presets []string
		tokens  int
		prefill int
		bwBytes int
		workers int
	)
	cmd := &cobra.Command{
		Use:   "engine",
		Short: "Model and engine throughput: batch-1 decode, prefill, read bandwidth",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool := kernels.NewPool(workers)
			defer pool.Close()
			rep := bench.EngineReport{GOMAXPROCS: runtime.GOMAXPROCS(0), Kernel: kernels.KernelName()}
			rep.ReadBandwidthGBs = kernels.StreamReadBandwidth(pool, bwBytes)
			for _, p := range presets {
				r, err := bench.Decode(cmd.Context(), pool, p, tokens, prefill, rep.ReadBandwidthGBs)
				if err != nil {
					return err
				}
				rep.Decode = append(rep.Decode, r)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			fmt.Fprintf(out, "kernel %s, %d workers, streaming read bandwidth %.1f GB/s\n\n", rep.Kernel, workers, rep.ReadBandwidthGBs)
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "preset\tdecode tok/s\tllama2.c tok/s\tratio\tweights GB/s\tof bandwidth\tprefill tok/s")
			for _, r := range rep.Decode {
				fmt.Fprintf(tw, "%s\t%.1f\t%.0f-%.0f\t%.2fx\t%.1f\t%.2f\t%.0f\n", r.Preset, r.DecodeTokensPerSec,
					r.Llama2CTokensPerSec[0], r.Llama2CTokensPerSec[1], r.DecodeTokensPerSec/r.Llama2CTokensPerSec[1],
					r.WeightGBPerSec, r.BandwidthRatio, r.PrefillTokensPerSec)
			}
			return tw.Flush()
		},
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, "print JSON")
	f.StringSliceVar(&presets, "presets", []string{"stories15m", "stories110m"}, "model presets to measure")
	f.IntVar(&tokens, "tokens", 256, "decode tokens per preset")
	f.IntVar(&prefill, "prefill", 256, "prefill chunk in tokens")
	f.IntVar(&bwBytes, "bandwidth-bytes", 1<<30, "bytes streamed by the bandwidth probe")
	f.IntVar(&workers, "workers", runtime.GOMAXPROCS(0), "kernel workers")
	return cmd
}
