// The op table's third mode (tests/ops/op_cases.h): every backend op's time at a model's sizes, with
// GFLOP/s for the matrix products and attention and GB/s (the least bytes each op must move) for the rest. On
// CUDA, attention is timed in each implementation (gemm, flash with its forward at 64 and at 128 query rows a
// block, flash-simt, cuDNN's fused attention where it applies, and where cuDNN refuses it again with its
// nondeterministic engines allowed, "cudnn-nondeterministic"), and a product over a few rows (decoding) again
// through anvil's direct kernels rather than cuBLASLt ("direct": BackendOptions::direct_products), its GB/s
// the forward's bytes (the weight, mostly) over the forward's time. --only times the ops whose name contains
// the text (e.g. "attention B="), or any of several texts separated by '|' (a fused op beside the ops it
// replaces: "residual|layernorm C=768").
//   anvil_op_bench [--device cpu|cuda] [--dtype fp32|bf16|fp16] [--sizes bench|gpt2] [--reps N] [--threads N]
//                  [--only TEXT]
// `make bench` runs it on the CPU at `make bench`'s model (4 layers, width 256, context 128, batch 8).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "../tests/ops/op_cases.h"
#include "core/text.h"

// Whether `name` contains one of the '|'-separated texts of `only`.
static bool matches(const std::string& name, const std::string& only) {
    for (size_t from = 0;;) {
        const size_t bar = only.find('|', from);
        const std::string text = only.substr(from, bar == std::string::npos ? std::string::npos : bar - from);
        if (!text.empty() && name.find(text) != std::string::npos) return true;
        if (bar == std::string::npos) return false;
        from = bar + 1;
    }
}

int main(int argc, char** argv) {
    using namespace anvil;
    using namespace anvil::test;
    std::string device = "cpu", precision = "fp32", sizes = "bench", only;
    int reps = 20, threads = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string k = argv[i], v = argv[i + 1];
        if (k == "--device")
            device = v;
        else if (k == "--dtype")
            precision = v;
        else if (k == "--sizes")
            sizes = v;
        else if (k == "--reps")
            reps = std::atoi(v.c_str());
        else if (k == "--threads")
            threads = std::atoi(v.c_str());
        else if (k == "--only")
            only = v;
        else {
            std::fprintf(stderr,
                         "anvil_op_bench: unknown flag %s; see the comment at the top of op_bench.cpp\n",
                         k.c_str());
            return 2;
        }
    }
    try {
        DType dt;
        ANVIL_CHECK(dtype_from_precision(precision, &dt), "--dtype {}: use fp32, bf16 or fp16", precision);
        ANVIL_CHECK(sizes == "bench" || sizes == "gpt2", "--sizes {}: use bench or gpt2", sizes);
        auto be = make_backend({device == "cuda" ? Device::CUDA : Device::CPU, threads, 0});
        std::printf("%s, %s, %s sizes, mean of %d runs after a warm-up\n", be->describe().c_str(),
                    precision.c_str(), sizes.c_str(), reps);
        std::printf("%-52s %10s %10s %10s %10s\n", "op", "fwd ms", "bwd ms", "GFLOP/s", "GB/s");
        struct Impl {
            AttentionImpl impl;
            int fwd_rows;  // BackendOptions::attn_fwd_rows
            const char* name;
        };
        const Impl impls[] = {{AttentionImpl::Gemm, 0, "gemm"},
                              {AttentionImpl::Flash, 64, "flash"},
                              {AttentionImpl::Flash, 128, "flash:128"},
                              {AttentionImpl::FlashSimt, 0, "flash-simt"},
                              {AttentionImpl::Cudnn, 0, "cudnn"}};
        int failed = 0;
        for (const OpCase& c : op_cases(sizes == "gpt2" ? OpSizes::gpt2() : OpSizes::perf())) {
            if (dt != DType::F32 && !c.low_precision) continue;
            if (!only.empty() && !matches(c.name, only)) continue;
            // an op that fails is reported on its line, and the others still run (exit status 1 at the end)
            auto report = [&](Backend& b, const std::string& name) {
                try {
                    const OpTiming t = time_case(c, b, dt, reps);
                    const std::string bwd = c.backward ? fmt::format("{:.3f}", t.bwd_ms) : "-";
                    // a product over a few rows (decoding) is bound by reading its weight: its forward's GB/s
                    const std::string bw = c.product_rows >= 1 && c.product_rows <= 8
                                               ? fmt::format("{:10.1f}", t.fwd_gbps)
                                               : fmt::format("{:>10}", "-");
                    const std::string rate = c.flops > 0 ? fmt::format("{:10.1f} {}", t.gflops, bw)
                                                         : fmt::format("{:>10} {:10.1f}", "-", t.gbps);
                    std::printf("%-52s %10.3f %10s %s\n", name.c_str(), t.fwd_ms, bwd.c_str(), rate.c_str());
                } catch (const std::exception& e) {
                    std::printf("%-52s failed: %s\n", name.c_str(), e.what());
                    failed++;
                }
            };
            if (!c.attention || device != "cuda") {
                report(*be, c.name);
                if (device == "cuda" && few_row_float_product(c)) {
                    BackendOptions o;
                    o.device = Device::CUDA, o.direct_products = true;
                    auto direct = make_backend(o);
                    report(*direct, c.name + " direct");
                }
                continue;
            }
            for (const Impl& impl : impls) {
                // cuDNN's fused attention: bf16/f16 without dropout, head sizes multiples of 8
                if (impl.impl == AttentionImpl::Cudnn &&
                    (dt == DType::F32 || c.attn_dropout || c.attn.HS % 8 != 0))
                    continue;
                auto b = make_backend({Device::CUDA, threads, 0, impl.impl, impl.fwd_rows});
                const int before = failed;
                report(*b, c.name + " " + impl.name);
                // a refused cuDNN case (perhaps for want of a deterministic engine): timed again taking the
                // nondeterministic ones (PyTorch's default), so the card says whether determinism keeps cuDNN
                // out
                if (failed > before && impl.impl == AttentionImpl::Cudnn &&
                    !env_on("ANVIL_CUDNN_NONDETERMINISTIC")) {
                    setenv("ANVIL_CUDNN_NONDETERMINISTIC", "1", 1);
                    auto nd = make_backend({Device::CUDA, threads, 0, impl.impl, impl.fwd_rows});
                    report(*nd, c.name + " cudnn-nondeterministic");
                    unsetenv("ANVIL_CUDNN_NONDETERMINISTIC");
                }
            }
        }
        if (failed > 0) {
            std::fprintf(stderr, "anvil_op_bench: %d op(s) failed (see their lines)\n", failed);
            return 1;
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "anvil_op_bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
