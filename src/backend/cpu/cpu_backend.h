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

private:
    int threads_;
    MemoryAccount memory_;
    std::vector<float> q8_panel_;      // int8 products over many rows: a dequantized panel of the weight
    std::unique_ptr<cpu::Gemm> bf16_;  // set_autocast(BF16): oneDNN's bf16 products
    cpu::Gemm* gemm_ = nullptr;        // what matmul_fwd/_bwd multiply with (null: OpenBLAS's sgemm)
    std::vector<float> fp8_scratch_;   // FP8 products: the operands rounded to the format's grid
};

}  // namespace anvil
