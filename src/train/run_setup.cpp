#include "train/run_setup.h"

#include <algorithm>
#include <ctime>
#include <filesystem>

#include "data/synthetic.h"
#include "io/checkpoint.h"
#include "io/fs.h"
#include "io/json_text.h"
#include "train/autobatch.h"

namespace anvil {

namespace fsys = std::filesystem;

namespace {

constexpr int kEmbeddedExamples = 20000;

std::string default_out_dir() {
    const std::time_t now = std::time(nullptr);
    char buf[40];
    std::strftime(buf, sizeof buf, "runs/%Y%m%d-%H%M%S", std::localtime(&now));
    return buf;
}

int checkpoint_step(const std::string& dir) {
    const std::string p = dir + "/trainer_state.json";
    if (!file_exists(p)) return -1;
    const nlohmann::json j = read_json_file(p);
    return j.value("step", -1);
}

std::string hex(uint64_t x) {
    return fmt::format("{:016x}", x);
}

}  // namespace

Device parse_device(const std::string& name) {
    if (name == "cpu") return Device::CPU;
    if (name == "cuda") return Device::CUDA;
    if (name == "auto") return cuda_available() ? Device::CUDA : Device::CPU;
    fail("--device {}: unknown device; use cpu, cuda or auto", name);
}

std::string resolve_checkpoint(const std::string& dir) {
    ANVIL_CHECK(dir_exists(dir), "--resume {}: no such directory", dir);
    if (file_exists(dir + "/trainer_state.json")) return dir;
    std::string best;
    int best_step = -1;
    for (const auto& e : fsys::directory_iterator(dir)) {
        if (!e.is_directory()) continue;
        const std::string name = e.path().filename().string();
        if (name != "final" && !name.starts_with("checkpoint-")) continue;
        if (name.find(".tmp.") != std::string::npos || name.find(".old.") != std::string::npos) continue;
        const int s = checkpoint_step(e.path().string());
        if (s > best_step) {
            best_step = s;
            best = e.path().string();
        }
    }
    ANVIL_CHECK(!best.empty(),
                "--resume {}: no training checkpoint here (a directory with trainer_state.json, or "
                "a run directory holding checkpoint-N or final)",
                dir);
    return best;
}

RunSetup setup_run(TrainOptions& o) {
    refuse_multi_process_launch();
    RunSetup r;
    std::string ckpt;
    nlohmann::json state;
    if (!o.resume.empty()) {
        ckpt = resolve_checkpoint(o.resume);
        if (o.out.empty()) o.out = fsys::path(ckpt).parent_path().string();
        if (o.out.empty()) o.out = ".";
    } else if (o.out.empty()) {
        o.out = default_out_dir();
    }
    make_dirs(o.out);
    // From here on this process owns the directory: a second one is refused before it writes anything.
    r.lock = RunDirLock(o.out, o.resume.empty() ? "--out" : "--resume");
    ANVIL_CHECK(!o.resume.empty() || !file_exists(o.out + "/metrics.jsonl"),
                "--out {}: already holds a run; continue it with --resume {} or choose another --out", o.out,
                o.out);
    if (const std::string cleaned = clean_stale_temporaries(o.out); !cleaned.empty())
        std::fprintf(stderr, "anvil: %s: %s\n", o.out.c_str(), cleaned.c_str());
    if (!ckpt.empty()) {
        ckpt = resolve_checkpoint(o.resume);  // again: a restored directory may be the newest
        state = read_json_file(ckpt + "/trainer_state.json");
    }

    // Tokenizer: the flag wins; otherwise a prepared data directory's; otherwise the checkpoint's; else
    // bytes.
    const std::string model_src = !ckpt.empty() ? ckpt : o.init;
    nlohmann::json src_config;
    GPTConfig cfg;
    if (!model_src.empty()) cfg = read_model_config(model_src, &src_config);
    const bool prepared = !o.data.empty() && is_prepared_dir(o.data);
    nlohmann::json data_meta;
    if (prepared) data_meta = read_prepared_meta(o.data);
    if (!o.tokenizer.empty())
        r.tok = make_tokenizer(o.tokenizer);
    else if (prepared)
        r.tok = tokenizer_for_prepared(o.data);
    else if (!model_src.empty())
        r.tok = tokenizer_for_checkpoint(model_src, src_config);
    else
        r.tok = make_tokenizer("byte");

    // Data.
    if (o.data.empty()) {
        o.embedded = true;
        o.data = o.out + "/data.jsonl";
        if (!file_exists(o.data))
            write_instruction_jsonl(o.data, synthetic_examples(kEmbeddedExamples, o.seed));
        std::fprintf(stderr,
                     "anvil: embedded default: %d synthetic instruction records (reversal, sorting, "
                     "uppercasing) in %s\n",
                     kEmbeddedExamples, o.data.c_str());
    }
    if (prepared) {
        o.prompt_template =
            data_meta.value("template", o.prompt_template);  // the shards hold rendered prompts
        r.data = open_prepared(o.data, *r.tok);
    } else {
        r.data = load_dataset(o.data, *r.tok,
                              DataOptions{o.val_fraction, o.text_field, parse_template(o.prompt_template)});
    }

    // Model shape.
    const Device device = parse_device(o.device);
    if (model_src.empty()) {
        cfg.n_layer = o.layers;
        cfg.n_head = o.heads;
        cfg.n_embd = o.dim;
        cfg.n_ctx = o.seq > 0 ? o.seq : 128;
        ANVIL_CHECK(
            o.vocab == 0 || o.vocab >= r.tok->vocab_size(),
            "--vocab {}: smaller than the tokenizer's {} ids; use --vocab {} or more (or leave it out)",
            o.vocab, r.tok->vocab_size(), r.tok->vocab_size());
        // On CUDA a new model's vocabulary is padded to a multiple of 64 (as llm.c and nanoGPT do for GPT-2):
        // the classifier's products then have aligned rows for the tensor cores. The extra rows are never
        // sampled and learn to stay unlikely.
        const int tok_vocab = r.tok->vocab_size();
        cfg.vocab_size = o.vocab > 0              ? o.vocab
                         : device == Device::CUDA ? (tok_vocab + 63) / 64 * 64
                                                  : tok_vocab;
        if (o.vocab == 0 && cfg.vocab_size != tok_vocab)
            std::fprintf(
                stderr, "anvil: vocabulary padded from %d to %d ids for the tensor cores (--vocab sets it)\n",
                tok_vocab, cfg.vocab_size);
        cfg.validate("--layers/--heads/--dim/--seq/--vocab");
    }
    if (o.seq <= 0) o.seq = cfg.n_ctx;
    ANVIL_CHECK(o.seq <= cfg.n_ctx,
                "--seq {}: longer than the model's context of {} tokens; use --seq {} or less", o.seq,
                cfg.n_ctx, cfg.n_ctx);
    ANVIL_CHECK(r.tok->vocab_size() <= cfg.vocab_size,
                "the tokenizer has {} ids but the model's vocabulary is "
                "{}; use the tokenizer the model was trained with",
                r.tok->vocab_size(), cfg.vocab_size);
    ANVIL_CHECK(o.batch > 0 && o.grad_accum > 0 && o.steps > 0,
                "--batch, --grad-accum and --steps must be "
                "positive (got {}, {}, {})",
                o.batch, o.grad_accum, o.steps);
    ANVIL_CHECK(o.lr > 0.0f && std::isfinite(o.lr), "--lr {} must be a positive number", o.lr);
    ANVIL_CHECK(o.warmup >= 0 && o.log_every > 0 && o.eval_every >= 0 && o.save_every >= 0,
                "--warmup, --eval-every and --save-every must not be negative, --log-every must be positive");
    ANVIL_CHECK(o.lr_schedule == "cosine" || o.lr_schedule == "constant",
                "--lr-schedule {}: use cosine or "
                "constant",
                o.lr_schedule);

    BackendOptions bo;
    bo.device = device;
    bo.threads = o.threads;
    bo.attention = parse_attention(o.attention);
    r.backend = make_backend(bo);
    if (!o.memory_limit.empty()) r.backend->set_memory_limit(parse_bytes(o.memory_limit, "--memory-limit"));
    Backend* be = r.backend.get();
    if (o.profile) {
        r.profiler = std::make_unique<ProfilingBackend>(*r.backend);
        be = r.profiler.get();
    }
    if (o.precision == "auto") o.precision = bo.device == Device::CUDA ? "bf16" : "fp32";
    DType dtype;
    ANVIL_CHECK(dtype_from_precision(o.precision, &dtype), "--precision {}: use fp32, bf16 or fp16",
                o.precision);
    ANVIL_CHECK(bo.device == Device::CUDA || dtype == DType::F32,
                "--precision {}: the CPU backend trains in fp32; "
                "use --precision fp32, or --device cuda",
                o.precision);
    r.model = std::make_unique<GPT2>(*be, cfg, dtype, o.recompute);
    r.opt = std::make_unique<AdamW>(*r.model, o.weight_decay);
    if (!model_src.empty()) {
        r.opt->weights_from_host(read_model_weights(model_src, *r.model));  // f32 master, rounded parameters
    } else {
        r.opt->weights_from_host(r.model->init_host(o.seed));  // drawn in f32, before any rounding
    }
    if (o.batch_auto) {
        ANVIL_CHECK(ckpt.empty(), "--batch auto: a resumed run keeps the batch it chose; drop the flag");
        const int global = o.global_batch > 0 ? o.global_batch : 64;
        std::fprintf(stderr, "anvil: batch-size search, global batch %d, sequence %d:\n", global, o.seq);
        const AutoBatch ab =
            find_batch_size(*r.model, *r.opt, r.data.train, o.seq, global, o.shuffle, o.seed);
        for (const auto& line : ab.log) std::fprintf(stderr, "  %s\n", line.c_str());
        o.batch = ab.micro;
        o.grad_accum = ab.accum;
        o.batch_auto = false;  // what a resumed run (or a re-run) should use
        r.batch_search = ab.log;
    }
    r.model->reserve(o.batch, o.seq, true);
    if (!ckpt.empty()) {
        load_optimizer_state(ckpt, *r.model, *r.opt);
        r.start_step = state.value("step", 0);
        const std::string fp = state.contains("data") ? state["data"].value("fingerprint", "") : "";
        ANVIL_CHECK(
            fp.empty() || fp == hex(r.data.fingerprint),
            "--resume {}: the training data differs from the run's ({} now, {} then); pass the original "
            "--data {} so the resumed run sees the same batches",
            ckpt, hex(r.data.fingerprint), fp, state["data"].value("path", std::string("?")));
        ANVIL_CHECK(r.start_step <= o.steps, "--resume {}: the checkpoint is at step {}, past --steps {}",
                    ckpt, r.start_step, o.steps);
        std::fprintf(stderr, "anvil: resuming %s at step %d\n", ckpt.c_str(), r.start_step);
    }
    r.opts = o;
    return r;
}

void save_checkpoint(const RunSetup& run, int step, const std::string& name) {
    const TrainOptions& o = run.opts;
    const std::string dir = o.out + "/" + name;
    const std::string tmp = temp_dir_for(dir);
    make_dirs(tmp);
    write_model_files(tmp, *run.model,
                      {{"anvil_tokenizer", run.tok->kind()}, {"anvil_template", o.prompt_template}},
                      run.opt->weights_to_host());
    run.tok->save(tmp);
    write_optimizer_state(tmp, *run.model, *run.opt);
    const nlohmann::json state = {
        {"step", step},
        {"options", options_to_json(o)},
        {"data",
         {{"path", o.data},
          {"fingerprint", hex(run.data.fingerprint)},
          {"train_tokens", run.data.train.size()}}},
    };
    write_file_atomic(tmp + "/trainer_state.json", json_text(state, 2) + "\n");
    replace_dir(tmp, dir);
    // Keep the newest --keep-checkpoints checkpoint-N directories.
    std::vector<std::pair<int, std::string>> ckpts;
    for (const auto& e : fsys::directory_iterator(o.out)) {
        const std::string n = e.path().filename().string();
        if (!e.is_directory() || !n.starts_with("checkpoint-") || n.find('.') != std::string::npos) continue;
        ckpts.emplace_back(std::atoi(n.c_str() + 11), e.path().string());
    }
    std::sort(ckpts.begin(), ckpts.end());
    for (size_t i = 0; o.keep_checkpoints > 0 && i + size_t(o.keep_checkpoints) < ckpts.size(); i++) {
        std::error_code ec;
        fsys::remove_all(ckpts[i].second, ec);
    }
}

}  // namespace anvil
