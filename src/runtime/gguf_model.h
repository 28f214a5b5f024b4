// Models as GGUF files, the way llama.cpp lays them out: GPT-2 as its `gpt2` architecture, the Llama family
// as `llama` (grouped-query attention, tied or untied head, linear and llama3 rope scaling), the tokenizer
// inside (tokenizer.ggml.*: GPT-2 byte-level BPE, Llama 3's and Qwen 2's byte-level BPE with their
// pre-tokenizer names, SentencePiece-style BPE as the `llama` vocabulary), the chat template and general.*
// metadata. Hugging Face tensors map to llama.cpp's names; the Llama q and k projections are permuted from
// Hugging Face's rotate-half layout to the interleaved pairs llama.cpp rotates.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "data/tokenizer.h"
#include "model/lora.h"
#include "model/model.h"

namespace anvil {

// f32, f16, bf16 or q8_0 (ggml's 8-bit blocks); 1-D tensors (norms, biases) stay f32 in every form.
struct GgufExportOptions {
    std::string dtype = "f16";
    std::string name;         // general.name
    std::string description;  // general.description (where the model came from)
};

// Writes `model` (a loaded model: any adapter merged first) with `tok` to `path`, atomically. A tokenizer
// GGUF cannot carry (the byte tokenizer) and int8 weights are refused, naming what to do.
void export_gguf(const Model& model, const Tokenizer& tok, const std::string& path,
                 const GgufExportOptions& o);

// The LoRA adapters of `model` (loaded on its base) as llama.cpp's adapter GGUF (general.type "adapter"),
// which llama.cpp applies at load time to the base's own GGUF (llama-cli --lora FILE): `lora` gives the
// scaling.
void export_gguf_adapter(const Model& model, const LoraOptions& lora, const std::string& path,
                         const GgufExportOptions& o);

// Whether `path` is a file that starts as a GGUF file does.
bool is_gguf_file(const std::string& path);

// A GGUF file read back (the inverse of export_gguf, for llama.cpp's files as for anvil's): the model on `be`
// with every tensor dequantized to f32 (F32, F16, BF16 and Q8_0), and its tokenizer rebuilt as Hugging Face's
// tokenizer.json and tokenizer_config.json would give it (byte-level BPE: gpt-2, llama-bpe, qwen2;
// SentencePiece "llama": merges rebuilt from the scores).
struct GgufModel {
    std::unique_ptr<Model> model;
    std::unique_ptr<Tokenizer> tok;
};
GgufModel import_gguf(const std::string& path, Backend& be);

// A GGUF file as a model directory (config.json, model.safetensors, tokenizer files), for every command that
// takes one (--model, --init): written once into anvil's cache (~/.cache/anvil/gguf, or $XDG_CACHE_HOME's),
// named by the file's path, size and modification time, and reused while the file is unchanged.
std::string gguf_model_dir(const std::string& path);

}  // namespace anvil
