#include "train/trainer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>

#include "backend/backend.h"
#include "core/progress.h"
#include "data/dataset.h"
#include "data/prefetch.h"
#include "data/synthetic.h"
#include "io/checkpoint.h"
#include "io/fs.h"
#include "io/json_text.h"
#include "io/tensorboard.h"
#include "train/evaluate.h"
#include "train/instruments.h"
#include "train/run_setup.h"
#include "train/schedule.h"
#include "train/step.h"

namespace anvil {

namespace {

// The only process-wide state: set by SIGINT/SIGTERM so the loop can save a checkpoint and stop cleanly.
std::atomic<bool> g_stop{false};
// A second signal exits at once: a step that never ends must still be stoppable.
extern "C" void on_stop_signal(int) {
    if (g_stop) std::_Exit(130);
    g_stop = true;
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

class MetricsLog {
public:
    explicit MetricsLog(const std::string& path) : f_(path, std::ios::app) {
        ANVIL_CHECK(f_.good(), "{}: cannot open for writing", path);
    }
    void write(const nlohmann::json& j) {
        f_ << json_text(j) << '\n';
        f_.flush();
    }

private:
    std::ofstream f_;
};

// Every numeric field of a metrics record as a TensorBoard scalar, grouped by what it measures.
void write_scalars(TensorBoardWriter& tb, const nlohmann::json& rec, int step) {
    for (const auto& [key, value] : rec.items()) {
        if (!value.is_number() || key == "step") continue;
        std::string group = "train";
        if (key.starts_with("val_"))
            group = "val";
        else if (key.starts_with("gpu_") || key.starts_with("cpu_") || key == "rss_mb" ||
                 key == "peak_mem_mb")
            group = "system";
        else if (key.ends_with("_ms") || key == "tokens_per_s" || key == "mfu")
            group = "perf";
        else if (key.find("cost") != std::string::npos || key.find("usd") != std::string::npos)
            group = "cost";
        tb.scalar(group + "/" + key, value.get<double>(), step);
    }
    tb.flush();
}

// fp16's dynamic loss scaling: gradients are computed on loss x scale so small ones survive fp16; a step
// whose gradients overflow is skipped and the scale halved; after `interval` clean steps it doubles.
struct LossScaler {
    bool enabled = false;
    float scale = 65536.0f;
    int good = 0, interval = 2000;
    void update(bool finite) {
        if (!enabled) return;
        if (!finite) {
            scale = std::max(1.0f, scale / 2);
            good = 0;
        } else if (++good >= interval) {
            scale = std::min(scale * 2, 16777216.0f);
            good = 0;
        }
    }
};

}  // namespace

TrainOptions embedded_default_options() {
    TrainOptions o;
    o.embedded = true;
    o.layers = 4;
    o.heads = 4;
    o.dim = 128;
    o.seq = 64;
    o.batch = 32;
    o.steps = 1500;
    o.lr = 2e-3f;
    o.prompt_template = "compact";
    o.warmup = 50;
    o.weight_decay = 0.1f;
    o.grad_clip = 1.0f;
    o.val_fraction = 0.05;
    o.log_every = 50;
    o.eval_examples = 300;
    return o;
}

int run_train(TrainOptions o) {
    const auto t_start = Clock::now();
    RunSetup run = setup_run(o);  // resolves out dir, data, tokenizer, model, optimizer, resume state
    GPT2& model = *run.model;
    Backend& be = model.backend();
    AdamW& opt = *run.opt;
    const int B = o.batch, T = o.seq, accum = o.grad_accum;
    std::fprintf(stderr, "anvil: %s\n", be.describe().c_str());
    std::fprintf(stderr, "anvil: model %s, %.2fM parameters\n", model.config().str().c_str(),
                 double(model.config().num_params()) / 1e6);
    std::fprintf(stderr, "anvil: data %s: %zu train tokens, %zu val tokens (%zu records)\n", o.data.c_str(),
                 run.data.train.size(), run.data.val.size(), run.data.records);
    std::fprintf(stderr, "anvil: batch %d x %d tokens x %d accumulation, %d steps, out %s\n", B, T, accum,
                 o.steps, o.out.c_str());

    RunInstruments instruments(o, model);
    LossScaler scaler;
    scaler.enabled = model.dtype() == DType::F16;
    if (!scaler.enabled) scaler.scale = 1.0f;
    std::unique_ptr<TensorBoardWriter> tensorboard;
    if (o.tensorboard) tensorboard = std::make_unique<TensorBoardWriter>(o.out);
    Prefetcher loader(Batcher(run.data.train, B, T, o.shuffle, o.seed), be, B, T, accum, run.start_step);
    LrSchedule sched{o.lr, o.min_lr_frac, o.warmup, o.steps, o.lr_schedule == "cosine"};
    MetricsLog metrics(o.out + "/metrics.jsonl");
    TensorTable scalars;
    scalars.add("norm_sq", {1}, DType::F32);
    Arena scalar_arena(be, scalars);
    const Tensor norm_sq = scalar_arena[0];

    std::signal(SIGINT, on_stop_signal);
    std::signal(SIGTERM, on_stop_signal);

    LossBuffer losses;
    Progress bar("train", o.steps, o.log_every, "steps");
    double train_time = 0.0, wait_time = 0.0, last_loss = NAN, step_s = 0.0;
    int64_t trained_tokens = 0;
    int skipped = 0, step = run.start_step;
    bool interrupted = false;
    for (; step < o.steps; step++) {
        const auto t0 = Clock::now();
        double waited = 0.0;
        const StepBatch batch = loader.acquire(step, &waited);
        const StepResult sr = accumulate_gradients(model, batch, accum, B, T, losses, scaler.scale);
        loader.release();
        const double t_compute = seconds_since(t0) - waited;
        const auto t_opt = Clock::now();
        be.global_norm_sq(norm_sq, {model.grads().flat(model.params()[0].dtype)});
        AdamWArgs args;
        args.lr = sched.at(step);
        args.beta1 = o.beta1;
        args.beta2 = o.beta2;
        args.eps = o.eps;
        args.step = step + 1;
        args.max_grad_norm = o.grad_clip;
        args.grad_scale = 1.0f / scaler.scale;
        opt.step(args, norm_sq);
        float nsq = 0.0f;
        be.download(&nsq, norm_sq);
        const double loss = sr.loss;
        const double t_optimizer = seconds_since(t_opt);
        const double dt = seconds_since(t0);
        train_time += dt;
        wait_time += waited;
        trained_tokens += int64_t(B) * T * accum;
        const double tok_s = double(B) * T * accum / dt;
        step_s = step_s > 0 ? 0.9 * step_s + 0.1 * dt : dt;  // smoothed, for projections
        const double elapsed = seconds_since(t_start);
        const bool finite = std::isfinite(loss) && std::isfinite(nsq);
        const float used_scale = scaler.scale;
        if (!finite) {
            skipped++;
            std::fprintf(stderr, "\nanvil: step %d: non-finite %s; update skipped (%d so far)%s\n", step + 1,
                         std::isfinite(loss) ? "gradient" : "loss", skipped,
                         scaler.enabled
                             ? fmt::format(", loss scale {} -> {}", scaler.scale, scaler.scale / 2).c_str()
                             : "");
        }
        scaler.update(finite);
        last_loss = loss;
        const int done = step + 1;
        nlohmann::json rec = {{"step", done},
                              {"loss", loss},
                              {"lr", args.lr},
                              {"grad_norm", std::sqrt(double(nsq))},
                              {"tokens_per_s", tok_s},
                              {"step_ms", dt * 1e3},
                              {"data_wait_ms", waited * 1e3},
                              {"fwd_bwd_ms", t_compute * 1e3},
                              {"optimizer_ms", t_optimizer * 1e3},
                              {"elapsed_s", seconds_since(t_start)}};
        if (!finite) rec["skipped"] = true;
        if (scaler.enabled) rec["loss_scale"] = used_scale;
        instruments.add_step(rec, tok_s, elapsed, double(trained_tokens), step_s, o.steps - done);
        const bool eval_now =
            o.eval_every > 0 && done % o.eval_every == 0 && done < o.steps && run.data.val.size() > 1;
        if (eval_now) {
            const LossResult v = evaluate_loss(model, run.data.val, B, T, o.eval_batches);
            rec["val_loss"] = v.loss;
        }
        if (done % o.log_every == 0 || done == o.steps || eval_now || !finite) {
            metrics.write(rec);
            if (tensorboard) write_scalars(*tensorboard, rec, done);
        }
        bar.update(done,
                   fmt::format("loss {:.4f} | lr {:.2e} | {:.0f} tok/s", loss, args.lr, tok_s) +
                       instruments.progress(tok_s, elapsed, double(trained_tokens), step_s, o.steps - done));
        if (o.save_every > 0 && done % o.save_every == 0 && done < o.steps)
            save_checkpoint(run, done, fmt::format("checkpoint-{}", done));
        if (g_stop) {
            interrupted = true;
            step++;
            break;
        }
    }
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
    const std::string final_dir = interrupted ? fmt::format("checkpoint-{}", step) : "final";
    save_checkpoint(run, step, final_dir);
    if (interrupted) {
        bar.finish(fmt::format("interrupted at step {}; continue with: anvil train --resume {}/{}", step,
                               o.out, final_dir));
        return 130;
    }
    const double tokens_per_s = train_time > 0 ? double(trained_tokens) / train_time : 0.0;
    bar.finish(fmt::format("done: {} steps, loss {:.4f}, {:.0f} tok/s", step, last_loss, tokens_per_s));
    if (run.profiler) {
        std::fprintf(stderr, "per-op time over the run (synchronised after each op):\n%s",
                     run.profiler->report().c_str());
        write_file_atomic(o.out + "/profile.json", json_text(run.profiler->report_json(), 1) + "\n");
    }

    nlohmann::json summary = {{"steps", step},
                              {"train_loss", last_loss},
                              {"tokens_per_s", tokens_per_s},
                              {"data_wait_share", train_time > 0 ? wait_time / train_time : 0.0},
                              {"micro_batch", B},
                              {"grad_accum", accum},
                              {"trained_tokens", trained_tokens},
                              {"skipped_steps", skipped},
                              {"params", model.config().num_params()},
                              {"model_dir", o.out + "/final"}};
    if (run.data.val.size() > 1) {
        const LossResult v = evaluate_loss(model, run.data.val, B, T, 0);
        summary["val_loss"] = v.loss;
        summary["val_ppl"] = v.ppl;
        std::printf("validation: loss %.4f, perplexity %.3f (%ld targets)\n", v.loss, v.ppl, long(v.targets));
    }
    if (!run.data.val_examples.empty()) {
        const ExactMatchResult em = exact_match(model, *run.tok, parse_template(o.prompt_template),
                                                run.data.val_examples, o.eval_examples, 5);
        summary["exact_match"] = em.accuracy();
        summary["exact_match_n"] = em.total;
        std::printf("exact match: %.1f%% (%d of %d held-out examples)\n", 100.0 * em.accuracy(), em.correct,
                    em.total);
        nlohmann::json samples = nlohmann::json::array();
        for (const auto& s : em.samples) {
            std::printf("  %s %s | %s -> %s (expected %s)\n", s.correct ? "ok  " : "MISS",
                        s.example.instruction.c_str(), s.example.input.c_str(), s.got.c_str(),
                        s.example.output.c_str());
            samples.push_back({{"instruction", s.example.instruction},
                               {"input", s.example.input},
                               {"expected", s.example.output},
                               {"got", s.got}});
        }
        summary["samples"] = samples;
    }
    summary["wall_s"] = seconds_since(t_start);
    instruments.add_summary(summary, tokens_per_s, summary["wall_s"].get<double>(), double(trained_tokens));
    if (!run.batch_search.empty()) summary["batch_search"] = run.batch_search;
    if (summary.contains("mfu"))
        std::printf("MFU: %.1f%% (peak %.2f TFLOP/s: %s)\n", 100 * summary["mfu"].get<double>(),
                    summary["peak_tflops"].get<double>(), instruments.peak_source().c_str());
    if (summary.contains("cost_usd"))
        std::printf("cost: $%.4f ($%.4f per million tokens at $%.2f/h)\n", summary["cost_usd"].get<double>(),
                    summary["cost_per_million_tokens"].get<double>(),
                    summary["price_per_hour"].get<double>());
    std::printf("data wait: %.3f%% of step time (background loader)\n",
                100.0 * summary["data_wait_share"].get<double>());
    std::printf("throughput: %.0f tokens/s; wall time %s; model in %s/final\n", tokens_per_s,
                format_duration(summary["wall_s"].get<double>()).c_str(), o.out.c_str());
    write_file_atomic(o.out + "/summary.json", json_text(summary, 2) + "\n");
    return 0;
}

}  // namespace anvil
