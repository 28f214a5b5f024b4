#include "train/optimizer.h"

#include <algorithm>

namespace anvil {

namespace {
constexpr size_t kRangeAlign = kAlign / sizeof(float);  // a rank's range starts where an arena entry could

Arena range_arena(Backend& be, const char* name, size_t n) {
    TensorTable t;
    t.add(name, {int64_t(std::max<size_t>(n, 1))}, DType::F32);
    return Arena(be, t);
}
}  // namespace

AdamW::AdamW(ParamStore& store, float wd, OptShard shard)
    : store_(store), wd_(wd), shard_(shard), slot_of_(store.size(), ParamStore::npos) {
    Backend& be = store.backend();
    ANVIL_CHECK(shard.world >= 1 && shard.rank >= 0 && shard.rank < shard.world, "optimizer shard {} of {}",
                shard.rank, shard.world);
    TensorTable layout;
    bool need_master = false;
    for (size_t i : store.trainable()) {
        slot_of_[i] = layout.add(store.spec(i).name, store.spec(i).shape, DType::F32);
        need_master = need_master || store.spec(i).dtype != DType::F32;
    }
    for (const TableEntry& e : layout.entries()) offsets_.push_back(e.offset / sizeof(float));
    n_ = layout.total_bytes() / sizeof(float);
    lo_ = begin(shard.rank);
    hi_ = begin(shard.rank + 1);
    if (layout.size() == 0) return;
    m_ = range_arena(be, "exp_avg", hi_ - lo_);
    v_ = range_arena(be, "exp_avg_sq", hi_ - lo_);
    if (need_master) master_ = range_arena(be, "master", hi_ - lo_);
    for (size_t i : store.trainable()) {
        const auto [o, a, b] = part(i);
        if (a >= b) continue;
        ParamSlot s;
        s.param = store.param(i).range(a - o, b - a);
        s.grad = store.grad(i).range(a - o, b - a);
        s.m = m_[0].range(a - lo_, b - a);
        s.v = v_[0].range(a - lo_, b - a);
        if (need_master && store.spec(i).dtype != DType::F32) {
            s.master = master_[0].range(a - lo_, b - a);
            be.convert(s.master, s.param);
        }
        s.weight_decay = store.spec(i).decay ? wd : 0.0f;
        slots_.push_back(s);
        pieces_.push_back({a, i, s.param, s.grad});
    }
}

AdamW::Part AdamW::part(size_t i) const {
    const size_t o = offset(i), n = size_t(store_.spec(i).shape.numel());
    return {o, std::max(o, lo_), std::min(o + n, hi_)};
}

std::vector<size_t> AdamW::range_sizes() const {
    std::vector<size_t> sizes;
    for (int r = 0; r < shard_.world; r++) sizes.push_back(begin(r + 1) - begin(r));
    return sizes;
}

size_t AdamW::begin(int rank) const {
    if (rank >= shard_.world) return n_;
    const size_t b = n_ * size_t(rank) / size_t(shard_.world);
    return std::min(n_, (b + kRangeAlign - 1) / kRangeAlign * kRangeAlign);
}

size_t AdamW::slot(size_t i) const {
    ANVIL_ASSERT(i < slot_of_.size() && slot_of_[i] != ParamStore::npos);
    return slot_of_[i];
}

size_t AdamW::offset(size_t i) const {
    return offsets_[slot(i)];
}

Tensor AdamW::m_range() const {
    return m_[0].range(0, hi_ - lo_);
}

Tensor AdamW::v_range() const {
    return v_[0].range(0, hi_ - lo_);
}

Tensor AdamW::master_range() const {
    return master_[0].range(0, hi_ - lo_);
}

void AdamW::step(const AdamWArgs& args, Tensor norm_sq) {
    if (!slots_.empty()) store_.backend().adamw(slots_, args, norm_sq);
}

void AdamW::reset_moments() {
    if (m_.size() == 0) return;
    store_.backend().zero(m_[0]);
    store_.backend().zero(v_[0]);
}

void AdamW::set_moments(size_t i, const float* m, const float* v) {
    const auto [o, a, b] = part(i);
    if (a >= b) return;
    store_.backend().upload(m_[0].range(a - lo_, b - a), m + (a - o));
    store_.backend().upload(v_[0].range(a - lo_, b - a), v + (a - o));
}

void AdamW::moments(size_t i, float* m, float* v) const {
    const size_t o = offset(i), n = size_t(store_.spec(i).shape.numel());
    ANVIL_ASSERT(o >= lo_ && o + n <= hi_);
    store_.backend().download(m, m_[0].range(o - lo_, n));
    store_.backend().download(v, v_[0].range(o - lo_, n));
}

void AdamW::weights_f32(size_t i, float* dst) const {
    if (has_master() && slot_of_[i] != ParamStore::npos && store_.spec(i).dtype != DType::F32) {
        const size_t o = offset(i), n = size_t(store_.spec(i).shape.numel());
        ANVIL_CHECK(o >= lo_ && o + n <= hi_, "the f32 master weights of {} are sharded (ZeRO-1)",
                    store_.spec(i).name);
        return store_.backend().download(dst, master_[0].range(o - lo_, n));
    }
    const std::vector<float> v = store_.read_f32(i);
    std::copy(v.begin(), v.end(), dst);
}

void AdamW::set_master(size_t i, const float* f32) {
    if (!has_master() || slot_of_[i] == ParamStore::npos || store_.spec(i).dtype == DType::F32) return;
    const auto [o, a, b] = part(i);
    if (a < b) store_.backend().upload(master_[0].range(a - lo_, b - a), f32 + (a - o));
}

}  // namespace anvil
