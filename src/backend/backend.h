// The backend seam: every op the model families need (GPT-2, Llama), forward and backward, behind one
// interface.
//
// The ops are listed once, with their contracts, in ops.def; this class, both backends' declarations and the
// profiling backend are generated from that list. The CPU backend (src/backend/cpu) is the specification:
// plain loops plus BLAS, f32 only. The CUDA backend (src/backend/cuda) implements the same contract with its
// own kernels and libraries and is tested against the CPU one. Model and trainer code talk only to this
// interface.
//
// Conventions shared by all ops:
//  - N = B*T rows; C channels; V vocabulary; NH heads, HS = C/NH head size.
//  - Forward ops overwrite their outputs.
//  - Backward ops ACCUMULATE (+=) into parameter gradients. Activation gradients are overwritten, except
//    the norms' din (layernorm_bwd, rmsnorm_bwd), which is accumulated because it is the residual stream's
//    gradient.
//  - A frozen parameter has no gradient: its gradient tensor is passed empty and the op skips that part of
//    the work (no weight-gradient product for a frozen matrix).
//  - Statistics (layernorm mean/rstd, per-row losses, the grad-norm scalar) are f32 whatever the
//    activation dtype.
//  - Tensors live on the backend's device; upload/download move bytes to and from host memory.
#pragma once

#include <functional>
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

// FP8 delayed scaling for one linear layer's products (core/fp8.h's Fp8History): `state` (3, F) f32 on the
// backend, F = Fp8History::floats(H), the histories of its input, its weight and its output gradient in that
// order. Empty: every operand scaled from its own amax (current scaling).
struct Fp8Scaling {
    Tensor state;
    bool record = false;  // a training pass: the forward's and the backward's amaxes join the histories
    bool again = false;   // a forward run a second time (--recompute full): its first run's scales, kept
    bool on() const { return !state.empty(); }
};

// A stretch of a backend's queued work recorded once and replayed as one launch (a CUDA graph): the same
// kernels and library calls with the same arguments on the same memory, reading what that memory holds when
// it replays (so what changes from one replay to the next travels in device memory: a decode step's tokens,
// positions and slots).
class Recording {
public:
    virtual ~Recording() = default;
    // Queues the recorded work; false (nothing queued) where the backend has since moved memory the recording
    // names (a scratch buffer grew): record again.
    virtual bool replay() = 0;
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
    // The likeliest of the first V columns of each row of logits (N,Vp), into out (N) on the host: greedy
    // decoding's choice made on the device (token_logprobs' top 1, ties to the lower id), so N ids come back
    // instead of N * Vp logits. zeros (N) i32 must hold 0 (the targets, whose log-probabilities go to lp
    // (N) f32 unread); ids (N) i32 and top (N) f32 are scratch.
    void argmax_rows(int32_t* out, Tensor logits, int V, Tensor zeros, Tensor lp, Tensor ids, Tensor top);
    virtual void convert(Tensor dst, Tensor src) = 0;  // same numel, any float dtypes
    virtual void synchronize() = 0;
    // Records what `work` queues on this backend without running it and returns the recording (replay() runs
    // it); null where this backend records nothing (the CPU, whose ops run as they are called; CUDA with
    // BackendOptions::record off or under --profile) or where `work` did what a recording cannot hold (a
    // wait for the device, an allocation: said once on stderr). Null means nothing of `work` ran on the
    // device: run it as usual. `work` must queue the same work for every replay and read nothing back; a
    // throw from it ends the recording and propagates.
    virtual std::unique_ptr<Recording> record(const std::function<void()>& work) {
        (void)work;
        return nullptr;
    }
    // Device memory accounting (what alloc handed out, not including library workspaces).
    virtual size_t memory_in_use() const = 0;
    virtual size_t memory_peak() const = 0;
    // Pretend the device has only this many bytes (0 = its real size): --memory-limit, and tests.
    virtual void set_memory_limit(size_t bytes) = 0;

    // Matrix products in a lower precision than the tensors' (autocast): `products` BF16 makes the CPU
    // backend round both operands of every matmul_fwd/matmul_bwd product to bf16 and multiply them on the
    // cores' bf16 instructions (oneDNN), accumulating and storing f32, as PyTorch's CPU autocast does; F32
    // turns it off. False where the backend has no such mode (CUDA multiplies in its tensors' dtype; a build
    // without oneDNN).
    virtual bool set_autocast(DType products) {
        (void)products;
        return false;
    }
    // The sizes of attention_fwd's `saved` and attention_bwd's `scratch`, in elements of the activations'
    // dtype: backend-defined (what its implementation keeps).
    virtual size_t attention_saved_elems(const AttnDims& d) const = 0;
    virtual size_t attention_scratch_elems(const AttnDims& d) const = 0;
    // The size of matmul_fp8_fwd/_bwd's `kept` for N rows of C inputs and OC outputs, in elements of the
    // activations' dtype `dt`: what the forward can leave for the backward (0: nothing, the backward derives
    // it).
    virtual size_t fp8_kept_elems(int N, int C, int OC, DType dt) const {
        (void)N, (void)C, (void)OC, (void)dt;
        return 0;
    }

    // ---- ops: one pure virtual member each, from the op list (ops.def has each op's contract) -----------
#define ANVIL_OP(name, params, args, rule, label, bytes) virtual void name params = 0;
#define ANVIL_OP_CUSTOM(name, params, args, label, bytes) virtual void name params = 0;
#include "backend/ops.def"

    // ---- a job of several processes -------------------------------------------------------------
    // Collectives on this backend's memory among the job's ranks (NCCL on CUDA); null where the host's
    // collectives reach the memory directly (the CPU). Throws saying what to install when they cannot be had.
    virtual std::unique_ptr<DeviceCollectives> make_collectives(const CollectiveSetup& /*setup*/) {
        return nullptr;
    }
};

// Every op's name, in the op list's order (the op table is checked against it).
inline constexpr const char* kBackendOps[] = {
#define ANVIL_OP(name, params, args, rule, label, bytes) #name,
#define ANVIL_OP_CUSTOM(name, params, args, label, bytes) #name,
#include "backend/ops.def"
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
    // CUDA: record a decode step once per shape and replay it as one CUDA graph (Backend::record);
    // ANVIL_CUDA_GRAPHS=0 in the environment turns it off (each kernel launched from the host, as before)
    bool record = true;
    // CUDA: products over at most 8 rows (decoding) through anvil's kernels that read the weight once, 16
    // bytes a load (always for int8 weights), rather than cuBLASLt; also ANVIL_DIRECT_PRODUCTS=1 in the
    // environment. A choice the benchmarks compare until a card decides the default
    bool direct_products = false;
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
