// TrainOptions <-> JSON, for trainer_state.json. Keys are the CLI flags with '-' written '_'.
#include "train/options.h"

#include "core/error.h"

namespace anvil {

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(
    TrainOptions, data, tokenizer, text_field, prompt_template, init, resume, out, val_fraction, layers,
    heads, dim, vocab, seq, batch, grad_accum, steps, lr, min_lr_frac, weight_decay, grad_clip, beta1, beta2,
    eps, lr_schedule, warmup, seed, shuffle, eval_every, eval_batches, eval_examples, log_every, save_every,
    keep_checkpoints, device, threads, profile, embedded, batch_auto, global_batch, memory_limit,
    price_per_hour, peak_tflops, bench, monitor_interval, tensorboard, precision, recompute, attention,
    lora_rank, lora_alpha, lora_dropout, lora_targets, rslora, adapter, arch, kv_heads, ffn_dim, rope_theta,
    norm_eps, tie_embeddings, max_shard_size, comm_timeout, zero)

nlohmann::json options_to_json(const TrainOptions& o) {
    return o;
}

void options_from_json(const nlohmann::json& j, TrainOptions& o) {
    try {
        o = j.get<TrainOptions>();
    } catch (const nlohmann::json::exception& e) {
        fail("trainer_state.json: options are malformed ({})", e.what());
    }
}

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

}  // namespace anvil
