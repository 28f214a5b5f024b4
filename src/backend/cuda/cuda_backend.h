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
    // opts.device_id, .attention, .attn_fwd_rows (0: Ctx's default) and .gemm_tune
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
    size_t memory_in_use() const override { return memory_.in_use(); }
    size_t memory_peak() const override { return memory_.peak(); }
    void set_memory_limit(size_t bytes) override { memory_.set_limit(bytes); }

    void embedding_fwd(Tensor out, Tensor tokens, Tensor wte, Tensor wpe) override;
    void embedding_rows_add(Tensor out, Tensor table, std::span<const int> rows) override;
    void embedding_bwd(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens) override;
    void layernorm_fwd(Tensor out, Tensor mean, Tensor rstd, Tensor in, Tensor w, Tensor b) override;
    void layernorm_bwd(Tensor din, Tensor dw, Tensor db, Tensor dout, Tensor in, Tensor w, Tensor mean,
                       Tensor rstd) override;
    void rmsnorm_fwd(Tensor out, Tensor rstd, Tensor in, Tensor w, float eps) override;
    void rmsnorm_bwd(Tensor din, Tensor dw, Tensor dout, Tensor in, Tensor w, Tensor rstd) override;
    void rope(Tensor x, Tensor inv_freq, int H, int pos0, bool inverse) override;
    void rope_rows(Tensor x, Tensor inv_freq, int H, std::span<const int> pos, bool inverse) override;
    void swiglu_fwd(Tensor out, Tensor gate, Tensor up) override;
    void swiglu_bwd(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) override;
    void qkv_pack(Tensor qkv, Tensor q, Tensor k, Tensor v, int NH) override;
    void qkv_unpack(Tensor dq, Tensor dk, Tensor dv, Tensor dqkv, int NH) override;
    void matmul_fwd(Tensor out, Tensor in, Tensor w, WLayout layout, Tensor bias, Tensor pre_gelu) override;
    void matmul_bwd(Tensor din, Tensor dw, Tensor dbias, Tensor dout, Tensor in, Tensor w, WLayout layout,
                    Tensor in_pre_gelu) override;
    void matmul_fp8_fwd(Tensor out, Tensor in, Tensor w, WLayout layout, Tensor bias, Tensor pre_gelu) override;
    void matmul_fp8_bwd(Tensor din, Tensor dw, Tensor dbias, Tensor dout, Tensor in, Tensor w, WLayout layout,
                        Tensor in_pre_gelu) override;
    void matmul_q8_fwd(Tensor out, Tensor in, Tensor q, Tensor scale, WLayout layout, Tensor bias,
                       Tensor pre_gelu) override;
    void matmul_q8_bwd(Tensor din, Tensor dout, Tensor q, Tensor scale, WLayout layout, Tensor in_pre_gelu) override;
    void embedding_q8_fwd(Tensor out, Tensor tokens, Tensor q, Tensor scale, Tensor wpe) override;
    void gelu_fwd(Tensor out, Tensor in) override;
    void gelu_bwd(Tensor din, Tensor dout, Tensor in) override;
    size_t attention_saved_elems(const AttnDims& d) const override;
    size_t attention_scratch_elems(const AttnDims& d) const override;
    void attention_fwd(Tensor out, Tensor saved, Tensor qkv, int NH, const AttnDropout& drop) override;
    void attention_bwd(Tensor dqkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor out, Tensor saved, int NH,
                       const AttnDropout& drop) override;
    void attention_cached(Tensor out, Tensor qkv, Tensor kcache, Tensor vcache, int pos0, int NH) override;
    void attention_cached_rows(Tensor out, Tensor qkv, Tensor kcache, Tensor vcache, Tensor pages,
                               std::span<const int> slot, std::span<const int> pos, int NH) override;
    void residual_fwd(Tensor out, Tensor a, Tensor b) override;
    void scale(Tensor x, float s) override;
    void dropout(Tensor out, Tensor in, float p, uint64_t seed) override;
    void classifier(Tensor losses, Tensor logits, Tensor targets, float dloss, int vocab_real) override;
    void token_logprobs(Tensor lp, Tensor top_ids, Tensor top_lp, Tensor logits, Tensor targets,
                        int V) override;
    void global_norm_sq(Tensor out, const std::vector<Tensor>& grads) override;
    void adamw(const std::vector<ParamSlot>& slots, const AdamWArgs& args, Tensor norm_sq) override;
    std::unique_ptr<DeviceCollectives> make_collectives(const CollectiveSetup& setup) override;  // nccl.cpp

private:
    bool attention_gemm_planned(const AttnDims& d) const;
    bool attention_uses_gemm(const AttnDims& d, const Tensor& saved) const;
    // b, grown to at least `bytes` (after the queued work is done with it): scratch that grows to the largest use.
    void* grown(Buffer& b, size_t bytes);
    // An int8 weight dequantized into `dtype` in the backend's growing scratch buffer (products over many rows).
    Tensor dequantized(Tensor q, Tensor scale, WLayout layout, DType dtype);
    void check_fp8() const;  // FP8 tensor cores (compute capability 8.9+), or a clear error

    int device_;
    AttentionImpl attention_;
    cudaDeviceProp prop_{};
    cuda::Ctx ctx_;
    Buffer workspace_, lt_workspace_;
    Buffer q8_weight_;    // the largest int8 weight so far, dequantized (see dequantized())
    Buffer fp8_scratch_;  // FP8 products: the rounded operands and their scales (cuda::matmul_fp8_scratch_bytes)
    std::shared_ptr<cuda::LtPlans> lt_plans_;
    std::shared_ptr<cuda::CudnnAttention> cudnn_;  // --attention cudnn (loads cuDNN on its first call)
    MemoryAccount memory_;
};

}  // namespace anvil
