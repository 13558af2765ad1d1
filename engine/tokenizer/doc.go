// Package tokenizer turns text into token ids and back, for the three vocabularies the engine
// meets: the byte-level default of the built-in `tiny` preset ([NewByte]), llama2.c's
// `tokenizer.bin` ([LoadLlama2C]) and Hugging Face `tokenizer.json` byte-level BPE ([LoadHF]),
// both of the GPT-2 layout and of the Split-then-ByteLevel one of Llama-3, Qwen2/2.5 and
// DeepSeek, with Unicode normalization (NFC, NFD, NFKC, NFKD); [HF] says exactly what is
// accepted. [Synthetic] builds a deterministic vocabulary of any size for presets whose
// shape needs one (stories15m: 32000), writable in both file formats ([WriteLlama2C],
// [WriteHF]).
//
// Everything here is written for untrusted input: malformed files return errors wrapping
// [ErrMalformed], [ErrUnsupported] or [ErrVocabSize], bad ids return [ErrInvalidID], and no
// input makes the package panic (fuzz targets cover the parsers and Encode/Decode).
//
// Conventions shared by every [Tokenizer]:
//   - Encode adds no BOS or EOS; callers add them.
//   - Control tokens (BOS, EOS, PAD) are never produced by Encode, even when the text spells
//     them ("<s>" in a prompt is tokenized as text, so a prompt cannot inject an EOS), and
//     Decode renders them as nothing. Other special tokens (e.g. "<|im_start|>") are matched
//     in text and rendered as their content.
//   - Decode returns the raw bytes the tokens stand for, which may be invalid UTF-8 when a
//     sequence ends inside a character; [StreamDecoder] turns a token stream into valid UTF-8
//     text, holding back incomplete characters.
//   - Decode(Encode(s)) == s for every s with the byte-level and HF tokenizers (HF only when
//     the file's pre-tokenizer has add_prefix_space off, as Synthetic's does, and has no
//     Split that removes text; with a normalizer it is the normalized s) and
//     " "+s for non-empty s with llama2.c, whose encode() adds a dummy-prefix space.
package tokenizer
