// The backend seam: every op the model families need (GPT-2, Llama), forward and backward, behind one
// interface.
//
// The CPU backend (src/backend/cpu) is the specification: plain loops plus BLAS, f32 only. The CUDA
// backend (src/backend/cuda) implements the same contract with its own kernels and libraries and is
// tested against the CPU one. Model and trainer code talk only to this interface.
//
// Conventions shared by all ops:
//  - N = B*T rows; C channels; V vocabulary; NH heads, HS = C/NH head size.
//  - Forward ops overwrite their outputs.
//  - Backward ops ACCUMULATE (+=) into parameter gradients. Activation gradients are overwritten, except
//    layernorm_bwd's din, which is accumulated because it is the residual stream's gradient.
//  - A frozen parameter has no gradient: its gradient tensor is passed empty and the op skips that part of
//    the work (no weight-gradient product for a frozen matrix).
//  - Statistics (layernorm mean/rstd, per-row losses, the grad-norm scalar) are f32 whatever the
//    activation dtype.
//  - Tensors live on the backend's device; upload/download move bytes to and from host memory.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <vector>

#include "backend/collectives.h"
#include "backend/dropout_mask.h"
#include "core/arena.h"
#include "core/tensor.h"

namespace anvil {

// How a weight matrix is stored. HF GPT-2's Conv1D keeps linear weights as (in, out); the tied
// embedding used as the classifier is (V, C), i.e. (out, in).
enum class WLayout : uint8_t { InOut, OutIn };

struct AttnDims {
    int B = 0, T = 0, NH = 0, HS = 0;
    DType dtype = DType::F32;  // of the activations (q, k, v and the output)
};

// One parameter tensor's slot for the optimizer. `master` is empty when params are f32 themselves.
struct ParamSlot {
    Tensor param, grad, m, v, master;
    float weight_decay = 0.0f;
};

struct AdamWArgs {
    float lr = 0.0f;
    float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
    int step = 1;                // 1-based, for bias correction
    float max_grad_norm = 0.0f;  // clip to this global norm; 0 = off
    float grad_scale = 1.0f;     // multiplies every gradient before use (1/loss_scale for fp16)
};

class Backend : public Allocator {
public:
    ~Backend() override = default;
    Device device() const override = 0;
    virtual std::string describe() const = 0;     // one line: device, libraries, threads
    virtual std::string device_name() const = 0;  // the CPU model or the GPU's name

    // ---- memory ---------------------------------------------------------------------------------
    Buffer alloc(size_t bytes) override = 0;  // zero-filled; throws OutOfMemory when it does not fit
    // Host memory for data headed to the device (page-locked on CUDA, so copies can overlap compute).
    virtual Buffer alloc_host(size_t bytes) = 0;
    virtual void zero(Tensor t) = 0;
    virtual void upload(Tensor dst, const void* host) = 0;  // dst.nbytes() bytes from host
    virtual void download(void* host, Tensor src) = 0;      // src.nbytes() bytes to host
    // The same copy queued behind the work before it, without waiting: the bytes are in `host` after the
    // next synchronize() (or download). `host` should come from alloc_host so the device can write it
    // directly.
    virtual void download_async(void* host, Tensor src) = 0;
    // src's values as f32 on the host, whatever its dtype (download, then convert).
    std::vector<float> download_f32(Tensor src);
    virtual void convert(Tensor dst, Tensor src) = 0;  // same numel, any float dtypes
    virtual void synchronize() = 0;
    // Device memory accounting (what alloc handed out, not including library workspaces).
    virtual size_t memory_in_use() const = 0;
    virtual size_t memory_peak() const = 0;
    // Pretend the device has only this many bytes (0 = its real size): --memory-limit, and tests.
    virtual void set_memory_limit(size_t bytes) = 0;

    // ---- ops ------------------------------------------------------------------------------------
    // out (B,T,C) = wte[tokens] + wpe[t]; tokens (B,T) i32; wte (V,C); wpe (maxT,C) or empty (no positions)
    virtual void embedding_fwd(Tensor out, Tensor tokens, Tensor wte, Tensor wpe) = 0;
    // out (B,C) += table[rows[b]] for each b: a decode step's learned positions, each row at its own (rows: B
    // host integers within the table). With a token-only embedding_fwd before it, out equals embedding_fwd's
    // with wpe[rows[b]].
    virtual void embedding_rows_add(Tensor out, Tensor table, std::span<const int> rows) = 0;
    // dwte += scatter(dout by tokens); dwpe += sum over B of dout. Deterministic.
    virtual void embedding_bwd(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens) = 0;

    // out (N,C) = (in - mean) * rstd * w + b; mean, rstd (N) f32; eps 1e-5
    virtual void layernorm_fwd(Tensor out, Tensor mean, Tensor rstd, Tensor in, Tensor w, Tensor b) = 0;
    // din += ..., dw += ..., db += ...
    virtual void layernorm_bwd(Tensor din, Tensor dw, Tensor db, Tensor dout, Tensor in, Tensor w,
                               Tensor mean, Tensor rstd) = 0;

    // RMSNorm: out (N,C) = in * rstd * w, rstd (N) f32 = 1 / sqrt(mean(in^2) + eps)
    virtual void rmsnorm_fwd(Tensor out, Tensor rstd, Tensor in, Tensor w, float eps) = 0;
    // din += ..., dw += ... (skipped when empty)
    virtual void rmsnorm_bwd(Tensor din, Tensor dw, Tensor dout, Tensor in, Tensor w, Tensor rstd) = 0;

    // Matrix products in a lower precision than the tensors' (autocast): `products` BF16 makes the CPU
    // backend round both operands of every matmul_fwd/matmul_bwd product to bf16 and multiply them on the
    // cores' bf16 instructions (oneDNN), accumulating and storing f32, as PyTorch's CPU autocast does; F32
    // turns it off. False where the backend has no such mode (CUDA multiplies in its tensors' dtype; a build
    // without oneDNN).
    virtual bool set_autocast(DType products) {
        (void)products;
        return false;
    }
    // out (N,OC) = in (N,C) @ W + bias, W (C,OC) for InOut or (OC,C) for OutIn; bias may be empty.
    // If pre_gelu is given, pre_gelu = in @ W + bias and out = gelu(pre_gelu) (fused epilogue).
    virtual void matmul_fwd(Tensor out, Tensor in, Tensor w, WLayout layout, Tensor bias,
                            Tensor pre_gelu) = 0;
    // din (N,C) = dout @ W^T (overwritten; skipped when empty); if in_pre_gelu is given the input was
    // gelu(in_pre_gelu) and din is taken through the GELU: din = (dout @ W^T) * gelu'(in_pre_gelu).
    // dw += in^T @ dout (in its layout); dbias += column sums of dout (skipped when empty).
    virtual void matmul_bwd(Tensor din, Tensor dw, Tensor dbias, Tensor dout, Tensor in, Tensor w,
                            WLayout layout, Tensor in_pre_gelu) = 0;

    // FP8 products (--precision fp8; core/fp8.h): matmul_fwd and matmul_bwd with each operand rounded to
    // 8-bit floats under its own power-of-two scale first, the scale picked from the tensor's amax
    // (fp8_fake_quantize). Forward: in and W in E4M3. Backward: dout in E5M2 (gradients need the range),
    // against W in E4M3 for din and against in (E4M3) for dw. Products accumulate in f32 and come out in the
    // activations' dtype; the bias, the GELU and dbias (from the unrounded dout) are as in matmul_fwd/_bwd.
    virtual void matmul_fp8_fwd(Tensor out, Tensor in, Tensor w, WLayout layout, Tensor bias,
                                Tensor pre_gelu) = 0;
    virtual void matmul_fp8_bwd(Tensor din, Tensor dw, Tensor dbias, Tensor dout, Tensor in, Tensor w,
                                WLayout layout, Tensor in_pre_gelu) = 0;

    // Weight-only int8 (anvil quantize): W = q * scale, q (I8) in `layout` as matmul_fwd's W, scale (OC) f32,
    // one per output channel. out (N,OC) = in @ W + bias, pre_gelu as matmul_fwd. The activations stay float.
    virtual void matmul_q8_fwd(Tensor out, Tensor in, Tensor q, Tensor scale, WLayout layout, Tensor bias,
                               Tensor pre_gelu) = 0;
    // din (N,C) = dout @ W^T (overwritten), through the GELU when in_pre_gelu is given. An int8 weight is a
    // frozen base (QLoRA-style fine-tuning): it has no gradient.
    virtual void matmul_q8_bwd(Tensor din, Tensor dout, Tensor q, Tensor scale, WLayout layout,
                               Tensor in_pre_gelu) = 0;
    // embedding_fwd over an int8 token table: out (B,T,C) = q[tokens] * scale[tokens] + wpe[t]; q (V,C) I8,
    // scale (V) f32 (a row of the table is an output channel of the tied head).
    virtual void embedding_q8_fwd(Tensor out, Tensor tokens, Tensor q, Tensor scale, Tensor wpe) = 0;

    // GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    virtual void gelu_fwd(Tensor out, Tensor in) = 0;
    virtual void gelu_bwd(Tensor din, Tensor dout, Tensor in) = 0;  // din = dout * gelu'(in); may alias

    // Rotary position embedding (Hugging Face's rotate_half layout), in place on x (B,T,H*HS): for i < HS/2
    // the pair (x_i, x_{i+HS/2}) of every head turns by the angle (pos0 + t) * inv_freq[i], inv_freq (HS/2)
    // f32. inverse turns it back: the backward, applied to the gradient.
    virtual void rope(Tensor x, Tensor inv_freq, int H, int pos0, bool inverse) = 0;
    // The same for B sequences at their own positions: row b of x (B,T,H*HS) starts at pos[b] (B host
    // integers), in one call (a decode step of continuous batching).
    virtual void rope_rows(Tensor x, Tensor inv_freq, int H, std::span<const int> pos, bool inverse) = 0;
    // SwiGLU: out = silu(gate) * up, elementwise; the backward overwrites dgate and dup.
    virtual void swiglu_fwd(Tensor out, Tensor gate, Tensor up) = 0;
    virtual void swiglu_bwd(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) = 0;
    // Grouped-query heads into the packed layout: qkv (N, (NH + 2 KH) HS) = [q | k | v] from q (N, NH HS) and
    // k, v (N, KVH HS). KH is the width of qkv: KVH (what attention and the cache take) or NH, every
    // key/value head repeated NH/KVH times. The backward overwrites dq, dk, dv from dqkv (N, (NH + 2 KH) HS),
    // summing the repeats (attention_bwd's dqkv has KH = NH).
    virtual void qkv_pack(Tensor qkv, Tensor q, Tensor k, Tensor v, int NH) = 0;
    virtual void qkv_unpack(Tensor dq, Tensor dk, Tensor dv, Tensor dqkv, int NH) = 0;

    // Causal self-attention. qkv (B,T,(NH + 2 KVH) HS) packs q (B,T,NH,HS), k and v (B,T,KVH,HS); query head
    // h attends with key/value head h / (NH/KVH) (grouped-query attention; GPT-2: KVH = NH, qkv (B,T,3C)).
    // out (B,T,C), C = NH HS. `saved` keeps what the backward needs (its size is backend-defined, see
    // attention_saved_elems). `drop`: dropout on the probabilities (dropout_mask.h's AttnDropout), the
    // backward given the forward's.
    virtual size_t attention_saved_elems(const AttnDims& d) const = 0;
    virtual size_t attention_scratch_elems(const AttnDims& d) const = 0;
    virtual void attention_fwd(Tensor out, Tensor saved, Tensor qkv, int NH, const AttnDropout& drop) = 0;
    // dqkv (B,T,3C) overwritten: dq, then shares of each key/value head's dk and dv, one per query head of
    // its group, which qkv_unpack sums (with KVH = NH they are the gradients themselves). How the shares
    // split a group's sum is the implementation's: anvil's kernels give each query head its own term, cuDNN's
    // fused attention the whole sum to the group's first head and zero to the rest.
    virtual void attention_bwd(Tensor dqkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor out, Tensor saved,
                               int NH, const AttnDropout& drop) = 0;
    // Incremental attention for generation (one sequence). qkv (Tq, (NH + 2 KVH) HS) holds the new positions
    // pos0..pos0+Tq-1; their k and v are appended to kcache/vcache (maxT, KVH HS), then each new query
    // attends causally over positions 0..its own, query head h reading key/value head h / (NH/KVH) (KVH = NH
    // for GPT-2: qkv (Tq, 3C)). out (Tq, NH HS).
    virtual void attention_cached(Tensor out, Tensor qkv, Tensor kcache, Tensor vcache, int pos0, int NH) = 0;
    // attention_cached for B rows of one token each (continuous batching), over a paged cache.
    //   kcache, vcache (P, page, KVH HS): P pages of `page` positions
    //   pages (S, PPS) i32 on this backend: slot s's page table; position p of slot s is row p % page of
    //       page pages[s, p / page] (a slot holds up to PPS pages)
    //   qkv (B, (NH + 2 KVH) HS): row b is position pos[b] of slot slot[b]; out (B, NH HS)
    // Every row's k and v are written first, then each row's query attends over its slot's positions
    // 0..pos[b]: rows of one slot at consecutive positions attend over each other (a packed prefill), and
    // a decode step's rows each continue their own slot. slot, pos: B host integers; no (slot, position)
    // pair twice, a slot's rows in ascending positions, no page in two slots' tables (the caller keeps
    // them apart).
    virtual void attention_cached_rows(Tensor out, Tensor qkv, Tensor kcache, Tensor vcache, Tensor pages,
                                       std::span<const int> slot, std::span<const int> pos, int NH) = 0;

    // out = a + b, elementwise (out may alias a)
    virtual void residual_fwd(Tensor out, Tensor a, Tensor b) = 0;
    // x *= s, elementwise, in place
    virtual void scale(Tensor x, float s) = 0;
    // out = in * keep / (1 - p), keep from dropout_mask.h's hash of (seed, element): one seed, one mask, on
    // every backend. Its own backward: the same call on the gradient. out may alias in; p in [0, 1).
    virtual void dropout(Tensor out, Tensor in, float p, uint64_t seed) = 0;

    // Fused softmax + cross-entropy over logits (N,V) against targets (N) i32 (-1 = ignored row).
    // losses (N) f32 gets -log p[target] (0 for ignored rows). If dloss != 0, logits is overwritten with
    // the gradient dloss * (softmax - onehot) (zero rows for ignored targets); the probabilities are
    // never stored. Only the first `vocab_real` columns are real tokens; padded columns get
    // probability 0 and gradient 0.
    virtual void classifier(Tensor losses, Tensor logits, Tensor targets, float dloss, int vocab_real) = 0;
    // Log-probabilities of rows of logits (N,Vp) over their first V columns (backend/logprobs.h is the spec):
    // lp (N) f32 = log_softmax(row)[target], targets (N) i32 in [0, V); top_ids (N,K) i32 and top_lp (N,K)
    // f32 the K likeliest ids and theirs, most likely first, ties to the lower id (K = 0: both empty). For a
    // server's scored prompt rows: N * (2K + 1) values come back instead of N * V.
    virtual void token_logprobs(Tensor lp, Tensor top_ids, Tensor top_lp, Tensor logits, Tensor targets,
                                int V) = 0;

    // out (1) f32 = sum of squares of every element of every tensor in `grads`.
    virtual void global_norm_sq(Tensor out, const std::vector<Tensor>& grads) = 0;
    // AdamW on every slot, PyTorch's formulation (decoupled decay: p -= lr*wd*p before the Adam step).
    // Gradients are scaled by args.grad_scale and, if max_grad_norm > 0 and the norm (sqrt of
    // norm_sq[0]) exceeds it, by max_grad_norm / (norm + 1e-6). If norm_sq is not finite the update
    // is skipped entirely (nothing is written).
    virtual void adamw(const std::vector<ParamSlot>& slots, const AdamWArgs& args, Tensor norm_sq) = 0;

    // ---- a job of several processes -------------------------------------------------------------
    // Collectives on this backend's memory among the job's ranks (NCCL on CUDA); null where the host's
    // collectives reach the memory directly (the CPU). Throws saying what to install when they cannot be had.
    virtual std::unique_ptr<DeviceCollectives> make_collectives(const CollectiveSetup& /*setup*/) {
        return nullptr;
    }
};

// How the CUDA backend computes attention: Gemm (cuBLASLt products on the tensor cores, keeping the (T,T)
// probabilities), Flash (anvil's tiled kernels, keeping only the log-sum-exp: on the tensor cores in bf16 and
// fp16, on the CUDA cores in fp32), FlashSimt (the CUDA-core kernels in every dtype), Cudnn (cuDNN's fused
// flash attention: bf16/fp16 without dropout, head sizes multiples of 8; an error elsewhere), Auto (Flash on
// the tensor cores, else Gemm where the probabilities take at most 1 GiB per layer). The CPU backend has one
// implementation.
enum class AttentionImpl : uint8_t { Auto, Gemm, Flash, FlashSimt, Cudnn };
// Parses --attention auto|gemm|flash|flash-simt|cudnn; throws naming the flag otherwise.
AttentionImpl parse_attention(const std::string& name);

struct BackendOptions {
    Device device = Device::CPU;
    int threads = 0;    // CPU threads (0 = all cores / OMP_NUM_THREADS)
    int device_id = 0;  // CUDA device ordinal
    AttentionImpl attention = AttentionImpl::Auto;
    // CUDA: query rows a block of the tensor-core attention forward takes, 64 or 128 (0: 64;
    // --attn-fwd-rows); a tuning choice the benchmarks compare, the same results either way
    int attn_fwd_rows = 0;
    // CUDA: time cuBLASLt's best few algorithms for each product shape once and keep the fastest (--gemm-tune
    // on); runs may then differ in the last bits, as with PyTorch's cudnn.benchmark
    bool gemm_tune = false;
};

// Creates the backend for `opts.device`; throws a clear error if it is not built in or not usable.
std::unique_ptr<Backend> make_backend(const BackendOptions& opts);
// True when the binary was built with the CUDA backend.
bool cuda_built();
// True when a CUDA device is visible and usable (false when not built).
bool cuda_available();

// What `anvil doctor` and `anvil bench` ask of the GPU; the layers above call these and never name CUDA.
// One object per device (name, compute capability, memory, SMs, driver and runtime CUDA versions, cuBLASLt,
// cuDNN and NCCL versions found at run time); `problem` gets why no device is usable (a binary without the
// CUDA backend among the reasons), or stays empty.
nlohmann::json gpu_device_report(std::string* problem);
// A device's measured ceilings: matrix-product rates (matmul_fp32, _tf32, _bf16, _fp16, and _fp8 where the
// device has it) through cuBLASLt in TFLOP/s; device-to-device copy (copy_d2d) and host-to-device bandwidth
// from pinned and pageable memory (h2d_pinned, h2d_pageable) in GB/s. Throws without the CUDA backend.
struct GpuRate {
    std::string name, unit;
    double measured = 0;
    std::string detail;  // shape, size, repeats
};
struct GpuRates {
    std::string device_name;
    std::vector<GpuRate> rates;
};
GpuRates gpu_measure(int device, bool quick);

}  // namespace anvil
