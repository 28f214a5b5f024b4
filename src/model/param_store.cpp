#include "model/param_store.h"

#include <algorithm>

#include "core/rng.h"

namespace anvil {

Shape ParamSpec::full_shape() const {
    Shape f = shape;
    if (shard.split()) f.dims[size_t(shard.dim)] *= shard.parts;
    return f;
}

namespace {
// Calls f(whole_offset, piece_offset, n) for each run of n consecutive floats piece `part` of an entry shares
// with the whole entry.
template <class F>
void for_each_run(const ParamSpec& s, int part, F f) {
    if (!s.shard.split()) return f(int64_t(0), int64_t(0), s.shape.numel());
    const int d = s.shard.dim;
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < d; i++) outer *= s.shape[i];
    for (int i = d + 1; i < s.shape.ndim; i++) inner *= s.shape[i];
    const int64_t local = s.shape[d], blocks = s.shard.blocks;
    const int64_t lb = local / blocks;      // a block's piece along dim
    const int64_t fb = lb * s.shard.parts;  // a whole block
    for (int64_t o = 0; o < outer; o++)
        for (int64_t b = 0; b < blocks; b++)
            f(((o * blocks + b) * fb + int64_t(part) * lb) * inner, (o * local + b * lb) * inner, lb * inner);
}
}  // namespace

void keep_shard(const ParamSpec& s, std::vector<float>& v) {
    if (!s.shard.split()) return;
    std::vector<float> piece(size_t(s.shape.numel()));
    for_each_run(s, s.shard.part,
                 [&](int64_t w, int64_t p, int64_t n) { std::copy_n(v.data() + w, n, piece.data() + p); });
    v.swap(piece);
}

void put_shard(const ParamSpec& s, int part, const float* piece, float* whole) {
    for_each_run(s, part, [&](int64_t w, int64_t p, int64_t n) { std::copy_n(piece + p, n, whole + w); });
}

ParamStore::ParamStore(Backend& backend, std::vector<ParamSpec> specs)
    : be_(&backend), specs_(std::move(specs)) {
    TensorTable all, trainable;
    std::vector<size_t> grad_slot(specs_.size(), npos);
    for (size_t i = 0; i < specs_.size(); i++) {
        const ParamSpec& s = specs_[i];
        ANVIL_CHECK(index_.emplace(s.name, i).second, "parameter store: \"{}\" is declared twice", s.name);
        all.add(s.name, s.shape, s.dtype, s.joined && i > 0);
        if (s.trainable) {
            grad_slot[i] =
                trainable.add(s.name, s.shape, s.dtype, s.joined && i > 0 && specs_[i - 1].trainable);
            trainable_.push_back(i);
        }
    }
    params_ = Arena(backend, all);
    if (!trainable_.empty()) grads_ = Arena(backend, trainable);
    grad_views_.resize(specs_.size());
    for (size_t i = 0; i < specs_.size(); i++)
        if (grad_slot[i] != npos) grad_views_[i] = grads_[grad_slot[i]];
}

size_t ParamStore::find(const std::string& name) const {
    const auto it = index_.find(name);
    return it == index_.end() ? npos : it->second;
}

std::vector<Tensor> ParamStore::grad_tensors() const {
    if (trainable_.empty()) return {};
    bool uniform = true;
    for (size_t i : trainable_) uniform = uniform && specs_[i].dtype == specs_[trainable_[0]].dtype;
    if (uniform) return {grads_.flat(specs_[trainable_[0]].dtype)};  // padding between entries is zero
    std::vector<Tensor> out;
    for (size_t i : trainable_) out.push_back(grad_views_[i]);
    return out;
}

void ParamStore::zero_grads() {
    for (const Tensor& t : grad_tensors()) be_->zero(t);
}

int64_t ParamStore::numel(bool trainable_only) const {
    int64_t n = 0;
    for (const ParamSpec& s : specs_)
        if (s.trainable || !trainable_only) n += s.full_shape().numel();
    return n;
}

void ParamStore::init(uint64_t seed, const std::function<void(size_t, const float*)>& on_f32) {
    init_entries(seed, false, on_f32);
}

void ParamStore::init_adapters(uint64_t seed, const std::function<void(size_t, const float*)>& on_f32) {
    init_entries(seed, true, on_f32);
}

void ParamStore::init_entries(uint64_t seed, bool adapters_only, const std::function<void(size_t, const float*)>& on_f32) {
    Rng rng(seed);
    std::vector<float> v;
    for (size_t i = 0; i < specs_.size(); i++) {
        const ParamSpec& s = specs_[i];
        if (adapters_only && !s.adapter) continue;
        v.assign(size_t(s.full_shape().numel()), 0.0f);
        if (s.init.kind == Init::Ones)
            for (auto& x : v) x = 1.0f;
        else if (s.init.kind == Init::Normal)
            for (auto& x : v) x = float(rng.normal() * s.init.std);
        else if (s.init.kind == Init::Uniform)
            for (auto& x : v) x = float((2.0 * rng.uniform() - 1.0) * s.init.std);
        keep_shard(s, v);  // drawn whole, in the same order as one process, then this rank's piece
        if (on_f32) on_f32(i, v.data());
        write_f32(i, v.data());
    }
}

std::vector<float> ParamStore::read_f32(size_t i) const {
    return be_->download_f32(params_[i]);
}

void ParamStore::write_f32(size_t i, const float* host) {
    const Tensor t = params_[i];
    if (t.dtype == DType::F32) return be_->upload(t, host);
    std::vector<uint8_t> raw(t.nbytes());
    convert_from_f32(raw.data(), t.dtype, host, size_t(t.numel()));
    be_->upload(t, raw.data());
}

}  // namespace anvil
