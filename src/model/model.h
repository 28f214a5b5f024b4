// The model seam: what training, evaluation, generation and checkpoints need from any model family.
//
// A model owns a ParamStore (its parameters and, for trainable entries, gradients) and a composition of
// layers (layers.h). A pass runs on an Activations object the model plans for a batch size and a mode: the
// model keeps one for training (reserve()), and a generator or a server asks for their own. Families are
// registered by Hugging Face's `model_type` (model.cpp); nothing outside src/model names a family.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/activations.h"
#include "model/config.h"
#include "model/layers.h"
#include "model/lora.h"
#include "model/param_store.h"

namespace anvil {

// One forward pass over a batch of tokens. The batch is the caller's: any (B, T) i32 tensor on the model's
// backend, usually the activations' own (act::tokens, which Model::tokens() views).
struct ForwardPass {
    Tensor tokens = {};   // (B, T) i32
    Tensor targets = {};  // (B, T) i32, -1 = ignore: per-token losses into the activations' losses (B, T);
                          // empty: none
    int pos0 = 0;         // the position of the first token (decoding continues a sequence)
    KvCache* cache = nullptr;  // append keys and values at pos0.. and attend over the cache (B = 1)
    int slot = 0;              // the cache slot of that one sequence
    // Or, when set, B rows of one token each (T = 1), row b at position row_pos[b] of cache slot row_slot[b]
    // (continuous batching): a decode step's rows each continue their own slot, and rows of one slot at
    // consecutive positions are a piece of a prompt (a packed prefill); every row's key and value are in the
    // cache before any row attends.
    const int* row_slot = nullptr;
    const int* row_pos = nullptr;
    // With row_slot and n_logit_rows >= 0: logits only for rows logit_rows[0..n_logit_rows) (ascending
    // indices), as logits(n_logit_rows, 1); none at 0 (prompt pieces that do not end their prompt need none).
    // -1: every row's.
    const int* logit_rows = nullptr;
    int n_logit_rows = -1;
    float dloss = 0.0f;        // != 0: leave dloss * d(sum of losses)/d(logits) in the logits for backward()
    bool last_logits = false;  // logits only for each row's last position, as logits(B, 1)
    uint64_t seed = 0;         // the pass's randomness (LoRA dropout), reused by its backward
    // (B, T) i32, each position's record length within its row: NEFTune's L (ModelOptions::neftune_alpha),
    // needed by a pass that takes gradients when the model has it on
    Tensor lengths = {};
    int B() const { return int(tokens.shape[0]); }
    int T() const { return int(tokens.shape[1]); }
};

// A pass of B one-token rows, tokens (B, 1), row b at position pos[b] of cache slot slot[b] (continuous
// batching: a decode step, or packed prompt pieces); logits for every row, or (n_logit_rows >= 0) for
// logit_rows only.
inline ForwardPass rows_pass(Tensor tokens, KvCache* cache, const int* slot, const int* pos,
                             const int* logit_rows = nullptr, int n_logit_rows = -1) {
    ForwardPass f;
    f.tokens = tokens;
    f.cache = cache;
    f.row_slot = slot;
    f.row_pos = pos;
    f.logit_rows = logit_rows;
    f.n_logit_rows = n_logit_rows;
    return f;
}

// Called by backward() as gradients complete: on_layer_grads_ready(l) once per block, l = n_layers-1 .. 0,
// right after block l's parameter gradients are final, then once with kOutsideLayers for the parameters
// outside the blocks (embeddings, final norm, head). Data parallelism reduces a bucket here.
constexpr int kOutsideLayers = -1;
class BackwardHooks {
public:
    virtual ~BackwardHooks() = default;
    virtual void on_layer_grads_ready(int layer) = 0;
};

struct ModelOptions {
    DType dtype = DType::F32;              // parameters, gradients and activations as the ops see them
    Recompute recompute = Recompute::Off;  // what the backward recomputes instead of keeping (activations.h)
    // The most logits kept at once while training or evaluating: past it the loss is taken a chunk of whole
    // sequences at a time, each chunk's logits turned into its loss and its gradients before the next one's
    // are made (the head's weight gradient and the final norm's output gradient, in the forward). 0: the
    // whole batch at once.
    size_t logits_chunk_bytes = size_t(256) << 20;
    // FP8 products (--precision fp8) for the blocks' linear layers (Backend::matmul_fp8_fwd); the embedding,
    // the head and attention's own products keep the model's dtype, as Transformer Engine's recipes do.
    bool fp8 = false;
    // With fp8: delayed scaling's history length (--fp8-scaling delayed, --fp8-history; core/fp8.h's
    // Fp8History), each operand scaled from the largest amax of its last uses; 0: each from its own amax
    // (current scaling).
    int fp8_history = 0;
    // Dropout while training (--dropout, nanoGPT's `dropout`, Hugging Face GPT-2's embd_pdrop and
    // resid_pdrop): on the embeddings' output and on each block's attention and MLP output before its
    // residual add. Off in every pass that takes no gradient (evaluation, generation).
    float dropout = 0.0f;
    // Dropout on the attention probabilities while training (--attn-dropout, nanoGPT's `dropout` in its
    // attention, Hugging Face's attn_pdrop / attention_dropout): P = softmax(QK^T) multiplies V as
    // P * keep / (1 - p). Off where `dropout` is.
    float attn_dropout = 0.0f;
    // NEFTune while training (--neftune-alpha, TRL's neftune_noise_alpha): the embeddings' output gets noise
    // uniform in +-alpha / sqrt(L d), L the length of the record a position belongs to
    // (ForwardPass::lengths), d the width, before the embeddings' dropout. 0: off. Off in every pass that
    // takes no gradient.
    float neftune_alpha = 0.0f;
    // Names of parameters that get no gradient and no optimizer state (frozen). Matched whole.
    std::vector<std::string> frozen;
    // LoRA adapters on the linear layers LoRA's targets name; every other parameter is then frozen.
    LoraOptions lora;
    // Tensor parallelism: this rank holds its slice of every block's heads and MLP columns (layers.h).
    TensorParallel tp;
};

class Model {
public:
    virtual ~Model() = default;
    const ModelConfig& config() const { return config_; }
    Backend& backend() const { return be_; }
    ParamStore& params() { return store_; }
    const ParamStore& params() const { return store_; }
    DType dtype() const { return options_.dtype; }
    const ModelOptions& options() const { return options_; }
    bool has_adapters() const { return options_.lora.enabled(); }
    // The linear layers adapters may attach to (LoRA's targets match their names), and their weight layout.
    virtual std::vector<Linear*> linears() = 0;
    virtual WLayout linear_layout() const = 0;
    Recompute recompute() const { return options_.recompute; }
    // The names of its activation buffers: a layer added after the model is built (an adapter) names its
    // buffers here.
    ActNames& act_names() { return reg_.acts; }
    int n_layers() const { return config_.n_layer; }
    // FP8 delayed scaling's state (ModelOptions::fp8_history): the amax histories of every FP8 linear layer's
    // input, weight and output gradient, (layers, 3, Fp8History::floats(H)) f32 on the backend, layers in the
    // order the blocks build them; empty without delayed scaling. Training checkpoints keep it.
    Tensor fp8_state() const { return reg_.fp8_state; }

    // Activations for batches up to (max_B, max_T) in a mode.
    std::unique_ptr<Activations> make_activations(int max_B, int max_T, ActMode mode) const;
    // A KV cache for `slots` sequences of up to max_T positions each (0 = the model's context): every slot
    // its own positions, or (pages > 0) a pool of that many pages of `page` positions the caller lends to
    // slots (kv_cache.h).
    std::unique_ptr<KvCache> make_cache(int max_T = 0, int slots = 1, int pages = 0,
                                        int page = KvCache::kDefaultPage) const;
    // Its size per sequence of max_T positions, and per page, in bytes.
    size_t cache_slot_bytes(int max_T = 0) const;
    size_t cache_page_bytes(int page = KvCache::kDefaultPage) const;

    // The model's own activations (training, evaluation): reserve once, release to change size.
    void reserve(int max_B, int max_T, bool training);
    void release() { acts_.reset(); }
    int max_B() const { return acts_ ? acts_->max_B() : 0; }
    int max_T() const { return acts_ ? acts_->max_T() : 0; }
    Activations& activations() const;
    // Views of the reserved activations: tokens and targets (B, T) i32 (-1 = ignore), losses (B, T) f32,
    // logits (B, T, V) (valid after a forward with dloss == 0).
    Tensor tokens(int B, int T) const { return activations().get(act::tokens, B, T); }
    Tensor targets(int B, int T) const { return activations().get(act::targets, B, T); }
    Tensor losses(int B, int T) const { return activations().get(act::losses, B, T); }
    Tensor logits(int B, int T) const { return activations().get(act::logits, B, T); }
    // Each position's record length (B, T) i32: planned for training when neftune_alpha > 0.
    Tensor lengths(int B, int T) const { return activations().get(act::lengths, B, T); }

    const Tape& forward(const ForwardPass& f) { return forward(activations(), f); }
    void backward(BackwardHooks* hooks = nullptr) { backward(activations(), hooks); }
    // Runs the pass; returns the tape it left in `acts` for the backward.
    virtual const Tape& forward(Activations& acts, const ForwardPass& f) = 0;
    // Accumulates into the gradients; needs a forward with dloss != 0 on the same activations (their tape).
    virtual void backward(Activations& acts, BackwardHooks* hooks) = 0;
    void zero_grads() { store_.zero_grads(); }

    // Checkpoint names: the store's name for a tensor name found in a file (a family accepts aliases, such as
    // GPT-2 names without "transformer."), and tensors a file may hold that are not parameters (buffers, a
    // tied head).
    virtual std::string canonical_name(const std::string& file_name) const { return file_name; }
    virtual bool ignorable_tensor(const std::string& /*file_name*/) const { return false; }

protected:
    Model(Backend& be, const ModelConfig& c, ModelOptions o);
    // Families call these from their constructor: layers register into reg_, then allocate_params().
    void allocate_params();
    virtual void plan(ActPlan& plan) const = 0;
    int cache_width() const;  // a KV-cache row: this rank's key/value heads x head size

    Backend& be_;
    ModelConfig config_;
    ModelOptions options_;
    ParamRegistry reg_;
    ParamStore store_;
    Buffer fp8_state_;  // reg_.fp8_state's memory
    std::unique_ptr<Activations> acts_;
};

// A model family, registered by Hugging Face's model_type.
struct ModelFamily {
    const char* model_type;
    ModelConfig (*from_hf)(const nlohmann::json& j, const std::string& path);
    nlohmann::json (*to_hf)(const ModelConfig& c);
    int64_t (*num_params)(const ModelConfig& c);
    int64_t (*position_params)(const ModelConfig& c);  // learned position tables (left out of FLOPs)
    std::unique_ptr<Model> (*make)(Backend& be, const ModelConfig& c, const ModelOptions& o);
    const char* default_lora_targets;             // PEFT's default target_modules for the family
    void (*new_model)(ModelConfig& c) = nullptr;  // what the family sets in a model made from flags (--arch)
};
const ModelFamily* find_model_family(const std::string& model_type);  // nullptr when unknown
const ModelFamily& model_family(const std::string& model_type);       // throws when unknown
std::string known_model_types();                                      // "gpt2"

// The factory: a model of config.model_type on `be`.
std::unique_ptr<Model> make_model(Backend& be, const ModelConfig& c, const ModelOptions& o = {});

}  // namespace anvil
