// One optimizer step, the one place it is written: zero the gradients, forward and backward over the step's
// micro-batches (the loss is the mean over every target of the step, so accumulation equals one large batch),
// the global gradient norm, clipping, AdamW, a skipped update on a non-finite loss or gradient, and fp16's
// dynamic loss scale. Training, `--batch auto` and the tests all step through Trainer::step.
#pragma once

#include <cmath>
#include <cstdint>
#include <deque>
#include <vector>

#include "data/prefetch.h"
#include "model/model.h"
#include "train/data_parallel.h"
#include "train/optimizer.h"

namespace anvil {

// fp16's dynamic loss scaling: gradients are computed on loss x scale so small ones survive fp16; a step
// whose gradients overflow is skipped and the scale halved; after `interval` clean steps it doubles.
struct LossScaler {
    bool enabled = false;
    float scale = 1.0f;
    int good = 0, interval = 2000;
    void update(bool finite);
};

// llm.c's outlier detector: the z-score of a value against a window of the last `window` values, the new
// one included (mean and population standard deviation over the window); NaN until the window is full, 0
// when every value in it is the same. Values are kept oldest first.
class ZScoreWindow {
public:
    explicit ZScoreWindow(size_t window = 128) : window_(window) {}
    double push(double x);  // x joins the window (the oldest leaves once it is full); x's z-score
    const std::deque<double>& values() const { return v_; }
    void set_values(const std::vector<double>& v);  // the newest `window` of them

private:
    size_t window_;
    std::deque<double> v_;
};

// Skipping the update of a step whose loss or gradient norm is an outlier (llm.c's -sl and -sg): the z-score
// of the step's loss (or norm) against the last `window` steps' (128, llm.c's) exceeds loss_z (grad_z); 0 =
// off. Only finite values enter the windows (a non-finite step is skipped anyway). The new value is one of
// the window's, so no z-score exceeds sqrt(window - 1).
struct OutlierSkip {
    float loss_z = 0.0f, grad_z = 0.0f;
    int window = 128;
    bool on() const { return loss_z > 0.0f || grad_z > 0.0f; }
};
struct OutlierState {
    ZScoreWindow loss, grad;
};

struct StepStats {
    double loss = 0.0;       // mean over the step's target tokens (0 when there are none)
    int64_t targets = 0;     // target tokens in the step
    double grad_norm = 0.0;  // global norm of the (unscaled) gradients, before clipping
    bool finite = true;      // false: the update was skipped
    // With OutlierSkip on: the z-scores (NaN while the windows fill), and which one skipped the update
    // ("loss" or "grad"; null: applied, or skipped as non-finite)
    double loss_z = NAN, grad_z = NAN;
    const char* outlier = nullptr;
    float loss_scale = 1.0f;  // the scale this step's gradients were computed with
    double fwd_bwd_s = 0.0, optimizer_s = 0.0;
    double comm_s = 0.0;  // waiting for the gradient all-reduces after the backward (data parallel)
};

// Host memory the per-token losses are copied into without stopping the host (page-locked on CUDA).
class LossBuffer {
public:
    float* reserve(Backend& be, size_t n);  // at least n floats; reallocates when it must grow
private:
    Buffer buf_;
    size_t n_ = 0;
};

class Trainer {
public:
    // `seed` varies what randomness the passes use (LoRA dropout's masks): each micro-batch of each step gets
    // its own, derived from (seed, step, micro-batch), so a resumed run draws what the uninterrupted one did.
    Trainer(Model& model, AdamW& opt, uint64_t seed = 0);
    Model& model() { return model_; }
    // whether a StepBatch must carry each position's record length (--neftune-alpha's L)
    bool needs_lengths() const { return model_.options().neftune_alpha > 0.0f; }
    AdamW& optimizer() { return opt_; }
    LossScaler& scaler() { return scaler_; }
    // --skip-loss-z / --skip-grad-z, and the windows they judge by (saved in checkpoints)
    void set_outlier_skip(OutlierSkip o) {
        skip_ = o;
        outliers_ = {ZScoreWindow(size_t(o.window)), ZScoreWindow(size_t(o.window))};
    }
    OutlierState& outliers() { return outliers_; }
    // Data parallelism: this rank's batches are its rows of the global batch; the loss is normalised by the
    // targets of every rank's rows, the gradients are summed over the ranks during the last micro-batch's
    // backward, and the loss reported is the global batch's. Null (the default): one process.
    void set_data_parallel(DataParallel* dp) { dp_ = dp; }

    // Gradients of the step's `accum` micro-batches of (B, T) into the model's gradients; returns the loss.
    // The per-token losses are copied to the host as the device gets to them; the host waits once, at the
    // end.
    // `step`: the step's number (Step::number), which the passes' seeds derive from.
    StepStats gradients(const StepBatch& batch, int accum, int B, int T, int64_t step = 0);
    // gradients(), then the norm, clipping and the AdamW update with `args` (lr, betas, eps, step, clip;
    // its grad_scale is the loss scale's inverse), skipping it when the loss or the norm is not finite, or
    // (set_outlier_skip) an outlier; the host then reads the norm before the update.
    StepStats step(const StepBatch& batch, int accum, int B, int T, AdamWArgs args);
    // The randomness of micro-batch m of step number `step` on this rank (ForwardPass::seed: the dropout
    // masks).
    uint64_t pass_seed(int64_t step, int m) const;

private:
    // the z-scores of the step's loss and of its gradients' squared norm nsq (scaled), and the skip
    void judge(StepStats& r, float nsq);

    Model& model_;
    AdamW& opt_;
    Arena scalars_;  // the global norm's square, on the device
    LossBuffer losses_;
    LossScaler scaler_;
    OutlierSkip skip_;
    OutlierState outliers_;
    DataParallel* dp_ = nullptr;
    uint64_t seed_;
};

// Builds step `step`'s micro-batches from `batcher` into tokens/targets (for callers without a Prefetcher).
// With `lengths`, each position's record length too (--neftune-alpha).
StepBatch fill_step(Batcher& batcher, int64_t step, int accum, int B, int T, std::vector<int32_t>& tokens,
                    std::vector<int32_t>& targets, std::vector<int32_t>* lengths = nullptr);

}  // namespace anvil
