// Package weights reads and writes model checkpoints and fetches verified weight sets.
//
// Two on-disk formats are supported:
//
//   - Hugging Face: a directory with config.json and either model.safetensors or a sharded
//     model.safetensors.index.json plus its shard files. Tensors may be F32, F16 or BF16; they
//     are converted to float32 on load. [SaveHF] and [SaveHFSharded] write what
//     save_pretrained writes for LlamaForCausalLM (config fields, "format":"pt" metadata,
//     8-byte aligned contiguous data), so transformers can load the result. A model with q/k/v
//     biases is read from and written as Qwen2 (model_type qwen2); Llama 3's rope_scaling is
//     read and written as it is.
//   - llama2.c: the legacy .bin format of Karpathy's run.c (a 7-int32 header then float32
//     tensors). llama2.c rotates adjacent pairs in RoPE while [model.Weights] uses the HF
//     rotate-half layout, so q/k projection rows are permuted on load and back on save.
//
// Every loader treats its input as untrusted: header lengths, offsets, shapes and dtypes are
// checked against the real file size and against the shapes the config implies before
// anything is allocated, and a bad file yields an error wrapping [ErrBadCheckpoint] that names
// the file and tensor, never a panic.
//
// [Load] resolves a [Ref] (version, URI, SHA-256) from a local path, a file:// URI or an
// http(s):// URL, verifies its digest while reading (so the bytes hashed are exactly the bytes
// parsed) and checks the result with [model.Weights.Check]. The digest of a checkpoint is
// defined by [Digest].
package weights
