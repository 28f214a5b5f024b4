#include "train/run_setup.h"

#include <cmath>
#include <ctime>
#include <filesystem>

#include "core/sizes.h"
#include "data/augment.h"
#include "data/llmc.h"
#include "data/synthetic.h"
#include "io/fs.h"
#include "io/json_text.h"
#include "model/model_io.h"
#include "runtime/gguf_model.h"
#include "train/autobatch.h"
#include "train/schedule.h"

namespace anvil {

namespace fsys = std::filesystem;

std::string default_out_dir() {
    const std::time_t now = std::time(nullptr);
    char buf[40];
    std::strftime(buf, sizeof buf, "runs/%Y%m%d-%H%M%S", std::localtime(&now));
    return buf;
}

namespace {

constexpr int kEmbeddedExamples = 20000;

struct ModelSource {
    std::string base, adapter;
    LoraOptions lora;
};

std::vector<std::string> split_list(const std::string& s) {
    std::vector<std::string> out;
    size_t i = 0;
    while (i <= s.size() && !s.empty()) {
        const size_t j = std::min(s.find(',', i), s.size());
        if (j > i) out.push_back(s.substr(i, j - i));
        i = j + 1;
    }
    return out;
}

std::string join_list(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
    return s;
}
// A new model's vocabulary of at least kPadFrom ids is padded to a multiple of kVocabMultiple (llm.c and
// nanoGPT pad GPT-2's 50257 to 50304): aligned classifier rows for the matrix products, where the classifier
// is a large share of the step. The same on every device, so a model's shape never depends on where it was
// trained. The extra rows are never sampled and learn to stay unlikely. Small vocabularies (bytes) are kept
// as they are: their classifier costs little, and the extra rows would only change the initialisation.
constexpr int kVocabMultiple = 64, kPadFrom = 1024;

std::string hex(uint64_t x) {
    return fmt::format("{:016x}", x);
}

// Where a run's weights come from: a new model (nothing), a base model directory (--init, or the checkpoint
// of a full run being resumed), and for LoRA an adapter (--adapter, or the checkpoint of a LoRA run).
ModelSource model_source(TrainOptions& o, const ResumePoint* resume) {
    ModelSource s;
    s.lora.rank = o.lora_rank;
    s.lora.alpha = o.lora_alpha;
    s.lora.dropout = o.lora_dropout;
    s.lora.rslora = o.rslora;
    s.lora.targets = split_list(o.lora_targets);
    if (!o.adapter.empty() && !(resume && resume->adapter)) {
        const PeftAdapter a = read_peft_config(o.adapter);
        ANVIL_CHECK(o.lora_rank == 0 || o.lora_rank == a.lora.rank,
                    "--lora-rank {}: the adapter {} has rank {}; drop the flag to continue it", o.lora_rank,
                    o.adapter, a.lora.rank);
        s.lora = a.lora;
        s.adapter = o.adapter;
        if (o.init.empty()) o.init = a.base_model;
        o.lora_rank = a.lora.rank, o.lora_alpha = a.lora.alpha, o.lora_dropout = a.lora.dropout;
        o.rslora = a.lora.rslora, o.lora_targets = join_list(a.lora.targets);
    }
    if (resume && resume->adapter) {
        ANVIL_CHECK(s.lora.enabled(),
                    "--resume {}: the checkpoint holds a LoRA adapter but the run's options have "
                    "no --lora-rank",
                    resume->dir);
        s.adapter = resume->dir;
    }
    if (is_gguf_file(o.init))
        o.init = gguf_model_dir(o.init);  // llama.cpp's file, read into a directory once
    else if (!o.init.empty())
        o.init = resolve_model_dir(o.init, "--init");  // a run directory: its final/ (or newest checkpoint)
    s.base = resume && !resume->adapter ? resume->dir : o.init;
    ANVIL_CHECK(!s.lora.enabled() || !s.base.empty(),
                "--lora-rank {}: LoRA adapts a pretrained model; give its directory with --init BASE",
                o.lora_rank);
    return s;
}

// The run directory, locked for this process, with what a crashed save left cleaned up. Returns whether this
// call created it.
bool open_out_dir(TrainOptions& o, const ResumePoint* resume, RunSetup& r) {
    if (resume && o.out.empty()) o.out = fsys::path(resume->dir).parent_path().string();
    if (o.out.empty()) o.out = resume ? "." : default_out_dir();
    const bool created = !dir_exists(o.out);
    make_dirs(o.out);
    // From here on this process owns the directory: a second one is refused before it writes anything.
    r.lock = RunDirLock(o.out, resume ? "--resume" : "--out");
    if (!resume && o.resume_auto && file_exists(o.out + "/metrics.jsonl")) {
        // an attempt that ended before its first checkpoint: its log is kept, the run starts over
        std::string aside = o.out + "/metrics.before-restart.jsonl";
        for (int i = 2; file_exists(aside); i++)
            aside = fmt::format("{}/metrics.before-restart-{}.jsonl", o.out, i);
        fsys::rename(o.out + "/metrics.jsonl", aside);
        std::fprintf(stderr, "anvil: --resume auto: %s held no checkpoint; its metrics.jsonl is now %s\n",
                     o.out.c_str(), aside.c_str());
    }
    ANVIL_CHECK(resume || !file_exists(o.out + "/metrics.jsonl"),
                "--out {}: already holds a run; continue it with --resume {} or choose another --out", o.out,
                o.out);
    if (const std::string cleaned = clean_stale_temporaries(o.out); !cleaned.empty())
        std::fprintf(stderr, "anvil: %s: %s\n", o.out.c_str(), cleaned.c_str());
    return created;
}

// Rank 0 chose the run directory (a default one is named by rank 0's clock): every rank takes its name.
void share_out_dir(Comm& comm, TrainOptions& o) {
    if (comm.size() == 1) return;
    uint64_t n = o.out.size();
    comm.broadcast(&n, sizeof n, 0, "the run directory's name");
    o.out.resize(size_t(n));
    comm.broadcast(o.out.data(), size_t(n), 0, "the run directory's name");
}

// Every rank must run with rank 0's options: the first rank that differs is named with the options that
// differ, as flags, on every rank.
void check_same_options(Comm& comm, const nlohmann::json& mine) {
    const std::vector<std::string> all =
        allgather_text(comm, json_text(mine), "the start-up check of the training options");
    const auto options_of = [&](size_t r) { return nlohmann::json::parse(all[r]); };
    const nlohmann::json first = options_of(0);
    for (size_t r = 1; r < all.size(); r++) {
        const nlohmann::json other = options_of(r);
        if (other == first) continue;
        std::string diff;
        for (const auto& [key, value] : first.items()) {
            const nlohmann::json theirs = other.value(key, nlohmann::json());
            if (theirs == value) continue;
            std::string flag = "--" + key;
            std::replace(flag.begin(), flag.end(), '_', '-');
            diff += fmt::format("{}{} {} (rank 0: {})", diff.empty() ? "" : ", ", flag, theirs.dump(),
                                value.dump());
        }
        fail(
            "rank {} was started with other options than rank 0: {}; every rank must be given the same flags",
            r, diff);
    }
}

// Builds the run in a directory this call created: a bad option found on the way leaves nothing behind.
void build_run(RunSetup& r, TrainOptions& o, const ResumePoint* resume, Comm& comm);

// Tokenizer: the flag wins; otherwise a prepared data directory's; otherwise the model's; else bytes.
std::unique_ptr<Tokenizer> choose_tokenizer(const TrainOptions& o, const std::string& model_src,
                                            const nlohmann::json& src_config) {
    if (!o.tokenizer.empty()) return make_tokenizer(o.tokenizer);
    if (!o.data.empty() && is_prepared_dir(o.data)) return tokenizer_for_prepared(o.data);
    if (!o.data.empty() && is_llmc_dir(o.data)) {
        const std::string name = llmc_tokenizer_name(o.data);
        fail("--data {}: llm.c shards of {} token ids; give --tokenizer with that tokenizer ({})", o.data,
             name,
             name == "GPT-2"
                 ? "a directory with GPT-2's encoder.json + vocab.bpe, or a Hugging Face GPT-2 directory"
                 : "Llama 3's tokenizer.json and tokenizer_config.json");
    }
    if (!model_src.empty()) return tokenizer_for_checkpoint(model_src, src_config);
    return make_tokenizer("byte");
}

Dataset load_data(TrainOptions& o, const Tokenizer& tok, Comm& comm) {
    if (o.data.empty()) {
        o.embedded = true;
        o.data = o.out + "/data.jsonl";
        if (comm.rank() == 0 && !file_exists(o.data))
            write_examples_jsonl(o.data, synthetic_examples(kEmbeddedExamples, o.seed));
        comm.barrier("the wait for rank 0 to write the embedded data");
        std::fprintf(
            stderr,
            "anvil: embedded default: %d synthetic instruction records (reversal, sorting, uppercasing) "
            "in %s\n",
            kEmbeddedExamples, o.data.c_str());
    }
    ANVIL_CHECK(o.augment.empty() || !is_data_dir(o.data),
                "--augment: {} is a directory of token shards; augmentation re-renders records, so give the "
                "JSONL file of instruction or chat records",
                o.data);
    if (is_data_dir(o.data)) {
        // anvil's shards hold prompts rendered with the directory's template
        if (is_prepared_dir(o.data))
            o.prompt_template = read_prepared_meta(o.data).value("template", o.prompt_template);
        return open_data_dir(o.data, tok);
    }
    const PromptTemplate t = choose_template(o.prompt_template, tok);
    const std::string reason = template_reason(o.prompt_template, t, tok);
    o.prompt_template = template_name(t);  // what the checkpoint records, resolved
    Dataset d = load_dataset(o.data, tok, DataOptions{o.val_fraction, o.text_field, t, !o.augment.empty()});
    ANVIL_CHECK(o.augment.empty() || d.jsonl,
                "--augment: {} is plain text; augmentation changes the fields of instruction or chat records "
                "(JSONL)",
                o.data);
    if (d.jsonl && !o.embedded)
        std::fprintf(stderr, "anvil: template %s for instruction and chat records (%s)\n", template_name(t),
                     reason.c_str());
    return d;
}

}  // namespace

ModelConfig new_model_config(const TrainOptions& o, int tok_vocab) {
    ModelConfig c;
    ANVIL_CHECK(find_model_family(o.arch), "--arch {}: anvil implements {}", o.arch, known_model_types());
    c.model_type = o.arch;
    if (o.arch == "gpt2") {
        ANVIL_CHECK(
            o.kv_heads == 0 && o.ffn_dim == 0 && o.rope_theta == 0 && o.norm_eps == 0 && !o.tie_embeddings,
            "--kv-heads, --ffn-dim, --rope-theta, --norm-eps and --tie-embeddings shape a Llama model; add "
            "--arch llama (GPT-2 has a 4x MLP, learned positions and a tied head)");
    } else {
        c.n_kv_head = o.kv_heads;
        // Llama's MLP is about 8/3 of the width, rounded up to a multiple of 64 when not given
        c.ffn_dim = o.ffn_dim > 0 ? o.ffn_dim : (8 * o.dim / 3 + 63) / 64 * 64;
        c.rope_theta = o.rope_theta > 0 ? o.rope_theta : 10000.0;
        c.norm_eps = o.norm_eps > 0 ? o.norm_eps : 1e-6;
        c.tie_embeddings = o.tie_embeddings;
    }
    if (const auto set = model_family(o.arch).new_model) set(c);
    c.n_layer = o.layers;
    c.n_head = o.heads;
    c.n_embd = o.dim;
    c.n_ctx = o.seq > 0 ? o.seq : 128;
    ANVIL_CHECK(o.vocab == 0 || o.vocab >= tok_vocab,
                "--vocab {}: smaller than the tokenizer's {} ids; use --vocab {} or more (or leave it out)",
                o.vocab, tok_vocab, tok_vocab);
    c.vocab_size = o.vocab > 0 ? o.vocab
                   : tok_vocab < kPadFrom
                       ? tok_vocab
                       : (tok_vocab + kVocabMultiple - 1) / kVocabMultiple * kVocabMultiple;
    if (o.vocab == 0 && c.vocab_size != tok_vocab)
        std::fprintf(stderr,
                     "anvil: vocabulary padded from %d to %d rows, a multiple of %d (--vocab sets it)\n",
                     tok_vocab, c.vocab_size, kVocabMultiple);
    c.validate("--layers/--heads/--kv-heads/--dim/--seq/--vocab");
    return c;
}

namespace {

void check_options(TrainOptions& o, const ModelConfig& cfg, const Tokenizer& tok) {
    if (o.seq <= 0) o.seq = cfg.n_ctx;
    ANVIL_CHECK(
        o.seq <= cfg.n_ctx, "--seq {}: longer than the model's context of {} tokens{}; use --seq {} or less",
        o.seq, cfg.n_ctx,
        cfg.hf_max_positions > 0 ? " (its sliding window: anvil runs a Mistral within its window)" : "",
        cfg.n_ctx);
    ANVIL_CHECK(tok.vocab_size() <= cfg.vocab_size,
                "the tokenizer has {} ids but the model's vocabulary is {}; use the tokenizer the model was "
                "trained with",
                tok.vocab_size(), cfg.vocab_size);
    ANVIL_CHECK(o.batch > 0 && o.grad_accum > 0 && o.steps > 0,
                "--batch, --grad-accum and --steps must be positive (got {}, {}, {})", o.batch, o.grad_accum,
                o.steps);
    ANVIL_CHECK(o.lr > 0.0f && std::isfinite(o.lr), "--lr {} must be a positive number", o.lr);
    ANVIL_CHECK(o.warmup >= 0 && o.log_every > 0 && o.eval_every >= 0 && o.save_every >= 0,
                "--warmup, --eval-every and --save-every must not be negative, --log-every must be positive");
    ANVIL_CHECK(
        o.early_stop == 0 || o.eval_every > 0,
        "--early-stop {} watches the validation loss taken every --eval-every steps; give --eval-every N",
        o.early_stop);
    // the step is one of the window's values, so its z-score stays below sqrt(window - 1)
    const double z_max = std::sqrt(double(o.skip_window) - 1.0);
    for (const auto& [flag, z] :
         {std::pair{"--skip-loss-z", o.skip_loss_z}, std::pair{"--skip-grad-z", o.skip_grad_z}})
        ANVIL_CHECK(
            z < z_max,
            "{} {} can never be exceeded: over --skip-window {} steps no z-score reaches sqrt({}) = {:.2f}; "
            "use a smaller threshold or a longer window",
            flag, z, o.skip_window, o.skip_window - 1, z_max);
    parse_bytes(o.max_shard_size, "--max-shard-size");  // a bad size fails now, not at the first save
    parse_lr_shape(o.lr_schedule);                      // a bad name fails now
    ANVIL_CHECK(o.decay_frac > 0.0f && o.decay_frac <= 1.0f,
                "--decay-frac {}: the share of the steps wsd decays over must be in (0, 1]", o.decay_frac);
    const size_t prompt = o.sample_prompt.empty() ? 0 : tok.encode_prompt(o.sample_prompt).size();
    ANVIL_CHECK(prompt < size_t(cfg.n_ctx),
                "--sample-prompt: {} tokens, but the model's context is {}; give a shorter prompt", prompt,
                cfg.n_ctx);
}

// The parameter dtype from --precision (auto: bf16 on CUDA, fp32 on the CPU; fp8: bf16 with FP8 products on
// CUDA, the CPU's fp32 with FP8's rounding simulated).
DType run_dtype(TrainOptions& o, Device device) {
    if (o.precision == "auto") o.precision = device == Device::CUDA ? "bf16" : "fp32";
    if (o.precision == "fp8") return device == Device::CUDA ? DType::BF16 : DType::F32;
    if (o.precision == "bf16" && device == Device::CPU) return DType::F32;  // f32 tensors, bf16 products
    DType dtype;
    ANVIL_CHECK(dtype_from_precision(o.precision, &dtype), "--precision {}: use fp32, bf16, fp16 or fp8",
                o.precision);
    ANVIL_CHECK(device == Device::CUDA || dtype == DType::F32,
                "--precision {}: the CPU backend trains in fp32 (or bf16 products: --precision bf16); use "
                "--precision fp32 or bf16, or --device cuda",
                o.precision);
    return dtype;
}

}  // namespace

ModelOptions training_model_options(TrainOptions& o, Device device, const LoraOptions& lora) {
    ModelOptions mo;
    mo.dtype = run_dtype(o, device);
    mo.fp8 = o.precision == "fp8";
    ANVIL_CHECK(o.fp8_scaling == "current" || o.fp8_scaling == "delayed",
                "--fp8-scaling {}: use current or delayed", o.fp8_scaling);
    if (mo.fp8 && o.fp8_scaling == "delayed") mo.fp8_history = o.fp8_history;
    mo.recompute = parse_recompute(o.recompute);
    mo.logits_chunk_bytes = parse_bytes(o.logits_chunk, "--logits-chunk", true);
    mo.lora = lora;
    mo.dropout = o.dropout;
    mo.attn_dropout = o.attn_dropout_rate();
    mo.neftune_alpha = o.neftune_alpha;
    return mo;
}

namespace {

// Model and optimizer, with weights from the sources (base, adapter) or a seeded initialisation.
void build_model(RunSetup& r, TrainOptions& o, const ModelConfig& cfg, const ModelSource& src) {
    Backend& be = r.profiler ? static_cast<Backend&>(*r.profiler) : *r.backend;
    ModelOptions mo = training_model_options(o, r.backend->device(), src.lora);
    if (o.precision == "bf16" && r.backend->device() == Device::CPU) enable_cpu_bf16_products(be);
    if (r.grid.tp) {
        mo.tp = {r.grid.tp->rank(), r.grid.tp->size(), make_tp_reducer(*r.grid.tp, *r.backend)};
    }
    r.model = make_model(be, cfg, mo);
    ANVIL_CHECK(o.zero == 0 || o.zero == 1, "--zero {}: anvil shards the optimizer state (1) or nothing (0)",
                o.zero);
    Comm& dp = *r.grid.dp;  // ZeRO shards over the replicas
    if (o.zero == 1 && dp.size() == 1)
        std::fprintf(
            stderr,
            "anvil: warning: --zero 1 with one %s: nothing to shard; the optimizer state stays whole\n",
            r.grid.tp ? "replica" : "process");
    const OptShard shard = o.zero == 1 ? OptShard{dp.rank(), dp.size()} : OptShard{};
    r.opt = std::make_unique<AdamW>(r.model->params(), o.weight_decay, shard);
    if (shard.world > 1) {  // the moments, and the f32 master weights of bf16/f16 parameters
        const double arrays = r.opt->has_master() ? 3.0 : 2.0, mb = arrays * sizeof(float) / 1e6;
        std::fprintf(stderr, "anvil: ZeRO-1: optimizer state %.1f MB per rank (%.1f MB unsharded, 1/%d)\n",
                     mb * double(r.opt->begin(1) - r.opt->begin(0)), mb * double(r.opt->layout_floats()),
                     dp.size());
    }
    AdamW& opt = *r.opt;
    const auto master = [&](size_t i, const float* f32) { opt.set_master(i, f32); };  // before any rounding
    if (src.base.empty())
        r.model->params().init(o.seed, master);
    else if (src.lora.enabled())
        r.model->params().init_adapters(o.seed, master);  // A Kaiming-uniform, B zero
    if (!src.base.empty()) load_model_weights(src.base, *r.model, master);
    if (!src.adapter.empty()) load_peft_weights(src.adapter, *r.model, master);
    r.trainer = std::make_unique<Trainer>(*r.model, opt, o.seed);
    r.trainer->set_outlier_skip({o.skip_loss_z, o.skip_grad_z, o.skip_window});
}

void search_batch(RunSetup& r, TrainOptions& o, Comm& comm) {
    ANVIL_CHECK(
        !r.grid.tp,
        "--batch auto: the search does not run tensor parallel yet; give --batch with --tensor-parallel {}",
        o.tensor_parallel);
    const int global = o.global_batch > 0 ? o.global_batch : 64, W = comm.size();
    ANVIL_CHECK(global % W == 0,
                "--global-batch {}: not a multiple of the {} ranks; each rank trains on an "
                "equal share",
                global, W);
    std::fprintf(stderr, "anvil: batch-size search, global batch %d (%d per rank), sequence %d:\n", global,
                 global / W, o.seq);
    const AutoBatch ab = find_batch_size(*r.trainer, r.data.train, o.seq, global / W, o.shuffle, o.seed);
    for (const auto& line : ab.log) std::fprintf(stderr, "  %s\n", line.c_str());
    o.batch = ab.micro;
    // every rank trains with the smallest micro-batch any rank chose (each fits everywhere it was tried)
    if (W > 1) {
        std::vector<int> all(static_cast<size_t>(W));
        comm.allgather(&o.batch, sizeof(int), all.data(), "the batch-size search's agreement");
        o.batch = *std::min_element(all.begin(), all.end());
        while ((global / W) % o.batch != 0) o.batch--;
        if (o.batch != ab.micro)
            std::fprintf(
                stderr,
                "anvil: micro-batch %d, the smallest any rank chose (every rank trains with the same)\n",
                o.batch);
    }
    o.grad_accum = global / W / o.batch;
    o.batch_auto = false;  // what a resumed run (or a re-run) uses
    r.batch_search = ab.log;
}

void restore_state(RunSetup& r, const TrainOptions& o, const ResumePoint& rp) {
    read_optimizer_state(rp.dir, r.model->params(),
                         [&](size_t i, const float* m, const float* v) { r.opt->set_moments(i, m, v); });
    const nlohmann::json then = rp.state.value("options", nlohmann::json::object());
    const int then_tp = then.value("tensor_parallel", 1);
    const int then_dp = rp.state.value("world_size", 1) / std::max(1, then_tp);
    const auto layout = [](int dp, int z, int tp) {
        std::string s =
            z == 1 && dp > 1 ? fmt::format("sharded over {} ranks (ZeRO-1)", dp) : std::string("whole");
        return tp > 1 ? s + fmt::format(", split over {} tensor-parallel ranks", tp) : s;
    };
    const std::string was = layout(then_dp, then.value("zero", 0), then_tp);
    const std::string now = layout(r.grid.dp->size(), o.zero, r.grid.tp_size());
    if (was != now)
        std::fprintf(stderr,
                     "anvil: the optimizer state was %s and is now %s: resharded from the checkpoint\n",
                     was.c_str(), now.c_str());
    scaler_from_json(rp.state, r.trainer->scaler());
    if (!r.model->fp8_state().empty() && !read_fp8_state(rp.dir, *r.model))
        std::fprintf(stderr,
                     "anvil: the checkpoint keeps no FP8 amax histories (it was written without "
                     "--fp8-scaling delayed): they start empty\n");
    if (const auto w = rp.state.find("outlier_windows"); w != rp.state.end() && w->is_object()) {
        r.trainer->outliers().loss.set_values(w->value("loss", std::vector<double>{}));
        r.trainer->outliers().grad.set_values(w->value("grad_norm", std::vector<double>{}));
    }
    r.start_step = rp.state.value("step", 0);
    if (const auto b = rp.state.find("best"); b != rp.state.end() && b->is_object())
        r.best = {b->value("val_loss", 0.0), b->value("step", 0), b->value("evals_since", 0),
                  b->value("dir", std::string())};
    const std::string fp = rp.state.contains("data") ? rp.state["data"].value("fingerprint", "") : "";
    ANVIL_CHECK(
        fp.empty() || fp == hex(r.data.fingerprint),
        "--resume {}: the training data differs from the run's ({} now, {} then); pass the original --data "
        "{} so the resumed run sees the same batches",
        rp.dir, hex(r.data.fingerprint), fp, rp.state["data"].value("path", std::string("?")));
    ANVIL_CHECK(r.start_step <= o.steps, "--resume {}: the checkpoint is at step {}, past --steps {}", rp.dir,
                r.start_step, o.steps);
    std::fprintf(stderr, "anvil: resuming %s at step %lld\n", rp.dir.c_str(), (long long)r.start_step);
}

}  // namespace

std::unique_ptr<Backend> make_run_backend(const TrainOptions& o, int gpu) {
    BackendOptions bo = backend_options(o.device, o.threads, o.attention, gpu);
    bo.attn_fwd_rows = o.attn_fwd_rows;
    bo.gemm_tune = o.gemm_tune;
    return make_backend(bo);
}

RunSetup setup_run(TrainOptions& o, const ResumePoint* resume, Comm& comm) {
    RunSetup r;
    r.comm = &comm;
    const bool created = comm.rank() == 0 && open_out_dir(o, resume, r);
    share_out_dir(comm, o);
    try {
        build_run(r, o, resume, comm);
    } catch (...) {
        if (created) {
            r = RunSetup();  // releases the lock and every file first
            std::error_code ec;
            fsys::remove_all(o.out, ec);
        }
        throw;
    }
    return r;
}

namespace {

void build_run(RunSetup& r, TrainOptions& o, const ResumePoint* resume, Comm& comm) {
    r.grid = make_grid(comm, o.tensor_parallel);
    const ModelSource src = model_source(o, resume);
    nlohmann::json src_config;
    ModelConfig cfg;
    if (!src.base.empty()) cfg = read_model_config(src.base, &src_config);
    ANVIL_CHECK(
        !cfg.int8_weights || src.lora.enabled(),
        "--init {}: its weights are int8 (anvil quantize), a frozen base; fine-tune it with LoRA (add "
        "--lora-rank R), or train the float model it was quantized from",
        src.base);
    r.tok = choose_tokenizer(o, src.base, src_config);
    r.data = load_data(o, *r.tok, comm);
    ANVIL_CHECK(
        o.early_stop == 0 || r.data.val.size() > 1,
        "--early-stop {} watches the validation loss, and --data {} has no validation split (--val-fraction "
        "{}); hold some out",
        o.early_stop, o.data, o.val_fraction);
    if (!o.eval_choices.empty()) r.choices = read_choice_items(o.eval_choices);
    if (src.base.empty()) cfg = new_model_config(o, r.tok->vocab_size());
    check_options(o, cfg, *r.tok);
    r.backend = make_run_backend(o, comm.local_rank());  // the local rank's GPU
    if (!o.memory_limit.empty()) r.backend->set_memory_limit(parse_bytes(o.memory_limit, "--memory-limit"));
    if (o.profile) r.profiler = std::make_unique<ProfilingBackend>(*r.backend);
    build_model(r, o, cfg, src);
    if (o.batch_auto) {
        ANVIL_CHECK(!resume, "--batch auto: a resumed run keeps the batch it chose; drop the flag");
        search_batch(r, o, comm);
    }
    r.model->reserve(o.batch, o.seq, true);
    if (resume) restore_state(r, o, *resume);
    if (comm.size() > 1) {
        check_same_options(comm, options_to_json(o));
        check_same(comm, r.data.fingerprint, "the training data (its fingerprint)");
        r.dp = std::make_unique<DataParallel>(r.grid, r.model->params(), *r.opt);
        r.dp->set_fp8_state(r.model->fp8_state());
        r.trainer->set_data_parallel(r.dp.get());
    }
    r.opts = o;
}

}  // namespace

Batcher training_batcher(RunSetup& run, int rank, int world) {
    const TrainOptions& o = run.opts;
    Batcher b(run.data.train, o.batch, o.seq, o.shuffle, o.seed, rank, world);
    if (o.augment.empty()) return b;
    auto a = std::make_shared<RecordAugmenter>();
    a->opts.ops = parse_augment_ops(o.augment, "--augment");
    a->opts.fields = split_commas(o.augment_fields);
    a->opts.p = o.augment_p;
    if (!o.synonyms.empty()) a->opts.synonyms = std::make_shared<Synonyms>(Synonyms::read(o.synonyms));
    check_augment_options(a->opts, "--augment", "--augment-fields");
    a->examples = std::move(run.data.train_examples);
    a->prob = o.augment_prob;
    a->seed = o.seed;
    a->prompt = choose_template(o.prompt_template, *run.tok);
    a->tok = run.tok.get();
    b.set_augmenter(std::move(a));
    return b;
}

}  // namespace anvil
