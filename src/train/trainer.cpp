#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/rng.h"

namespace anvil {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}
}  // namespace

void LossScaler::update(bool finite) {
    if (!enabled) return;
    if (!finite) {
        scale = std::max(1.0f, scale / 2);
        good = 0;
    } else if (++good >= interval) {
        scale = std::min(scale * 2, 16777216.0f);
        good = 0;
    }
}

double ZScoreWindow::push(double x) {
    v_.push_back(x);
    if (v_.size() <= window_) return NAN;  // still filling
    v_.pop_front();
    double mean = 0.0, var = 0.0;
    for (double y : v_) mean += y;
    mean /= double(v_.size());
    for (double y : v_) var += (y - mean) * (y - mean);
    const double sd = std::sqrt(var / double(v_.size()));
    return sd > 0.0 ? (x - mean) / sd : 0.0;
}

void ZScoreWindow::set_values(const std::vector<double>& v) {
    v_.assign(v.size() > window_ ? v.end() - std::ptrdiff_t(window_) : v.begin(), v.end());
}

float* LossBuffer::reserve(Backend& be, size_t n) {
    if (n > n_) {
        buf_ = be.alloc_host(n * sizeof(float));
        n_ = n;
    }
    return static_cast<float*>(buf_.data());
}

Trainer::Trainer(Model& model, AdamW& opt, uint64_t seed) : model_(model), opt_(opt), seed_(seed) {
    TensorTable t;
    t.add("norm_sq", {1}, DType::F32);
    scalars_ = Arena(model.backend(), t);
    scaler_.enabled = model.dtype() == DType::F16;
    scaler_.scale = scaler_.enabled ? 65536.0f : 1.0f;
}

uint64_t Trainer::pass_seed(int64_t step, int m) const {
    // each rank's rows draw their own randomness
    const uint64_t seed = seed_ ^ (dp_ ? uint64_t(dp_->rank()) * 0x9e3779b97f4a7c15ull : 0);
    return Rng(seed ^ (uint64_t(step) << 20) ^ uint64_t(m)).next_u64();
}

StepStats Trainer::gradients(const StepBatch& batch, int accum, int B, int T, int64_t step) {
    const auto t0 = Clock::now();
    Backend& be = model_.backend();
    const size_t per = size_t(B) * T;
    float* host = losses_.reserve(be, per * size_t(accum));
    StepStats r;
    r.targets = dp_ ? dp_->total_targets(batch.target_count) : batch.target_count;
    r.loss_scale = scaler_.scale;
    // With no targets at all the gradient is zero; any nonzero dloss makes the classifier write zeros.
    const float dloss = (r.targets > 0 ? 1.0f / float(r.targets) : 1.0f) * scaler_.scale;
    model_.zero_grads();
    ForwardPass f{.tokens = model_.tokens(B, T), .targets = model_.targets(B, T)};
    f.dloss = dloss;
    if (needs_lengths()) {
        ANVIL_CHECK(batch.lengths,
                    "internal: --neftune-alpha needs each position's record length in the batch");
        f.lengths = model_.lengths(B, T);
    }
    for (int m = 0; m < accum; m++) {
        f.seed = pass_seed(step, m);
        be.upload(f.tokens, batch.tokens + size_t(m) * per);
        be.upload(f.targets, batch.targets + size_t(m) * per);
        if (f.lengths.data) be.upload(f.lengths, batch.lengths + size_t(m) * per);
        model_.forward(f);
        if (dp_) dp_->arm(m == accum - 1);
        model_.backward(dp_);
        be.download_async(host + size_t(m) * per, model_.losses(B, T));
    }
    be.synchronize();
    double sum = 0.0;
    for (size_t i = 0; i < per * size_t(accum); i++) sum += host[i];
    if (dp_) {
        dp_->finish();
        r.comm_s = dp_->exposed_s();
        sum = dp_->total_loss(sum);
    }
    r.loss = r.targets > 0 ? sum / double(r.targets) : 0.0;
    r.fwd_bwd_s = seconds_since(t0);
    return r;
}

StepStats Trainer::step(const StepBatch& batch, int accum, int B, int T, AdamWArgs args) {
    StepStats r = gradients(batch, accum, B, T, args.step);
    const auto t0 = Clock::now();
    Backend& be = model_.backend();
    const Tensor norm_sq = scalars_[0];
    const std::vector<Tensor> grads = model_.params().grad_tensors();
    if (grads.empty())
        be.zero(norm_sq);
    else if (dp_)
        dp_->global_norm_sq(norm_sq);
    else
        be.global_norm_sq(norm_sq, grads);
    args.grad_scale = 1.0f / scaler_.scale;
    float nsq = 0.0f;
    if (skip_.on()) {  // the decision needs the norm before the update: the host waits for it there
        be.download(&nsq, norm_sq);
        judge(r, nsq);
    }
    if (!r.outlier) {
        opt_.step(args, norm_sq);
        if (dp_) dp_->after_update();
    }
    if (!skip_.on()) be.download(&nsq, norm_sq);                   // the update leaves the norm as it was
    r.grad_norm = std::sqrt(double(nsq)) / double(scaler_.scale);  // the norm of the unscaled gradients
    r.finite = std::isfinite(r.loss) && std::isfinite(nsq);
    scaler_.update(r.finite);
    r.optimizer_s = seconds_since(t0);
    return r;
}

void Trainer::judge(StepStats& r, float nsq) {
    if (r.targets == 0) return;  // no loss and a zero gradient: nothing to judge, kept out of the windows
    const double norm = std::sqrt(double(nsq)) / double(scaler_.scale);
    if (!std::isfinite(r.loss) || !std::isfinite(norm))
        return;  // skipped as non-finite; kept out of the windows
    // every rank sees the same global loss and norm, so every rank decides the same
    r.loss_z = outliers_.loss.push(r.loss);
    r.grad_z = outliers_.grad.push(norm);
    if (skip_.loss_z > 0.0f && r.loss_z > skip_.loss_z)
        r.outlier = "loss";
    else if (skip_.grad_z > 0.0f && r.grad_z > skip_.grad_z)
        r.outlier = "grad";
}

StepBatch fill_step(Batcher& batcher, int64_t step, int accum, int B, int T, std::vector<int32_t>& tokens,
                    std::vector<int32_t>& targets, std::vector<int32_t>* lengths) {
    const size_t per = size_t(B) * T;
    tokens.resize(per * size_t(accum));
    targets.resize(per * size_t(accum));
    if (lengths) lengths->resize(per * size_t(accum));
    for (int m = 0; m < accum; m++)
        batcher.fill(step * accum + m, tokens.data() + size_t(m) * per, targets.data() + size_t(m) * per,
                     lengths ? lengths->data() + size_t(m) * per : nullptr);
    int64_t count = 0;
    for (int32_t t : targets) count += t >= 0;
    return StepBatch{tokens.data(), targets.data(), count, lengths ? lengths->data() : nullptr};
}

}  // namespace anvil
