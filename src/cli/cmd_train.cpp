// anvil train: flags -> TrainOptions -> run_train. With --resume, the run's stored options are the
// defaults and only flags given on this command line override them.
#include <filesystem>
#include <memory>
#include <optional>
#include <tuple>

#include "cli/commands.h"
#include "dist/comm.h"
#include "io/fs.h"
#include "io/json_text.h"
#include "monitor/cost.h"
#include "train/run.h"
#include "train/run_setup.h"
#include "train/supervisor.h"

namespace anvil::cli {

namespace {
std::string flag_key(const CLI::Option* opt) {
    std::string k = opt->get_lnames().empty() ? opt->get_name() : opt->get_lnames()[0];
    for (char& c : k)
        if (c == '-') c = '_';
    return k == "template" ? "prompt_template" : k;
}
}  // namespace

namespace {
// Copies into `merged` the options given on this command line (the rest keep merged's values).
void apply_given_flags(nlohmann::json& merged, const nlohmann::json& given, const CLI::App& sub) {
    for (const CLI::Option* opt : sub.get_options()) {
        if (opt->count() == 0) continue;
        const std::string key = flag_key(opt);
        if (given.contains(key)) merged[key] = given[key];
        if (key == "batch") merged["batch_auto"] = given["batch_auto"];
    }
}

// Re-running the first command with --resume added must work: architecture flags (and --init) that equal
// the checkpoint's are accepted; one that differs is refused, naming both values.
void check_resume_flags(const CLI::App& sub, const TrainOptions& given, const ResumePoint& rp,
                        const nlohmann::json& stored) {
    const ModelConfig& c = rp.config;
    const std::string& ckpt = rp.dir;
    const std::pair<const char*, std::pair<int, int>> arch[] = {{"layers", {given.layers, c.n_layer}},
                                                                {"heads", {given.heads, c.n_head}},
                                                                {"dim", {given.dim, c.n_embd}},
                                                                {"vocab", {given.vocab, c.vocab_size}},
                                                                {"kv-heads", {given.kv_heads, c.kv_heads()}},
                                                                {"ffn-dim", {given.ffn_dim, c.ffn()}}};
    for (const auto& [flag, v] : arch)
        if (sub.get_option(std::string("--") + flag)->count() && v.first != v.second)
            fail(
                "--{} {}: the checkpoint {} has --{} {}; the architecture cannot change when resuming (drop "
                "the flag or give {})",
                flag, v.first, ckpt, flag, v.second, v.second);
    if (sub.get_option("--arch")->count() && given.arch != c.model_type)
        fail(
            "--arch {}: the checkpoint {} is a {} model; the architecture cannot change when resuming "
            "(drop the flag or give {})",
            given.arch, ckpt, c.model_type, c.model_type);
    const std::string init = stored.value("init", std::string());
    if (sub.get_option("--init")->count() && given.init != init)
        fail("--init {}: the run being resumed started from {}; drop the flag (the weights come from {})",
             given.init, init.empty() ? std::string("a random initialisation") : init, ckpt);
    const int rank = stored.value("lora_rank", 0);
    if (sub.get_option("--lora-rank")->count() && given.lora_rank != rank)
        fail(
            "--lora-rank {}: the run being resumed {}; the adapters cannot change when resuming (drop the "
            "flag)",
            given.lora_rank,
            rank > 0 ? fmt::format("has rank {}", rank) : std::string("fine-tunes every weight"));
    const std::string adapter = stored.value("adapter", std::string());
    if (sub.get_option("--adapter")->count() && given.adapter != adapter)
        fail(
            "--adapter {}: the run being resumed {}; its weights come from {} (drop the flag)", given.adapter,
            adapter.empty() ? std::string("did not start from an adapter") : "started from " + adapter, ckpt);
    // the choices that change the numbers (not only the speed): a resumed run repeats the uninterrupted one
    // bit for bit only with the ones it started with
    const std::string attention = stored.value("attention", std::string("auto"));
    if (sub.get_option("--attention")->count() && given.attention != attention)
        fail(
            "--attention {}: the run being resumed used --attention {}; another implementation would not "
            "continue "
            "it bit for bit (drop the flag, or start a new run from {} with --init)",
            given.attention, attention, ckpt);
    const bool tune = stored.value("gemm_tune", false);
    if (sub.get_option("--gemm-tune")->count() && given.gemm_tune != tune)
        fail(
            "--gemm-tune {}: the run being resumed used --gemm-tune {}; the products' algorithms would "
            "change "
            "(drop the flag, or start a new run from {} with --init)",
            given.gemm_tune ? "on" : "off", tune ? "on" : "off", ckpt);
    const std::string scaling = stored.value("fp8_scaling", std::string("current"));
    if (sub.get_option("--fp8-scaling")->count() && given.fp8_scaling != scaling)
        fail(
            "--fp8-scaling {}: the run being resumed used --fp8-scaling {}; its products would round "
            "otherwise (drop the flag, or start a new run from {} with --init)",
            given.fp8_scaling, scaling, ckpt);
}

// A checkpoint of a job with another number of ranks: the global batch (every rank's rows of a step) stays,
// so each step still trains on the same rows, by scaling accumulation (or, failing that, the per-rank batch),
// unless --batch or --grad-accum say otherwise.
// With tensor parallelism the replicas count: a K-way group trains one replica's rows.
void keep_global_batch(nlohmann::json& merged, const ResumePoint& rp, const CLI::App& sub) {
    const nlohmann::json stored = rp.state.value("options", nlohmann::json::object());
    const bool lead = launched_rank() == 0;
    const int then_tp = stored.value("tensor_parallel", 1);
    if (then_tp > 1 && launched_world_size() == 1 && sub.get_option("--tensor-parallel")->count() == 0) {
        merged["tensor_parallel"] = 1;  // the checkpoint's tensors are whole: one process takes all of them
        if (lead)
            std::fprintf(stderr, "anvil: resuming a %d-way tensor-parallel checkpoint in one process\n",
                         then_tp);
    }
    const int now_tp = std::max(1, merged.value("tensor_parallel", 1));
    if (launched_world_size() % now_tp != 0) return;  // the job's set-up says what is wrong
    const int then = rp.state.value("world_size", 1) / std::max(1, then_tp),
              now = launched_world_size() / now_tp;
    if (then == now) return;
    const char* unit = then_tp > 1 || now_tp > 1 ? "replica" : "rank";  // a replica: a tensor-parallel group
    const int batch = stored.value("batch", 1), accum = stored.value("grad_accum", 1);
    const int global = then * batch * accum;  // the run's, whatever this command line gives
    if (sub.get_option("--batch")->count() || sub.get_option("--grad-accum")->count()) {
        if (lead)
            std::fprintf(stderr,
                         "anvil: resuming a %d-%s checkpoint on %d %s%s with the batch given: %d "
                         "sequences per step (the run had %d)\n",
                         then, unit, now, unit, now == 1 ? "" : "s",
                         now * merged.value("batch", 1) * merged.value("grad_accum", 1), global);
        return;
    }
    int b = batch, a = accum;
    if ((then * accum) % now == 0)
        a = then * accum / now;
    else if ((then * batch) % now == 0)
        b = then * batch / now;
    else
        fail(
            "--resume {}: the {}-{} run's {} sequences per step ({} per {} x {} accumulation) do not "
            "split evenly over {} {}s; give --batch and --grad-accum for this job",
            rp.dir, then, unit, global, batch, unit, accum, now, unit);
    merged["batch"] = b;
    merged["grad_accum"] = a;
    if (lead)
        std::fprintf(
            stderr,
            "anvil: resuming a %d-%s checkpoint on %d %s%s: %d x %d accumulation per %s keeps the %d "
            "sequences of each step (the same rows)\n",
            then, unit, now, unit, now == 1 ? "" : "s", b, a, unit, global);
}

}  // namespace

namespace {

// The flags kept as text until the command runs (on/off switches, INT|auto).
struct TextFlags {
    std::string shuffle = "on", gemm_tune = "off", batch = "8", keep_best = "on", tensorboard = "on";
};

// the data, the tokenizer and template, where the weights start (--init, LoRA, --adapter, --resume) and
// where the run goes
void add_source_flags(CLI::App* sub, TrainOptions& o) {
    const auto& pos = kPositive;
    const auto& nonneg = kNonNegative;
    sub->add_option(
        "--data", o.data,
        "training data: text file, .jsonl of {\"text\"}, {\"instruction\",\"input\",\"output\"} or "
        "{\"messages\":[{\"role\",\"content\"}]} records, or a `data prepare` directory (default: the "
        "embedded synthetic set)");
    sub->add_option(
        "--tokenizer", o.tokenizer,
        "tokenizer: byte, GPT-2 BPE files (encoder.json + vocab.bpe) or a Hugging Face tokenizer.json (file "
        "or directory); default: the prepared data's, else the --init or --resume model's, else byte");
    sub->add_option("--text-field", o.text_field, "JSONL field holding plain text")->capture_default_str();
    add_template_flag(sub, o.prompt_template, "the chosen one is stored in the checkpoint")
        ->capture_default_str();
    sub->add_option("--init", o.init,
                    "start from this Hugging Face GPT-2 or Llama model directory (config.json + safetensors; "
                    "LoRA's base), a run directory (its final/), or a GGUF file");
    sub->add_option(
           "--lora-rank", o.lora_rank,
           "train LoRA adapters of this rank on the --init base, every other weight frozen (0 = full "
           "fine-tuning)")
        ->capture_default_str()
        ->check(nonneg);
    sub->add_option("--lora-alpha", o.lora_alpha, "LoRA's alpha: the update is scaled by alpha / rank")
        ->capture_default_str()
        ->check(pos);
    sub->add_option(
        "--lora-targets", o.lora_targets,
        "comma-separated layer names LoRA adapts, matched at the end of a name as PEFT does (GPT-2: c_attn, "
        "c_proj, c_fc, default c_attn; Llama: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, "
        "default q_proj,v_proj)");
    sub->add_option("--lora-dropout", o.lora_dropout, "dropout on the adapters' input while training")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 0.99));
    sub->add_flag("--rslora", o.rslora, "rank-stabilised LoRA: scale by alpha / sqrt(rank)");
    sub->add_option(
        "--adapter", o.adapter,
        "continue training this PEFT LoRA adapter directory (its base: --init, else the adapter's "
        "base_model_name_or_path)");
    sub->add_option("--resume", o.resume,
                    "continue a run from its checkpoint (or run) directory; auto: the newest undamaged "
                    "checkpoint in --out, or start the run there when it has none (a job that may be "
                    "requeued)");
    sub->add_option("--out", o.out, "run directory (default runs/<date>-<time>)");
    sub->add_option("--val-fraction", o.val_fraction, "hold out this fraction from the end of the data")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 0.99));
}

}  // namespace

void add_model_flags(CLI::App* sub, TrainOptions& o) {
    const auto& pos = kPositive;
    sub->add_option(
           "--arch", o.arch,
           "model family of a new model: gpt2, or llama and its relatives mistral (the same layout) and "
           "qwen2 (with biases on q, k and v); --init takes it from config.json")
        ->capture_default_str()
        ->check(CLI::IsMember({"gpt2", "llama", "mistral", "qwen2"}));
    sub->add_option("--layers", o.layers, "transformer layers")->capture_default_str()->check(pos);
    sub->add_option("--heads", o.heads, "attention heads")->capture_default_str()->check(pos);
    sub->add_option("--dim", o.dim, "model width (n_embd, hidden_size)")->capture_default_str()->check(pos);
    sub->add_option("--kv-heads", o.kv_heads,
                    "llama: key/value heads, grouped-query attention (default: --heads)")
        ->check(pos);
    sub->add_option("--ffn-dim", o.ffn_dim,
                    "llama: MLP width, intermediate_size (default: 8/3 of --dim, to 64)")
        ->check(pos);
    sub->add_option("--rope-theta", o.rope_theta, "llama: rotary base, rope_theta (default 10000)")
        ->check(pos);
    sub->add_option("--norm-eps", o.norm_eps, "llama: RMSNorm epsilon, rms_norm_eps (default 1e-6)")
        ->check(CLI::Range(1e-12, 0.1));
    sub->add_flag("--tie-embeddings", o.tie_embeddings, "llama: the output layer shares the token embedding");
    sub->add_option("--vocab", o.vocab,
                    "embedding rows (default: the tokenizer's vocabulary); pad to a multiple of 64 or 128 "
                    "for faster matrix products, e.g. 50304 for GPT-2's 50257")
        ->check(pos);
    sub->add_option("--seq", o.seq, "sequence length (default: the model's context, 128 for new models)")
        ->check(pos);
}

namespace {

// the batch: its size (or auto), the device memory it may take, accumulation
void add_batch_flags(CLI::App* sub, TrainOptions& o, TextFlags& t) {
    const auto& pos = kPositive;
    sub->add_option("--batch,--batch-size", t.batch,
                    "sequences per micro-batch, or auto: the fastest that fits "
                    "the device, keeping --global-batch through accumulation")
        ->capture_default_str()
        ->check(CLI::Validator(
            [](std::string& v) -> std::string {
                if (v == "auto") return {};
                char* end = nullptr;
                const long n = std::strtol(v.c_str(), &end, 10);
                return *end == '\0' && end != v.c_str() && n > 0
                           ? ""
                           : "must be a positive integer or auto, got " + v;
            },
            "INT|auto"));
    sub->add_option("--global-batch", o.global_batch,
                    "sequences per optimizer step with --batch auto (default 64)")
        ->check(pos);
    sub->add_option("--memory-limit", o.memory_limit, "use at most this much device memory (e.g. 2G, 512M)");
    sub->add_option("--grad-accum", o.grad_accum, "micro-batches per optimizer step")
        ->capture_default_str()
        ->check(pos);
}

// the data strategy while training: augmentation drawn per epoch and NEFTune's noisy embeddings
void add_augment_flags(CLI::App* sub, TrainOptions& o) {
    sub->add_option("--augment", o.augment,
                    "label-safe augmentation drawn afresh each epoch from --seed (resume stays exact): "
                    "operations, comma-separated, one drawn per record: swap, delete, insert, synonym, case, "
                    "space (JSONL instruction or chat records; docs/data.md)");
    sub->add_option("--augment-prob", o.augment_prob,
                    "--augment: a record's chance of an augmented copy in an epoch")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    sub->add_option("--augment-p", o.augment_p,
                    "--augment: the share of a field's words an operation changes")
        ->capture_default_str()
        ->check(CLI::Range(0.001, 1.0));
    sub->add_option("--augment-fields", o.augment_fields,
                    "--augment: fields it may change: instruction, input, system, user")
        ->capture_default_str();
    sub->add_option("--synonyms", o.synonyms,
                    "--augment: a word list, one group of synonyms a line, comma-separated");
    sub->add_option(
           "--neftune-alpha", o.neftune_alpha,
           "NEFTune: uniform noise of +-A/sqrt(L d) on the embeddings while training, L the record's "
           "length in the row, d the width (TRL's neftune_noise_alpha; the paper uses 5); 0 = off")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1e4));
}

// the schedule, AdamW, dropout, clipping, outlier steps, the seed and the data order
void add_optimizer_flags(CLI::App* sub, TrainOptions& o, TextFlags& t) {
    const auto& pos = kPositive;
    const auto& nonneg = kNonNegative;
    sub->add_option("--steps", o.steps, "optimizer steps")->capture_default_str()->check(pos);
    sub->add_option("--lr", o.lr, "peak learning rate")->capture_default_str()->check(pos);
    sub->add_option("--min-lr-frac", o.min_lr_frac, "where the decay ends, as a fraction of --lr")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    sub->add_option("--lr-schedule", o.lr_schedule,
                    "after warmup: cosine or linear decay to --min-lr-frac, constant, or wsd (constant, then "
                    "the last --decay-frac of the steps down to --min-lr-frac along 1 - sqrt, as llm.c)")
        ->capture_default_str()
        ->check(CLI::IsMember({"cosine", "linear", "constant", "wsd"}));
    sub->add_option("--decay-frac", o.decay_frac, "wsd: the last share of the steps, decaying")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    sub->add_option("--warmup", o.warmup, "linear warmup steps")->capture_default_str()->check(nonneg);
    sub->add_option("--weight-decay", o.weight_decay, "AdamW decoupled weight decay (matrices only)")
        ->capture_default_str()
        ->check(nonneg);
    sub->add_option("--dropout", o.dropout,
                    "dropout while training on the embeddings, on the attention probabilities and on each "
                    "block's attention and MLP output: nanoGPT's dropout (Hugging Face GPT-2's embd_pdrop, "
                    "attn_pdrop and resid_pdrop); off in evaluation and generation")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 0.99));
    sub->add_option("--attn-dropout", o.attn_dropout,
                    "dropout on the attention probabilities alone (Hugging Face's attn_pdrop, Llama's "
                    "attention_dropout); default: --dropout's rate")
        ->check(CLI::Range(0.0, 0.99));
    sub->add_option("--grad-clip", o.grad_clip, "clip the global gradient norm to this (0 = off)")
        ->capture_default_str()
        ->check(nonneg);
    for (const auto& [flag, z, what, llmc] :
         {std::tuple{"--skip-loss-z", &o.skip_loss_z, "loss", "-sl"},
          std::tuple{"--skip-grad-z", &o.skip_grad_z, "gradient norm", "-sg"}})
        sub->add_option(
               flag, *z,
               fmt::format("skip the update of a step whose {} is more than Z standard deviations above "
                           "the mean of the last --skip-window steps' (llm.c's {}; 0 = off)",
                           what, llmc))
            ->capture_default_str()
            ->check(nonneg);
    sub->add_option(
           "--skip-window", o.skip_window,
           "steps --skip-loss-z and --skip-grad-z look back over (the step itself one of them, so no "
           "z-score exceeds sqrt(N - 1))")
        ->capture_default_str()
        ->check(CLI::Range(2, 1 << 20));
    sub->add_option("--beta1", o.beta1, "AdamW beta1")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 0.9999999));
    sub->add_option("--beta2", o.beta2, "AdamW beta2")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 0.9999999));
    sub->add_option("--eps", o.eps, "AdamW epsilon")->capture_default_str()->check(pos);
    sub->add_option("--seed", o.seed, "random seed (weights, shuffling, embedded data)")
        ->capture_default_str();
    sub->add_option("--shuffle", t.shuffle, "on: seeded window permutation per epoch; off: sequential order")
        ->capture_default_str()
        ->check(CLI::IsMember({"on", "off"}));
}

// evaluation, samples, logging and checkpoints
void add_eval_flags(CLI::App* sub, TrainOptions& o, TextFlags& t) {
    const auto& pos = kPositive;
    const auto& nonneg = kNonNegative;
    sub->add_option("--eval-every", o.eval_every, "validation loss every N steps (0 = at the end only)")
        ->capture_default_str()
        ->check(nonneg);
    sub->add_option("--eval-batches", o.eval_batches, "validation batches per evaluation (0 = all)")
        ->capture_default_str()
        ->check(nonneg);
    sub->add_option("--eval-examples", o.eval_examples,
                    "held-out instruction examples for exact match (0: all of them)")
        ->capture_default_str()
        ->check(nonneg);
    sub->add_option("--eval-choices", o.eval_choices,
                    "multiple-choice JSONL (HellaSwag's ctx/endings/label) scored with every validation loss "
                    "and at the end: mc_acc and mc_acc_norm in the metrics, as llm.c evaluates HellaSwag");
    sub->add_option("--eval-choices-limit", o.eval_choices_limit,
                    "score only the first N items of --eval-choices (0 = all)")
        ->capture_default_str()
        ->check(nonneg);
    sub->add_option("--sample-every", o.sample_every,
                    "sample text from the model every N steps (0 = never): printed, and in metrics.jsonl's "
                    "\"sample\"")
        ->capture_default_str()
        ->check(nonneg);
    sub->add_option(
        "--sample-prompt", o.sample_prompt,
        "what --sample-every continues (default: the first held-out instruction or chat prompt; for "
        "plain text, the end-of-text token)");
    sub->add_option("--sample-tokens", o.sample_tokens, "tokens per sample")
        ->capture_default_str()
        ->check(pos);
    sub->add_option("--log-every", o.log_every, "write metrics every N steps")
        ->capture_default_str()
        ->check(pos);
    sub->add_option("--save-every", o.save_every, "checkpoint every N steps (0 = at the end only)")
        ->capture_default_str()
        ->check(nonneg);
    sub->add_option("--max-shard-size", o.max_shard_size,
                    "largest weight file of a saved model; larger models are sharded as Hugging Face does "
                    "(model-0000N-of-0000M.safetensors and an index)")
        ->capture_default_str();
    sub->add_option("--keep-checkpoints", o.keep_checkpoints, "checkpoint-N directories to keep (0 = all)")
        ->capture_default_str()
        ->check(nonneg);
    sub->add_option("--max-restarts", o.max_restarts,
                    "restart the training process up to N times after a crash, an out-of-memory kill or "
                    "kill -9, from its newest checkpoint (as torchrun's --max-restarts)")
        ->capture_default_str()
        ->check(nonneg);
    sub->add_option("--keep-best", t.keep_best,
                    "with --eval-every: keep a checkpoint of the lowest validation loss so far in OUT/best")
        ->capture_default_str()
        ->check(CLI::IsMember({"on", "off"}));
    sub->add_option("--early-stop", o.early_stop,
                    "with --eval-every: stop once this many evaluations in a row have not lowered the "
                    "validation loss (0 = never)")
        ->capture_default_str()
        ->check(nonneg);
}

// the device, its precision and memory trade-offs
void add_device_flags(CLI::App* sub, TrainOptions& o) {
    const auto& nonneg = kNonNegative;
    sub->add_option("--device", o.device,
                    "cpu, cuda, or auto: CUDA when a usable GPU is visible (anvil doctor), else the CPU")
        ->capture_default_str()
        ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
    sub->add_option("--threads", o.threads, "CPU threads (0 = all cores)")
        ->capture_default_str()
        ->check(nonneg);
    sub->add_flag("--profile", o.profile, "time every backend op and print a table at the end");
    sub->add_option(
           "--precision", o.precision,
           "fp32, bf16 (fp32 master weights; on the CPU: f32 tensors with the linear layers' products "
           "in bf16 through oneDNN, as PyTorch's CPU autocast), fp16 (dynamic loss scaling) or fp8 "
           "(bf16 with the blocks' matrix products in FP8 on Hopper/Ada; on the CPU its rounding is "
           "simulated in fp32); auto: bf16 on CUDA, fp32 on the CPU")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "fp32", "bf16", "fp16", "fp8"}));
    sub->add_option("--fp8-scaling", o.fp8_scaling,
                    "with --precision fp8: each operand's scale from its own largest value (current: a pass "
                    "over it first) or from the largest of its last --fp8-history uses (delayed, as "
                    "Transformer Engine: no pass first, its largest value found while it is rounded; values "
                    "that outgrow the history saturate)")
        ->capture_default_str()
        ->check(CLI::IsMember({"current", "delayed"}));
    sub->add_option("--fp8-history", o.fp8_history,
                    "--fp8-scaling delayed: the uses each scale looks back over")
        ->capture_default_str()
        ->check(CLI::Range(1, 1024));
    sub->add_option(
           "--recompute", o.recompute,
           "what the backward recomputes instead of keeping: off; selective (alone: --recompute), the "
           "layer norms and GELU/SwiGLU, a little more compute; full, every block from its input "
           "(activation checkpointing: one block's activations at a time, for about a third more "
           "compute). Gradients are the same, bit for bit")
        ->expected(0, 1)
        ->default_str("selective")
        ->check(CLI::IsMember({"off", "selective", "full"}))
        ->option_text("[off|selective|full]  (default off)");
    sub->add_option(
           "--logits-chunk", o.logits_chunk,
           "the most logits (micro-batch x sequence x vocabulary) kept at once, e.g. 256M; past it each "
           "chunk of whole sequences is scored and its gradient taken before the next one's logits are "
           "made (0: the whole micro-batch at once)")
        ->capture_default_str();
}

// CUDA's implementation choices, and multi-process jobs
void add_cuda_flags(CLI::App* sub, TrainOptions& o, TextFlags& t) {
    sub->add_option(
           "--attention", o.attention,
           "CUDA attention: gemm (cuBLASLt on the tensor cores, keeps the T x T probabilities), flash "
           "(anvil's tiled kernels, keeps only the log-sum-exp; tensor cores in bf16/fp16), flash-simt "
           "(the same on the CUDA cores), cudnn (cuDNN's fused flash attention: bf16/fp16, no attention "
           "dropout, head sizes multiples of 8; an error elsewhere) or auto (flash on the tensor cores in "
           "bf16/fp16, else gemm up to 1 GiB per layer)")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "gemm", "flash", "flash-simt", "cudnn"}));
    sub->add_option(
           "--attn-fwd-rows", o.attn_fwd_rows,
           "CUDA: query rows a block of the tensor-core attention forward takes (128: two row tiles a "
           "warp, head sizes up to 64; slower than 64 on the H200); the same results either way")
        ->capture_default_str()
        ->check(CLI::IsMember({64, 128}));
    sub->add_option(
           "--gemm-tune", t.gemm_tune,
           "CUDA: on: time cuBLASLt's best eight algorithms on each product shape's first call and keep "
           "the fastest (+2.3% tokens/s on the H200), as PyTorch's cudnn.benchmark; two runs may then "
           "choose differently and differ in the last bits. off: the heuristic's first, bit-for-bit "
           "repeatable")
        ->capture_default_str()
        ->check(CLI::IsMember({"on", "off"}));
    sub->add_option(
           "--zero", o.zero,
           "1: ZeRO-1, shard the AdamW state over the data-parallel ranks (reduce-scatter the gradients, "
           "update the own shard, all-gather the weights); 0: every rank keeps all of it")
        ->capture_default_str()
        ->check(CLI::Range(0, 1));
    sub->add_option(
           "--tensor-parallel", o.tensor_parallel,
           "multi-process jobs: ranks that split each model (Megatron: attention heads and MLP columns over "
           "K "
           "consecutive ranks, one all-reduce per sub-block each way); the job's ranks / K replicas train "
           "data-parallel")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    sub->add_option(
           "--comm-timeout", o.comm_timeout,
           "multi-process jobs: seconds a collective may wait for the other ranks before the job ends "
           "with an error")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
}

// MFU, cost and monitoring
void add_instrument_flags(CLI::App* sub, TrainOptions& o, TextFlags& t) {
    const auto& pos = kPositive;
    sub->add_option("--price-per-hour", o.price_per_hour,
                    "dollars per hour, or a preset: " + price_presets());
    sub->add_option("--peak-tflops", o.peak_tflops,
                    "the MFU denominator (default: measured on the CPU, the "
                    "datasheet bf16 rate on a GPU)")
        ->check(pos);
    sub->add_option("--bench", o.bench, "take the MFU denominator from an `anvil bench --json` file");
    sub->add_option("--monitor-interval", o.monitor_interval, "seconds between hardware samples")
        ->capture_default_str()
        ->check(pos);
    sub->add_option("--tensorboard", t.tensorboard, "write TensorBoard event files into the run directory")
        ->capture_default_str()
        ->check(CLI::IsMember({"on", "off"}));
}

// --max-restarts: this process supervises one that trains (train/supervisor.h), started with this command
// line less --max-restarts; restarts take --resume auto in the same run directory.
int supervise_train(const TrainOptions& o) {
    ANVIL_CHECK(launched_world_size() <= 1,
                "--max-restarts supervises one process; restart a job of several through its launcher "
                "(Slurm's --requeue with --resume auto, or torchrun-style elastic launchers)");
    const bool out_given = !o.out.empty();
    ANVIL_CHECK(out_given || o.resume.empty(),
                "--max-restarts with --resume: give --out too, the run directory the restarts continue in");
    const std::string out = out_given ? o.out : default_out_dir();
    std::vector<std::string> first, again;
    const std::vector<std::string> args = own_arguments();
    for (size_t i = 0; i < args.size(); i++) {
        const std::string& a = args[i];
        const bool restarts = a == "--max-restarts" || a.starts_with("--max-restarts=");
        const bool resume = a == "--resume" || a.starts_with("--resume=");
        const size_t n = (a == "--max-restarts" || a == "--resume") && i + 1 < args.size() ? 2 : 1;
        if (!restarts)
            for (size_t k = 0; k < n; k++) first.push_back(args[i + k]);
        if (!restarts && !resume)
            for (size_t k = 0; k < n; k++) again.push_back(args[i + k]);
        i += n - 1;
    }
    if (!out_given) first.insert(first.end(), {"--out", out}), again.insert(again.end(), {"--out", out});
    again.insert(again.end(), {"--resume", "auto"});
    return supervise({first, again, out, o.max_restarts});
}

// The command: the text flags read, --resume's stored options under the flags given, the embedded default
// when no data is named, then the run.
int run_train_command(const CLI::App& sub, TrainOptions o, const TextFlags& t) {
    if (o.max_restarts > 0 && !supervised_worker()) return supervise_train(o);
    o.shuffle = t.shuffle == "on";
    o.gemm_tune = t.gemm_tune == "on";
    o.keep_best = t.keep_best == "on";
    o.tensorboard = t.tensorboard == "on";
    o.batch_auto = t.batch == "auto";
    if (!o.batch_auto) o.batch = std::atoi(t.batch.c_str());
    std::optional<ResumePoint> resume;
    if (o.resume == "auto") {
        ANVIL_CHECK(!o.out.empty(), "--resume auto continues (or starts) the run in --out: give --out DIR");
        resume = find_resume_point(o.out, true);
        o.resume_auto = !resume;
        o.resume = resume ? resume->dir : "";
        if (launched_rank() == 0)  // every rank of a job resolves it; rank 0 says which
            std::fprintf(stderr, "anvil: --resume auto: %s %s\n",
                         resume ? "continuing from" : "no checkpoint yet; starting the run in",
                         resume ? resume->dir.c_str() : o.out.c_str());
    } else if (!o.resume.empty()) {
        resume = find_resume_point(o.resume, false);
    }
    const bool any_data_flag = !o.data.empty() || !o.init.empty() || !o.resume.empty();
    TrainOptions opts = o;
    if (resume) {
        // Stored options first, then every flag given on this command line.
        nlohmann::json merged = resume->state.value("options", nlohmann::json::object());
        check_resume_flags(sub, o, *resume, merged);
        const nlohmann::json stored = merged;
        apply_given_flags(merged, options_to_json(o), sub);
        if (o.batch_auto) {  // the batch the first run's search chose stays
            for (const char* k : {"batch", "grad_accum", "batch_auto"})
                merged[k] = stored.value(k, nlohmann::json());
            std::fprintf(stderr,
                         "anvil: --batch auto: keeping the batch the run chose (%d x %d accumulation)\n",
                         merged["batch"].get<int>(), merged["grad_accum"].get<int>());
        }
        keep_global_batch(merged, *resume, sub);
        merged["resume"] = o.resume;
        // A run directory that was copied or moved continues where its checkpoint now is, not where it
        // was first written (that directory may be another run by now); --out still chooses.
        if (sub.get_option("--out")->count() == 0) merged["out"] = "";
        options_from_json(merged, opts);
    } else if (!any_data_flag) {
        // The embedded default; explicit flags still override its settings.
        TrainOptions def = embedded_default_options();
        nlohmann::json merged = options_to_json(def);
        apply_given_flags(merged, options_to_json(o), sub);
        options_from_json(merged, opts);
    }
    return run_train(opts, resume ? &*resume : nullptr);
}

}  // namespace

Command add_train(CLI::App& app, std::shared_ptr<const TrainHooks> hooks) {
    CLI::App* sub = app.add_subcommand("train",
                                       "train a GPT-2 or Llama model (no data flags: the embedded demo, a "
                                       "4-layer Llama on synthetic tasks)");
    auto o = std::make_shared<TrainOptions>();
    auto t = std::make_shared<TextFlags>();
    add_source_flags(sub, *o);
    add_model_flags(sub, *o);
    add_batch_flags(sub, *o, *t);
    add_optimizer_flags(sub, *o, *t);
    add_augment_flags(sub, *o);
    add_eval_flags(sub, *o, *t);
    add_device_flags(sub, *o);
    add_cuda_flags(sub, *o, *t);
    add_instrument_flags(sub, *o, *t);
    return {sub, [sub, o, t, hooks] {
                o->hooks = hooks;
                return run_train_command(*sub, *o, *t);
            }};
}

}  // namespace anvil::cli
