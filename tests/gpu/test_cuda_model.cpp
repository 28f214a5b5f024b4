// The whole model on the GPU: fp32 loss and every gradient equal to the CPU backend's within 1e-4, bf16 and
// fp16 (with loss scaling) training tracking the fp32 loss curve, runs that repeat bit for bit, and
// activation recomputation giving the same gradients.
#include <cmath>

#include "../unit/model_harness.h"
#include "dist/comm.h"
#include "gpu_harness.h"
#include "model/generate.h"
#include "train/data_parallel.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace anvil::test {
namespace {

// GPT-2, or Llama with grouped-query attention (4 heads, 2 key/value heads) and an untied head.
ModelConfig small(const std::string& family = "gpt2") {
    ModelConfig c;
    c.model_type = family;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_embd = 64;
    c.n_ctx = 64;
    c.vocab_size = 96;
    if (family != "gpt2") {  // llama, or qwen2: llama with biases on q, k and v
        c.n_kv_head = 2;
        c.ffn_dim = 160;
        c.norm_eps = 1e-6;
        c.tie_embeddings = false;
        c.qkv_bias = family == "qwen2";
    }
    return c;
}

// Token streams with structure to learn: each sequence follows x -> (5x + 3) mod V from a random start,
// with a little noise, so the loss falls well below log V within tens of steps.
struct Batches {
    int B, T, V;
    std::vector<int32_t> tok, tgt;
    Batches(int B_, int T_, int V_, int steps, uint64_t seed) : B(B_), T(T_), V(V_) {
        std::mt19937_64 g(seed);
        for (int s = 0; s < steps; s++)
            for (int b = 0; b < B; b++) {
                int32_t x = int32_t(g() % uint64_t(V));
                std::vector<int32_t> seq;
                for (int t = 0; t <= T; t++) {
                    seq.push_back(x);
                    x = g() % 10 == 0 ? int32_t(g() % uint64_t(V)) : (5 * x + 3) % V;
                }
                tok.insert(tok.end(), seq.begin(), seq.end() - 1);
                tgt.insert(tgt.end(), seq.begin() + 1, seq.end());
            }
    }
    StepBatch step(int s) const {
        const size_t per = size_t(B) * T;
        return StepBatch{tok.data() + per * size_t(s), tgt.data() + per * size_t(s), int64_t(per)};
    }
};

// One model + optimizer on a backend, stepping through the trainer's own step.
struct TrainRun {
    std::unique_ptr<Model> model;
    std::unique_ptr<AdamW> opt;
    std::unique_ptr<Trainer> trainer;
    float loss_scale;
    TrainRun(Backend& be, DType dt, uint64_t seed, int B, int T, Recompute recompute = Recompute::Off,
             LoraOptions lora = {}, const ModelConfig& cfg = small(), bool fp8 = false,
             size_t logits_chunk = ModelOptions{}.logits_chunk_bytes, float dropout = 0.0f) {
        ModelOptions mo;
        mo.logits_chunk_bytes = logits_chunk;
        mo.dropout = mo.attn_dropout = dropout;  // nanoGPT's dropout: the attention probabilities too
        mo.dtype = dt;
        mo.recompute = recompute;
        mo.lora = lora;
        mo.fp8 = fp8;
        model = make_model(be, cfg, mo);
        opt = std::make_unique<AdamW>(model->params(), 0.1f);
        model->params().init(seed, [&](size_t i, const float* f32) { opt->set_master(i, f32); });
        model->reserve(B, T, true);
        trainer = std::make_unique<Trainer>(*model, *opt);
        if (dt == DType::F16) trainer->scaler().scale = 1024.0f;  // fixed: no overflow in 40 steps here
        loss_scale = trainer->scaler().scale;
    }
    double grads_only(const StepBatch& b, int B, int T) { return trainer->gradients(b, 1, B, T).loss; }
    double step(const StepBatch& b, int B, int T, int step_no) {
        AdamWArgs a;
        a.lr = 3e-3f;
        a.step = step_no + 1;
        a.max_grad_norm = 1.0f;
        return trainer->step(b, 1, B, T, a).loss;
    }
    std::vector<std::vector<float>> grads() {
        std::vector<std::vector<float>> g;
        const ParamStore& s = model->params();
        for (size_t i : s.trainable()) {
            g.push_back(get(model->backend(), s.grad(i)));
            for (float& x : g.back()) x /= loss_scale;
        }
        return g;
    }
    std::vector<std::vector<float>> weights() {
        std::vector<std::vector<float>> w;
        for (size_t i = 0; i < model->params().size(); i++) {
            w.emplace_back(size_t(model->params().spec(i).shape.numel()));
            opt->weights_f32(i, w.back().data());
        }
        return w;
    }
};

class CudaModel : public ::testing::Test {
protected:
    Backends be;
};

class CudaModelAttention : public CudaModel,
                           public ::testing::WithParamInterface<std::tuple<AttentionImpl, const char*>> {};

// Step 0's fp32 loss and every gradient on the GPU within 1e-4 of the CPU's; returns the loss.
double expect_step_matches_the_cpu(TrainRun& cpu, TrainRun& gpu, const StepBatch& batch, int B, int T) {
    const double lc = cpu.grads_only(batch, B, T), lg = gpu.grads_only(batch, B, T);
    EXPECT_LE(std::abs(lg - lc), 1e-4 * std::abs(lc)) << "loss: gpu " << lg << " cpu " << lc;
    const auto gc = cpu.grads(), gg = gpu.grads();
    const ParamStore& store = cpu.model->params();
    for (size_t k = 0; k < gc.size(); k++) {
        const size_t i = store.trainable()[k];
        double num = 0.0, den = 0.0, scale = 0.0;
        for (size_t e = 0; e < gc[k].size(); e++) {
            num += std::pow(double(gg[k][e]) - double(gc[k][e]), 2);
            den += std::pow(double(gc[k][e]), 2);
            scale = std::max(scale, double(std::abs(gc[k][e])));
        }
        EXPECT_LE(std::sqrt(num), 1e-4 * std::sqrt(den)) << store.spec(i).name << ": relative L2 error";
        EXPECT_TRUE(all_close(gg[k], gc[k], 1e-4, 1e-4 * scale, store.spec(i).name));
    }
    return lc;
}

TEST_P(CudaModelAttention, Fp32LossAndGradientsMatchTheCpu) {
    const int B = 3, T = 48;
    const ModelConfig cfg = small(std::get<1>(GetParam()));
    const Batches data(B, T, cfg.vocab_size, 1, test_seed());
    auto gpu_be = make_backend({Device::CUDA, 0, 0, std::get<0>(GetParam())});
    TrainRun cpu(*be.cpu, DType::F32, 7, B, T, Recompute::Off, {}, cfg),
        gpu(*gpu_be, DType::F32, 7, B, T, Recompute::Off, {}, cfg);
    expect_step_matches_the_cpu(cpu, gpu, data.step(0), B, T);
}

// --dropout: the masks are the CPU's (the same hash of the same pass seed), so the fp32 step matches it too,
// and differs from the step without dropout; the attention probabilities' masks through both attention
// paths (gemm, and flash: the CUDA-core kernels in fp32).
TEST_F(CudaModel, DropoutMatchesTheCpu) {
    const int B = 3, T = 48;
    auto flash = make_backend({Device::CUDA, 0, 0, AttentionImpl::Flash});
    for (const char* family : {"gpt2", "llama"})
        for (Backend* gpu_be : {be.gpu.get(), flash.get()}) {
            SCOPED_TRACE(std::string(family) + (gpu_be == flash.get() ? " flash" : " auto"));
            const ModelConfig cfg = small(family);
            const Batches data(B, T, cfg.vocab_size, 1, test_seed());
            const size_t chunk = ModelOptions{}.logits_chunk_bytes;
            TrainRun cpu(*be.cpu, DType::F32, 7, B, T, Recompute::Off, {}, cfg, false, chunk, 0.2f),
                gpu(*gpu_be, DType::F32, 7, B, T, Recompute::Off, {}, cfg, false, chunk, 0.2f),
                plain(*gpu_be, DType::F32, 7, B, T, Recompute::Off, {}, cfg);
            expect_step_matches_the_cpu(cpu, gpu, data.step(0), B, T);
            plain.grads_only(data.step(0), B, T);
            const auto g = gpu.grads(), p = plain.grads();
            double num = 0.0,
                   den = 0.0;  // all gradients together: dropout moves them by far more than rounding
            for (size_t k = 0; k < g.size(); k++)
                for (size_t e = 0; e < g[k].size(); e++)
                    num += std::pow(double(g[k][e]) - double(p[k][e]), 2),
                        den += std::pow(double(p[k][e]), 2);
            EXPECT_GT(std::sqrt(num), 0.01 * std::sqrt(den)) << "dropout changed the gradients";
        }
}

INSTANTIATE_TEST_SUITE_P(Attention, CudaModelAttention,
                         ::testing::Combine(::testing::Values(AttentionImpl::Gemm, AttentionImpl::Flash),
                                            ::testing::Values("gpt2", "llama", "qwen2")),
                         [](const auto& p) {
                             return std::string(std::get<0>(p.param) == AttentionImpl::Gemm ? "gemm_"
                                                                                            : "flash_") +
                                    std::get<1>(p.param);
                         });

// 40 AdamW steps from the same weights on the same batches: bf16, fp16 (with a loss scale of 1024) and fp8
// (bf16 with the blocks' products in FP8, every dimension a multiple of 16 so cuBLASLt's FP8 kernels run)
// stay within a few percent of the fp32 loss at every step, and all of them learn. Under cuemu a quarter of
// the tokens a step (the suite's slowest test there, 91 s a family at 4 x 64).
class CudaModelFamily : public CudaModel, public ::testing::WithParamInterface<const char*> {};

TEST_P(CudaModelFamily, LowPrecisionTracksFp32) {
#ifdef ANVIL_CUDA_EMU
    const int B = 2, T = 32, steps = 40;
#else
    const int B = 4, T = 64, steps = 40;
#endif
    const ModelConfig cfg = small(GetParam());
    const Batches data(B, T, cfg.vocab_size, steps, test_seed());
    constexpr int kRuns = 4;
    std::vector<double> curve[kRuns];
    const DType dts[kRuns] = {DType::F32, DType::BF16, DType::F16, DType::BF16};
    const char* names[kRuns] = {"fp32", "bf16", "fp16", "fp8"};
    for (int r = 0; r < kRuns; r++) {
        TrainRun run(*be.gpu, dts[r], 11, B, T, Recompute::Off, {}, cfg, r == 3);
        for (int s = 0; s < steps; s++) curve[r].push_back(run.step(data.step(s), B, T, s));
    }
    for (int r = 0; r < kRuns; r++) {
        SCOPED_TRACE(std::string(GetParam()) + " " + names[r]);
        EXPECT_LT(curve[r].back(), 0.6 * curve[r].front()) << "did not learn";
        if (r == 0) continue;
        double worst = 0.0;
        for (int s = 0; s < steps; s++) {
            ASSERT_TRUE(std::isfinite(curve[r][size_t(s)])) << "step " << s;
            worst =
                std::max(worst, std::abs(curve[r][size_t(s)] - curve[0][size_t(s)]) / curve[0][size_t(s)]);
        }
        EXPECT_LT(worst, 0.05) << "largest relative gap to the fp32 loss curve";
        std::printf("%s %s vs fp32: largest relative loss gap %.4f over %d steps (final %.4f vs %.4f)\n",
                    GetParam(), names[r], worst, steps, curve[r].back(), curve[0].back());
    }
    EXPECT_NE(curve[3], curve[1]) << "the fp8 run must differ from bf16 (its products round to FP8)";
}

// Continuous batching: three prompts prefilled into slots 2, 0, 1 of one cache (each alone, or packed in one
// forward of a row per position, the cache contiguous or paged with shuffled pages), then 6 steps of all
// three rows in one pass each (attention_cached_rows, rope_rows for Llama, embedding_rows_add for GPT-2), the
// same tokens fed on both backends. Every step's logits, rows in order.
std::vector<float> batched_decode_logits(Backend& be, const ModelConfig& cfg, DType dt, bool packed,
                                         bool paged) {
    ModelOptions mo;
    mo.dtype = dt;
    auto m = make_model(be, cfg, mo);
    m->params().init(7);
    const auto steps = decode_rows(
        *m, {{3, 1, 4, 1, 5}, {9}, {2, 6, 5, 3, 5, 8, 9, 7, 9}}, {2, 0, 1}, 6,
        [&](int b, int s) { return int32_t((7 * s + 5 * b + 1) % cfg.vocab_size); }, packed, paged);
    std::vector<float> all;
    for (const auto& l : steps) all.insert(all.end(), l.begin(), l.end());
    return all;
}

TEST_P(CudaModelFamily, BatchedDecodeMatchesTheCpu) {
    const ModelConfig cfg = small(GetParam());
    for (const auto& [packed, paged] : {std::pair{false, false}, {true, false}, {true, true}}) {
        const std::vector<float> want = batched_decode_logits(*be.cpu, cfg, DType::F32, packed, paged);
        double scale = 0.0;
        for (float x : want) scale = std::max(scale, double(std::abs(x)));
        const std::string how = std::string(packed ? " (packed prefill" : "") + (paged    ? ", paged)"
                                                                                 : packed ? ")"
                                                                                          : "");
        EXPECT_TRUE(all_close(batched_decode_logits(*be.gpu, cfg, DType::F32, packed, paged), want, 1e-4,
                              1e-4 * scale, "fp32 decode-step logits" + how));
        EXPECT_TRUE(all_close(batched_decode_logits(*be.gpu, cfg, DType::BF16, packed, paged), want, 5e-2,
                              5e-2 * scale, "bf16 decode-step logits" + how));
    }
}

// A CUDA backend that launches every kernel, recording nothing (BackendOptions::record off)
std::unique_ptr<Backend> launching_backend() {
    BackendOptions o;
    o.device = Device::CUDA;
    o.record = false;
    return make_backend(o);
}

// Decode steps recorded once and replayed as CUDA graphs (Backend::record, Activations::run_recorded) give
// the bits of the same steps launched kernel by kernel (BackendOptions::record off): continuous batching's
// rows (a decode step's slots and positions read from device memory at every replay) and the generator's one
// sequence, sampled, whose steps from the second on are replays.
TEST_P(CudaModelFamily, RecordedDecodeStepsGiveTheLaunchedBits) {
    const ModelConfig cfg = small(GetParam());
    const auto launched = launching_backend();
    for (DType dt : {DType::F32, DType::BF16}) {
        SCOPED_TRACE(dtype_name(dt));
        for (bool packed : {false, true})
            EXPECT_EQ(batched_decode_logits(*be.gpu, cfg, dt, packed, packed),
                      batched_decode_logits(*launched, cfg, dt, packed, packed))
                << (packed ? "packed prefill, paged cache" : "contiguous cache");
        Backend* backends[2] = {be.gpu.get(), launched.get()};
        std::vector<int32_t> tokens[2];
        std::vector<float> logprobs[2];
        size_t replays[2] = {};
        for (int r = 0; r < 2; r++) {
            ModelOptions mo;
            mo.dtype = dt;
            auto m = make_model(*backends[r], cfg, mo);
            m->params().init(7);
            Generator g(*m);
            SampleOptions so;
            so.max_new_tokens = 12;
            so.temperature = 0.9f;
            so.seed = 5;
            tokens[r] = g.generate({3, 1, 4, 1, 5}, so, {}, &logprobs[r]);
            replays[r] = g.replays();
        }
        EXPECT_EQ(tokens[0], tokens[1]);
        EXPECT_EQ(logprobs[0], logprobs[1]);
        // 11 decode steps: the first launched, the second recorded and replayed, the rest replayed
        EXPECT_EQ(replays[0], 10u);
        EXPECT_EQ(replays[1], 0u);
        // greedy: the device picks each decode step's token unless log-probabilities are asked for
        ModelOptions mo;
        mo.dtype = dt;
        auto m = make_model(*be.gpu, cfg, mo);
        m->params().init(7);
        Generator g(*m);
        SampleOptions so;
        so.max_new_tokens = 12;
        so.temperature = 0.0f;
        so.vocab_real = cfg.vocab_size - 5;
        std::vector<float> lps;
        EXPECT_EQ(g.generate({2, 7, 1, 8}, so), g.generate({2, 7, 1, 8}, so, {}, &lps));
    }
}

// One set of activations serving decode steps (each row in a slot of its own: the attention kernel writes the
// keys and values) and packed steps of the same row count (two rows of one slot, the second reading the
// first's key: the write kernel first), each kind twice so that both are recorded and replayed: a recording
// is of one kind of step (the recording's key holds it), so the replays give the bits of the steps launched
// one by one.
TEST_P(CudaModelFamily, DecodeAndPackedStepsOfOneSizeReplayTheirOwnRecordings) {
    const ModelConfig cfg = small(GetParam());
    const auto launched = launching_backend();
    struct Step {
        std::vector<int> slot, pos;
    };
    // three slots: a decode step at positions 0 and 1, then packed (slot 0 twice), decode, packed
    const std::vector<Step> steps = {{{0, 1, 2}, {0, 0, 0}}, {{0, 1, 2}, {1, 1, 1}}, {{0, 0, 1}, {2, 3, 2}},
                                     {{2, 1, 0}, {2, 3, 4}}, {{1, 1, 2}, {4, 5, 3}}, {{2, 2, 0}, {4, 5, 5}}};
    const auto run = [&](Backend& be) {
        auto m = make_model(be, cfg, {});
        m->params().init(7);
        auto cache = m->make_cache(0, 3, 3 * KvCache::pages_for(cfg.n_ctx));
        for (int s = 0; s < 3; s++) {
            std::vector<int32_t> pages(size_t(KvCache::pages_for(cfg.n_ctx)));
            std::iota(pages.begin(), pages.end(), s * int(pages.size()));
            cache->set_pages(s, pages);
        }
        cache->sync();
        auto acts = m->make_activations(3, 1, ActMode::Decode);
        std::vector<float> all;
        for (size_t k = 0; k < steps.size(); k++) {
            const std::vector<int32_t> tok = {int32_t(k + 1), int32_t(2 * k + 3), int32_t(5 * k + 2)};
            const Tensor tokens = acts->get(act::tokens, 3, 1);
            be.upload(tokens, tok.data());
            m->forward(*acts, rows_pass(tokens, cache.get(), steps[k].slot.data(), steps[k].pos.data()));
            const Tensor l = acts->get(act::logits, 3, 1);
            std::vector<float> v(size_t(l.numel()));
            be.download(v.data(), l);
            all.insert(all.end(), v.begin(), v.end());
        }
        return all;
    };
    EXPECT_EQ(run(*be.gpu), run(*launched));
    const std::vector<float> want = run(*be.cpu), got = run(*be.gpu);
    double scale = 0.0;
    for (float x : want) scale = std::max(scale, double(std::abs(x)));
    EXPECT_TRUE(all_close(got, want, 1e-4, 1e-4 * scale, "mixed decode and packed steps' logits"));
}

INSTANTIATE_TEST_SUITE_P(Family, CudaModelFamily, ::testing::Values("gpt2", "llama"));

// Every kernel is deterministic (no atomics in a reduction), so two runs repeat bit for bit: the basis of
// exact resume on the GPU.
TEST_F(CudaModel, RunsRepeatBitForBit) {
    const int B = 2, T = 32, steps = 5;
    const Batches data(B, T, small().vocab_size, steps, test_seed());
    std::vector<double> losses[2];
    std::vector<std::vector<float>> weights[2];
    for (int r = 0; r < 2; r++) {
        TrainRun run(*be.gpu, DType::BF16, 3, B, T);
        for (int s = 0; s < steps; s++) losses[r].push_back(run.step(data.step(s), B, T, s));
        weights[r] = run.weights();
    }
    EXPECT_EQ(losses[0], losses[1]);
    EXPECT_TRUE(weights[0] == weights[1]);
}

// bf16 training with `attn`'s attention inside the model, over two 64-row tiles, for GPT-2 and Llama
// (grouped-query): it tracks the fp32 curve (gemm attention) within 5% at every step, learns, and two such
// runs repeat bit for bit.
void trains_in_bf16(Backend& fp32, Backend& attn, const char* what) {
    for (const char* family : {"gpt2", "llama"}) {
        SCOPED_TRACE(family);
        const int B = 1, T = 128, steps = 12;
        ModelConfig cfg = small(family);
        cfg.n_ctx = T;
        const Batches data(B, T, cfg.vocab_size, steps, test_seed());
        TrainRun ref(fp32, DType::F32, 5, B, T, Recompute::Off, {}, cfg);
        TrainRun a(attn, DType::BF16, 5, B, T, Recompute::Off, {}, cfg),
            b(attn, DType::BF16, 5, B, T, Recompute::Off, {}, cfg);
        double worst = 0.0;
        std::vector<double> la, lb;
        for (int s = 0; s < steps; s++) {
            const double want = ref.step(data.step(s), B, T, s);
            la.push_back(a.step(data.step(s), B, T, s));
            lb.push_back(b.step(data.step(s), B, T, s));
            ASSERT_TRUE(std::isfinite(la.back())) << "step " << s;
            worst = std::max(worst, std::abs(la.back() - want) / want);
        }
        EXPECT_LT(worst, 0.05) << "largest relative gap to the fp32 loss curve";
        // learned at all (a dead model stays at the first loss): the last three batches' mean against the
        // first; how far 12 steps get depends on the random batches (0.81 of the first loss for one seed)
        const double last = (la[steps - 1] + la[steps - 2] + la[steps - 3]) / 3.0;
        EXPECT_LT(last, 0.9 * la.front()) << "did not learn";
        EXPECT_EQ(la, lb);
        EXPECT_TRUE(a.weights() == b.weights());
        std::printf(
            "%s bf16 %s vs fp32: largest relative loss gap %.4f over %d steps; last three steps' mean %.3f "
            "of the first loss\n",
            family, what, worst, steps, last / la.front());
    }
}

TEST_F(CudaModel, FlashOnTensorCoresTrainsInBf16) {
    auto flash = make_backend({Device::CUDA, 0, 0, AttentionImpl::Flash});
    trains_in_bf16(*be.gpu, *flash, "flash (tensor cores)");
}

// The same with cuDNN's fused attention (its deterministic backward: the two runs repeat bit for bit).
TEST_F(CudaModel, CudnnAttentionTrainsInBf16) {
#ifndef ANVIL_TEST_CUDNN
    GTEST_SKIP() << "this build has no cuDNN (cudnn_graph.h was not found)";
#endif
    auto cudnn = make_backend({Device::CUDA, 0, 0, AttentionImpl::Cudnn});
    trains_in_bf16(*be.gpu, *cudnn, "cuDNN fused attention");
}

// LoRA on the GPU: the adapters' gradients in fp32 equal the CPU's (the base frozen, its weight-gradient
// products skipped), and a bf16 base with f32 master adapters trains like fp32.
TEST_F(CudaModel, LoraMatchesTheCpuAndTrainsInBf16) {
    const int B = 3, T = 48, steps = 30;
    LoraOptions lora;
    lora.rank = 4;
    lora.alpha = 8.0f;
    lora.targets = {"c_attn", "c_proj", "c_fc"};
    const Batches data(B, T, small().vocab_size, steps, test_seed());
    TrainRun cpu(*be.cpu, DType::F32, 7, B, T, Recompute::Off, lora),
        gpu(*be.gpu, DType::F32, 7, B, T, Recompute::Off, lora);
    EXPECT_LE(std::abs(gpu.grads_only(data.step(0), B, T) - cpu.grads_only(data.step(0), B, T)), 1e-4);
    const auto gc = cpu.grads(), gg = gpu.grads();
    ASSERT_EQ(gc.size(), size_t(2 * 2 * 4));
    for (size_t k = 0; k < gc.size(); k++) {
        double scale = 0.0;
        for (float x : gc[k]) scale = std::max(scale, double(std::abs(x)));
        EXPECT_TRUE(all_close(gg[k], gc[k], 1e-4, 1e-4 * scale, "lora gradient " + std::to_string(k)));
    }
    // 30 AdamW steps: the fp32 curve on the GPU is the CPU's, and bf16 tracks it
    std::vector<double> curve[3];
    Backend* bes[3] = {be.cpu.get(), be.gpu.get(), be.gpu.get()};
    const DType dts[3] = {DType::F32, DType::F32, DType::BF16};
    for (int r = 0; r < 3; r++) {
        TrainRun run(*bes[r], dts[r], 11, B, T, Recompute::Off, lora);
        for (int s = 0; s < steps; s++) curve[r].push_back(run.step(data.step(s), B, T, s));
    }
    auto mean5 = [](const std::vector<double>& c, size_t from) {
        return (c[from] + c[from + 1] + c[from + 2] + c[from + 3] + c[from + 4]) / 5.0;
    };
    EXPECT_LT(mean5(curve[0], steps - 5), mean5(curve[0], 0) - 0.1) << "LoRA learned (on the CPU)";
    for (int s = 0; s < steps; s++) {
        const size_t i = size_t(s);
        EXPECT_LT(std::abs(curve[1][i] - curve[0][i]) / curve[0][i], 1e-4)
            << "fp32 against the CPU, step " << s;
        EXPECT_LT(std::abs(curve[2][i] - curve[1][i]) / curve[1][i], 0.05) << "bf16 against fp32, step " << s;
    }
}

// --recompute selective and full give the gradients of keeping everything, bit for bit (GPT-2 and Llama, both
// attention paths: full recomputation runs attention's forward again before its backward).
TEST_F(CudaModel, RecomputeGivesIdenticalGradients) {
    const int B = 2, T = 40;
    auto flash = make_backend({Device::CUDA, 0, 0, AttentionImpl::Flash});
    for (Backend* gpu : {be.gpu.get(), flash.get()})
        for (const char* family : {"gpt2", "llama"}) {
            const ModelConfig cfg = small(family);
            const Batches data(B, T, cfg.vocab_size, 1, test_seed());
            TrainRun plain(*gpu, DType::BF16, 5, B, T, Recompute::Off, {}, cfg);
            const double loss = plain.grads_only(data.step(0), B, T);
            const auto a = plain.grads();
            for (Recompute r : {Recompute::Selective, Recompute::Full}) {
                SCOPED_TRACE(std::string(family) + (gpu == flash.get() ? " flash" : " auto") +
                             ", --recompute " + recompute_name(r));
                TrainRun run(*gpu, DType::BF16, 5, B, T, r, {}, cfg);
                EXPECT_EQ(run.grads_only(data.step(0), B, T), loss);
                const auto b = run.grads();
                for (size_t i = 0; i < a.size(); i++)
                    EXPECT_TRUE(a[i] == b[i]) << plain.model->params().spec(i).name;
            }
        }
    // FP8 products: 64 rows, so the linear layers' forwards keep their inputs' and weights' roundings for the
    // backward (Backend::fp8_kept_elems), which --recompute full refills block by block in shared buffers
    for (const char* family : {"gpt2", "llama"}) {
        const ModelConfig cfg = small(family);
        const Batches data(B, 32, cfg.vocab_size, 1, test_seed());
        TrainRun plain(*be.gpu, DType::BF16, 5, B, 32, Recompute::Off, {}, cfg, true);
        const double loss = plain.grads_only(data.step(0), B, 32);
        const auto a = plain.grads();
        for (Recompute r : {Recompute::Selective, Recompute::Full}) {
            SCOPED_TRACE(std::string(family) + " fp8, --recompute " + recompute_name(r));
            TrainRun run(*be.gpu, DType::BF16, 5, B, 32, r, {}, cfg, true);
            EXPECT_EQ(run.grads_only(data.step(0), B, 32), loss);
            const auto b = run.grads();
            for (size_t i = 0; i < a.size(); i++)
                EXPECT_TRUE(a[i] == b[i]) << plain.model->params().spec(i).name;
        }
    }
}

// The loss a sequence at a time (the head's backward in the forward, chunk by chunk) against the whole batch
// at once, on the GPU: fp32 losses and gradients within rounding, bf16 too (GPT-2's tied head, Llama's own).
TEST_F(CudaModel, ChunkedLossMatchesTheWhole) {
    const int B = 3, T = 32;
    for (const char* family : {"gpt2", "llama"})
        for (DType dt : {DType::F32, DType::BF16}) {
            SCOPED_TRACE(std::string(family) + " " + std::string(dtype_name(dt)));
            const ModelConfig cfg = small(family);
            const Batches data(B, T, cfg.vocab_size, 1, test_seed());
            const size_t one = size_t(T) * size_t(cfg.vocab_size) * dtype_size(dt);
            TrainRun whole(*be.gpu, dt, 5, B, T, Recompute::Off, {}, cfg, false, 0),
                chunked(*be.gpu, dt, 5, B, T, Recompute::Off, {}, cfg, false, one);
            EXPECT_EQ(chunked.model->activations().capacity(act::logits), 1);
            const double lw = whole.grads_only(data.step(0), B, T),
                         lc = chunked.grads_only(data.step(0), B, T);
            // bf16: the head's weight gradient is rounded to bf16 once a chunk, as gradient accumulation
            // rounds it once a micro-batch (every other gradient equal); the test prints the gap
            const double tol = dt == DType::F32 ? 1e-5 : 1e-2;
            EXPECT_NEAR(lc, lw, tol * lw);
            const auto a = whole.grads(), b = chunked.grads();
            double worst = 0.0;
            for (size_t i = 0; i < a.size(); i++) {
                double num = 0, den = 0;
                for (size_t k = 0; k < a[i].size(); k++)
                    num += (a[i][k] - b[i][k]) * (a[i][k] - b[i][k]), den += a[i][k] * a[i][k];
                const double e = std::sqrt(num / std::max(den, 1e-30));
                EXPECT_LE(e, tol) << whole.model->params().spec(i).name;
                worst = std::max(worst, e);
            }
            std::printf(
                "%s %s: a sequence a chunk against the whole batch, largest gradient gap %.2e "
                "(norm-relative)\n",
                family, std::string(dtype_name(dt)).c_str(), worst);
        }
}

// The NCCL path with a world of one (issue 13): the library loads, a communicator forms, f32 and bf16
// all-reduces on their own stream leave the values as they were (a sum over one rank), and training through
// data parallelism's hooks (each layer's all-reduce started after its backward kernels, waited for before the
// optimizer) repeats the plain run bit for bit; so does ZeRO-1's path (each layer's gradients reduced to
// their owner, the updated bf16 weights all-gathered through the gradient memory).
TEST_F(CudaModel, NcclWithOneRankLeavesGradientsAndTrainingUnchanged) {
#ifdef ANVIL_CUDA_EMU
    GTEST_SKIP() << "NCCL needs a GPU: the emulated backend (tests/cuemu) is built without it";
#endif
    CollectiveSetup cs;
    cs.broadcast_from_rank0 = [](void*, size_t) {};
    cs.abort = [](const std::string& why) { throw Error(why); };
    std::unique_ptr<DeviceCollectives> nccl = be.gpu->make_collectives(cs);
    ASSERT_TRUE(nccl);
    EXPECT_NE(nccl->describe().find("NCCL"), std::string::npos) << nccl->describe();
    std::mt19937_64 gen(test_seed());
    for (DType dt : {DType::F32, DType::BF16}) {
        const std::vector<float> v = randn(gen, 100003);
        DevTensor t = put(*be.gpu, v, {100003}, dt);
        nccl->allreduce_sum_start(t.t, "the one-rank all-reduce");
        nccl->wait_all();
        EXPECT_EQ(get(*be.gpu, t.t), rounded(v, dt)) << dtype_name(dt);
    }

    const int B = 2, T = 32, steps = 4;
    const Batches data(B, T, small().vocab_size, steps, test_seed());
    const std::unique_ptr<Comm> one = make_comm(60);
    const ProcessGrid grid = make_grid(*one, 1);
    std::vector<double> losses[3];
    std::vector<std::vector<float>> weights[3];
    for (int r = 0; r < 3; r++) {  // plain, through the all-reduces, through ZeRO-1's reduces and all-gather
        TrainRun run(*be.gpu, DType::BF16, 5, B, T);
        std::unique_ptr<DataParallel> dp;
        if (r > 0) {
            dp = std::make_unique<DataParallel>(grid, run.model->params(), *run.opt, /*even_alone=*/true,
                                                /*zero_alone=*/r == 2);
            EXPECT_EQ(dp->zero(), r == 2);
            run.trainer->set_data_parallel(dp.get());
        }
        for (int s = 0; s < steps; s++) losses[r].push_back(run.step(data.step(s), B, T, s));
        weights[r] = run.weights();
    }
    for (int r = 1; r < 3; r++) {
        EXPECT_EQ(losses[0], losses[r]) << (r == 2 ? "ZeRO-1" : "all-reduce");
        EXPECT_TRUE(weights[0] == weights[r]) << (r == 2 ? "ZeRO-1" : "all-reduce");
    }
}

}  // namespace
}  // namespace anvil::test
