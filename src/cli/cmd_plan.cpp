// anvil plan: which GPU, how many, how long and what it costs, before a card is rented (train/plan.h).
#include <cmath>
#include <memory>

#include "cli/commands.h"
#include "core/sizes.h"
#include "data/augment.h"
#include "model/model_io.h"
#include "runtime/run_dir.h"
#include "train/plan.h"
#include "train/run_setup.h"

namespace anvil::cli {

namespace {

struct PlanFlags {
    TrainOptions train;
    std::string model, tokens, gpus, json;
    std::vector<std::string> prices;
    int global_batch = 0;
    int micro = 0;
};

double gib(size_t bytes) {
    return double(bytes) / double(1ull << 30);
}

std::string duration(double hours) {
    if (hours < 1.0) return fmt::format("{:.0f} min", hours * 60);
    if (hours < 48.0) return fmt::format("{:.1f} h", hours);
    return fmt::format("{:.1f} days", hours / 24);
}

std::string count_words(double n) {
    if (n >= 1e12) return fmt::format("{:.3g}T", n / 1e12);
    if (n >= 1e9) return fmt::format("{:.3g}B", n / 1e9);
    if (n >= 1e6) return fmt::format("{:.3g}M", n / 1e6);
    return fmt::format("{:.0f}", n);
}

std::string layout_words(const Layout& l) {
    std::string s = l.tp > 1   ? fmt::format("tp {} x dp {}", l.tp, l.dp)
                    : l.dp > 1 ? "data parallel"
                               : "one card";
    return l.zero ? s + ", ZeRO-1" : s;
}

// The run from the flags: --model's configuration, or a new model's from the shape flags.
PlanRun plan_run(PlanFlags& f, const CLI::App& sub) {
    PlanRun run;
    TrainOptions& o = f.train;
    if (!f.model.empty()) {
        for (const char* flag :
             {"--arch", "--layers", "--heads", "--dim", "--kv-heads", "--ffn-dim", "--vocab"})
            ANVIL_CHECK(sub.count(flag) == 0, "{}: --model {} gives the shape; leave {} out", flag, f.model,
                        flag);
        run.config = read_model_config(resolve_model_dir(f.model));
    } else {
        ANVIL_CHECK(o.lora_rank == 0,
                    "--lora-rank {}: LoRA adapts a pretrained model; give it with --model DIR", o.lora_rank);
        run.config = new_model_config(o, o.vocab > 0 ? o.vocab : 50304);
    }
    if (o.seq <= 0) o.seq = run.config.n_ctx;
    ANVIL_CHECK(o.seq <= run.config.n_ctx, "--seq {}: longer than the model's context {}", o.seq,
                run.config.n_ctx);
    if (o.precision == "auto") o.precision = "bf16";
    run.lora.rank = o.lora_rank;
    run.lora.alpha = o.lora_alpha;
    if (!o.lora_targets.empty())
        run.lora.targets = split_commas(o.lora_targets);  // else the family's default
    run.tokens = int64_t(parse_count(f.tokens, "--tokens"));
    const int global = f.global_batch > 0 ? f.global_batch : std::max(1, (1 << 19) / o.seq);  // llm.c's 0.5M
    run.global_tokens = int64_t(global) * o.seq;
    run.micro = f.micro;
    run.opts = o;
    return run;
}

nlohmann::json row_json(const CardPlan& p) {
    const MemoryUse& m = p.mem;
    nlohmann::json j = {{"kind", p.card ? p.card->kind : "cpu"},
                        {"name", p.card ? p.card->name : "this machine's CPU"},
                        {"cards", p.layout.cards},
                        {"fits", p.fits},
                        {"usable_bytes", p.usable}};
    if (!p.fits) {
        j["cards"] = p.requested > 0 ? nlohmann::json(p.requested) : nlohmann::json(nullptr);
        j["why"] = p.why;
        return j;
    }
    const Layout& l = p.layout;
    j["layout"] = {{"tp", l.tp},       {"dp", l.dp},       {"zero", l.zero ? 1 : 0},
                   {"micro", l.micro}, {"accum", l.accum}, {"max_micro", l.max_micro}};
    j["memory"] = {{"weights", m.weights},     {"grads", m.grads},
                   {"optimizer", m.optimizer}, {"activations", m.activations},
                   {"workspace", m.workspace}, {"other", m.other},
                   {"logits", m.logits},       {"activations_one_sequence", p.one_sequence},
                   {"total", m.total()}};
    if (!p.card) return j;
    const StepTime& s = p.step;
    j["speed"] = {{"tokens_per_s", s.tokens_per_s},
                  {"rate_tflops", p.rate.flops / 1e12},
                  {"measured", p.rate.measured},
                  {"source", p.rate.source},
                  {"step_s", s.step_s},
                  {"compute_s", s.compute_s},
                  {"reduce_s", s.reduce_s},
                  {"exposed_reduce_s", s.exposed_reduce_s},
                  {"optimizer_s", s.optimizer_s},
                  {"allgather_s", s.allgather_s},
                  {"tp_s", s.tp_s},
                  {"comm_share", s.comm_share}};
    const StepShape& m2 = p.shape;
    j["step_model"] = {{"flops_per_token", m2.flops_per_token},
                       {"bwd_head", m2.bwd_head},
                       {"bwd_layer", m2.bwd_layer},
                       {"layer_params", m2.layer_params},
                       {"rest_params", m2.rest_params},
                       {"params", m2.params},
                       {"grad_bytes", m2.grad_bytes},
                       {"tp_bytes_per_token", m2.tp_bytes_per_token},
                       {"micro_tokens", m2.micro_tokens},
                       {"global_tokens", m2.global_tokens},
                       {"rate_flops", p.rate.flops},
                       {"hbm_bytes_s", p.hbm},
                       {"busbw", p.link.busbw},
                       {"alpha", p.link.alpha}};
    j["hours"] = p.hours;
    j["usd_per_card_hour"] = p.usd_per_hour;
    j["usd"] = p.usd;
    j["tokens_per_usd"] = p.tokens_per_usd;
    return j;
}

std::string row_text(const CardPlan& p) {
    const std::string name = p.card ? p.card->name : "CPU (this machine)";
    if (!p.fits)
        return fmt::format("{:<22} {:>5}  {}\n", name, p.requested > 0 ? std::to_string(p.requested) : "-",
                           p.why);
    const Layout& l = p.layout;
    const MemoryUse& m = p.mem;
    std::string s =
        fmt::format("{:<22} {:>5}  {:<21} {:>5} x {:<4} {:>6.1f} {:>6.1f} {:>6.1f}/{:<6.1f}", name, l.cards,
                    layout_words(l), l.micro, l.accum, gib(m.total() - m.activations), gib(m.activations),
                    gib(m.total()), gib(p.usable));
    if (p.card)
        s += fmt::format(" {:>10.0f} {:>5.1f}% {:>10} {:>10} {:>8.2f}", p.step.tokens_per_s,
                         100 * p.step.comm_share, duration(p.hours), fmt::format("${:.0f}", p.usd),
                         p.tokens_per_usd / 1e6);
    return s + "\n";
}

std::string plan_text(const PlanRun& run, const Plan& plan) {
    const ModelConfig& c = run.config;
    std::string s = fmt::format(
        "{} {} ({} layers x {}, {} heads, vocabulary {}), {} tokens in {}, sequences of {}, {} "
        "tokens a step\n  {:.3g} GFLOP per token; {} parameters, {} trained{}{}\n\n",
        c.model_type, count_words(double(plan.params)), c.n_layer, c.n_embd, c.n_head, c.vocab_size,
        count_words(double(run.tokens)), run.opts.precision, run.opts.seq,
        count_words(double(plan.global_tokens)), plan.flops_per_token / 1e9, count_words(double(plan.params)),
        count_words(double(plan.trainable)),
        run.opts.recompute != "off" ? ", --recompute " + run.opts.recompute : "",
        run.lora.enabled() ? fmt::format(", LoRA rank {}", run.lora.rank) : "");
    s += fmt::format("{:<22} {:>5}  {:<21} {:>12} {:>6} {:>6} {:>13} {:>10} {:>6} {:>10} {:>10} {:>8}\n",
                     "card", "cards", "layout", "micro x acc", "state", "activ", "GiB/usable", "tokens/s",
                     "comm", "time", "cost", "Mtok/$");
    for (const CardPlan& p : plan.rows) s += row_text(p);
    const auto pick = [&](const char* what, int i) {
        if (i < 0) return std::string();
        const CardPlan& p = plan.rows[size_t(i)];
        const MemoryUse& m = p.mem;
        return fmt::format(
            "{}: {} x {} ({}), {}, ${:.0f}\n  per card: weights {:.2f} GiB, gradients {:.2f}, optimizer "
            "{:.2f}, "
            "activations {:.2f} ({:.2f} for one sequence; logits {:.2f}), workspace {:.2f}; micro-batches up "
            "to {} "
            "fit\n",
            what, p.layout.cards, p.card->name, layout_words(p.layout), duration(p.hours), p.usd,
            gib(m.weights), gib(m.grads), gib(m.optimizer), gib(m.activations), gib(p.one_sequence),
            gib(m.logits), gib(m.workspace + m.other), p.layout.max_micro);
    };
    s += "\n" + pick("fastest", plan.fastest) + pick("cheapest", plan.cheapest);
    s += "\nstate: weights, gradients, optimizer and workspace per card in GiB; activ: activations at the "
         "micro-batch; usable: the card's memory less 1 GiB (CUDA context, libraries, NCCL)\nspeed:\n";
    std::vector<std::string> seen;
    for (const CardPlan& p : plan.rows)
        if (p.fits && p.card && std::find(seen.begin(), seen.end(), p.card->kind) == seen.end()) {
            seen.push_back(p.card->kind);
            s += fmt::format("  {}: {}\n", p.card->kind, p.rate.source);
        }
    return s + fmt::format("prices: {}\nlinks: {}\n", kPriceSource, kLinkSource);
}

nlohmann::json plan_json(const PlanRun& run, const Plan& plan) {
    const ModelConfig& c = run.config;
    nlohmann::json rows = nlohmann::json::array();
    for (const CardPlan& p : plan.rows) rows.push_back(row_json(p));
    return {{"model",
             {{"model_type", c.model_type},
              {"layers", c.n_layer},
              {"dim", c.n_embd},
              {"heads", c.n_head},
              {"kv_heads", c.kv_heads()},
              {"vocab", c.vocab_size},
              {"params", plan.params},
              {"trainable", plan.trainable}}},
            {"tokens", run.tokens},
            {"precision", run.opts.precision},
            {"seq", run.opts.seq},
            {"recompute", run.opts.recompute},
            {"lora_rank", run.lora.rank},
            {"global_tokens", plan.global_tokens},
            {"flops_per_token", plan.flops_per_token},
            {"rows", rows},
            {"fastest", plan.fastest},
            {"cheapest", plan.cheapest},
            {"price_source", kPriceSource},
            {"link_source", kLinkSource}};
}

// The row of the card with the most memory, when the run fits on none of them (else null).
const CardPlan* largest_misfit(const Plan& plan) {
    const CardPlan* largest = nullptr;
    for (const CardPlan& p : plan.rows) {
        if (p.fits) return nullptr;
        if (!largest || p.usable > largest->usable) largest = &p;
    }
    return largest;
}

// A run that fits on none of the cards: the card with the most memory says what one rank needs at the most
// sharding anvil plans, and where --recompute full would make it fit, that plan (or that it would not).
void refuse_if_nothing_fits(const PlanRun& run, const Plan& plan, const std::vector<CardRequest>& gpus,
                            const std::map<std::string, double>& prices) {
    const CardPlan* largest = largest_misfit(plan);
    if (!largest) return;
    std::string why = largest->why, with_full;
    if (run.opts.recompute != "full" && why.starts_with("does not fit")) {
        PlanRun full = run;
        full.opts.recompute = "full";
        const Plan again = make_plan(full, gpus, prices);
        if (const CardPlan* still = largest_misfit(again)) {
            why = "even with --recompute full, " + still->why.substr(still->why.find(':') + 2);
        } else {
            for (const CardPlan& p : again.rows)
                if (p.fits && with_full.empty())
                    with_full = fmt::format("; with --recompute full it fits on {} x {} ({})", p.layout.cards,
                                            p.card ? p.card->name : "CPU", layout_words(p.layout));
        }
    }
    fail("{}{}: {}{}", plan.rows.size() > 1 ? "fits on none of the cards; on " : "on ",
         largest->card ? largest->card->name : "the CPU", why, with_full);
}

void add_run_flags(CLI::App* sub, PlanFlags& f) {
    TrainOptions& o = f.train;
    sub->add_option("--precision", o.precision, "fp32, bf16, fp16 or fp8 (auto: bf16)")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "fp32", "bf16", "fp16", "fp8"}));
    sub->add_option("--recompute", o.recompute, "off, selective or full (as train's)")
        ->expected(0, 1)
        ->default_str("selective")
        ->check(CLI::IsMember({"off", "selective", "full"}))
        ->option_text("[off|selective|full]  (default off)");
    sub->add_option("--logits-chunk", o.logits_chunk, "the most logits kept at once (as train's)")
        ->capture_default_str();
    sub->add_option("--zero", o.zero,
                    "1: require ZeRO-1 where there is more than one card (default: only "
                    "where it is needed)")
        ->check(CLI::Range(0, 1));
    sub->add_option("--tensor-parallel", o.tensor_parallel,
                    "require this tensor-parallel size (default: only where it is needed)")
        ->check(kPositive);
    sub->add_option("--lora-rank", o.lora_rank, "LoRA adapters of this rank on the --model base")
        ->check(kNonNegative);
    sub->add_option("--lora-alpha", o.lora_alpha, "LoRA's alpha")->check(kPositive);
    sub->add_option("--lora-targets", o.lora_targets, "the layers LoRA adapts (as train's)");
    sub->add_option("--attention", o.attention,
                    "CUDA attention (as train's): auto, gemm, flash, flash-simt, "
                    "cudnn")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "gemm", "flash", "flash-simt", "cudnn"}));
    sub->add_option("--batch", f.micro, "sequences per micro-batch (default: the largest that fits)")
        ->check(kPositive);
    sub->add_option("--global-batch", f.global_batch,
                    "sequences per optimizer step (default: 524,288 tokens' worth, llm.c's)")
        ->check(kPositive);
    sub->add_option("--threads", o.threads, "--gpus cpu: the CPU threads the run would use (0 = all cores)")
        ->check(kNonNegative);
}

}  // namespace

Command add_plan(CLI::App& app) {
    CLI::App* sub = app.add_subcommand(
        "plan",
        "which GPU, how many, how long and what it costs: for each card kind the memory a rank needs "
        "(counted as training allocates it), the largest micro-batch, ZeRO-1 or tensor parallelism where "
        "needed, the speed at anvil's measured (or assumed) rate, time and cost to a token budget. A new "
        "model's vocabulary is GPT-2's padded 50304 unless --vocab says");
    auto f = std::make_shared<PlanFlags>();
    sub->add_option("--model", f->model, "a model directory (Hugging Face, a run, or a .gguf file) to train");
    add_model_flags(sub, f->train);
    sub->add_option("--tokens", f->tokens, "the token budget: 10B, 300M, 2.5T")->required();
    sub->add_option(
        "--gpus", f->gpus,
        "card kinds, each with a count or not (the fewest that fit, and a node of 8): "
        "h100:8,a100-80; cpu plans this machine's CPU backend (memory only). Default: " +
            [] {
                std::string s;
                for (const CardRequest& r : parse_gpus("")) s += (s.empty() ? "" : ", ") + r.kind;
                return s;
            }());
    sub->add_option("--price", f->prices, "KIND=USD per card-hour, repeatable (default: the built-in table)");
    add_run_flags(sub, *f);
    add_json_flag(sub, f->json);
    return {sub, [f, sub]() -> int {
                const PlanRun run = plan_run(*f, *sub);
                const auto gpus = parse_gpus(f->gpus);
                const auto prices = parse_prices(f->prices);
                const Plan plan = make_plan(run, gpus, prices);
                refuse_if_nothing_fits(run, plan, gpus, prices);
                emit_result(f->json, plan_json(run, plan), plan_text(run, plan));
                return 0;
            }};
}

}  // namespace anvil::cli
