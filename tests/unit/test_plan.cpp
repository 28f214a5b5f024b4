// anvil plan's parts: the dry backend counts what the CPU backend allocates for a training run, byte for
// byte; the step-time model keeps bench/step_time_model.py's invariants; card rates come from the records;
// bad
// --gpus, --price and --tokens are refused naming the flag.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/device_sizes.h"
#include "backend/dry_backend.h"
#include "core/sizes.h"
#include "model_harness.h"
#include "train/optimizer.h"
#include "train/plan.h"
#include "train/trainer.h"

namespace anvil {
namespace {

using test::expect_error;

// What a training run holds on `be`: the model, AdamW (sharded over `zero_world`), the trainer's scalars and
// the activations of a B x T micro-batch.
size_t held_for_training(Backend& be, const ModelConfig& c, const ModelOptions& mo, int B, int T,
                         int zero_world) {
    auto model = make_model(be, c, mo);
    AdamW opt(model->params(), 0.1f, OptShard{0, zero_world});
    Trainer trainer(*model, opt, 0);
    model->reserve(B, T, true);
    return be.memory_in_use();
}

TEST(Plan, DryBackendCountsWhatTheCpuBackendAllocates) {
    struct Case {
        ModelConfig c;
        Recompute r;
        int lora_rank, zero_world, B;
    };
    ModelConfig gpt2 = test::tiny(), llama = test::tiny_llama();
    gpt2.n_ctx = llama.n_ctx = 16;
    const Case cases[] = {{gpt2, Recompute::Off, 0, 1, 3},
                          {gpt2, Recompute::Selective, 0, 1, 2},
                          {gpt2, Recompute::Full, 0, 2, 4},
                          {llama, Recompute::Off, 0, 1, 2},
                          {llama, Recompute::Full, 0, 1, 5},
                          {llama, Recompute::Off, 4, 1, 2},
                          {test::tiny_llama(true), Recompute::Selective, 0, 3, 1}};
    for (const Case& k : cases) {
        ModelOptions mo;
        mo.recompute = k.r;
        mo.logits_chunk_bytes = 2048;  // chunked for some batches
        mo.lora.rank = k.lora_rank;
        CpuBackend cpu(3);
        DryBackend dry(DryTarget{Device::CPU, 3, AttentionImpl::Auto});
        const int T = std::min(k.c.n_ctx, 12);
        EXPECT_EQ(held_for_training(dry, k.c, mo, k.B, T, k.zero_world),
                  held_for_training(cpu, k.c, mo, k.B, T, k.zero_world))
            << k.c.model_type << " recompute " << recompute_name(k.r) << " lora " << k.lora_rank;
        EXPECT_EQ(dry.memory_peak(), cpu.memory_peak());
    }
}

TEST(Plan, DryBackendKeepsTheCudaBackendsChoices) {
    ModelConfig c = test::tiny();
    c.n_ctx = 64;
    ModelOptions mo;
    mo.dtype = DType::BF16;
    DryBackend cuda(DryTarget{Device::CUDA, 1, AttentionImpl::Auto});
    EXPECT_EQ(cuda.memory_in_use(), (size_t(96) << 20) + sizes::kCudaDirectDoneBytes)
        << "the workspaces and the direct products' counters its constructor allocates";
    // bf16 on the tensor cores: the flash kernels keep one f32 per row and head (in bf16 elements, two each)
    const AttnDims d{4, 64, 2, 4, DType::BF16};
    EXPECT_EQ(cuda.attention_saved_elems(d), size_t(4 * 2 * 64 * 2));
    // f32 under auto: cuBLASLt's path keeps the probabilities
    EXPECT_EQ(cuda.attention_saved_elems({4, 64, 2, 4, DType::F32}), size_t(4 * 2 * 64 * 64));
    DryBackend flash(DryTarget{Device::CUDA, 1, AttentionImpl::Flash});
    EXPECT_EQ(flash.attention_saved_elems({4, 64, 2, 4, DType::F32}), size_t(4 * 2 * 64 * 2));
    const size_t before = cuda.memory_in_use();
    EXPECT_GT(held_for_training(cuda, c, mo, 2, 64, 1), before);
}

// bench/step_time_model.py's check(), on the C++ port: GPT-2 124M on 8 H100s
TEST(Plan, StepTimeKeepsTheModelsInvariants) {
    StepShape s;
    s.layers = 12;
    const double d = 768, V = 50304, T = 1024, layer = 12 * d * d + 13 * d, rest = V * d + T * d + 2 * d;
    s.params = 12 * layer + rest;
    ASSERT_EQ(s.params, 124475904.0);
    s.layer_params = layer, s.rest_params = rest, s.grad_bytes = 2;
    s.flops_per_token = 6 * s.params + 6 * 12 * d * T;
    s.bwd_head = 4 * V * d, s.bwd_layer = 4 * layer + 4 * d * T;
    s.global_tokens = 524288, s.micro_tokens = 64 * 1024;
    const Link nvlink{460e9, 20e-6}, no_alpha{460e9, 0};
    const double rate = 400e12, hbm = 3e12;
    const StepTime one = step_time(s, 1, 1, false, rate, hbm, nvlink);
    EXPECT_EQ(one.reduce_s, 0.0);
    EXPECT_EQ(one.exposed_reduce_s, 0.0);
    EXPECT_NEAR(one.compute_s, 524288 * s.flops_per_token / rate, 1e-12);
    const StepTime fast = step_time(s, 8, 1, false, rate, hbm, Link{1e30, 0});
    EXPECT_LT(fast.exposed_reduce_s, 1e-12);
    // a backward that takes no time hides nothing: the whole all-reduce is exposed
    const StepTime inst = step_time(s, 8, 1, false, 1e30, hbm, no_alpha);
    const double whole = s.params * 2 * 2 * 7 / 8 / 460e9;
    EXPECT_NEAR(inst.exposed_reduce_s, whole, 1e-9);
    EXPECT_NEAR(inst.reduce_s, whole, 1e-9);
    // a long backward hides all but the last two buckets (block 0, and the embeddings and head)
    const StepTime r = step_time(s, 8, 1, false, rate, hbm, no_alpha);
    EXPECT_NEAR(r.exposed_reduce_s, (layer + rest) * 2 * 2 * 7 / 8 / 460e9, 1e-9);
    // ZeRO-1: an eighth of AdamW, and an all-gather of every bf16 weight that nothing hides
    const StepTime z = step_time(s, 8, 1, true, rate, hbm, no_alpha);
    EXPECT_NEAR(z.optimizer_s, r.optimizer_s / 8, 1e-12);
    EXPECT_NEAR(z.allgather_s, s.params * 2 / 460e9, 1e-12);
    // tensor parallelism: the products split over the cards, its all-reduces exposed
    const StepTime tp = step_time(s, 4, 2, false, rate, hbm, nvlink);
    EXPECT_NEAR(tp.compute_s, 524288.0 / 4 * s.flops_per_token / (2 * rate), 1e-12);
    EXPECT_NEAR(tp.tp_s, 2 * 12 * 4 * 20e-6, 1e-12)
        << "no bytes per token given: 4 collectives' latency a block";
    s.tp_bytes_per_token = 4 * d * 2;
    EXPECT_GT(step_time(s, 4, 2, false, rate, hbm, nvlink).tp_s, 0.0);
}

TEST(Plan, RatesComeFromTheRecords) {
    const CardRate h100 = card_rate(*find_card("h100"), "bf16", 16 * 1024);
    EXPECT_TRUE(h100.measured);
    EXPECT_NE(h100.source.find("2026-11-27-h100.json"), std::string::npos) << h100.source;
    const CardRate a100 = card_rate(*find_card("a100"), "bf16", 16 * 1024);
    EXPECT_FALSE(a100.measured);
    EXPECT_NE(a100.source.find("assumed"), std::string::npos) << a100.source;
    EXPECT_NEAR(a100.flops / h100.flops, 312.0 / 989.4, 1e-9) << "the H100's share of the datasheet";
    // FP8: measured on the H200, assumed elsewhere from the H200's ratio to bf16
    EXPECT_TRUE(card_rate(*find_card("h200"), "fp8", 16 * 1024).measured);
    const CardRate fp8 = card_rate(*find_card("h100"), "fp8", 16 * 1024);
    EXPECT_FALSE(fp8.measured);
    EXPECT_LT(fp8.flops, h100.flops);
}

TEST(Plan, BadInputNamesTheFlag) {
    expect_error([] { parse_gpus("h100:8,b200"); }, "unknown card kind b200");
    expect_error([] { parse_gpus("h100:0"); }, "whole number");
    EXPECT_EQ(parse_gpus("cpu:2")[0].count, 2) << "processes on this machine";
    EXPECT_EQ(parse_gpus("a100:4,h100").size(), 2u);
    EXPECT_EQ(parse_gpus("a100:4")[0].count, 4);
    EXPECT_GE(parse_gpus("").size(), 7u);
    expect_error([] { parse_prices({"h100"}); }, "KIND=USD");
    expect_error([] { parse_prices({"h100=cheap"}); }, "dollars");
    EXPECT_DOUBLE_EQ(parse_prices({"a100=1.5"}).at("a100-80"), 1.5);
    EXPECT_EQ(parse_count("10B", "--tokens"), 10000000000ull);
    EXPECT_EQ(parse_count("2.5M", "--tokens"), 2500000ull);
    expect_error([] { parse_count("0", "--tokens"); }, "--tokens 0");
    expect_error([] { parse_count("12Q", "--tokens"); }, "positive count");
}

}  // namespace
}  // namespace anvil
