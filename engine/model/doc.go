// Package model is the engine's Llama-family decoder in float32: RMSNorm, RoPE (Hugging Face
// rotate-half convention, optionally with Llama 3's frequency scaling), grouped-query attention
// with optional q/k/v biases (Qwen2), SwiGLU, tied or untied embeddings. Presets give random
// weights of named shapes, up to Llama-3.2-1B's and Qwen2.5-0.5B's (docs/models.md).
//
// Two forward passes exist. [Model.Forward] is the paged, batched pass the engine runs: one call
// computes a flat batch of tokens from many sequences (prefill chunks and decode tokens mixed),
// reading and writing K/V in a [kvcache.Storage] through each sequence's block table. [Reference]
// computes a whole sequence with no cache, straight from [Weights], and exists only so tests can
// check the paged path against it.
//
// Forward is batch invariant: a token's logits are bitwise identical whatever else is in the
// batch and however its sequence's prompt was chunked, because every per-token computation
// (matmul rows, norms, attention over the cache) has one fixed reduction order (see package
// kernels). RL needs this for reproducible rollouts.
package model
