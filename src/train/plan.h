// anvil plan: what a training run needs before a card is rented. For each card kind: the memory one rank
// holds (counted by a dry run of the run's own model, optimizer and activations: dry_backend.h), the
// largest micro-batch, the accumulation that reaches the global batch, whether ZeRO-1 or tensor
// parallelism is needed and on how many cards; the speed from FLOPs per token at anvil's measured rate on
// that card (or an assumed one, said so), with data parallelism's exposed communication from the step-time
// model (bench/step_time_model.py's, ported); time to the token budget, cost and tokens per dollar.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "backend/dry_backend.h"
#include "model/config.h"
#include "model/lora.h"
#include "monitor/cards.h"
#include "train/options.h"

namespace anvil {

// The run being planned: its model, and the training flags that change memory or speed (precision,
// recompute, logits_chunk, seq, zero, tensor_parallel, threads from `opts`; the LoRA adapters).
struct PlanRun {
    ModelConfig config;
    TrainOptions opts;
    LoraOptions lora;
    int64_t tokens = 0;         // the budget
    int64_t global_tokens = 0;  // tokens per optimizer step
    int micro = 0;              // a given micro-batch (--batch); 0: the largest that fits
};

// Bytes one rank holds, by what holds them.
struct MemoryUse {
    size_t weights = 0, grads = 0, optimizer = 0, activations = 0, workspace = 0, other = 0;
    size_t logits = 0;  // of the activations: the logits kept at once (--logits-chunk)
    size_t total() const { return weights + grads + optimizer + activations + workspace + other; }
};

// The memory of one rank, counted by building the run's model, AdamW, Trainer and activations on a
// DryBackend for the target: the peak the run itself reports (its summary's peak_mem_mb).
class MemoryPlanner {
public:
    MemoryPlanner(const PlanRun& run, const DryTarget& target);
    // A micro-batch of B sequences, accum of them a step, tensor parallel over tp ranks, the optimizer
    // state sharded over zero_world ranks (1: whole). Results are kept.
    MemoryUse use(int B, int accum, int tp, int zero_world);
    // Why the model does not split over tp ranks ("" when it does).
    std::string split_problem(int tp);
    // Parameters: all, trainable; one block's (all of them, the trainable ones: a gradient bucket) and the
    // trainable ones outside the blocks.
    int64_t params() const { return params_; }
    double layer_params() const { return layer_params_; }
    int64_t trainable() const { return trainable_; }
    double layer_trainable() const { return layer_trainable_; }
    double rest_trainable() const { return rest_trainable_; }
    size_t grad_bytes() const { return grad_bytes_; }  // a gradient element's size

private:
    const PlanRun& run_;
    DryTarget target_;
    int64_t params_ = 0, trainable_ = 0;
    double layer_params_ = 0, layer_trainable_ = 0, rest_trainable_ = 0;
    size_t grad_bytes_ = 4;
    std::map<std::tuple<int, int, int, int>, MemoryUse> kept_;
    std::map<int, std::string> split_;
};

// One optimizer step's times on `dp` data-parallel replicas of `tp` cards each (bench/step_time_model.py's
// step(), with tensor parallelism's all-reduces added): the micro-batches' compute at `rate` FLOP/s per
// card; the gradient buckets' collectives on one stream, each started as its block's backward ends in the
// last micro-batch (what the backward does not hide is exposed); AdamW memory-bound at `hbm` bytes/s;
// ZeRO-1's all-gather of the weights, which nothing hides.
struct StepShape {
    int layers = 0;
    double flops_per_token = 0;          // forward and backward
    double bwd_head = 0, bwd_layer = 0;  // the backward's FLOPs per token in the head, in one block
    double layer_params = 0, rest_params = 0, params = 0;  // trainable: per block, outside, all
    double grad_bytes = 2;
    double tp_bytes_per_token = 0;  // tensor parallel: bytes all-reduced per token and block (4 collectives)
    int64_t global_tokens = 0;
    int64_t micro_tokens = 0;  // one micro-batch's, per replica
};
struct StepTime {
    double compute_s = 0, reduce_s = 0, exposed_reduce_s = 0, optimizer_s = 0, allgather_s = 0, tp_s = 0;
    double step_s = 0, comm_share = 0, tokens_per_s = 0;
};
StepTime step_time(const StepShape& s, int dp, int tp, bool zero, double rate, double hbm, const Link& link);

// A card's training rate in FLOP/s (anvil's convention: ModelConfig::flops_per_token), measured where a
// record exists for the card and precision (the nearest micro-batch), else assumed, with where it came from.
struct CardRate {
    double flops = 0;
    bool measured = false;
    std::string source;
};
CardRate card_rate(const CardKind& card, const std::string& precision, int64_t micro_tokens);

struct Layout {
    int cards = 1, tp = 1, dp = 1;
    bool zero = false;
    int micro = 0, accum = 1;  // sequences per micro-batch, micro-batches per step
    int max_micro = 0;         // the largest micro-batch that fits
};

struct CardPlan {
    const CardKind* card = nullptr;  // null: this machine's CPU
    int requested = 0;               // the cards --gpus asked for (0: the fewest that fit)
    bool fits = false;
    std::string why;  // when it does not fit: what would
    Layout layout;
    MemoryUse mem;
    size_t one_sequence = 0;  // the activations of a micro-batch of one sequence
    size_t usable = 0;        // bytes a rank may allocate
    CardRate rate;
    StepShape shape;  // what the step-time model was given
    Link link;
    double hbm = 0;
    StepTime step;
    double hours = 0, usd = 0, tokens_per_usd = 0, usd_per_hour = 0;
};

// What --gpus asks for: a kind and a count (0: the fewest cards that fit, and a full node beside it).
struct CardRequest {
    std::string kind;  // a card kind, or "cpu"
    int count = 0;
};
std::vector<CardRequest> parse_gpus(const std::string& spec);  // "h100:8,a100-80" ; "" = the default list
// --price KIND=USD, repeatable.
std::map<std::string, double> parse_prices(const std::vector<std::string>& specs);

struct Plan {
    std::vector<CardPlan> rows;
    int cheapest = -1, fastest = -1;  // rows that fit; -1 none
    double flops_per_token = 0;
    int64_t params = 0, trainable = 0;
    int64_t global_tokens = 0;
};
Plan make_plan(const PlanRun& run, const std::vector<CardRequest>& gpus,
               const std::map<std::string, double>& prices);

}  // namespace anvil
