// CudaBackend: the Backend interface on one NVIDIA GPU. Kernels in this directory, matrix products through
// cuBLASLt. One compute stream; device memory from cudaMalloc, accounted (and limited, --memory-limit);
// host staging memory page-locked.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "backend/cuda/ops.h"
#include "backend/memory_account.h"

namespace anvil {

int cuda_device_count();  // 0 when no device is visible or the driver is missing
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opts);

class CudaBackend final : public Backend {
public:
    // opts.device_id, .attention, .attn_fwd_rows (0: Ctx's default), .gemm_tune, .record and .direct_products
    explicit CudaBackend(const BackendOptions& opts);
    ~CudaBackend() override;
    Device device() const override { return Device::CUDA; }
    std::string describe() const override;
    std::string device_name() const override;

    Buffer alloc(size_t bytes) override;
    Buffer alloc_host(size_t bytes) override;
    void zero(Tensor t) override;
    void upload(Tensor dst, const void* host) override;
    void download(void* host, Tensor src) override;
    void download_async(void* host, Tensor src) override;
    void convert(Tensor dst, Tensor src) override;
    void synchronize() override;
    // A CUDA graph captured from the compute stream (thread-local capture mode); null when `record_` is off
    // or the capture was invalidated (a wait or an allocation inside `work`), said once on stderr
    std::unique_ptr<Recording> record(const std::function<void()>& work) override;
    size_t memory_in_use() const override { return memory_.in_use(); }
    size_t memory_peak() const override { return memory_.peak(); }
    void set_memory_limit(size_t bytes) override { memory_.set_limit(bytes); }

    size_t attention_saved_elems(const AttnDims& d) const override;
    size_t attention_scratch_elems(const AttnDims& d) const override;
    size_t fp8_kept_elems(int N, int C, int OC, DType dt) const override;
#define ANVIL_OP(name, params, args, rule, label, bytes) void name params override;
#define ANVIL_OP_CUSTOM(name, params, args, label, bytes) void name params override;
#include "backend/ops.def"
    std::unique_ptr<DeviceCollectives> make_collectives(const CollectiveSetup& setup) override;  // nccl.cpp

private:
    bool attention_gemm_planned(const AttnDims& d) const;
    bool attention_uses_gemm(const AttnDims& d, const Tensor& saved) const;
    // b, grown to at least `bytes` (after the queued work is done with it): scratch that grows to the largest use.
    void* grown(Buffer& b, size_t bytes);
    // An int8 weight dequantized into `dtype` in the backend's growing scratch buffer (products over many rows).
    Tensor dequantized(Tensor q, Tensor scale, WLayout layout, DType dtype);
    void check_fp8() const;  // FP8 tensor cores (compute capability 8.9+), or a clear error
    void* fp8_kept(Tensor kept, const MatDims& d, DType dt) const;  // null: nothing kept

    int device_;
    AttentionImpl attention_;
    bool record_ = true;  // BackendOptions::record and ANVIL_CUDA_GRAPHS
    bool said_ = false;   // a refused recording was reported
    uint64_t moved_ = 0;  // how often a growing scratch buffer moved: a recording made before is stale
    cudaDeviceProp prop_{};
    cuda::Ctx ctx_;
    Buffer workspace_, lt_workspace_;
    Buffer direct_done_;  // the direct products' counters (Ctx::direct_done)
    Buffer q8_weight_;    // the largest int8 weight so far, dequantized (see dequantized())
    Buffer fp8_scratch_;  // FP8 products: the rounded operands and their scales (cuda::matmul_fp8_scratch_bytes)
    std::shared_ptr<cuda::LtPlans> lt_plans_;
    std::shared_ptr<cuda::CudnnAttention> cudnn_;  // --attention cudnn (loads cuDNN on its first call)
    MemoryAccount memory_;
};

}  // namespace anvil
