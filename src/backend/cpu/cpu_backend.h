// CpuBackend: the Backend interface on the host, f32 only (set_autocast(BF16): f32 tensors, bf16 products).
// Each method checks shapes and dtypes, then calls the reference op in ops.h.
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/memory_account.h"

namespace anvil {

namespace cpu {
class Gemm;  // ops.h
}

class CpuBackend final : public Backend {
public:
    explicit CpuBackend(int threads);
    ~CpuBackend() override;
    bool set_autocast(DType products) override;
    Device device() const override { return Device::CPU; }
    std::string describe() const override;
    std::string device_name() const override;

    Buffer alloc(size_t bytes) override;
    Buffer alloc_host(size_t bytes) override { return alloc(bytes); }
    void zero(Tensor t) override;
    void upload(Tensor dst, const void* host) override;
    void download(void* host, Tensor src) override;
    void download_async(void* host, Tensor src) override { download(host, src); }
    void convert(Tensor dst, Tensor src) override;
    void synchronize() override {}
    size_t memory_in_use() const override { return memory_.in_use(); }
    size_t memory_peak() const override { return memory_.peak(); }
    void set_memory_limit(size_t bytes) override { memory_.set_limit(bytes); }

    size_t attention_saved_elems(const AttnDims& d) const override;
    size_t attention_scratch_elems(const AttnDims& d) const override;
#define ANVIL_OP(name, params, args, rule, label, bytes) void name params override;
#define ANVIL_OP_CUSTOM(name, params, args, label, bytes) void name params override;
#include "backend/ops.def"

private:
    int threads_;
    MemoryAccount memory_;
    std::vector<float> q8_panel_;      // int8 products over many rows: a dequantized panel of the weight
    std::unique_ptr<cpu::Gemm> bf16_;  // set_autocast(BF16): oneDNN's bf16 products
    cpu::Gemm* gemm_ = nullptr;        // what matmul_fwd/_bwd multiply with (null: OpenBLAS's sgemm)
    std::vector<float> fp8_scratch_;   // FP8 products: the operands rounded to the format's grid
};

}  // namespace anvil
