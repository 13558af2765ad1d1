// Package gguf writes a checkpoint as a GGUF v3 file that llama.cpp and the tools built on it
// (node-llama-cpp, Ollama, LM Studio) load, so the same weights can be run in a peer engine
// and compared token for token.
//
// A model without q/k/v biases is written with llama.cpp's "llama" architecture, whose RoPE
// rotates adjacent pairs: the q and k projection rows are permuted from the Hugging Face
// rotate-half order as llama.cpp's convert_hf_to_gguf.py does. Llama 3's RoPE scaling goes
// into a rope_freqs.weight tensor of per-pair divisors, also as the converter writes it. A
// model with q/k/v biases is written as "qwen2", which rotates halves (no permutation) and
// has the bias tensors.
//
// Matrices are written as F32, BF16, F16 or Q8_0 (blocks of 32 weights sharing an f16 scale,
// quantized exactly as ggml's quantize_row_q8_0_ref does); norms, biases and rope_freqs stay
// F32, and a matrix whose rows do not split into 32-weight blocks falls back to F16, as the
// converter does. The vocabulary goes into the tokenizer.ggml.* keys: a byte-level BPE
// (tokenizer.json, and the synthetic vocabularies of the presets) as "gpt2" with its merges, a
// llama2.c tokenizer.bin and the byte vocabulary as sentencepiece-style "llama".
package gguf
