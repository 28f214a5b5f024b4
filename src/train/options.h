// The options of a training run (the `anvil train` flags) and their JSON form in trainer_state.json.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace anvil {

// What a caller that embeds a run (the Python layer) sees of it.
struct TrainHooks {
    // After each step, its metrics record (metrics.jsonl's, every step); false stops the run after that step,
    // which then checkpoints as on SIGINT.
    std::function<bool(const nlohmann::json& record)> on_step;
    // When the run ends (rank 0): where and at which step.
    struct End {
        std::string out;        // the run directory
        std::string model_dir;  // what it wrote last: final/, or the interruption's checkpoint-N/
        int64_t step = 0;       // the steps done
        bool interrupted = false;
    };
    std::function<void(const End&)> on_end;
};

struct TrainOptions {
    // data and model sources
    std::string data;       // empty = the embedded synthetic instruction set
    std::string tokenizer;  // empty = the checkpoint's, or "byte" for a new model
    std::string text_field = "text";
    // auto, alpaca, compact, llama3, chatml, llama2, mistral, zephyr (data/chat.h)
    std::string prompt_template = "auto";
    std::string init;    // start from this HF GPT-2 model directory (the base, with LoRA)
    std::string resume;  // continue this training checkpoint (or run directory)
    // --resume auto found no checkpoint in --out: this run starts it (not kept with the options; a failed
    // attempt's metrics.jsonl is moved aside instead of refusing the directory)
    bool resume_auto = false;
    // --max-restarts: a supervising process restarts the training process this many times
    // (train/supervisor.h; not kept with the options: a process question, not the run's)
    int max_restarts = 0;
    std::string out;  // run directory (default runs/<timestamp>)
    double val_fraction = 0.1;
    // model shape (new models only)
    std::string arch = "gpt2";  // the family: gpt2 or llama
    int layers = 4, heads = 4, dim = 128;
    // llama: key/value heads (0 = heads), MLP width (0 = the family's), rope theta and RMSNorm eps (0 = the
    // family's: 10000, 1e-6), a head tied to the embedding
    int kv_heads = 0, ffn_dim = 0;
    double rope_theta = 0, norm_eps = 0;
    bool tie_embeddings = false;
    int vocab = 0;  // rows of the embedding: 0 = the tokenizer's; larger pads it (GPT-2: 50304)
    std::string attention = "auto";  // CUDA attention: auto, gemm, flash, flash-simt or cudnn
    int attn_fwd_rows = 64;  // CUDA: query rows a block of the tensor-core attention forward, 64 or 128
    bool gemm_tune = false;  // CUDA: time cuBLASLt's algorithms per product shape and keep the fastest
    int seq = 0;             // 0 = the model's context (128 for a new model)
    // LoRA (PEFT's LoraConfig): adapters on the targeted linear layers of the --init base, all else frozen
    int lora_rank = 0;  // 0 = full fine-tuning
    float lora_alpha = 8.0f, lora_dropout = 0.0f;
    std::string lora_targets;  // comma-separated module-name suffixes (empty: the family's default, c_attn)
    bool rslora = false;
    std::string adapter;  // continue training this PEFT adapter directory
    // optimisation
    int batch = 8, grad_accum = 1, steps = 1000;
    bool batch_auto = false;   // --batch auto: search the micro-batch, keep global_batch via accumulation
    int global_batch = 0;      // sequences per optimizer step with --batch auto (0 = 64)
    std::string memory_limit;  // --memory-limit: pretend the device has this much memory ("2G", "512M")
    float lr = 3e-4f, min_lr_frac = 0.1f, weight_decay = 0.1f, grad_clip = 1.0f;
    // skip the update of a step whose loss (gradient norm) z-score over the last 128 steps exceeds this
    // (llm.c's -sl, -sg; Trainer's OutlierSkip); 0 = off
    float skip_loss_z = 0.0f, skip_grad_z = 0.0f;
    int skip_window = 128;  // the steps those z-scores look back over
    float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
    // on the embeddings, the residual branches and (unless attn_dropout says otherwise) the attention
    // probabilities while training (ModelOptions::dropout, attn_dropout)
    float dropout = 0.0f;
    float attn_dropout = -1.0f;  // the attention probabilities' dropout; below 0: dropout's
    float attn_dropout_rate() const { return attn_dropout < 0.0f ? dropout : attn_dropout; }
    // NEFTune's alpha (ModelOptions::neftune_alpha); 0: off
    float neftune_alpha = 0.0f;
    std::string lr_schedule = "cosine";  // cosine, linear, constant or wsd (train/schedule.h)
    float decay_frac = 0.2f;             // wsd: the last share of the steps, decaying
    int warmup = 0;
    uint64_t seed = 1337;
    bool shuffle = true;
    // --augment: label-safe augmentation drawn afresh each epoch (data/augment.h): the operations, the share
    // of words an operation changes, a record's chance of an augmented copy in an epoch, the fields, the
    // synonym list
    std::string augment, augment_fields = "instruction", synonyms;
    float augment_p = 0.1f, augment_prob = 0.5f;
    // reporting and checkpoints
    int eval_every = 0;    // 0 = only at the end
    int eval_batches = 0;  // 0 = the whole validation split
    int eval_examples = 200;
    std::string eval_choices;    // a multiple-choice JSONL (HellaSwag) scored with the validation loss
    int eval_choices_limit = 0;  // its first N items (0 = all)
    // text sampled from the model every N steps (0 = never), as llm.c does: from the prompt (empty: from the
    // end-of-text token, or BOS), seeded by --seed and the step
    int sample_every = 0;
    std::string sample_prompt;
    int sample_tokens = 64;
    int log_every = 10;
    int save_every = 0;  // 0 = only at the end
    int keep_checkpoints = 2;
    // with --eval-every: OUT/best, a checkpoint of the lowest validation loss so far; stop once that many
    // evaluations in a row have not improved on it (0 = never)
    bool keep_best = true;
    int early_stop = 0;
    // model weights in shards of at most this size (Hugging Face's layout)
    std::string max_shard_size = "5G";
    // execution
    std::string device = "auto";  // CUDA when a usable GPU is visible, else the CPU
    std::string precision =
        "auto";  // fp32, bf16, fp16 (dynamic loss scaling); auto: bf16 on CUDA, fp32 on CPU
    // with fp8: each operand's scale from its own amax (current) or from the largest of its last
    // fp8_history uses' amaxes (delayed, Transformer Engine's recipe)
    std::string fp8_scaling = "current";
    int fp8_history = 1024;
    // what the backward recomputes instead of keeping: off, selective (layer norms, GELU/SwiGLU) or full
    // (every block from its input: activation checkpointing)
    std::string recompute = "off";
    // the most logits kept at once: past it the loss is taken a chunk of sequences at a time (0: never)
    std::string logits_chunk = "256M";
    int threads = 0;
    bool profile = false;       // time every backend op and print the table at the end
    double comm_timeout = 600;  // seconds any collective of a multi-process job may take
    int zero = 0;               // 1: ZeRO-1, the optimizer state sharded over the data-parallel ranks
    int tensor_parallel = 1;    // ranks that split each model (Megatron's layout); the rest is data parallel
    // instruments
    std::string price_per_hour;  // dollars per hour or a preset name
    double peak_tflops = 0;      // the MFU denominator; 0 = measured (CPU) or the datasheet (GPU)
    std::string bench;           // or: the matmul rate from an `anvil bench --json` file
    double monitor_interval = 0.5;
    bool tensorboard = true;  // write TensorBoard event files into the run directory
    bool embedded = false;    // set when running the embedded default
    // A caller that embeds the run (the Python layer; not an option, never stored): see its steps, stop it,
    // learn where it ended.
    std::shared_ptr<const TrainHooks> hooks;
};

nlohmann::json options_to_json(const TrainOptions& o);
void options_from_json(const nlohmann::json& j, TrainOptions& o);

// The embedded default: what `anvil train` with no --data runs.
TrainOptions embedded_default_options();

}  // namespace anvil
