// TrainOptions <-> JSON, for trainer_state.json. Keys are the CLI flags with '-' written '_'.
#include "train/options.h"

#include "core/error.h"

namespace anvil {

// Every option, as X(field): the JSON key is the field's name (more fields than nlohmann's macros take).
// clang-format off
#define ANVIL_TRAIN_OPTIONS(X) \
    X(data) X(tokenizer) X(text_field) X(prompt_template) X(init) X(resume) X(out) X(val_fraction) X(layers) \
    X(heads) X(dim) X(vocab) X(seq) X(batch) X(grad_accum) X(steps) X(lr) X(min_lr_frac) X(weight_decay) \
    X(grad_clip) X(beta1) X(beta2) X(eps) X(lr_schedule) X(warmup) X(seed) X(shuffle) X(eval_every) \
    X(eval_batches) X(eval_examples) X(log_every) X(save_every) X(keep_checkpoints) X(device) X(threads) \
    X(profile) X(embedded) X(batch_auto) X(global_batch) X(memory_limit) X(price_per_hour) X(peak_tflops) \
    X(bench) X(monitor_interval) X(tensorboard) X(precision) X(recompute) X(attention) X(attn_fwd_rows) \
    X(gemm_tune) X(lora_rank) \
    X(lora_alpha) X(lora_dropout) X(lora_targets) X(rslora) X(adapter) X(arch) X(kv_heads) X(ffn_dim) \
    X(rope_theta) X(norm_eps) X(tie_embeddings) X(max_shard_size) X(comm_timeout) X(zero) X(tensor_parallel) \
    X(logits_chunk) X(eval_choices) X(eval_choices_limit) X(sample_every) X(sample_prompt) X(sample_tokens) \
    X(decay_frac) X(keep_best) X(early_stop) X(dropout) X(attn_dropout) \
    X(skip_loss_z) X(skip_grad_z) X(skip_window) X(augment) X(augment_fields) X(synonyms) X(augment_p) \
    X(augment_prob) X(neftune_alpha) X(fp8_scaling) X(fp8_history)
// clang-format on

namespace {

void to_json(nlohmann::json& j, const TrainOptions& o) {
#define ANVIL_TO(f) j[#f] = o.f;
    ANVIL_TRAIN_OPTIONS(ANVIL_TO)
#undef ANVIL_TO
}

// Missing keys keep their defaults (a checkpoint written before an option existed).
void from_json(const nlohmann::json& j, TrainOptions& o) {
    const TrainOptions d;
#define ANVIL_FROM(f) o.f = j.value(#f, d.f);
    ANVIL_TRAIN_OPTIONS(ANVIL_FROM)
#undef ANVIL_FROM
}

}  // namespace

nlohmann::json options_to_json(const TrainOptions& o) {
    nlohmann::json j;
    to_json(j, o);
    return j;
}

void options_from_json(const nlohmann::json& j, TrainOptions& o) {
    try {
        if (const auto r = j.find("recompute"); r != j.end() && r->is_boolean()) {
            // written before --recompute took a mode: true was what is now "selective"
            nlohmann::json k = j;
            k["recompute"] = r->get<bool>() ? "selective" : "off";
            return from_json(k, o);
        }
        from_json(j, o);
    } catch (const nlohmann::json::exception& e) {
        fail("trainer_state.json: options are malformed ({})", e.what());
    }
}

TrainOptions embedded_default_options() {
    TrainOptions o;
    o.embedded = true;
    // Llama (RoPE): copying, reversing and sorting letters are relative-position skills, which rotary
    // positions give almost for free and GPT-2's learned absolute positions must learn. At 1000 steps the
    // same 4 x 128 GPT-2 reached 61% exact match, the Llama 98%; 900 Llama steps (97%) cost two thirds of
    // the 1500 GPT-2 steps (also 97%) the demo took before.
    o.arch = "llama";
    o.layers = 4;
    o.heads = 4;
    o.dim = 128;
    o.seq = 64;
    o.batch = 32;
    o.steps = 900;
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

}  // namespace anvil
