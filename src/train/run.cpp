#include "train/run.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "core/progress.h"
#include "core/version.h"
#include "data/chat.h"
#include "data/prefetch.h"
#include "io/fs.h"
#include "io/json_text.h"
#include "io/tensorboard.h"
#include "runtime/compare.h"
#include "runtime/evaluate.h"
#include "train/instruments.h"
#include "train/run_setup.h"
#include "train/schedule.h"
#include "train/supervisor.h"

namespace anvil {

namespace {

// The only process-wide state: set by SIGINT/SIGTERM/SIGUSR1 so the loop can save a checkpoint and stop
// cleanly. Under mpirun, Ctrl-C reaches the ranks as SIGTERM (after odls_base_sigkill_timeout seconds, and
// SIGKILL as long again later); mpirun forwards SIGUSR1 at once, as Slurm's --signal=USR1@SECONDS sends it.
std::atomic<bool> g_stop{false};
std::atomic<int64_t> g_stop_ns{0};  // when the first one came (CLOCK_MONOTONIC)
bool g_supervised = false;          // a --max-restarts worker (train/supervisor.h)
// A second signal exits at once: a step that never ends must still be stoppable. A supervised worker takes a
// second one within 2 s as the first's copy (its supervisor passes on what may have reached it directly too).
extern "C" void on_stop_signal(int) {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe
    const int64_t now = int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
    if (g_stop) {
        if (g_supervised && now - g_stop_ns.load() < 2000000000) return;
        static const char msg[] = "\nanvil: a second stop signal: exiting now, without a checkpoint\n";
        [[maybe_unused]] const ssize_t n = ::write(2, msg, sizeof msg - 1);  // async-signal-safe
        std::_Exit(130);
    }
    g_stop_ns = now;
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
void write_scalars(TensorBoardWriter& tb, const nlohmann::json& rec, int64_t step) {
    for (const auto& [key, value] : rec.items()) {
        if (!value.is_number() || key == "step") continue;
        std::string group = "train";
        if (key.starts_with("val_") || key.starts_with("mc_"))
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

class TrainingLoop {
public:
    TrainingLoop(RunSetup& run, Clock::time_point start)
        : run_(run),
          o_(run.opts),
          t_start_(start),
          comm_(*run.comm),
          replicas_(*run.grid.dp),
          W_(replicas_.size()),
          instruments_(o_, *run.model, comm_.size()),  // every rank's device
          loader_(training_batcher(run, replicas_.rank(), W_), run.model->backend(),
                  {.B = o_.batch,
                   .T = o_.seq,
                   .accum = o_.grad_accum,
                   .first_step = run.start_step,
                   .lengths = run.trainer->needs_lengths()}),
          sched_{o_.lr, o_.min_lr_frac, o_.warmup, o_.steps, parse_lr_shape(o_.lr_schedule), o_.decay_frac},
          bar_("train", o_.steps, o_.log_every, "steps") {
        if (comm_.rank() != 0) return;  // rank 0 alone writes the run directory
        metrics_ = std::make_unique<MetricsLog>(o_.out + "/metrics.jsonl");
        if (o_.tensorboard) tensorboard_ = std::make_unique<TensorBoardWriter>(o_.out);
    }
    int run();

private:
    // Every function here names a step by its number (Step, train/schedule.h).
    void one_step(Step s);
    void note_skip(int64_t step, const StepStats& st);
    void note_loss(int64_t step, const StepStats& st);
    nlohmann::json step_record(int64_t step, const StepStats& st, double lr, double dt, double waited,
                               double tok_s, double elapsed) const;
    void log(const nlohmann::json& rec, int64_t step, bool force);
    int finish(int64_t steps_done, bool interrupted);
    void print_profile(int64_t steps_done);  // --profile's table and profile.json (rank 0)
    void report(nlohmann::json& summary, double tokens_per_s);
    // --sample-every's text at step `step`: --sample-prompt's continuation, else the first held-out
    // instruction or chat example's answer, both ending at the template's stop tokens; else (plain text) from
    // the end-of-text token (BOS where the tokenizer has one), as llm.c samples during training.
    std::string sample(int64_t step) const;
    // --eval-every's validation loss at step `step`: OUT/best when it is the lowest so far (--keep-best), and
    // --early-stop's count of evaluations without improvement
    void track_best(double val_loss, int64_t step);
    std::string eval_line(int64_t step, const std::optional<LossResult>& val,
                          const std::optional<ChoiceResult>& mc) const;

    // Stop after this step: a signal reached this process or, in a job, any rank before the step (the votes
    // travel with the step's loss, so every rank stops after the same step).
    bool stop_requested();

    RunSetup& run_;
    const TrainOptions& o_;
    Clock::time_point t_start_;
    Comm& comm_;
    Comm& replicas_;  // the data-parallel ranks (tensor parallel: one per group)
    const int W_;     // their number
    RunInstruments instruments_;
    Prefetcher loader_;
    LrSchedule sched_;
    std::unique_ptr<MetricsLog> metrics_;
    Progress bar_;
    std::unique_ptr<TensorBoardWriter> tensorboard_;
    double train_time_ = 0.0, wait_time_ = 0.0, comm_time_ = 0.0, last_loss_ = NAN, step_s_ = 0.0;
    int64_t trained_tokens_ = 0;
    int skipped_ = 0;
    int64_t profiled_from_ = 0;  // --profile: the first step the table covers
    int no_target_steps_ = 0;    // steps whose rows had no loss targets (all masked, or past --seq)
    bool had_loss_ = false;      // a step of this process had targets (last_loss_ is its loss)
    bool early_stopped_ = false;
    bool hook_stop_ = false;  // TrainHooks::on_step said to stop
};

int TrainingLoop::run() {
    g_supervised = supervised_worker();
    g_stop = false;  // a process may run several (the Python layer)
    // the handlers before the run's own come back after it (Python's SIGINT handler, for one)
    const std::array<int, 3> sigs = {SIGINT, SIGTERM, SIGUSR1};
    std::array<void (*)(int), 3> before{};
    for (size_t i = 0; i < sigs.size(); i++) before[i] = std::signal(sigs[i], on_stop_signal);
    int64_t done = run_.start_step;  // the steps completed: the last one's number
    profiled_from_ = done + 1;
    bool interrupted = false;
    for (Step s{done + 1}; s.number <= o_.steps; s.number++) {
        one_step(s);
        done = s.number;
        // --profile: the table leaves out the first step (cuBLASLt's plans, first allocations) when more
        // follow
        if (run_.profiler && done == run_.start_step + 1 && done < o_.steps)
            run_.profiler->reset(), profiled_from_ = done + 1;
        if (o_.save_every > 0 && done % o_.save_every == 0 && done < o_.steps)
            save_checkpoint(run_, done, fmt::format("checkpoint-{}", done));
        if (stop_requested()) {
            interrupted = true;
            break;
        }
        if (early_stopped_) break;
    }
    for (size_t i = 0; i < sigs.size(); i++) std::signal(sigs[i], before[i] == SIG_ERR ? SIG_DFL : before[i]);
    return finish(done, interrupted);
}

bool TrainingLoop::stop_requested() {
    // Under data parallelism a stop (a signal, or a hook on any rank) travels with the next step's vote, so
    // every rank stops after the same step.
    return run_.dp ? run_.dp->stop_agreed() : hook_stop_ || g_stop;
}

// One optimizer step, its metrics record, the progress line, and --eval-every's validation.
void TrainingLoop::one_step(Step s) {
    const int64_t step = s.number;
    const int B = o_.batch, T = o_.seq, accum = o_.grad_accum;
    const auto t0 = Clock::now();
    double waited = 0.0;
    const StepBatch batch = loader_.acquire(s.index(), &waited);
    if (run_.dp) run_.dp->vote_stop(g_stop || hook_stop_);
    AdamWArgs args;
    args.lr = sched_.at(s.index());
    args.beta1 = o_.beta1;
    args.beta2 = o_.beta2;
    args.eps = o_.eps;
    args.step = int(step);
    args.max_grad_norm = o_.grad_clip;
    const StepStats st = run_.trainer->step(batch, accum, B, T, args);
    loader_.release();
    const double dt = seconds_since(t0);
    train_time_ += dt;
    wait_time_ += waited;
    comm_time_ += st.comm_s;
    const int64_t step_tokens = int64_t(B) * T * accum * W_;  // every replica's rows
    trained_tokens_ += step_tokens;
    const double tok_s = double(step_tokens) / dt, elapsed = seconds_since(t_start_);
    step_s_ = step_s_ > 0 ? 0.9 * step_s_ + 0.1 * dt : dt;  // smoothed, for projections
    const bool skipped = !st.finite || st.outlier;
    if (skipped) note_skip(step, st);
    const bool has_loss = st.targets > 0;
    note_loss(step, st);
    nlohmann::json rec = step_record(step, st, args.lr, dt, waited, tok_s, elapsed);
    if (skipped) rec["skipped"] = true;
    const int left = int(o_.steps - step);
    instruments_.add_step(rec, tok_s, elapsed, double(trained_tokens_), step_s_, left);
    const bool eval_due = o_.eval_every > 0 && step % o_.eval_every == 0 && step < o_.steps;
    std::optional<LossResult> val;
    std::optional<ChoiceResult> mc;
    if (eval_due && run_.data.val.size() > 1) {
        const LossResult v = evaluate_loss(*run_.model, run_.data.val, B, T, o_.eval_batches, &replicas_);
        if (v.targets > 0) {
            rec["val_loss"] = v.loss;
            track_best(v.loss, step);
            val = v;
        }
    }
    if (o_.sample_every > 0 && step % o_.sample_every == 0) {
        rec["sample"] = sample(step);
        bar_.note(fmt::format("sample at step {}:\n---\n{}\n---", step, rec["sample"].get<std::string>()));
    }
    if (eval_due && !run_.choices.empty()) {
        mc = multiple_choice(*run_.model, *run_.tok, run_.choices, o_.eval_choices_limit, &replicas_);
        rec["mc_acc"] = mc->acc();
        rec["mc_acc_norm"] = mc->acc_norm();
    }
    // A held-out split with no loss targets (every row masked) gives no validation line of its own.
    const bool eval_now = val || mc;
    if (eval_now) bar_.note(eval_line(step, val, mc));
    if (early_stopped_)
        bar_.note(
            fmt::format("early stop at step {}: the validation loss has not improved on {:.4f} (step {}) "
                        "in {} evaluations",
                        step, run_.best.loss, run_.best.step, run_.best.evals_since));
    log(rec, step, eval_now || skipped || rec.contains("sample"));
    if (o_.hooks && o_.hooks->on_step && !o_.hooks->on_step(rec)) hook_stop_ = true;
    bar_.update(int(step),
                fmt::format("loss {} | lr {:.2e} | {:.0f} tok/s",
                            has_loss ? fmt::format("{:.4f}", st.loss) : "n/a (no targets)", args.lr, tok_s) +
                    instruments_.progress(tok_s, elapsed, double(trained_tokens_), step_s_, left));
}

// The step's loss for the end-of-run line; a step whose rows have no targets has none (its gradient is
// zero), and the first one says why.
void TrainingLoop::note_loss(int64_t step, const StepStats& st) {
    if (st.targets > 0) {
        last_loss_ = st.loss, had_loss_ = true;
    } else if (no_target_steps_++ == 0) {
        bar_.note(
            fmt::format("step {} has no loss targets: every row's targets are masked (or, for instruction "
                        "and chat data, start past --seq {}); such steps log no loss. A longer --seq "
                        "or a larger --batch may help",
                        step, o_.seq));
    }
}

// metrics.jsonl's record of a step (null loss without targets, never 0), before the evaluations.
nlohmann::json TrainingLoop::step_record(int64_t step, const StepStats& st, double lr, double dt,
                                         double waited, double tok_s, double elapsed) const {
    nlohmann::json rec = {{"step", step},
                          {"loss", st.targets > 0 ? nlohmann::json(st.loss) : nlohmann::json(nullptr)},
                          {"lr", lr},
                          {"grad_norm", st.grad_norm},
                          {"tokens_per_s", tok_s},
                          {"step_ms", dt * 1e3},
                          {"data_wait_ms", waited * 1e3},
                          {"fwd_bwd_ms", st.fwd_bwd_s * 1e3},
                          {"optimizer_ms", st.optimizer_s * 1e3},
                          {"elapsed_s", elapsed}};
    if (comm_.size() > 1) rec["comm_ms"] = st.comm_s * 1e3;
    if (st.outlier) rec["skipped_for"] = std::string(st.outlier) + "_z";
    if (std::isfinite(st.loss_z)) rec["loss_z"] = st.loss_z;
    if (std::isfinite(st.grad_z)) rec["grad_z"] = st.grad_z;
    if (run_.trainer->scaler().enabled) rec["loss_scale"] = st.loss_scale;
    return rec;
}

// The line on stderr for a step whose update was skipped (non-finite, or an outlier), and its count.
void TrainingLoop::note_skip(int64_t step, const StepStats& st) {
    const LossScaler& scaler = run_.trainer->scaler();
    skipped_++;
    if (!st.finite) {
        std::fprintf(
            stderr, "\nanvil: step %lld: non-finite %s; update skipped (%d so far)%s\n", (long long)step,
            std::isfinite(st.loss) ? "gradient" : "loss", skipped_,
            scaler.enabled ? fmt::format(", loss scale {} -> {}", st.loss_scale, scaler.scale).c_str() : "");
        return;
    }
    const bool by_loss = std::string_view(st.outlier) == "loss";
    std::fprintf(stderr,
                 "\nanvil: step %lld: %s z-score %.2f above --skip-%s-z %g; update skipped (%d so far)\n",
                 (long long)step, by_loss ? "loss" : "gradient norm", by_loss ? st.loss_z : st.grad_z,
                 by_loss ? "loss" : "grad", by_loss ? o_.skip_loss_z : o_.skip_grad_z, skipped_);
}

// One line per evaluation, as llm.c and nanoGPT print theirs: validation loss and perplexity, whether it is
// the best so far (--keep-best wrote best/), multiple-choice accuracy.
std::string TrainingLoop::eval_line(int64_t step, const std::optional<LossResult>& val,
                                    const std::optional<ChoiceResult>& mc) const {
    std::string line = fmt::format("eval at step {}:", step);
    if (val) {
        line += fmt::format(" val loss {:.4f}, perplexity {:.3f}", val->loss, val->ppl);
        if (run_.best.step == step)
            line += o_.keep_best ? " (best so far: saved best/)" : " (best so far)";
        else
            line += fmt::format(" (best {:.4f} at step {})", run_.best.loss, run_.best.step);
    }
    if (mc)
        line += fmt::format("{} multiple choice {:.1f}% (normalised {:.1f}%)", val ? ";" : "",
                            100 * mc->acc(), 100 * mc->acc_norm());
    return line;
}

void TrainingLoop::track_best(double val_loss, int64_t step) {
    RunSetup::Best& b = run_.best;
    if (b.step == 0 || val_loss < b.loss) {
        b = {val_loss, step, 0, o_.keep_best ? std::filesystem::absolute(o_.out + "/best").string() : ""};
        if (o_.keep_best) save_checkpoint(run_, step, "best");  // every rank: the loss is the replicas' own
        return;
    }
    b.evals_since++;
    early_stopped_ = o_.early_stop > 0 && b.evals_since >= o_.early_stop;
}

std::string TrainingLoop::sample(int64_t step) const {
    const Tokenizer& tok = *run_.tok;
    const PromptTemplate tmpl = choose_template(o_.prompt_template, tok);
    const uint64_t seed = o_.seed + uint64_t(step);
    if (!o_.sample_prompt.empty())
        return sample_text(*run_.model, tok, tok.encode_prompt(o_.sample_prompt), o_.sample_tokens, seed,
                           stop_tokens(tmpl, tok));
    if (!run_.data.val_examples.empty())
        return sample_text(*run_.model, tok, prompt_tokens(run_.data.val_examples.front(), tmpl, tok),
                           o_.sample_tokens, seed, stop_tokens(tmpl, tok));
    return sample_text(*run_.model, tok, {tok.bos_id() >= 0 ? tok.bos_id() : tok.eot_id()}, o_.sample_tokens,
                       seed);  // past the ends of documents, as llm.c samples
}

void TrainingLoop::log(const nlohmann::json& rec, int64_t step, bool force) {
    if (!metrics_ || !(force || step % o_.log_every == 0 || step == o_.steps)) return;
    metrics_->write(rec);
    if (tensorboard_) write_scalars(*tensorboard_, rec, step);
}

void TrainingLoop::print_profile(int64_t steps_done) {
    if (!run_.profiler || comm_.rank() != 0) return;
    const int64_t steps_run = steps_done - run_.start_step;
    std::fprintf(stderr, "per-op time over steps %lld to %lld (synchronised after each op%s):\n%s",
                 (long long)profiled_from_, (long long)steps_done,
                 profiled_from_ > run_.start_step + 1 ? "; the first step, the warm-up, left out" : "",
                 run_.profiler->report().c_str());
    nlohmann::json prof = run_.profiler->report_json();
    if (W_ > 1 && steps_run > 0) {  // not a backend op: the wait for the collectives after the backward
        const double ms = comm_time_ * 1e3 / steps_run;
        std::fprintf(stderr,
                     "gradient all-reduce over %d ranks: %.2f ms per step not hidden by the backward "
                     "(%.1f%% of step time)\n",
                     W_, ms, train_time_ > 0 ? 100.0 * comm_time_ / train_time_ : 0.0);
        prof.push_back({{"op", "gradient all-reduce wait (not a backend op)"},
                        {"calls", steps_run},
                        {"total_ms", comm_time_ * 1e3},
                        {"ms_per_call", ms}});
    }
    write_file_atomic(o_.out + "/profile.json", json_text(prof, 1) + "\n");
}

int TrainingLoop::finish(int64_t step, bool interrupted) {
    const std::string final_dir = interrupted ? fmt::format("checkpoint-{}", step) : "final";
    if (run_.profiler) run_.profiler->stop();  // the checkpoint's downloads are not a step's
    save_checkpoint(run_, step, final_dir);
    // Every rank goes through the report (the held-out scores are shared work); rank 0 alone writes files,
    // and the other ranks' output goes nowhere (Comm::quiet_unless_rank0).
    const bool lead = comm_.rank() == 0;
    if (lead && o_.hooks && o_.hooks->on_end)
        o_.hooks->on_end({o_.out, o_.out + "/" + final_dir, step, interrupted});
    if (interrupted) {
        bar_.finish(fmt::format("interrupted at step {}; continue with: anvil train --resume {}/{}", step,
                                o_.out, final_dir));
        return 130;
    }
    const double tokens_per_s = train_time_ > 0 ? double(trained_tokens_) / train_time_ : 0.0;
    const std::string loss = had_loss_              ? fmt::format("{:.4f}", last_loss_)
                             : no_target_steps_ > 0 ? std::string("n/a (no step had loss targets)")
                                                    : std::string("n/a");
    bar_.finish(fmt::format("done: {} steps, loss {}, {:.0f} tok/s", step, loss, tokens_per_s));
    print_profile(step);
    nlohmann::json summary = {{"steps", step},
                              {"train_loss", last_loss_},
                              {"tokens_per_s", tokens_per_s},
                              {"data_wait_share", train_time_ > 0 ? wait_time_ / train_time_ : 0.0},
                              {"micro_batch", o_.batch},
                              {"grad_accum", o_.grad_accum},
                              {"trained_tokens", trained_tokens_},
                              {"skipped_steps", skipped_},
                              {"steps_without_targets", no_target_steps_},
                              {"params", run_.model->params().numel()},
                              {"trainable_params", run_.model->params().numel(true)},
                              {"model_dir", o_.out + "/final"},
                              {"anvil_version", version_string()},
                              // the choices that change a run's speed or its last bits, as trainer_state.json
                              // keeps them with the other options
                              {"backend",
                               {{"device", device_name(run_.model->backend().device())},
                                {"attention", o_.attention},
                                {"attn_fwd_rows", o_.attn_fwd_rows},
                                {"gemm_tune", o_.gemm_tune},
                                {"precision", o_.precision}}}};
    if (comm_.size() > 1) {
        summary["world_size"] = comm_.size();
        summary["tensor_parallel"] = run_.grid.tp_size();
        summary["per_rank_batch"] = o_.batch;
        summary["comm_exposed_share"] = train_time_ > 0 ? comm_time_ / train_time_ : 0.0;
    }
    if (W_ > 1) {
        std::printf(
            "data parallel: %d %s, %d sequences per step; waiting on the gradient all-reduce %.1f%% of "
            "step time\n",
            W_, run_.grid.tp ? "replicas" : "ranks", W_ * o_.batch * o_.grad_accum,
            100.0 * summary["comm_exposed_share"].get<double>());
    }
    if (early_stopped_) summary["early_stopped"] = true;
    report(summary, tokens_per_s);
    if (lead) write_file_atomic(o_.out + "/summary.json", json_text(summary, 2) + "\n");
    return 0;
}

// Held-out loss, exact match with samples, MFU, cost, data wait and throughput: printed and in the summary.
void TrainingLoop::report(nlohmann::json& summary, double tokens_per_s) {
    Model& model = *run_.model;
    if (run_.data.val.size() > 1) {
        const LossResult v = evaluate_loss(model, run_.data.val, o_.batch, o_.seq, 0, &replicas_);
        if (v.targets > 0) {
            summary["val_loss"] = v.loss;
            summary["val_ppl"] = v.ppl;
            std::printf("validation: loss %.4f, perplexity %.3f (%ld targets)\n", v.loss, v.ppl,
                        long(v.targets));
        } else {  // every held-out record's response starts past the sequence length
            std::printf(
                "validation: no held-out targets within --seq %d (the held-out records' responses start "
                "past it); use a longer --seq\n",
                o_.seq);
        }
    }
    if (!run_.data.val_examples.empty()) {
        const ExactMatchResult em =
            exact_match(model, *run_.tok, choose_template(o_.prompt_template, *run_.tok),
                        run_.data.val_examples, o_.eval_examples, 5, &replicas_, true);
        // each record's result, for `anvil compare` between runs
        if (comm_.rank() == 0) write_per_example(o_.out + "/" + kRunExamplesFile, em.examples);
        summary["exact_match"] = em.accuracy();
        summary["exact_match_n"] = em.total;
        std::printf("exact match: %.1f%% (%d of %d held-out examples)\n", 100.0 * em.accuracy(), em.correct,
                    em.total);
        nlohmann::json samples = nlohmann::json::array();
        for (const auto& s : em.samples) {
            std::printf("  %s %s | %s -> %s (expected %s)\n", s.correct ? "ok  " : "MISS",
                        s.example.question().c_str(), s.example.input.c_str(), s.got.c_str(),
                        s.example.answer().c_str());
            samples.push_back({{"instruction", s.example.question()},
                               {"input", s.example.input},
                               {"expected", s.example.answer()},
                               {"got", s.got}});
        }
        summary["samples"] = samples;
    }
    if (!run_.choices.empty()) {
        const ChoiceResult mc =
            multiple_choice(model, *run_.tok, run_.choices, o_.eval_choices_limit, &replicas_);
        summary["mc_acc"] = mc.acc();
        summary["mc_acc_norm"] = mc.acc_norm();
        summary["mc_n"] = mc.total;
        std::printf("multiple choice: acc %.2f%%, acc_norm %.2f%% (%d items of %s)\n", 100.0 * mc.acc(),
                    100.0 * mc.acc_norm(), mc.total, o_.eval_choices.c_str());
    }
    summary["wall_s"] = seconds_since(t_start_);
    instruments_.add_summary(summary, tokens_per_s, summary["wall_s"].get<double>(), double(trained_tokens_));
    if (!run_.batch_search.empty()) summary["batch_search"] = run_.batch_search;
    if (summary.contains("mfu"))
        std::printf("MFU: %.1f%% (peak %.2f TFLOP/s: %s)\n", 100 * summary["mfu"].get<double>(),
                    summary["peak_tflops"].get<double>(), instruments_.peak_source().c_str());
    if (summary.contains("cost_usd"))
        std::printf("cost: $%.4f ($%.4f per million tokens at $%.2f/h)\n", summary["cost_usd"].get<double>(),
                    summary["cost_per_million_tokens"].get<double>(),
                    summary["price_per_hour"].get<double>());
    const RunSetup::Best& b = run_.best;
    // the lowest of --eval-every's validation losses, or the final one
    if (o_.eval_every > 0 && b.step > 0) {
        const bool final_best = summary.contains("val_loss") && summary["val_loss"].get<double>() < b.loss;
        summary["best_val_loss"] = final_best ? summary["val_loss"].get<double>() : b.loss;
        summary["best_step"] = final_best ? summary["steps"].get<int>() : b.step;
        if (final_best)
            summary["best_model_dir"] = o_.out + "/final";
        else if (!b.dir.empty() && dir_exists(b.dir))  // a resumed run's may be its first run directory's
            summary["best_model_dir"] = b.dir;
        std::printf("best validation loss: %.4f at step %d%s\n", summary["best_val_loss"].get<double>(),
                    summary["best_step"].get<int>(),
                    summary.contains("best_model_dir")
                        ? (" (" + summary["best_model_dir"].get<std::string>() + ")").c_str()
                        : "");
    }
    std::printf("data wait: %.3f%% of step time (background loader)\n",
                100.0 * summary["data_wait_share"].get<double>());
    std::printf("throughput: %.0f tokens/s; wall time %s; model in %s/final\n", tokens_per_s,
                format_duration(summary["wall_s"].get<double>()).c_str(), o_.out.c_str());
}

int train(TrainOptions& o, const ResumePoint* resume, Comm& comm, Clock::time_point t_start) {
    RunSetup run = setup_run(o, resume, comm);
    const Model& model = *run.model;
    std::fprintf(stderr, "anvil: %s\n", model.backend().describe().c_str());
    const int K = run.grid.tp_size(), R = comm.size() / K;  // tensor-parallel group size, replicas
    if (K > 1)
        std::fprintf(
            stderr,
            "anvil: tensor parallel: %d group%s of %d ranks (%s), each holding 1/%d of every block's "
            "heads and MLP columns\n",
            R, R == 1 ? "" : "s", K, comm.kind(), K);
    if (R > 1)
        std::fprintf(
            stderr, "anvil: data parallel over %d %s (%s), gradients in %d %s buckets of %.1f MB in all\n", R,
            K > 1 ? "replicas" : "ranks", comm.kind(), run.dp->buckets(),
            run.dp->zero() ? "reduce-to-owner (ZeRO-1)" : "all-reduce", double(run.dp->bucket_bytes()) / 1e6);
    const bool cpu_bf16 = o.precision == "bf16" && model.backend().device() == Device::CPU;
    std::fprintf(stderr, "anvil: model %s, %.2fM parameters (%s)\n", model.config().str().c_str(),
                 double(model.params().numel()) / 1e6,
                 cpu_bf16 ? "bf16 products through oneDNN, f32 tensors" : o.precision.c_str());
    if (model.options().fp8)
        std::fprintf(stderr,
                     "anvil: fp8: the blocks' matrix products take E4M3 operands (E5M2 gradients), one "
                     "power-of-two scale per tensor from %s; %s\n",
                     model.options().fp8_history > 0
                         ? fmt::format("the largest amax of its last {} uses (delayed scaling)",
                                       model.options().fp8_history)
                               .c_str()
                         : "its own amax",
                     model.backend().device() == Device::CUDA
                         ? "bf16 elsewhere, fp32 master weights"
                         : "the CPU simulates FP8's rounding in fp32 (a check, not a speed-up)");
    std::fprintf(stderr, "anvil: data %s: %zu train tokens, %zu val tokens%s\n", o.data.c_str(),
                 run.data.train.size(), run.data.val.size(),
                 run.data.format.empty() ? fmt::format(" ({} records)", run.data.records).c_str()
                                         : fmt::format(" ({})", run.data.format).c_str());
    const std::string ranks =
        R > 1 ? fmt::format(" per {}, x {} {}s = {} sequences per step", K > 1 ? "replica" : "rank", R,
                            K > 1 ? "replica" : "rank", o.batch * o.grad_accum * R)
              : "";
    std::fprintf(stderr, "anvil: batch %d x %d tokens x %d accumulation%s, %d steps, out %s\n", o.batch,
                 o.seq, o.grad_accum, ranks.c_str(), o.steps, o.out.c_str());
    const auto mb = [](size_t bytes) { return double(bytes) / 1e6; };
    const int chunk = model.activations().capacity(act::logits);
    const std::string logits = chunk < o.batch
                                   ? fmt::format("; --logits-chunk {}: the loss {} sequence{} at a time",
                                                 o.logits_chunk, chunk, chunk == 1 ? "" : "s")
                                   : "";
    std::fprintf(
        stderr,
        "anvil: memory%s: weights %.2f MB, gradients %.2f MB, optimizer %.2f MB, activations %.2f MB "
        "(--recompute %s%s)\n",
        comm.size() > 1 ? " per rank" : "", mb(model.params().param_bytes()), mb(model.params().grad_bytes()),
        mb(run.opt->state_bytes()), mb(model.activations().bytes()), o.recompute.c_str(), logits.c_str());
    TrainingLoop loop(run, t_start);
    return loop.run();
}

}  // namespace

int run_train(TrainOptions o, const ResumePoint* resume) {
    const auto t_start = Clock::now();
    // The job's processes: one without a launcher; under mpirun/srun every rank runs this same function.
    const std::unique_ptr<Comm> comm = make_comm(o.comm_timeout);
    if (comm->size() == 1) return train(o, resume, *comm, t_start);
    comm->quiet_unless_rank0();
    try {
        return train(o, resume, *comm, t_start);
    } catch (const std::bad_alloc&) {
        comm->abort("out of memory; use a smaller model, batch or --seq");
    } catch (const std::exception& e) {
        // A check every rank makes alike (flags against the model's shape) fails on all of them: rank 0 goes
        // first, so it reports and removes the run directory it made before another rank's abort kills it.
        if (comm->rank() != 0) std::this_thread::sleep_for(std::chrono::seconds(2));
        comm->abort(e.what());  // ends every rank: the others would wait for this one until --comm-timeout
    }
    return 1;  // not reached: abort() ends the process
}

}  // namespace anvil
