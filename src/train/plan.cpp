#include "train/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "backend/host_info.h"
#include "core/error.h"
#include "data/augment.h"
#include "model/model.h"
#include "monitor/hwbench.h"
#include "train/optimizer.h"
#include "train/run_setup.h"
#include "train/trainer.h"

namespace anvil {

namespace {

size_t round_up(size_t bytes) {
    return (bytes + kAlign - 1) / kAlign * kAlign;
}

// AdamW moves 28 bytes per parameter (f32 master, m and v read and written; the gradient and the weight) at
// about 90% of the card's datasheet bandwidth.
constexpr double kAdamWBytes = 28;
constexpr double kStreamShare = 0.9;

// A dry run's tensor-parallel sums: nothing to sum.
struct NoReducer final : TpReducer {
    void sum(Tensor, const char*) override {}
};

// The dry model of a run on `be`, tensor parallel over tp ranks (this rank the first).
std::unique_ptr<Model> dry_model(const PlanRun& run, Backend& be, int tp) {
    TrainOptions o = run.opts;
    ModelOptions mo = training_model_options(o, be.device(), run.lora);
    if (tp > 1) mo.tp = TensorParallel{0, tp, std::make_shared<NoReducer>()};
    return make_model(be, run.config, mo);
}

// FP8 products' scratch on CUDA (the backend keeps one buffer, grown to the largest product's): the MLP's
// first product, its operands rounded to 8 bits.
size_t fp8_scratch(const ModelConfig& c, int B, int T, int tp) {
    const size_t N = size_t(B) * T, C = size_t(c.n_embd), F = size_t(c.ffn()) / size_t(tp);
    return 2 * N * F + N * C + C * F + 16 * 1024;
}

}  // namespace

MemoryPlanner::MemoryPlanner(const PlanRun& run, const DryTarget& target) : run_(run), target_(target) {
    DryBackend be(target_);
    const auto model = dry_model(run_, be, 1);
    const ParamStore& st = model->params();
    params_ = st.numel(false);
    trainable_ = st.numel(true);
    for (size_t i = 0; i < st.size(); i++)
        if (st.spec(i).layer == 0) layer_params_ += double(st.spec(i).full_shape().numel());
    for (size_t i : st.trainable()) {
        const double n = double(st.spec(i).shape.numel());
        if (st.spec(i).layer == 0) layer_trainable_ += n;
        if (st.spec(i).layer < 0) rest_trainable_ += n;
        grad_bytes_ = dtype_size(st.spec(i).dtype);
    }
}

std::string MemoryPlanner::split_problem(int tp) {
    if (tp <= 1) return "";
    if (const auto it = split_.find(tp); it != split_.end()) return it->second;
    std::string why;
    try {
        DryBackend be(target_);
        dry_model(run_, be, tp);
    } catch (const Error& e) {
        why = e.what();
    }
    return split_[tp] = why;
}

MemoryUse MemoryPlanner::use(int B, int accum, int tp, int zero_world) {
    const auto key = std::make_tuple(B, accum, tp, zero_world);
    if (const auto it = kept_.find(key); it != kept_.end()) return it->second;
    DryBackend be(target_);
    MemoryUse m;
    m.workspace = be.memory_in_use();
    auto model = dry_model(run_, be, tp);
    m.grads = model->params().grad_bytes();
    m.weights = be.memory_in_use() - m.workspace - m.grads;  // the parameters and the model's own tables
    size_t held = be.memory_in_use();
    AdamW opt(model->params(), run_.opts.weight_decay, OptShard{0, std::max(1, zero_world)});
    m.optimizer = be.memory_in_use() - held;
    held = be.memory_in_use();
    Trainer trainer(*model, opt, 0);
    model->reserve(B, run_.opts.seq, true);
    m.activations = be.memory_in_use() - held;
    const Activations& acts = model->activations();
    m.logits = acts.get(act::logits, acts.capacity(act::logits), run_.opts.seq).nbytes();
    // the step's per-token losses come back to the host: device memory on the CPU (LossBuffer)
    if (target_.device == Device::CPU) m.other += round_up(size_t(B) * run_.opts.seq * accum * sizeof(float));
    if (target_.device == Device::CUDA && run_.opts.precision == "fp8")
        m.workspace += fp8_scratch(run_.config, B, run_.opts.seq, tp);
    return kept_[key] = m;
}

// ---- speed

StepTime step_time(const StepShape& s, int dp, int tp, bool zero, double rate, double hbm, const Link& link) {
    StepTime r;
    const double tokens = double(s.global_tokens) / dp;  // per replica
    const double micro = std::min(double(s.micro_tokens), tokens);
    const double group_rate = rate * tp;  // a replica's tp cards split every product
    r.compute_s = tokens * s.flops_per_token / group_rate;
    const double ring = dp > 1 ? 2.0 * (dp - 1) / dp : 0.0;
    // the last micro-batch's backward, block by block, each block's bucket queued on one stream
    const double t_tok = micro / group_rate;
    double t = s.bwd_head * t_tok, free = 0.0;
    const auto collective = [&](double bytes) {
        if (dp == 1) return 0.0;
        return zero ? link.alpha + bytes / link.busbw : link.alpha + bytes * ring / link.busbw;
    };
    for (int l = 0; l < s.layers; l++) {
        t += s.bwd_layer * t_tok;
        const double c = collective(s.layer_params / tp * s.grad_bytes);
        free = std::max(free, t) + c;
        r.reduce_s += c;
    }
    const double c = collective(s.rest_params * s.grad_bytes);  // the embeddings and head: ready last
    free = std::max(free, t) + c;
    r.reduce_s += c;
    r.exposed_reduce_s = std::max(0.0, free - t);
    r.optimizer_s = s.params / tp * kAdamWBytes / hbm / (zero ? dp : 1);
    if (zero && dp > 1) r.allgather_s = link.alpha + s.params / tp * s.grad_bytes / link.busbw;
    if (tp > 1)  // Megatron's all-reduces of the activations: 2 in each block's forward, 2 in its backward
        r.tp_s = tokens * s.layers * s.tp_bytes_per_token * 2.0 * (tp - 1) / tp / link.busbw +
                 std::ceil(tokens / micro) * s.layers * 4 * link.alpha;
    r.step_s = r.compute_s + r.exposed_reduce_s + r.optimizer_s + r.allgather_s + r.tp_s;
    r.comm_share = (r.exposed_reduce_s + r.allgather_s + r.tp_s) / r.step_s;
    r.tokens_per_s = double(s.global_tokens) / r.step_s;
    return r;
}

namespace {

const GpuDatasheet& datasheet(const CardKind& card) {
    const GpuDatasheet* d = find_datasheet(card.datasheet);
    ANVIL_ASSERT(d);
    return *d;
}

// A record's GPT-2 shape.
ModelConfig record_config(const SpeedRecord& r) {
    ModelConfig c;
    c.model_type = "gpt2";
    c.n_layer = r.layers, c.n_embd = r.dim, c.n_head = r.heads, c.vocab_size = r.vocab, c.n_ctx = r.seq;
    return c;
}

// The rate at which a record's own steps took their time on one card: its step less AdamW's share (the
// step-time model run backwards), in FLOP/s of anvil's convention.
double record_rate(const SpeedRecord& r, const CardKind& card) {
    const ModelConfig c = record_config(r);
    const double tokens = double(r.batch) * r.seq * r.accum, step_s = tokens / r.tokens_per_s;
    const double adamw_s =
        double(c.num_params()) * kAdamWBytes / (datasheet(card).mem_gbps * 1e9 * kStreamShare);
    return tokens * c.flops_per_token(r.seq) / (step_s - adamw_s);
}

// The record of `kind` in `precision` nearest to a micro-batch of `micro_tokens` tokens.
const SpeedRecord* nearest_record(const std::string& kind, const std::string& precision,
                                  int64_t micro_tokens) {
    const SpeedRecord* best = nullptr;
    double gap = 0;
    for (const SpeedRecord& r : speed_records()) {
        if (kind != r.kind || precision != r.precision) continue;
        const double g =
            std::abs(std::log(double(r.batch) * r.seq / double(std::max<int64_t>(micro_tokens, 1))));
        if (!best || g < gap) best = &r, gap = g;
    }
    return best;
}

std::string record_words(const SpeedRecord& r) {
    return fmt::format("bench/results/{} (commit {}): {:.0f} tokens/s on GPT-2 {}x{}, micro-batch {}x{}",
                       r.file, r.commit, r.tokens_per_s, r.layers, r.dim, r.batch, r.seq);
}

}  // namespace

CardRate card_rate(const CardKind& card, const std::string& precision, int64_t micro_tokens) {
    CardRate out;
    const GpuDatasheet& ds = datasheet(card);
    if (precision == "fp8") {
        if (const SpeedRecord* r = nearest_record(card.kind, "fp8", micro_tokens)) {
            out.flops = record_rate(*r, card), out.measured = true;
            out.source = "measured: " + record_words(*r);
            return out;
        }
    }
    const std::string base = precision == "fp8" || precision == "fp16" ? "bf16" : precision;
    if (const SpeedRecord* r = base == "bf16" ? nearest_record(card.kind, "bf16", micro_tokens) : nullptr) {
        out.flops = record_rate(*r, card), out.measured = true;
        out.source = fmt::format("measured: {}, {:.1f}% of the datasheet's {:.0f} TFLOP/s", record_words(*r),
                                 100 * out.flops / (ds.bf16 * 1e12), ds.bf16);
    } else {
        const SpeedRecord& h = *nearest_record("h100", "bf16", micro_tokens);
        const CardKind& h100 = *find_card("h100");
        const double mfu = record_rate(h, h100) / (datasheet(h100).bf16 * 1e12);
        const double peak = datasheet_tflops(ds, base == "fp32" ? "fp32" : "bf16");
        out.flops = mfu * peak * 1e12;
        out.source = fmt::format(
            "assumed: the {:.1f}% of the datasheet's bf16 rate anvil measured on the H100 ({}), "
            "applied to this card's {:.0f} TFLOP/s {}",
            100 * mfu, record_words(h), peak, base == "fp32" ? "fp32" : "bf16");
    }
    if (precision == "fp8") {  // anvil's FP8 products as measured against bf16 on the H200
        const SpeedRecord& f = *nearest_record("h200", "fp8", micro_tokens);
        const SpeedRecord& b = *nearest_record("h200", "bf16", int64_t(f.batch) * f.seq);
        const double ratio = f.tokens_per_s / b.tokens_per_s;
        out.flops *= ratio;
        out.measured = false;
        out.source +=
            fmt::format("; FP8 assumed at {:.2f}x of bf16, as anvil measured on the H200 ({} against {})",
                        ratio, f.file, b.file);
    }
    return out;
}

// ---- the search

namespace {

constexpr size_t kContextBytes = size_t(1) << 30;  // a GPU's CUDA context, library handles, NCCL's buffers
constexpr int kMaxCards = 4096;
constexpr int kMaxMicro = 1024;

int64_t ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

// One card kind's search: layouts of a number of cards, the micro-batches that fit them.
struct Search {
    const PlanRun& run;
    MemoryPlanner& mem;
    const CardKind* card;  // null: the CPU
    size_t usable;
    int64_t global_seqs;

    bool fits(int B, int dp, int tp, int zero_world) {
        const int accum = int(ceil_div(ceil_div(global_seqs, dp), B));
        return mem.use(B, accum, tp, zero_world).total() <= usable;
    }
    // The largest micro-batch up to `cap` that fits; 0 when one sequence does not.
    int largest(int cap, int dp, int tp, int zw) {
        if (!fits(1, dp, tp, zw)) return 0;
        int lo = 1, hi = 1;  // lo fits
        while (lo < cap) {
            hi = std::min(2 * lo, cap);
            if (!fits(hi, dp, tp, zw)) break;
            lo = hi;
        }
        while (hi - lo > 1) {
            const int mid = lo + (hi - lo) / 2;
            (fits(mid, dp, tp, zw) ? lo : hi) = mid;
        }
        return lo;
    }
    // A layout of `cards` cards that fits (the fewest collectives first: no sharding, ZeRO-1, then tensor
    // parallelism), or false.
    bool layout(int cards, Layout& out) {
        const int per_node = card ? card->per_node : 1;
        std::vector<int> sizes = {1, 2, 4, 8};  // tensor parallel within a node
        if (run.opts.tensor_parallel > 1) sizes = {run.opts.tensor_parallel};
        for (const int tp : sizes) {
            if (tp > per_node || cards % tp || !mem.split_problem(tp).empty()) continue;
            const int dp = cards / tp;
            if (global_seqs % dp) continue;  // every replica trains on the same number of sequences
            for (int zero = 0; zero <= 1; zero++) {
                if ((zero && dp == 1) || (run.opts.zero == 1 && !zero && dp > 1)) continue;
                const int zw = zero ? dp : 1;
                const int per_rank = int(global_seqs / dp);
                const int B = largest(kMaxMicro, dp, tp, zw);
                if (B == 0 || (run.micro > 0 && !fits(run.micro, dp, tp, zw))) continue;
                // the micro-batch: the given one, else the largest that fits and divides the replica's share
                // of the global batch (as --batch auto keeps it)
                int micro = run.micro > 0 ? run.micro : std::min(B, per_rank);
                while (run.micro == 0 && per_rank % micro) micro--;
                out = {cards, tp, dp, zero == 1, micro, int(ceil_div(per_rank, micro)), B};
                return true;
            }
        }
        return false;
    }
};

// What would make a run fit that does not: the memory one rank needs at its smallest.
std::string why_not(Search& s, int cards) {
    int tp = 1;
    while (tp * 2 <= std::min(8, s.card ? s.card->per_node : 1) && cards % (tp * 2) == 0 &&
           s.mem.split_problem(tp * 2).empty())
        tp *= 2;
    const int dp = std::max(1, cards / tp);
    const size_t need = s.mem.use(1, 1, tp, dp).total();
    std::string sharded;  // the most sharding tried, where it was any
    if (tp > 1) sharded = fmt::format("tensor parallel {}", tp);
    if (dp > 1) sharded += fmt::format("{}ZeRO-1 over {} replicas", sharded.empty() ? "" : ", ", dp);
    std::string try_ = s.run.opts.recompute == "full" ? "" : "--recompute full, ";
    if (!s.run.lora.enabled()) try_ += "--lora-rank on a base, ";
    return fmt::format(
        "does not fit: one sequence needs {:.1f} GiB per card{} against {:.1f} GiB usable; try {}a "
        "shorter --seq, or a card with more memory",
        double(need) / double(1 << 30), sharded.empty() ? "" : " (" + sharded + ")",
        double(s.usable) / double(1 << 30), try_);
}

StepShape step_shape(const PlanRun& run, MemoryPlanner& mem, int micro) {
    const ModelConfig& c = run.config;
    const double T = run.opts.seq, L = c.n_layer, d = c.n_embd;
    const double N = double(c.num_params() - model_family(c.model_type).position_params(c));
    const double blocks = L * mem.layer_params();  // the blocks' weights (the rest: embeddings, head)
    const bool lora = run.lora.enabled();
    StepShape s;
    s.layers = c.n_layer;
    // forward 2N + 4LdT; the backward twice that, less the frozen weights' gradients (LoRA: 2N, and 6 FLOPs
    // per adapter weight); --recompute full runs the blocks' forward again
    s.flops_per_token =
        lora ? 4 * N + 12 * L * d * T + 6 * double(mem.trainable()) : c.flops_per_token(run.opts.seq);
    if (run.opts.recompute == "full") s.flops_per_token += 2 * blocks + 4 * L * d * T;
    s.bwd_head = (lora ? 2 : 4) * double(c.vocab_size) * d;
    s.bwd_layer = (lora ? 2 : 4) * mem.layer_params() + 8 * d * T;
    s.layer_params = mem.layer_trainable();
    s.rest_params = mem.rest_trainable();
    s.params = double(mem.trainable());
    s.grad_bytes = double(mem.grad_bytes());
    s.tp_bytes_per_token = 4 * d * (run.opts.precision == "fp32" ? 4 : 2);
    s.global_tokens = run.global_tokens;
    s.micro_tokens = int64_t(micro) * run.opts.seq;
    return s;
}

void add_speed(const PlanRun& run, MemoryPlanner& mem, CardPlan& p) {
    const Layout& l = p.layout;
    const CardKind& card = *p.card;
    p.rate = card_rate(card, run.opts.precision, int64_t(l.micro) * run.opts.seq);
    p.link = l.cards <= card.per_node ? card.node : card.net;
    p.hbm = datasheet(card).mem_gbps * 1e9 * kStreamShare;
    p.shape = step_shape(run, mem, l.micro);
    p.step = step_time(p.shape, l.dp, l.tp, l.zero, p.rate.flops, p.hbm, p.link);
    p.hours = double(run.tokens) / p.step.tokens_per_s / 3600.0;
    p.usd = p.hours * p.usd_per_hour * l.cards;
    p.tokens_per_usd = p.usd > 0 ? double(run.tokens) / p.usd : 0.0;
}

// The plan of one request: the fewest cards that fit (count 0), or that many.
CardPlan plan_cards(const PlanRun& run, MemoryPlanner& mem, const CardKind* card, int count, double price) {
    CardPlan p;
    p.card = card;
    p.requested = count;
    p.usd_per_hour = price;
    // the CPU: this machine's memory, shared by `count` processes
    p.usable = card ? size_t(card->memory_gib * double(1ull << 30)) - kContextBytes
                    : cpu_info().ram_bytes / uint64_t(std::max(1, count));
    Search s{run, mem, card, p.usable, ceil_div(run.global_tokens, run.opts.seq)};
    if (!card) count = std::max(count, 1);  // processes on this machine
    const int first = count > 0 ? count : 1, last = count > 0 ? count : kMaxCards;
    for (int n = first; n <= last && !p.fits; n = count > 0 ? n + 1 : n * 2) p.fits = s.layout(n, p.layout);
    if (!p.fits) {
        const int tp = std::max(1, run.opts.tensor_parallel);
        if (count > 0 && (count % tp || tp > (card ? card->per_node : 1)))
            p.why = fmt::format(
                "cannot run: --tensor-parallel {} on {} cards (it must divide them, within a "
                "node of {})",
                tp, count, card ? card->per_node : 1);
        else if (count > 0 && s.global_seqs % (count / tp))
            p.why = fmt::format(
                "cannot run: the global batch of {} sequences does not split evenly over {} replicas; give "
                "--global-batch a multiple of {}",
                s.global_seqs, count / tp, count / tp);
        else
            p.why = why_not(s, last);
        return p;
    }
    const Layout& l = p.layout;
    p.mem = mem.use(l.micro, l.accum, l.tp, l.zero ? l.dp : 1);
    p.one_sequence = mem.use(1, l.accum, l.tp, l.zero ? l.dp : 1).activations;
    if (card) add_speed(run, mem, p);
    return p;
}

}  // namespace

std::vector<CardRequest> parse_gpus(const std::string& spec) {
    std::vector<CardRequest> out;
    if (spec.empty()) {
        for (const CardKind& c : card_kinds())
            if (c.planned) out.push_back({c.kind, 0});
        return out;
    }
    for (const std::string& item : split_commas(spec)) {
        const size_t colon = item.find(':');
        CardRequest r{item.substr(0, colon), 0};
        ANVIL_CHECK(r.kind == "cpu" || find_card(r.kind),
                    "--gpus {}: unknown card kind {}; anvil plans for {} and cpu", spec,
                    r.kind.empty() ? "\"\"" : r.kind, card_kind_names());
        if (colon != std::string::npos) {
            char* end = nullptr;
            const long n = std::strtol(item.c_str() + colon + 1, &end, 10);
            ANVIL_CHECK(*end == '\0' && end != item.c_str() + colon + 1 && n >= 1 && n <= kMaxCards,
                        "--gpus {}: the count after {}: must be a whole number from 1 to {}", spec, r.kind,
                        kMaxCards);
            r.count = int(n);
        }
        out.push_back(r);
    }
    return out;
}

std::map<std::string, double> parse_prices(const std::vector<std::string>& specs) {
    std::map<std::string, double> out;
    for (const std::string& sp : specs) {
        const size_t eq = sp.find('=');
        const std::string kind = sp.substr(0, eq);
        const CardKind* c = eq == std::string::npos ? nullptr : find_card(kind);
        ANVIL_CHECK(c, "--price {}: give KIND=USD per card-hour, KIND one of {}", sp, card_kind_names());
        char* end = nullptr;
        const double usd = std::strtod(sp.c_str() + eq + 1, &end);
        ANVIL_CHECK(*end == '\0' && end != sp.c_str() + eq + 1 && usd >= 0 && std::isfinite(usd),
                    "--price {}: the price must be a number of dollars per card-hour, 0 or more", sp);
        out[c->kind] = usd;
    }
    return out;
}

Plan make_plan(const PlanRun& run, const std::vector<CardRequest>& gpus,
               const std::map<std::string, double>& prices) {
    ANVIL_CHECK(run.tokens > 0, "--tokens {}: the token budget must be positive (e.g. 10B, 300M)",
                run.tokens);
    Plan plan;
    plan.global_tokens = run.global_tokens;
    std::unique_ptr<MemoryPlanner> gpu, cpu;
    for (const CardRequest& r : gpus) {
        const CardKind* card = r.kind == "cpu" ? nullptr : find_card(r.kind);
        auto& planner = card ? gpu : cpu;
        if (!planner) {
            DryTarget t;
            t.device = card ? Device::CUDA : Device::CPU;
            t.threads = run.opts.threads > 0 ? run.opts.threads : cpu_info().logical_cores;
            if (card) t.attention = parse_attention(run.opts.attention);
            planner = std::make_unique<MemoryPlanner>(run, t);
            const std::string split = planner->split_problem(run.opts.tensor_parallel);
            ANVIL_CHECK(split.empty(), "{}", split);
        }
        const auto price = card ? prices.find(card->kind) : prices.end();
        const double usd = card ? (price != prices.end() ? price->second : card->usd_per_hour) : 0.0;
        plan.rows.push_back(plan_cards(run, *planner, card, r.count, usd));
        // beside the fewest cards, a full node of them
        const CardPlan& last = plan.rows.back();
        if (r.count == 0 && card && last.fits && last.layout.cards < card->per_node)
            plan.rows.push_back(plan_cards(run, *planner, card, card->per_node, usd));
        plan.params = planner->params(), plan.trainable = planner->trainable();
    }
    for (size_t i = 0; i < plan.rows.size(); i++) {
        const CardPlan& p = plan.rows[i];
        if (!p.fits || !p.card) continue;
        if (plan.fastest < 0 || p.hours < plan.rows[size_t(plan.fastest)].hours) plan.fastest = int(i);
        if (plan.cheapest < 0 || p.usd < plan.rows[size_t(plan.cheapest)].usd) plan.cheapest = int(i);
    }
    plan.flops_per_token = run.config.flops_per_token(run.opts.seq);
    return plan;
}

}  // namespace anvil
