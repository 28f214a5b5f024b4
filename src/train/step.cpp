#include "train/step.h"

namespace anvil {

float* LossBuffer::reserve(Backend& be, size_t n) {
    if (n > n_) {
        buf_ = be.alloc_host(n * sizeof(float));
        n_ = n;
    }
    return static_cast<float*>(buf_.data());
}

StepResult accumulate_gradients(GPT2& model, const StepBatch& batch, int accum, int B, int T,
                                LossBuffer& losses, float loss_scale) {
    Backend& be = model.backend();
    const size_t per = size_t(B) * T;
    float* host = losses.reserve(be, per * size_t(accum));
    StepResult r;
    r.targets = batch.target_count;
    // With no targets at all the gradient is zero; any nonzero dloss makes the classifier write zeros.
    const float dloss = (r.targets > 0 ? 1.0f / float(r.targets) : 1.0f) * loss_scale;
    model.zero_grads();
    double sum = 0.0;
    for (int m = 0; m < accum; m++) {
        be.upload(model.tokens(B, T), batch.tokens + size_t(m) * per);
        be.upload(model.targets(B, T), batch.targets + size_t(m) * per);
        model.forward(B, T, true, dloss);
        model.backward();
        be.download_async(host + size_t(m) * per, model.losses(B, T));
    }
    be.synchronize();
    for (size_t i = 0; i < per * size_t(accum); i++) sum += host[i];
    r.loss = r.targets > 0 ? sum / double(r.targets) : 0.0;
    return r;
}

StepBatch fill_step(Batcher& batcher, int64_t step, int accum, int B, int T, std::vector<int32_t>& tokens,
                    std::vector<int32_t>& targets) {
    const size_t per = size_t(B) * T;
    tokens.resize(per * size_t(accum));
    targets.resize(per * size_t(accum));
    for (int m = 0; m < accum; m++)
        batcher.fill(step * accum + m, tokens.data() + size_t(m) * per, targets.data() + size_t(m) * per);
    int64_t count = 0;
    for (int32_t t : targets) count += t >= 0;
    return StepBatch{tokens.data(), targets.data(), count};
}

}  // namespace anvil
