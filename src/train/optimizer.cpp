#include "train/optimizer.h"

namespace anvil {

AdamW::AdamW(ParamStore& store, float wd) : store_(store), wd_(wd), slot_of_(store.size(), ParamStore::npos) {
    Backend& be = store.backend();
    TensorTable f32;
    bool need_master = false;
    for (size_t i : store.trainable()) {
        slot_of_[i] = f32.add(store.spec(i).name, store.spec(i).shape, DType::F32);
        need_master = need_master || store.spec(i).dtype != DType::F32;
    }
    if (f32.size() == 0) return;
    m_ = Arena(be, f32);
    v_ = Arena(be, f32);
    if (need_master) {
        master_ = Arena(be, f32);
        for (size_t i : store.trainable()) be.convert(master_[slot_of_[i]], store.param(i));
    }
    for (size_t i : store.trainable()) {
        ParamSlot s;
        s.param = store.param(i);
        s.grad = store.grad(i);
        s.m = m_[slot_of_[i]];
        s.v = v_[slot_of_[i]];
        if (need_master && store.spec(i).dtype != DType::F32) s.master = master_[slot_of_[i]];
        s.weight_decay = store.spec(i).decay ? wd : 0.0f;
        slots_.push_back(s);
    }
}

size_t AdamW::slot(size_t i) const {
    ANVIL_ASSERT(i < slot_of_.size() && slot_of_[i] != ParamStore::npos);
    return slot_of_[i];
}

void AdamW::step(const AdamWArgs& args, Tensor norm_sq) {
    if (!slots_.empty()) store_.backend().adamw(slots_, args, norm_sq);
}

void AdamW::reset_moments() {
    if (slots_.empty()) return;
    store_.backend().zero(m_.flat(DType::F32));
    store_.backend().zero(v_.flat(DType::F32));
}

void AdamW::weights_f32(size_t i, float* dst) const {
    if (has_master() && slot_of_[i] != ParamStore::npos && store_.spec(i).dtype != DType::F32)
        return store_.backend().download(dst, master_[slot_of_[i]]);
    const std::vector<float> v = store_.read_f32(i);
    std::copy(v.begin(), v.end(), dst);
}

void AdamW::set_master(size_t i, const float* f32) {
    if (has_master() && slot_of_[i] != ParamStore::npos && store_.spec(i).dtype != DType::F32)
        store_.backend().upload(master_[slot_of_[i]], f32);
}

}  // namespace anvil
