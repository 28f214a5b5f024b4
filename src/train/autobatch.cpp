#include "train/autobatch.h"

#include <chrono>
#include <cmath>

#include "data/batcher.h"

namespace anvil {

AutoBatch find_batch_size(Trainer& trainer, const TokenView& data, int T, int global, bool shuffle,
                          uint64_t seed) {
    Model& model = trainer.model();
    Backend& be = model.backend();
    AutoBatch r;
    std::vector<int32_t> tokens, targets, lengths;  // lengths: --neftune-alpha's record lengths
    AdamWArgs zero_lr;
    zero_lr.lr = 0.0f;  // the weights do not move (p * (1 - 0) - 0)
    // trial steps leave no trace: moments, loss scale, outlier windows and FP8 amax histories restored
    const LossScaler scaler = trainer.scaler();
    const OutlierState outliers = trainer.outliers();
    const std::vector<float> fp8 =
        model.fp8_state().empty() ? std::vector<float>{} : be.download_f32(model.fp8_state());
    double best_tps = 0;
    std::vector<int32_t>* want_lengths = trainer.needs_lengths() ? &lengths : nullptr;
    for (int b = 1; b <= global; b *= 2) {
        if (global % b) continue;
        double tps = 0;
        try {
            model.reserve(b, T, true);
            Batcher batcher(data, b, T, shuffle, seed);
            for (int s = 0; s < 3; s++) {  // the first steps warm caches and library workspaces
                const auto t0 = std::chrono::steady_clock::now();
                trainer.step(fill_step(batcher, s, 1, b, T, tokens, targets, want_lengths), 1, b, T, zero_lr);
                be.synchronize();
                tps = double(b) * T /
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            }
        } catch (const OutOfMemory& e) {
            model.release();
            r.log.push_back(fmt::format("micro-batch {:4}: does not fit ({})", b, e.what()));
            break;
        }
        model.release();
        r.log.push_back(fmt::format("micro-batch {:4}: fits, {:.0f} tokens/s", b, tps));
        if (tps > best_tps * 1.02 || r.micro == 0) {  // a larger batch must be clearly faster to be chosen
            best_tps = tps;
            r.micro = b;
        }
    }
    trainer.optimizer().reset_moments();
    trainer.scaler() = scaler;
    trainer.outliers() = outliers;
    if (!fp8.empty()) be.upload(model.fp8_state(), fp8.data());
    ANVIL_CHECK(r.micro > 0,
                "--batch auto: not even one sequence of {} tokens fits ({}); use a smaller model, "
                "--seq or a larger --memory-limit",
                T, r.log.empty() ? "" : r.log.back());
    r.accum = global / r.micro;
    r.log.push_back(
        fmt::format("chose micro-batch {} x {} accumulation = global batch {} (fastest that fits)", r.micro,
                    r.accum, global));
    return r;
}

}  // namespace anvil
