#include "train/step.h"

namespace anvil {

StepResult accumulate_gradients(GPT2& model, Batcher& batcher, int64_t step, int accum, int B, int T,
                                StepBuffers& buf) {
    Backend& be = model.backend();
    const size_t per = size_t(B) * T;
    buf.tokens.resize(per * size_t(accum));
    buf.targets.resize(per * size_t(accum));
    buf.losses.resize(per);
    for (int m = 0; m < accum; m++)
        batcher.fill(step * accum + m, buf.tokens.data() + size_t(m) * per,
                     buf.targets.data() + size_t(m) * per);
    StepResult r;
    for (int32_t t : buf.targets) r.targets += t >= 0;
    // With no targets at all the gradient is zero; any nonzero dloss makes the classifier write zeros.
    const float dloss = r.targets > 0 ? 1.0f / float(r.targets) : 1.0f;
    model.zero_grads();
    double sum = 0.0;
    for (int m = 0; m < accum; m++) {
        be.upload(model.tokens(B, T), buf.tokens.data() + size_t(m) * per);
        be.upload(model.targets(B, T), buf.targets.data() + size_t(m) * per);
        model.forward(B, T, true, dloss);
        model.backward();
        be.download(buf.losses.data(), model.losses(B, T));
        for (float l : buf.losses) sum += l;
    }
    r.loss = r.targets > 0 ? sum / double(r.targets) : 0.0;
    return r;
}

}  // namespace anvil
