// How llama.cpp lays out each family in a GGUF file: its architecture name and hyperparameter keys, and for
// every Hugging Face tensor the GGUF tensor (name, ggml dimensions, values in llama.cpp's order). The inverse
// reads a GGUF back into Hugging Face's names and layout. Only this file and runtime/gguf_model.cpp know
// GGUF's model conventions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "model/config.h"

namespace anvil {

// llama.cpp's architecture for a family: gpt2 -> "gpt2", llama and mistral -> "llama", qwen2 -> "qwen2".
// Refuses a model GGUF cannot carry (int8 weights), naming what to do.
std::string gguf_arch(const ModelConfig& c);
// The architecture's hyperparameters ({arch}.context_length, .embedding_length, ...).
void gguf_write_hparams(const ModelConfig& c, gguf::Writer& w);
// A config from a GGUF's hyperparameters (the inverse); vocab_size from the token embedding's rows.
ModelConfig gguf_read_hparams(const gguf::Reader& r);

// One tensor: a GGUF name, ggml dimensions (ne[0] fastest) and the values in that order.
struct GgufTensor {
    std::string name;
    std::vector<uint64_t> ne;
    std::vector<float> data;
};

// The GGUF form of the Hugging Face tensor `hf_name` of shape `hf_shape` (row-major values `data`): its name,
// dimensions and values (transposed or permuted where llama.cpp's layout differs; no values given, none
// made). Returns false for a tensor llama.cpp has no place for.
bool gguf_from_hf(const ModelConfig& c, const std::string& hf_name, const std::vector<int64_t>& hf_shape,
                  std::vector<float> data, GgufTensor* out);
// The same for a LoRA entry "<layer>.lora_A.weight" (rank, in) or "<layer>.lora_B.weight" (out, rank) on the
// layer's weight: llama.cpp's adapter tensor "<gguf weight>.lora_a" / ".lora_b", B's rows permuted as the
// weight's are. False for an entry on a layer llama.cpp has no place for.
bool gguf_lora_from_hf(const ModelConfig& c, const std::string& hf_name, const std::vector<int64_t>& hf_shape,
                       std::vector<float> data, GgufTensor* out);
// Tensors llama.cpp needs beyond the model's parameters (Llama 3.1's rope_freqs.weight).
std::vector<GgufTensor> gguf_extra_tensors(const ModelConfig& c);
// The inverse of gguf_from_hf: the Hugging Face name and row-major values of a GGUF tensor, or false for one
// with no Hugging Face counterpart (rope_freqs.weight, which the config's rope_scaling carries).
bool hf_from_gguf(const ModelConfig& c, const GgufTensor& t, std::string* hf_name,
                  std::vector<int64_t>* hf_shape, std::vector<float>* data);

}  // namespace anvil
