#include "train/optimizer.h"

namespace anvil {

AdamW::AdamW(GPT2& model, float wd) : model_(model), wd_(wd) {
    Backend& be = model.backend();
    TensorTable f32;
    for (const auto& p : model.params_info()) f32.add(p.name, p.shape, DType::F32);
    m_ = Arena(be, f32);
    v_ = Arena(be, f32);
    const bool need_master = model.params()[0].dtype != DType::F32;
    if (need_master) {
        master_ = Arena(be, f32);
        for (size_t i = 0; i < master_.size(); i++) be.convert(master_[i], model.params()[i]);
    }
    for (size_t i = 0; i < model.params_info().size(); i++) {
        ParamSlot s;
        s.param = model.params()[i];
        s.grad = model.grads()[i];
        s.m = m_[i];
        s.v = v_[i];
        if (need_master) s.master = master_[i];
        s.weight_decay = model.params_info()[i].decay ? wd : 0.0f;
        slots_.push_back(s);
    }
}

void AdamW::step(const AdamWArgs& args, Tensor norm_sq) {
    model_.backend().adamw(slots_, args, norm_sq);
}

}  // namespace anvil

namespace anvil {

void AdamW::reset_moments() {
    model_.backend().zero(m_.flat(DType::F32));
    model_.backend().zero(v_.flat(DType::F32));
}

}  // namespace anvil

namespace anvil {

std::vector<std::vector<float>> AdamW::weights_to_host() const {
    if (!has_master()) return model_.params_to_host();
    std::vector<std::vector<float>> host;
    for (size_t i = 0; i < master_.size(); i++) {
        host.emplace_back(static_cast<size_t>(master_[i].numel()));
        model_.backend().download(host.back().data(), master_[i]);
    }
    return host;
}

void AdamW::weights_from_host(const std::vector<std::vector<float>>& host) {
    model_.params_from_host(host);
    if (!has_master()) return;
    for (size_t i = 0; i < master_.size(); i++) model_.backend().upload(master_[i], host[i].data());
}

}  // namespace anvil
