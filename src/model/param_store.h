// The parameter store: every parameter of a model as a named entry (its Hugging Face name) with a shape, a
// dtype, a trainable flag and an init rule. Parameters live in one arena; gradients in another that holds
// only the trainable entries (a frozen entry has no gradient and costs no gradient memory). The optimizer
// keeps its moments and master weights the same way (train/optimizer.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "core/arena.h"

namespace anvil {

enum class Init : uint8_t { Zeros, Ones, Normal, Uniform };
struct InitRule {
    Init kind = Init::Zeros;
    double std = 0.0;  // Normal: N(0, std); Uniform: U(-std, std)
};

// How an entry is split over tensor-parallel ranks: along dimension `dim` (-1: not split, every rank holds the
// whole entry), which is `blocks` equal blocks one after another (c_attn's q, k and v), each cut into `parts`
// equal pieces; this rank holds piece `part` of every block, the blocks' pieces one after another.
struct Shard {
    int dim = -1;
    int blocks = 1, parts = 1, part = 0;
    bool split() const { return dim >= 0 && parts > 1; }
};

struct ParamSpec {
    std::string name;  // the Hugging Face name, e.g. "transformer.h.3.attn.c_attn.weight"
    Shape shape;
    DType dtype = DType::F32;
    bool trainable = true;
    InitRule init;
    bool decay = false;  // AdamW's weight decay applies (matrices and embeddings)
    int layer = -1;      // the block it belongs to; -1 for embeddings, the final norm and the head
    bool adapter = false;  // an adapter's (LoRA), saved apart from the base model
    Shard shard{};         // tensor parallelism: `shape` is this rank's piece of full_shape()
    // Stored, loaded and saved in its own dtype whatever the model's: int8 weights (I8) and their scales (F32).
    bool keep_dtype = false;
    int scale_dim = -1;  // an int8 weight: the dimension of its output channels (one scale each)
    // Laid right after the previous entry in the arenas (both in them), no alignment gap: the weights of
    // projections that run as one product (LinearGroup::join)
    bool joined = false;
    // The whole entry's shape, as checkpoints hold it.
    Shape full_shape() const;
};

// The tensor-parallel piece of an entry and the whole: keep_shard turns `v`, the whole entry's values, into this
// rank's piece (its spec's shard; unchanged for an entry that is not split); put_shard writes piece `part`
// into a whole tensor (the other parts' values are left as they are).
void keep_shard(const ParamSpec& s, std::vector<float>& v);
void put_shard(const ParamSpec& s, int part, const float* piece, float* whole);

class ParamStore {
public:
    static constexpr size_t npos = size_t(-1);

    ParamStore() = default;
    ParamStore(Backend& backend, std::vector<ParamSpec> specs);

    Backend& backend() const { return *be_; }
    size_t size() const { return specs_.size(); }
    const ParamSpec& spec(size_t i) const { return specs_[i]; }
    const std::vector<ParamSpec>& specs() const { return specs_; }
    Tensor param(size_t i) const { return params_[i]; }
    Tensor grad(size_t i) const { return grad_views_[i]; }  // empty for a frozen entry
    // The entry called `name`, or npos.
    size_t find(const std::string& name) const;
    // Indices of the trainable entries, in store order (the optimizer's slots).
    const std::vector<size_t>& trainable() const { return trainable_; }
    // The gradient arena as few tensors as possible (one when every gradient has one dtype), for the
    // global norm. Empty when nothing is trainable.
    std::vector<Tensor> grad_tensors() const;
    void zero_grads();
    // Elements of the model, tensor-parallel pieces counted whole.
    int64_t numel(bool trainable_only = false) const;
    size_t param_bytes() const { return params_.bytes(); }
    size_t grad_bytes() const { return grads_.bytes(); }

    // Draws every entry's initial values on the host in f32 (store order, one seeded stream: the same seed
    // gives the same weights on any backend), rounds them to the entry's dtype and uploads them. `on_f32`
    // (optional) sees each entry's f32 values first (the optimizer's master copy). A tensor-parallel piece
    // draws its whole entry and keeps its part: the same weights as one process.
    void init(uint64_t seed, const std::function<void(size_t, const float*)>& on_f32 = {});
    // The same for the adapter entries only (a base model's weights are loaded instead), from their own stream.
    void init_adapters(uint64_t seed, const std::function<void(size_t, const float*)>& on_f32 = {});
    // One entry through the host in f32.
    std::vector<float> read_f32(size_t i) const;
    void write_f32(size_t i, const float* host);

private:
    void init_entries(uint64_t seed, bool adapters_only, const std::function<void(size_t, const float*)>& on_f32);
    Backend* be_ = nullptr;
    std::vector<ParamSpec> specs_;
    Arena params_, grads_;
    std::vector<Tensor> grad_views_;
    std::vector<size_t> trainable_;
    std::unordered_map<std::string, size_t> index_;
};

}  // namespace anvil
