package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/rolloutkit/rollout/engine/gguf"
	"github.com/rolloutkit/rollout/engine/load"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/tokenizer"
	"github.com/rolloutkit/rollout/engine/weights"
)

func newModelCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "model", Short: "Create and inspect model checkpoints"}
	cmd.AddCommand(newModelInitCmd(), newModelExportCmd())
	return cmd
}

func newModelExportCmd() *cobra.Command {
	var model, tokPath, out, format, typ, name string
	cmd := &cobra.Command{
		Use:   "export",
		Short: "Write a checkpoint (a directory, a llama2.c .bin or builtin:NAME[@SEED]) as a GGUF file for llama.cpp",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format != "gguf" {
				return fmt.Errorf("--format %q: want gguf", format)
			}
			if out == "" {
				return fmt.Errorf("--out is required")
			}
			t, err := gguf.ParseType(typ)
			if err != nil {
				return err
			}
			m, err := load.Open(model, tokPath)
			if err != nil {
				return err
			}
			if name == "" {
				name = filepath.Base(strings.TrimRight(model, "/"))
			}
			if err := gguf.WriteFile(out, m.Weights, m.Tokenizer, t, name); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (%s, %s architecture, %d parameters)\n", out, t, gguf.Architecture(m.Weights.Config), m.Weights.Config.NumParams())
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&model, "model", load.DefaultSpec, "checkpoint directory, llama2.c .bin or builtin:NAME[@SEED]")
	f.StringVar(&tokPath, "tokenizer", "", "tokenizer file overriding the one beside the checkpoint")
	f.StringVar(&out, "out", "", "output file")
	f.StringVar(&format, "format", "gguf", "output format: gguf")
	f.StringVar(&typ, "type", "f32", "GGUF matrix type: "+strings.Join(gguf.Types(), ", "))
	f.StringVar(&name, "name", "", "general.name of the file (default: the checkpoint's base name)")
	return cmd
}

func newModelInitCmd() *cobra.Command {
	var (
		preset, out, format, dtype, ggufType string
		seed                                 uint64
	)
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Write a deterministic random checkpoint of a preset shape, with its tokenizer",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w, err := model.Preset(preset, seed)
			if err != nil {
				return err
			}
			if out == "" {
				return fmt.Errorf("--out is required")
			}
			tok, err := load.BuiltinTokenizer(w.Config)
			if err != nil {
				return err
			}
			if err := os.MkdirAll(out, 0o755); err != nil {
				return err
			}
			switch format {
			case "hf":
				dt, err := weights.ParseDType(dtype)
				if err != nil {
					return err
				}
				if err := weights.SaveHF(out, w, dt); err != nil {
					return err
				}
				if err := writeTokenizer(tok, filepath.Join(out, "tokenizer.json"), tokenizer.WriteHF); err != nil {
					return err
				}
				if err := writeTokenizer(tok, filepath.Join(out, "tokenizer_config.json"), tokenizer.WriteHFConfig); err != nil {
					return err
				}
			case "llama2c":
				if err := weights.SaveLlama2C(filepath.Join(out, "model.bin"), w); err != nil {
					return err
				}
				// run.c hard-codes a sentencepiece layout; a byte-level vocabulary has no
				// tokenizer.bin form, and the loader falls back to it for a 259-token model.
				if tok.Kind() != "byte" {
					if err := writeTokenizer(tok, filepath.Join(out, "tokenizer.bin"), tokenizer.WriteLlama2C); err != nil {
						return err
					}
				}
			case "gguf":
				t, err := gguf.ParseType(ggufType)
				if err != nil {
					return err
				}
				if err := gguf.WriteFile(filepath.Join(out, GGUFFile), w, tok, t, preset); err != nil {
					return err
				}
			default:
				return fmt.Errorf("--format %q: want hf, llama2c or gguf", format)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s checkpoint of preset %s (seed %d, %d parameters) to %s\n",
				format, preset, seed, w.Config.NumParams(), out)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&preset, "preset", "tiny", "preset shape: "+strings.Join(model.Presets(), ", "))
	f.Uint64Var(&seed, "seed", 1, "random seed (same seed, same weights)")
	f.StringVar(&out, "out", "", "output directory")
	f.StringVar(&format, "format", "hf", "hf (config.json + model.safetensors + tokenizer.json), llama2c (model.bin + tokenizer.bin) or gguf ("+GGUFFile+", vocabulary included)")
	f.StringVar(&dtype, "dtype", "f32", "hf tensor dtype: f32, f16, bf16")
	f.StringVar(&ggufType, "type", "f32", "gguf matrix type: "+strings.Join(gguf.Types(), ", "))
	return cmd
}

// GGUFFile is the file name `model init --format gguf` writes in its --out directory.
const GGUFFile = "model.gguf"

func writeTokenizer(tok tokenizer.Tokenizer, path string, write func(tokenizer.Tokenizer, io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(tok, f); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}
