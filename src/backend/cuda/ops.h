// The CUDA ops, one family per .cu file; CudaBackend checks shapes and calls these. Ctx carries the stream
// and the backend's workspace (a fixed allocation made once; ops take sub-buffers of it).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "backend/backend.h"
#include "backend/device_sizes.h"
#include "backend/op_checks.h"

namespace anvil::cuda {

// cuBLASLt plans (descriptors + chosen algorithm) per product shape, owned by the backend.
struct LtPlans;
std::shared_ptr<LtPlans> make_lt_plans();
// cuDNN's fused attention (attention_cudnn.cpp): the library, a handle, the plans per shape and their
// workspace, which grows through `alloc` (the backend's accounted allocation); nothing is loaded before the
// first call. `sm`: the device's compute capability, major * 10 + minor.
struct CudnnAttention;
std::shared_ptr<CudnnAttention> make_cudnn_attention(std::function<Buffer(size_t)> alloc, int sm);

struct Ctx {
    cudaStream_t stream = nullptr;
    char* workspace = nullptr;  // device scratch for partial sums, sort buffers
    size_t workspace_bytes = 0;
    int sm_count = 0;
    size_t smem_optin =
        0;  // the most dynamic shared memory a block may opt in to (99 KiB on Ada, 227 on Hopper)
    cublasLtHandle_t lt = nullptr;
    void* lt_workspace = nullptr;
    size_t lt_workspace_bytes = 0;
    LtPlans* lt_plans = nullptr;
    CudnnAttention* cudnn = nullptr;
    // query rows a block of the tensor-core attention forward takes (attention_tc.cu): 64, or 128 (two
    // m-tiles a warp, head sizes up to 64); BackendOptions::attn_fwd_rows (--attn-fwd-rows), else 64
    int attn_fwd_rows = 64;
    // time the heuristic's best few cuBLASLt algorithms on each product shape's first call and keep the
    // fastest (lt_gemm.cpp); BackendOptions::gemm_tune (--gemm-tune on). Runs may then choose differently
    // and so differ in the last bits, as PyTorch's cudnn.benchmark does.
    bool gemm_tune = false;
    // a 16-bit product with a GELU after it applies the GELU in cuBLASLt's epilogue (matmul.cu); off with
    // ANVIL_GELU_EPILOGUE=0 in the environment (the GELU then a kernel on the rounded pre-activation), to
    // measure the one against the other
    bool gelu_epilogue = true;
    // products over at most kDirectRows rows through anvil's direct kernels (gemv.cu) rather than cuBLASLt:
    // int8 weights always; others with BackendOptions::direct_products or ANVIL_DIRECT_PRODUCTS=1
    bool direct_products = false;
    unsigned* direct_done = nullptr;  // kDirectStrips counters, 0 between the direct kernels' launches
    // A workspace slice of `bytes` (256-aligned) at `offset`; throws if it does not fit.
    void* scratch(size_t offset, size_t bytes) const;
};

// elementwise.cu
void convert(const Ctx& c, Tensor dst, Tensor src);
// out (C) += column sums of in (rows, C); deterministic (fixed partial order)
void colsum_accumulate(const Ctx& c, Tensor out, Tensor in);
// n values of `type` (f32, bf16, f16, fp8 e4m3) in [-1, 1) from a hash of (index, seed): benchmark inputs
void fill_uniform(cudaStream_t s, void* p, size_t n, cudaDataType_t type, uint32_t seed);

// gemv.cu: out (N, OC) = in (N, C) . W (+ bias; pre_gelu as matmul_fwd's) for N <= kDirectRows rows
// (decoding), reading the weight once: W in `in`'s dtype (`scale` empty) or int8 with one f32 scale an output
// channel. Its W (C, OC) kernel takes up to kDirectStrips strips of 32 columns in slices of the rows (the
// workspace holds their sums, Ctx::direct_done counts them).
constexpr int kDirectRows = 8;
constexpr int kDirectStrips = int(sizes::kCudaDirectDoneBytes / sizeof(unsigned));
void matmul_direct(const Ctx& c, Tensor out, Tensor in, Tensor w, Tensor scale, WLayout layout, Tensor bias,
                   Tensor pre_gelu);

// quant.cu: int8 weights, W = q * scale[o] (a few rows read q directly: matmul_direct). dequant_q8 writes W
// in w's dtype and q's layout for a cuBLASLt product; the int8 token table.
void dequant_q8(const Ctx& c, Tensor w, Tensor q, Tensor scale, WLayout layout);

// rope.cu: rotary embeddings on x (B, T, H*HS) in place (x may be strided); grouped-query gradient unpacking
void rope(const Ctx& c, Tensor x, Tensor inv_freq, int B, int T, int H, int HS, int pos0, bool inverse);
// row b from pos[b] ((B) i32 in device memory)
void rope_rows(const Ctx& c, Tensor x, Tensor inv_freq, int B, int T, int H, int HS, Tensor pos,
               bool inverse);
void qkv_unpack(const Ctx& c, Tensor dq, Tensor dk, Tensor dv, Tensor dqkv, int N, int NH, int KVH, int KH,
                int HS);

// matmul.cu (cuBLASLt)
void bias_add(const Ctx& c, Tensor out,
              Tensor bias);  // out (N,OC) += bias (OC), every row (out may be strided)

// fp8.cu: FP8 products (Backend::matmul_fp8_fwd/_bwd) in a scratch of matmul_fp8_scratch_bytes for the
// product's N, C, OC and activation dtype (either direction); `kept` (null: none) the op's buffer of
// sizes::cuda_fp8_kept_elems, the same for a backward as for its forward
size_t matmul_fp8_scratch_bytes(int N, int C, int OC, DType t);
// Delayed scaling's histories of one product's operands (the op's Fp8Scaling): none where `state` is null.
struct Fp8Hist {
    float* state = nullptr;
    int stride = 0;  // floats from one operand's history to the next
    bool record = false, again = false;
    bool on() const { return state != nullptr; }
    float* of(int i) const { return state ? state + size_t(i) * size_t(stride) : nullptr; }
};
void matmul_fp8_fwd(const Ctx& c, void* scratch, void* kept, Tensor out, Tensor in, Tensor w, WLayout layout,
                    Tensor bias, Tensor pre_gelu, const Fp8Hist& h);
void matmul_fp8_bwd(const Ctx& c, void* scratch, void* kept, Tensor din, Tensor dw, Tensor dbias, Tensor dout,
                    Tensor in, Tensor w, WLayout layout, Tensor in_pre_gelu, const Fp8Hist& h);

// attention.cu: anvil's flash-style kernels (keep only the log-sum-exp); with `tensor_cores`, bf16 and f16
// run attention_tc.cu's kernels (f32 always the CUDA-core ones)
size_t attention_flash_saved_bytes(const AttnDims& d);
// the flash kernels run on the tensor cores for these dims: a 16-bit dtype, a head size up to 128 whose
// tiles' shared memory fits the device
bool attention_flash_tc_takes(const Ctx& c, const AttnDims& d);
size_t attention_flash_scratch_bytes(const AttnDims& d);
// `s`: the shapes check_attention found (heads, key/value heads, width); `drop`: dropout on the
// probabilities (dropout_mask.h), the backward given the forward's
void attention_flash_fwd(const Ctx& c, const AttnShape& s, Tensor out, Tensor saved, Tensor qkv,
                         bool tensor_cores, const AttnDropout& drop);
void attention_flash_bwd(const Ctx& c, const AttnShape& s, Tensor dqkv, Tensor scratch, Tensor dout,
                         Tensor qkv, Tensor out, Tensor saved, bool tensor_cores, const AttnDropout& drop);
// attention_cudnn.cpp: cuDNN's fused flash attention (--attention cudnn). The same saved statistics as the
// flash kernels' (the log-sum-exp, (B, NH, T) f32) and scratch (`dsum`, (B, NH, T) f32). A call cuDNN cannot
// take (f32, dropout, a head size that is not a multiple of 8, no library or engine) throws, saying why.
void attention_cudnn_fwd(const Ctx& c, const AttnShape& s, Tensor out, float* stats, const Tensor& qkv,
                         const AttnDropout& drop);
void attention_cudnn_bwd(const Ctx& c, const AttnShape& s, Tensor dqkv, float* dsum, const Tensor& dout,
                         const Tensor& qkv, const Tensor& out, const float* stats, const AttnDropout& drop);
// Both graphs built and finalized for the shape without a device (cuDNN checks their shapes, types and
// edges): "" when they are, else why not (no library included). For the tests that run without a GPU.
std::string attention_cudnn_check_graphs(const AttnShape& s, DType t);
// attention_gemm.cu: cuBLASLt products on the tensor cores (keep the probabilities, B*NH*T*T elements)
size_t attention_gemm_saved_elems(const AttnDims& d);
bool attention_gemm_fits(const Ctx& c, const AttnDims& d);  // one head's fp32 scores fit the workspace
void attention_gemm_fwd(const Ctx& c, const AttnShape& s, Tensor out, Tensor saved, Tensor qkv,
                        const AttnDropout& drop);
void attention_gemm_bwd(const Ctx& c, const AttnShape& s, Tensor dqkv, Tensor dout, Tensor qkv, Tensor saved,
                        const AttnDropout& drop);

// classifier.cu
// rows (N, Vp) -> lp (N), the K likeliest (N, K); a target outside [0, V) gets a NaN lp
void token_logprobs(const Ctx& c, Tensor lp, Tensor top_ids, Tensor top_lp, Tensor logits, Tensor targets,
                    int V, int K);

// The kernels of the listed ops (ops.def's ANVIL_OP): cuda::name(ctx, the op's parameters), one family per
// .cu file (layernorm.cu has the norms and add_norm_fwd, elementwise.cu residual_fwd, ...). CudaBackend's
// member for each is generated in cuda_backend.cpp: the op's rule, then this.
#define ANVIL_CTX_PARAMS(...) (const Ctx& c, __VA_ARGS__)
#define ANVIL_OP(name, params, args, rule, label, bytes) void name ANVIL_CTX_PARAMS params;
#include "backend/ops.def"
#undef ANVIL_CTX_PARAMS

}  // namespace anvil::cuda
