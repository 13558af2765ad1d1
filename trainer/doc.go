// Package trainer is a reference GRPO trainer for the engine's model family (Llama: RMSNorm,
// rotate-half RoPE, grouped-query attention, SwiGLU, tied or untied embeddings, float32).
//
// The forward pass repeats the engine's own arithmetic (the same packed matrix kernels, RMSNorm,
// RoPE tables, attention kernels and SwiGLU) so that the logprobs the trainer computes for a
// completion agree with the ones the servers returned while sampling it; every Step reports the
// remaining mismatch. The backward pass is written by hand through the whole transformer and is
// checked against finite differences in float64 (the same code is generic over float32 and
// float64; float32 is what training runs, float64 is the check path).
//
// A Step takes a batch of Samples (prompt, completion, the rollout's per-token logprobs and
// weight versions, a reward and a group id), computes group-normalised advantages, and applies a
// token-level clipped policy-gradient loss whose importance ratios compare the trainer's
// logprobs with the rollout's. Tokens sampled by an older weight version than the trainer's are
// off-policy: their ratio is truncated at a cap instead of clipped (truncated importance
// sampling). A sample's LossMask keeps tokens the policy did not sample (a multi-turn
// trajectory's tool results and user turns) in the sequence as context but out of the loss. An
// optional KL penalty to a reference policy uses the k3 estimator. Gradients are
// accumulated over micro-batches, clipped by global norm, and applied by AdamW with a
// warmup-then-constant or cosine learning-rate schedule.
//
// The logprobs are those of the distribution the rollouts were sampled from: Config.Sampling
// gives its temperature and filters, and the trainer recomputes the engine's processed logprobs
// of it bit for bit (the zero value is temperature 1 without filters, where raw and processed
// logprobs are one distribution). SupervisedStep is a cross-entropy step on the raw
// distribution, for a warm start (SFT) before GRPO. Every Step reports the policy's entropy
// alongside the KL, clip and truncation fractions and the gradient norm.
//
// Checkpoints are Hugging Face safetensors directories the engine loads directly, with the
// optimizer state beside them; package weightstore publishes versions over HTTP with the digest
// the engine verifies.
package trainer
