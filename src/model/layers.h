// Layer objects: the pieces a model is composed of. Each registers its parameters (ParamSpecs) and names its
// activation buffers (keeping their handles) when it is built, sizes those buffers when a pass is planned,
// and runs its forward and backward through the Backend interface. A model family is a composition of these
// (gpt2.cpp, llama.cpp); a new family adds the layers it lacks here rather than a new trainer.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/dropout_mask.h"
#include "model/activations.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/param_store.h"

namespace anvil {

// Tensor parallelism as the model sees it (Megatron's layout): the ranks that split every block's linear
// layers, this rank's place among them, and how to sum a tensor over them. The training code supplies the
// reducer (MPI on the CPU, NCCL on a GPU); nothing in src/model names a communicator.
class TpReducer {
public:
    virtual ~TpReducer() = default;
    // In place: t becomes the sum over the tensor-parallel ranks of their t. `what` names it in errors.
    virtual void sum(Tensor t, const char* what) = 0;
};
struct TensorParallel {
    int rank = 0, size = 1;
    std::shared_ptr<TpReducer> reducer;
    bool on() const { return size > 1; }
};

// Parameters while a model is being built: layers append their specs and keep the indices; the model
// allocates the store once every layer is in, and the layers read their tensors through `store`. Layers name
// their activation buffers in `acts` and keep the handles.
struct ParamRegistry {
    std::vector<ParamSpec> specs;
    ActNames acts;
    const ParamStore* store = nullptr;
    DType dtype = DType::F32;
    TensorParallel tp;  // layers register their piece of a split linear layer
    // Weight-only int8 (anvil quantize): the linear layers' and the token embedding's weights are I8
    // ("weight"), each with an f32 scale per output channel ("weight_scale"), and frozen.
    bool int8 = false;
    bool fp8 = false;         // the blocks' linear layers multiply in FP8 (ModelOptions::fp8)
    int fp8_history = 0;      // with fp8: delayed scaling's history length (ModelOptions::fp8_history)
    int fp8_layers = 0;       // the linear layers that hold a slot of the delayed-scaling state
    Tensor fp8_state;         // (fp8_layers, 3, Fp8History::floats) f32, the model's (after allocation)
    size_t add(ParamSpec s);  // in the registry's dtype unless the spec keeps its own
    // An int8 weight whose output channels run along dimension out_dim, and its scales (names: weight_name
    // and weight_name + "_scale"); returns the weight's index and sets *scale.
    size_t add_int8(const std::string& weight_name, Shape shape, int out_dim, int layer, size_t* scale);
};

// What one pass gives every layer.
struct Pass {
    Backend& be;
    Activations& acts;
    int B, T;
    int pos0 = 0;              // position of the first token
    KvCache* cache = nullptr;  // decoding: attention appends to and reads from it
    // Decoding with a cache: one sequence (B = 1) in cache slot `slot` at positions pos0.., or, when row_slot
    // is set, B sequences of one token each (T = 1): row b in slot row_slot[b] at position row_pos[b].
    int slot = 0;
    const int* row_slot = nullptr;
    const int* row_pos = nullptr;
    Tensor row_slots = {},
           row_positions = {};  // the same on the backend ((B) i32, act::rows), which the ops read
    bool own_slots = false;     // with row_slot: every row in a slot of its own (a decode step)
    uint64_t seed = 0;  // this pass's randomness (dropout masks), the same in its backward
    // The pass takes gradients (a forward with a nonzero dloss, and its backward): dropout is on, as in
    // PyTorch's model.train(). An evaluation on training activations (the validation loss during a run) runs
    // with it off, as after model.eval().
    bool train = false;
    // A block's forward run a second time within its pass (--recompute full, before the block's backward):
    // the same bits as the first, so FP8's delayed scaling takes the scales the first run took.
    bool again = false;
    float dropout = 0.0f;       // train: dropout on the embeddings and on each residual branch (ModelOptions)
    float attn_dropout = 0.0f;  // train: dropout on the attention probabilities (ModelOptions)
    float neftune = 0.0f;  // train: NEFTune's alpha on the embeddings' output (ModelOptions::neftune_alpha)
    TpReducer* tp = nullptr;  // tensor parallelism: sums the blocks' partial outputs and input gradients
    Tensor act(ActId id) const { return acts.get(id, B, T); }
    // out = dropout(in) with dropout site `site`'s mask (dropout_mask.h) when the pass drops; else nothing
    void drop(Tensor out, Tensor in, uint64_t site) const {
        if (dropout > 0.0f) be.dropout(out, in, dropout, dropout_site_seed(seed, site));
    }
    // The dropout of layer `layer`'s attention probabilities (site kAttnDropoutSite + layer), this rank's
    // heads numbered from head0; none when the pass does not drop.
    static constexpr uint64_t kAttnDropoutSite = uint64_t(1) << 32;
    static constexpr uint64_t kNeftuneSite = uint64_t(2) << 32;  // NEFTune's noise (one site a pass)
    AttnDropout attn_drop(int layer, int head0) const {
        if (!(attn_dropout > 0.0f)) return {};
        return {attn_dropout, dropout_site_seed(seed, kAttnDropoutSite + uint64_t(layer)), head0};
    }
    void tp_sum(Tensor t, const char* what) const {
        if (tp) tp->sum(t, what);
    }
};

// A trainable side path on a linear layer (LoRA's low-rank update): its forward adds to the layer's output,
// its backward adds to the input gradient and accumulates its own parameters' gradients. The base weight is
// untouched (and may be frozen).
class LinearAdapter {
public:
    virtual ~LinearAdapter() = default;
    virtual void plan(ActPlan& plan) const = 0;
    virtual void forward(const Pass& p, Tensor out, Tensor in) const = 0;
    virtual void backward(const Pass& p, Tensor din, Tensor dout, Tensor in) const = 0;
};

// How a linear layer is split over tensor-parallel ranks (Megatron): Column keeps a slice of the outputs
// (each rank computes its heads or MLP columns from the whole input; its input gradient is a partial sum),
// Row a slice of the inputs (each rank's output is a partial sum, the bias added by rank 0 alone). The
// block sums the partial results over the ranks (PreNormBlock), one all-reduce per sub-block each way.
enum class Parallel : uint8_t { None, Column, Row };

// out (N, out) = in (N, in) @ W + b. W is (in, out) for GPT-2's Conv1D (WLayout::InOut) or (out, in) for
// nn.Linear and a tied embedding (OutIn).
class Linear {
public:
    Linear() = default;
    // `in` and `out` are the whole layer's; split (reg.tp on) the layer keeps this rank's piece. Column
    // outputs made of `blocks` equal blocks (c_attn's q, k, v) take a piece of each.
    Linear(ParamRegistry& reg, const std::string& name, int in, int out, WLayout layout, bool bias,
           InitRule init, int layer, Parallel par = Parallel::None, int blocks = 1);
    // A linear layer over an existing weight (a tied embedding, with its int8 scales when it has them), no
    // bias.
    static Linear tied(ParamRegistry& reg, size_t weight, WLayout layout, size_t scale = ParamStore::npos);
    void set_adapter(std::shared_ptr<const LinearAdapter> a) { adapter_ = std::move(a); }
    const std::string& name() const { return name_; }
    size_t weight_index() const { return w_; }
    int in_features() const { return in_; }  // this rank's (tensor parallelism splits one of them)
    int out_features() const { return out_; }
    int layer() const { return layer_; }

    void plan(ActPlan& plan) const;
    // With pre_gelu: pre_gelu = in @ W + b and out = its GELU (of the unrounded value: Backend::matmul_fwd).
    void forward(const Pass& p, Tensor out, Tensor in, Tensor pre_gelu = {}) const;
    // out = the GELU output forward(p, out, in, pre_gelu) wrote, again, to the same bits (--recompute
    // selective): a 16-bit product (bf16/f16 weights or int8 ones) took the GELU of its unrounded value
    // (Backend::matmul_fwd, cuBLASLt's epilogue on CUDA), so it runs again; otherwise (f32, an adapter, FP8)
    // the GELU of pre_gelu, as the forward took it.
    void recompute_gelu(const Pass& p, Tensor out, Tensor in, Tensor pre_gelu) const;
    // Whether backward() reads `in`: for a trainable weight's gradient, an adapter's or FP8's roundings. A
    // frozen plain layer takes only its input gradient, so --recompute selective need not restore its `in`.
    bool backward_reads_input() const;
    // din (overwritten; skipped when empty) = dout @ W^T, through the GELU when in = gelu(in_pre_gelu);
    // the weight and bias gradients accumulate (none for a frozen weight).
    void backward(const Pass& p, Tensor din, Tensor dout, Tensor in, Tensor in_pre_gelu = {}) const;

private:
    friend class LinearGroup;
    Tensor fp8_kept(const Pass& p) const;  // empty where the plan has none
    Fp8Scaling fp8_scaling(const Pass& p) const;  // off where the model scales FP8 from each operand

    const ParamRegistry* reg_ = nullptr;
    std::string name_;
    size_t w_ = 0, b_ = ParamStore::npos;
    size_t scale_ = ParamStore::npos;  // int8 weight: its per-output-channel scales
    bool fp8_ = false;                 // FP8 products (a block's layer under ModelOptions::fp8)
    ActId fp8_kept_;  // what the FP8 forward keeps for the backward (Backend::fp8_kept_elems)
    int fp8_slot_ = -1;  // its row of ParamRegistry::fp8_state (delayed scaling)
    int in_ = 0, out_ = 0, layer_ = -1;
    WLayout layout_ = WLayout::InOut;
    Parallel parallel_ = Parallel::None;
    std::shared_ptr<const LinearAdapter> adapter_;
};

// Linear layers that read one input, their outputs side by side in each row of one (N, sum of outputs)
// tensor: Llama's q, k and v projections, its gate and up. Where their weights lie one after another in the
// parameter arena (OutIn: the stacked weight is one (sum, in) matrix), their gradients in the gradient arena
// (or none is trainable), their biases likewise (or none has one), and nothing rides on them (no adapter,
// int8 or FP8 weight, no row parallelism), they run as one product: one matmul_fwd, and one matmul_bwd whose
// input gradient is the parts' summed in its f32 accumulator (no adds between rounded parts). Otherwise each
// part runs on its own, into its columns (forward) and from its own contiguous block (backward).
// ANVIL_FUSE_PROJECTIONS=0 in the environment runs the parts apart everywhere (to measure one against the
// other).
class LinearGroup {
public:
    LinearGroup(std::initializer_list<const Linear*> parts);
    // At the model's construction: marks each part's weight to follow the one before in the arenas
    // (ParamSpec::joined), where it was registered right after it, and each bias the one before; parts that
    // registered a bias after each weight are first reordered, the weights before the biases (no int8).
    static void join(ParamRegistry& reg, std::initializer_list<Linear*> parts);
    bool fused() const { return fused_; }
    // out (B,T,sum), contiguous: part i's output in its columns
    void forward(const Pass& p, Tensor out, Tensor in) const;
    // Where part i's output gradient goes in the backward's dout (B,T,sum): its columns when fused, else the
    // i-th contiguous block of the storage (the form Linear::backward reads).
    Tensor grad_part(Tensor dout, int i) const;
    // din (overwritten; skipped when empty) = the parts' input gradients summed; the weights' and biases'
    // gradients accumulate. dx: a (B,T,in) scratch for the parts' sums when they run apart.
    void backward(const Pass& p, Tensor din, Tensor dout, Tensor in, Tensor dx) const;

private:
    // The parts' weights (total, in) and biases (total) as one, with their gradients: the first part's
    // storage
    struct Stacked {
        Tensor w, dw, b, db;
    };
    Stacked stacked(int64_t total) const;
    // The conditions above, from the parts' state and the arenas' layout (the environment aside)
    bool joinable() const;
    static constexpr int kMaxParts = 3;
    const Linear* parts_[kMaxParts]{};
    int n_ = 0;
    bool fused_ = false;  // decided once, when the group is made (a pass makes its groups)
};

// LayerNorm (eps 1e-5, a gain and a bias: GPT-2) or RMSNorm (a gain, eps from the config: Llama).
enum class NormKind : uint8_t { Layer, Rms };
class Norm {
public:
    Norm() = default;
    // recomputable: the backward may recompute the output (block norms) instead of keeping it.
    Norm(ParamRegistry& reg, const std::string& name, int dim, int layer, bool recomputable,
         NormKind kind = NormKind::Layer, float eps = 1e-5f);
    void plan(ActPlan& plan) const;
    Tensor out(const Pass& p) const { return p.act(out_); }
    void forward(const Pass& p, Tensor in) const;
    // sum = a + b (sum may alias a), then the norm of sum, in one op (add_norm_fwd); the backward is
    // backward(p, din, dout, sum), din being both a's and b's gradient
    void forward_add(const Pass& p, Tensor sum, Tensor a, Tensor b) const;
    void backward(const Pass& p, Tensor din, Tensor dout, Tensor in) const;  // din accumulates

private:
    const ParamRegistry* reg_ = nullptr;
    std::string name_;
    ActId out_, mean_, rstd_;
    size_t w_ = 0, b_ = 0;
    bool recomputable_ = false;
    NormKind kind_ = NormKind::Layer;
    float eps_ = 1e-5f;
};

// Token embedding (V, C) plus learned positions (n_ctx, C); `positions` empty: tokens only (rotary models).
class Embedding {
public:
    Embedding() = default;
    Embedding(ParamRegistry& reg, const std::string& tokens, const std::string& positions, int vocab,
              int n_ctx, int dim, double std);
    size_t token_weight() const { return wte_; }
    size_t token_scale() const { return wte_scale_; }              // an int8 table's row scales, or npos
    void forward(const Pass& p, Tensor out, Tensor tokens) const;  // positions p.pos0 ..
    void backward(const Pass& p, Tensor dout, Tensor tokens) const;

private:
    const ParamRegistry* reg_ = nullptr;
    size_t wte_ = 0, wpe_ = ParamStore::npos, wte_scale_ = ParamStore::npos;
};

// Causal multi-head self-attention: a fused q, k, v projection, attention, an output projection.
class Attention {
public:
    Attention() = default;
    Attention(ParamRegistry& reg, const std::string& prefix, int dim, int heads, int layer, double std,
              double proj_std);
    Linear& qkv() { return qkv_; }
    Linear& proj() { return proj_; }
    std::vector<Linear*> linears() { return {&qkv_, &proj_}; }
    void plan(ActPlan& plan) const;
    void forward(const Pass& p, Tensor out, Tensor in) const;
    // din (overwritten) from dout
    void backward(const Pass& p, Tensor din, Tensor dout, Tensor in) const;

private:
    const ParamRegistry* reg_ = nullptr;
    ActId qkv_buf_, y_buf_, saved_buf_, dy_, dqkv_, scratch_;
    int dim_ = 0, heads_ = 0, layer_ = 0;
    Linear qkv_, proj_;
};

// The feed-forward block: up projection with GELU, down projection.
class Mlp {
public:
    Mlp() = default;
    Mlp(ParamRegistry& reg, const std::string& prefix, int dim, int hidden, int layer, double std,
        double proj_std);
    Linear& up() { return fc_; }
    Linear& down() { return proj_; }
    std::vector<Linear*> linears() { return {&fc_, &proj_}; }
    void plan(ActPlan& plan) const;
    void forward(const Pass& p, Tensor out, Tensor in) const;
    void backward(const Pass& p, Tensor din, Tensor dout, Tensor in) const;  // din overwritten

private:
    const ParamRegistry* reg_ = nullptr;
    ActId pre_buf_, act_buf_, dpre_;
    int hidden_ = 0;
    Linear fc_, proj_;
};

// Rotary frequencies of a head size: inv_freq[i] = theta^(-2i/HS), with Llama 3.1's or linear scaling.
std::vector<float> rope_inv_freq(int head_size, double theta, const RopeScaling& scaling);

// Llama's attention: separate q, k, v projections (nn.Linear; biases on q, k and v in Qwen2, on all four with
// Llama's attention_bias), rotary positions on q and k, grouped-query heads (kv_heads key/value heads shared
// by heads / kv_heads query heads each; the KV cache holds kv_heads), an output projection.
class RotaryAttention {
public:
    RotaryAttention() = default;
    RotaryAttention(ParamRegistry& reg, const std::string& prefix, int dim, int heads, int kv_heads,
                    int head_size, int layer, double std, bool qkv_bias = false, bool o_bias = false);
    void set_rope(Tensor inv_freq) { inv_freq_ = inv_freq; }
    std::vector<Linear*> linears() { return {&q_, &k_, &v_, &o_}; }
    void plan(ActPlan& plan) const;
    void forward(const Pass& p, Tensor out, Tensor in) const;
    void backward(const Pass& p, Tensor din, Tensor dout, Tensor in) const;  // din overwritten

private:
    const ParamRegistry* reg_ = nullptr;
    ActId qkv_buf_, y_buf_, saved_buf_;
    ActId dy_, dqkv_, drot_, dx_, scratch_;
    int heads_ = 0, kv_heads_ = 0, hs_ = 0, layer_ = 0;
    Linear q_, k_, v_, o_;
    Tensor inv_freq_;
};

// Llama's MLP: down(silu(gate(x)) * up(x)), nn.Linear, biases only with Llama's mlp_bias.
class GatedMlp {
public:
    GatedMlp() = default;
    GatedMlp(ParamRegistry& reg, const std::string& prefix, int dim, int hidden, int layer, double std,
             bool bias = false);
    std::vector<Linear*> linears() { return {&gate_, &up_, &down_}; }
    void plan(ActPlan& plan) const;
    void forward(const Pass& p, Tensor out, Tensor in) const;
    void backward(const Pass& p, Tensor din, Tensor dout, Tensor in) const;  // din overwritten

private:
    const ParamRegistry* reg_ = nullptr;
    ActId gu_buf_, act_buf_, dact_, dgu_, dx_;
    int dim_ = 0, hidden_ = 0;
    Linear gate_, up_, down_;
};

}  // namespace anvil
