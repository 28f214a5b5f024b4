// GPT-2: parameters, activations and the forward/backward passes, written against the Backend interface.
//
// Parameters follow Hugging Face's GPT-2 names and layouts (Conv1D weights are (in, out)); the output layer
// is tied to wte. Parameters, gradients and activations each live in one Arena. Activations are sized once
// for (max_B, max_T) and reused for any smaller batch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/arena.h"
#include "model/config.h"

namespace anvil {

// Per-layer parameter tensors, in HF order.
enum LayerParam : int {
    kLn1W,
    kLn1B,
    kQkvW,
    kQkvB,
    kAttProjW,
    kAttProjB,
    kLn2W,
    kLn2B,
    kFcW,
    kFcB,
    kFcProjW,
    kFcProjB,
    kLayerParams
};

struct ParamInfo {
    std::string name;  // HF name, e.g. "transformer.h.3.attn.c_attn.weight"
    Shape shape;
    bool decay;          // weight decay applies (tensors of two or more dimensions)
    bool residual_proj;  // init std scaled by 1/sqrt(2 * n_layer)
};

std::vector<ParamInfo> param_table(const GPTConfig& c);

class GPT2 {
public:
    // param_dtype: dtype of the parameters, gradients and activations the ops see (F32 on the CPU).
    // recompute: keep neither the layer norms' outputs nor the GELU's per layer; the backward recomputes
    // them (one buffer each instead of one per layer), trading compute for activation memory.
    GPT2(Backend& backend, const GPTConfig& config, DType param_dtype = DType::F32, bool recompute = false);

    const GPTConfig& config() const { return config_; }
    Backend& backend() const { return backend_; }
    const std::vector<ParamInfo>& params_info() const { return info_; }
    const Arena& params() const { return params_; }
    const Arena& grads() const { return grads_; }
    DType dtype() const { return dtype_; }
    bool recompute() const { return recompute_; }
    Tensor wte() const { return params_[0]; }
    Tensor wpe() const { return params_[1]; }
    Tensor layer_param(int l, LayerParam p) const { return params_[size_t(2 + l * kLayerParams + p)]; }
    Tensor lnf_w() const { return params_[params_.size() - 2]; }
    Tensor lnf_b() const { return params_[params_.size() - 1]; }

    // GPT-2 initialisation: N(0, 0.02) weights, residual projections N(0, 0.02/sqrt(2L)), zero biases, unit
    // layer-norm gains. Same seed, same weights, on any backend.
    void init_random(uint64_t seed) { params_from_host(init_host(seed)); }
    std::vector<std::vector<float>> init_host(uint64_t seed) const;  // the same weights, as f32 host arrays
    // Host f32 copies of every parameter, in params_info() order.
    std::vector<std::vector<float>> params_to_host() const;
    void params_from_host(const std::vector<std::vector<float>>& host);

    // Allocates activations for batches up to (max_B, max_T). Called once; training=false skips backward
    // buffers.
    void reserve(int max_B, int max_T, bool training);
    void release();  // frees the activations (reserve again with another size)
    int max_B() const { return max_B_; }
    int max_T() const { return max_T_; }

    // Inputs of the next forward pass, on the device: tokens (B,T) and targets (B,T) i32 (-1 = ignore).
    Tensor tokens(int B, int T) const;
    Tensor targets(int B, int T) const;
    // Forward over tokens(B,T). With targets, per-position losses land in losses(B,T). If dloss != 0 the
    // logits are replaced by the gradient of sum(losses) * dloss, ready for backward().
    void forward(int B, int T, bool with_targets, float dloss);
    void backward();  // accumulates into grads(); needs a forward with dloss != 0
    Tensor losses(int B, int T) const;
    Tensor logits(int B, int T) const;  // (B,T,V), valid after a forward with dloss == 0
    void zero_grads();

private:
    struct LayerActs {
        Tensor ln1, ln1_mean, ln1_rstd, qkv, atty, att, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu, res3;
    };
    struct Acts {
        Tensor tokens, targets, encoded, lnf, lnf_mean, lnf_rstd, logits, losses, proj;
        std::vector<LayerActs> layers;
        Tensor dres, dln, dqkv, datty, dfch, att_scratch;  // backward scratch
    };
    Acts views(int B, int T) const;  // activation views for a (B,T) batch inside the arena

    Backend& backend_;
    GPTConfig config_;
    DType dtype_;
    bool recompute_;
    std::vector<ParamInfo> info_;
    Arena params_, grads_, acts_;
    int max_B_ = 0, max_T_ = 0;
    bool training_ = false;
    int last_B_ = 0, last_T_ = 0;
    bool have_grad_logits_ = false;
};

}  // namespace anvil
