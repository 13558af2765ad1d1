package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/rolloutkit/rollout/engine/weights"
)

func newWeightsCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "weights", Short: "Serve versioned checkpoints and compute the digests weight updates verify"}
	cmd.AddCommand(newWeightsDigestCmd())
	return cmd
}

// digestResult is what `weights digest --json` prints.
type digestResult struct {
	Path   string `json:"path"`
	Format string `json:"format"`
	SHA256 string `json:"sha256"`
}

func newWeightsDigestCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "digest PATH",
		Short: "Print the SHA-256 digest /update_weights and UpdateWeights verify, for --sha256",
		Long: "Print the digest of a checkpoint exactly as a weight update verifies it, so scripts can\n" +
			"pass it as --sha256. PATH is a Hugging Face checkpoint directory (the digest covers\n" +
			"config.json and the safetensors files: `cd DIR && sha256sum config.json model.safetensors | sha256sum`)\n" +
			"or a llama2.c .bin file (the file's SHA-256).",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := args[0]
			st, err := os.Stat(path)
			if err != nil {
				return fmt.Errorf("weights digest: %w", err)
			}
			format := weights.FormatLlama2C
			if st.IsDir() {
				format = weights.FormatHF
			}
			sum, err := weights.Digest(cmd.Context(), path)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(digestResult{Path: path, Format: format, SHA256: sum})
			}
			_, err = fmt.Fprintln(out, sum)
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print {path, format, sha256} as JSON")
	return cmd
}
