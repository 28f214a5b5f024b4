// llm.c's GPT-2 model files, both ways: what train_gpt2.py writes (gpt2_124M.bin, gpt2_124M_bf16.bin) and
// what train_gpt2.cu saves as checkpoints (model_00005000.bin).
//
// Layout: a header of 256 little-endian int32, [0] magic 20240326, [1] version (3: every tensor fp32, 5:
// bf16), [2] max_seq_len, [3] vocab_size (the real one, 50257), [4] num_layers, [5] num_heads, [6] channels,
// [7] padded_vocab_size (the embedding's rows, 50304), the rest 0; then the parameters one after another,
// each kind for every layer in turn, the linear layers' weights as PyTorch's nn.Linear keeps them (out, in):
//   wte (Vp, C), wpe (T, C), ln_1.weight (L, C), ln_1.bias (L, C), attn.c_attn.weight (L, 3C, C),
//   attn.c_attn.bias (L, 3C), attn.c_proj.weight (L, C, C), attn.c_proj.bias (L, C), ln_2.weight (L, C),
//   ln_2.bias (L, C), mlp.c_fc.weight (L, 4C, C), mlp.c_fc.bias (L, 4C), mlp.c_proj.weight (L, C, 4C),
//   mlp.c_proj.bias (L, C), ln_f.weight (C), ln_f.bias (C).
// Hugging Face's GPT-2 keeps those four weights transposed (Conv1D: (in, out)); the conversions transpose
// them.
#pragma once

#include <cstdint>
#include <string>

#include "model/model.h"

namespace anvil {

constexpr int32_t kLlmcModelMagic = 20240326;

struct LlmcHeader {
    int version = 3;  // 3: fp32, 5: bf16
    int max_t = 0, vocab = 0, layers = 0, heads = 0, channels = 0, padded_vocab = 0;
};

// The dtype of an llm.c model file's tensors: F32 (version 3) or BF16 (5).
inline DType llmc_dtype(int version) {
    return version == 3 ? DType::F32 : DType::BF16;
}

// The header of an llm.c model file, checked (magic, version, sizes, the file's length against them), and the
// GPT-2 config it describes (vocab_size: the padded rows). Errors name the file and what is wrong.
ModelConfig read_llmc_header(const std::string& path, LlmcHeader* header = nullptr);

// Fills every parameter of `model`, a GPT-2 of read_llmc_header's config, from the file.
void load_llmc_weights(const std::string& path, Model& model);

// Writes `model` (a GPT-2) as an llm.c model file of `version` (3: fp32, 5: bf16), through a temporary file
// renamed over `path`. `vocab` is the tokenizer's vocabulary (header [3]); the embedding's rows are padded
// with zeros to a multiple of 128, as train_gpt2.py pads them, unless it already has more rows than `vocab`.
void write_llmc_model(const std::string& path, const Model& model, int vocab, int version);

}  // namespace anvil
