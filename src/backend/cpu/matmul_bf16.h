// The CPU backend's bf16 products (--precision bf16 --device cpu, as PyTorch's CPU autocast): f32 operands
// rounded to bf16 (round to nearest even), multiplied by oneDNN's matmul on the cores' bf16 instructions
// (AVX512-BF16, AMX) with f32 accumulation and f32 results. Built where oneDNN is found (ANVIL_WITH_DNNL).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cpu/ops.h"

namespace anvil::cpu {

// Gemm's contract; primitives are made once per shape and kept, the rounded operands live in a scratch that
// grows.
class Bf16Gemm final : public Gemm {
public:
    Bf16Gemm();
    ~Bf16Gemm() override;
    void operator()(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
                    bool accumulate, float* C, int ldc) override;

private:
    struct Impl;
    std::unique_ptr<Impl> p_;
    std::vector<uint16_t> a_, b_;
};

}  // namespace anvil::cpu
