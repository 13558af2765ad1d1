// Package load resolves a model spec (what `--model` takes) into weights and a tokenizer:
// `builtin:NAME[@SEED]` generates a preset deterministically, a directory is a Hugging Face
// checkpoint (config.json + safetensors + tokenizer.json), and a `.bin` file is a llama2.c
// checkpoint with its `tokenizer.bin` beside it.
package load
