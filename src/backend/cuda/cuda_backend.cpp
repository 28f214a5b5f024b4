#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/device_sizes.h"
#include "backend/op_checks.h"
#include "core/text.h"

namespace anvil {

namespace {
constexpr size_t kWorkspaceBytes = sizes::kCudaWorkspaceBytes;      // partial sums, sort buffers
constexpr size_t kLtWorkspaceBytes = sizes::kCudaLtWorkspaceBytes;  // cuBLASLt's
}  // namespace

int cuda_device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();  // no driver / no device: clear the sticky error
        return 0;
    }
    return n;
}

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opts) {
    const int device = opts.device_id;
    const int n = cuda_device_count();
    ANVIL_CHECK(n > 0,
                "--device cuda: no usable CUDA device (run anvil doctor to see why), or use --device cpu");
    ANVIL_CHECK(device >= 0 && device < n,
                "CUDA device {} does not exist ({} visible): a job's rank uses the GPU of its local rank, so "
                "launch at most {} ranks per machine",
                device, n, n);
    return std::make_unique<CudaBackend>(opts);
}

namespace cuda {

void* Ctx::scratch(size_t offset, size_t bytes) const {
    offset = (offset + 255) / 256 * 256;
    ANVIL_CHECK(offset + bytes <= workspace_bytes, "cuda workspace: {} bytes needed at {}, {} available",
                bytes, offset, workspace_bytes);
    return workspace + offset;
}

const char* cublas_status_name(cublasStatus_t s) {
    switch (s) {
        case CUBLAS_STATUS_SUCCESS:
            return "CUBLAS_STATUS_SUCCESS";
        case CUBLAS_STATUS_NOT_INITIALIZED:
            return "CUBLAS_STATUS_NOT_INITIALIZED";
        case CUBLAS_STATUS_ALLOC_FAILED:
            return "CUBLAS_STATUS_ALLOC_FAILED";
        case CUBLAS_STATUS_INVALID_VALUE:
            return "CUBLAS_STATUS_INVALID_VALUE";
        case CUBLAS_STATUS_ARCH_MISMATCH:
            return "CUBLAS_STATUS_ARCH_MISMATCH";
        case CUBLAS_STATUS_MAPPING_ERROR:
            return "CUBLAS_STATUS_MAPPING_ERROR";
        case CUBLAS_STATUS_EXECUTION_FAILED:
            return "CUBLAS_STATUS_EXECUTION_FAILED";
        case CUBLAS_STATUS_INTERNAL_ERROR:
            return "CUBLAS_STATUS_INTERNAL_ERROR";
        case CUBLAS_STATUS_NOT_SUPPORTED:
            return "CUBLAS_STATUS_NOT_SUPPORTED";
        case CUBLAS_STATUS_LICENSE_ERROR:
            return "CUBLAS_STATUS_LICENSE_ERROR";
        default:
            return "cuBLAS error";
    }
}

}  // namespace cuda

CudaBackend::CudaBackend(const BackendOptions& opts) : device_(opts.device_id), attention_(opts.attention) {
    record_ = opts.record && env_not_off("ANVIL_CUDA_GRAPHS");
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaGetDeviceProperties(&prop_, device_));
    CUDA_CHECK(cudaStreamCreateWithFlags(&ctx_.stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasLtCreate(&ctx_.lt));
    ctx_.sm_count = prop_.multiProcessorCount;
    ctx_.smem_optin = prop_.sharedMemPerBlockOptin;
    ANVIL_CHECK(opts.attn_fwd_rows == 0 || opts.attn_fwd_rows == 64 || opts.attn_fwd_rows == 128,
                "attention forward rows {}: use 64 or 128", opts.attn_fwd_rows);
    if (opts.attn_fwd_rows != 0) ctx_.attn_fwd_rows = opts.attn_fwd_rows;
    ctx_.gemm_tune = opts.gemm_tune;
    ctx_.gelu_epilogue = env_not_off("ANVIL_GELU_EPILOGUE");
    ctx_.direct_products = opts.direct_products || env_on("ANVIL_DIRECT_PRODUCTS");
    workspace_ = alloc(kWorkspaceBytes);
    lt_workspace_ = alloc(kLtWorkspaceBytes);
    direct_done_ = alloc(sizes::kCudaDirectDoneBytes);  // zeroed, as every allocation
    ctx_.direct_done = static_cast<unsigned*>(direct_done_.data());
    ctx_.workspace = static_cast<char*>(workspace_.data());
    ctx_.workspace_bytes = kWorkspaceBytes;
    ctx_.lt_workspace = lt_workspace_.data();
    ctx_.lt_workspace_bytes = kLtWorkspaceBytes;
    lt_plans_ = cuda::make_lt_plans();
    ctx_.lt_plans = lt_plans_.get();
    cudnn_ = cuda::make_cudnn_attention(
        [this](size_t bytes) {
            moved_++;  // the workspace grows: what a recording named is freed
            return alloc(bytes);
        },
        prop_.major * 10 + prop_.minor);
    ctx_.cudnn = cudnn_.get();
}

CudaBackend::~CudaBackend() {
    // Destructors log, never throw: ignore errors while tearing down.
    (void)cudaStreamSynchronize(ctx_.stream);
    lt_plans_.reset();
    cudnn_.reset();
    workspace_.reset();
    lt_workspace_.reset();
    direct_done_.reset();
    q8_weight_.reset();
    fp8_scratch_.reset();
    (void)cublasLtDestroy(ctx_.lt);
    (void)cudaStreamDestroy(ctx_.stream);
}

std::string CudaBackend::describe() const {
    return fmt::format("cuda:{} ({}, compute capability {}.{}, {} SMs, {:.1f} GiB, cuBLASLt {})", device_,
                       prop_.name, prop_.major, prop_.minor, prop_.multiProcessorCount,
                       double(prop_.totalGlobalMem) / double(1ull << 30), cublasLtGetVersion());
}

std::string CudaBackend::device_name() const {
    return prop_.name;
}

Buffer CudaBackend::alloc(size_t bytes) {
    const size_t rounded = memory_.admit(bytes);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, rounded);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        (void)cudaMemGetInfo(&free_b, &total_b);
        throw OutOfMemory(
            fmt::format("out of GPU memory allocating {:.1f} MiB ({:.1f} of {:.1f} GiB free); use a "
                        "smaller model or batch, --recompute full, or --batch auto",
                        double(rounded) / (1 << 20), double(free_b) / double(1ull << 30),
                        double(total_b) / double(1ull << 30)));
    }
    CUDA_CHECK(e);
    CUDA_CHECK(cudaMemsetAsync(p, 0, rounded, ctx_.stream));
    return memory_.track(p, bytes, rounded, Device::CUDA, [](void* q) { (void)cudaFree(q); });
}

Buffer CudaBackend::alloc_host(size_t bytes) {
    void* p = nullptr;
    CUDA_CHECK(cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocDefault));
    return Buffer(p, bytes, Device::CPU, [](void* q) { (void)cudaFreeHost(q); });
}

void CudaBackend::zero(Tensor t) {
    CUDA_CHECK(cudaMemsetAsync(t.ptr<void>(), 0, t.nbytes(), ctx_.stream));  // (ptr: contiguous only)
}

void CudaBackend::upload(Tensor dst, const void* host) {
    CUDA_CHECK(cudaMemcpyAsync(dst.ptr<void>(), host, dst.nbytes(), cudaMemcpyHostToDevice, ctx_.stream));
}

void CudaBackend::download(void* host, Tensor src) {
    CUDA_CHECK(cudaMemcpyAsync(host, src.ptr<void>(), src.nbytes(), cudaMemcpyDeviceToHost, ctx_.stream));
    CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
}

void CudaBackend::download_async(void* host, Tensor src) {
    CUDA_CHECK(cudaMemcpyAsync(host, src.ptr<void>(), src.nbytes(), cudaMemcpyDeviceToHost, ctx_.stream));
}

void CudaBackend::convert(Tensor dst, Tensor src) {
    cuda::convert(ctx_, dst, src);
}
void CudaBackend::synchronize() {
    CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
}

namespace {

// A captured CUDA graph, replayed on the stream it was captured from while the backend's scratch buffers stay
// where they were (`moved` unchanged). It must not outlive its backend.
class CudaRecording final : public Recording {
public:
    CudaRecording(cudaGraphExec_t exec, cudaStream_t stream, const uint64_t* moved)
        : exec_(exec), stream_(stream), moved_(moved), at_(*moved) {}
    ~CudaRecording() override { (void)cudaGraphExecDestroy(exec_); }
    bool replay() override {
        if (*moved_ != at_) return false;
        CUDA_CHECK(cudaGraphLaunch(exec_, stream_));
        return true;
    }

private:
    cudaGraphExec_t exec_;
    cudaStream_t stream_;
    const uint64_t* moved_;
    uint64_t at_;
};

}  // namespace

std::unique_ptr<Recording> CudaBackend::record(const std::function<void()>& work) {
    if (!record_) return nullptr;
    // thread-local: another thread's CUDA calls (a data loader's uploads) do not break this capture
    CUDA_CHECK(cudaStreamBeginCapture(ctx_.stream, cudaStreamCaptureModeThreadLocal));
    cudaGraph_t graph = nullptr;
    const auto refused = [&](const char* why) -> std::unique_ptr<Recording> {
        if (graph) (void)cudaGraphDestroy(graph);
        (void)cudaGetLastError();
        if (!said_)
            std::fprintf(stderr,
                         "anvil: a decode step could not be recorded as a CUDA graph (%s); its kernels are "
                         "launched one by one instead\n",
                         why);
        said_ = true;
        return nullptr;
    };
    try {
        work();
    } catch (...) {
        cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
        (void)cudaStreamIsCapturing(ctx_.stream, &st);
        (void)cudaStreamEndCapture(ctx_.stream, &graph);
        // a call the capture could not hold failed (a wait, an allocation: so a scratch buffer that grows,
        // which waits and allocates, is refused here): run the work without it
        if (st == cudaStreamCaptureStatusInvalidated) return refused("a call inside it is not capturable");
        if (graph) (void)cudaGraphDestroy(graph);
        (void)cudaGetLastError();
        throw;
    }
    if (cudaStreamEndCapture(ctx_.stream, &graph) != cudaSuccess || !graph)
        return refused("the capture was invalidated");
    cudaGraphExec_t exec = nullptr;
    if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess)
        return refused("instantiating the graph failed");
    (void)cudaGraphDestroy(graph);
    return std::make_unique<CudaRecording>(exec, ctx_.stream, &moved_);
}

void CudaBackend::rope(Tensor x, Tensor inv_freq, int H, int pos0, bool inverse) {
    const RopeDims d = check_rope(x, inv_freq, H);
    cuda::rope(ctx_, x, inv_freq, d.B, d.T, d.H, d.HS, pos0, inverse);
}

void CudaBackend::rope_rows(Tensor x, Tensor inv_freq, int H, Tensor pos, bool inverse) {
    const RopeDims d = check_rope_rows(x, inv_freq, H, pos);
    cuda::rope_rows(ctx_, x, inv_freq, d.B, d.T, d.H, d.HS, pos, inverse);
}

void CudaBackend::qkv_unpack(Tensor dq, Tensor dk, Tensor dv, Tensor dqkv, int NH) {
    const HeadDims d = check_qkv_unpack(dq, dk, dv, dqkv, NH);
    cuda::qkv_unpack(ctx_, dq, dk, dv, dqkv, d.N, d.NH, d.KVH, d.KH, d.HS);
}

void* CudaBackend::grown(Buffer& b, size_t bytes) {
    if (b.bytes() < bytes) {  // grows to the largest request; the work queued before is done with it
        CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
        b.reset();
        b = alloc(bytes);
        moved_++;
    }
    return b.data();
}

Tensor CudaBackend::dequantized(Tensor q, Tensor scale, WLayout layout, DType dtype) {
    Tensor w = q;
    w.data = grown(q8_weight_, size_t(q.numel()) * dtype_size(dtype));
    w.dtype = dtype;
    cuda::dequant_q8(ctx_, w, q, scale, layout);
    return w;
}

void CudaBackend::check_fp8() const {
    ANVIL_CHECK(prop_.major * 10 + prop_.minor >= 89,
                "--precision fp8: the {} (compute capability {}.{}) has no FP8 tensor cores; they start with "
                "8.9 (Ada) "
                "and 9.0 (Hopper). Use --precision bf16",
                prop_.name, prop_.major, prop_.minor);
}

// The op's `kept` as fp8.cu takes it: null where none was given or none is needed at these sizes.
void* CudaBackend::fp8_kept(Tensor kept, const MatDims& d, DType dt) const {
    const size_t want = sizes::cuda_fp8_kept_elems(d.N, d.C, d.OC, dt);
    ANVIL_CHECK(
        kept.empty() || (kept.dtype == dt && size_t(kept.numel()) >= want && kept.contiguous()),
        "matmul_fp8: `kept` is {} {}; an FP8 product of {} x {} -> {} in {} keeps {} elements of its dtype",
        kept.shape.str(), dtype_name(kept.dtype), d.N, d.C, d.OC, dtype_name(dt), want);
    return kept.empty() || want == 0 ? nullptr : kept.data;
}

size_t CudaBackend::fp8_kept_elems(int N, int C, int OC, DType dt) const {
    return sizes::cuda_fp8_kept_elems(N, C, OC, dt);
}

namespace {

cuda::Fp8Hist fp8_hist(const Fp8Scaling& s) {
    const int F = check_fp8_scaling(s);
    return {F ? s.state.f32() : nullptr, F, s.record, s.again};
}

}  // namespace

void CudaBackend::matmul_fp8_fwd(Tensor out, Tensor in, Tensor w, WLayout layout, Tensor bias,
                                 Tensor pre_gelu, Tensor kept, const Fp8Scaling& scaling) {
    const MatDims d = check_matmul_fwd(out, in, w, layout, bias, pre_gelu);
    check_fp8();
    const cuda::Fp8Hist h = fp8_hist(scaling);
    void* scratch = grown(fp8_scratch_, cuda::matmul_fp8_scratch_bytes(d.N, d.C, d.OC, in.dtype));
    cuda::matmul_fp8_fwd(ctx_, scratch, fp8_kept(kept, d, in.dtype), out, in, w, layout, bias, pre_gelu, h);
}

void CudaBackend::matmul_fp8_bwd(Tensor din, Tensor dw, Tensor dbias, Tensor dout, Tensor in, Tensor w,
                                 WLayout layout, Tensor in_pre_gelu, Tensor kept, const Fp8Scaling& scaling) {
    const MatDims d = check_matmul_bwd(din, dw, dout, in, w, layout);
    check_fp8();
    const cuda::Fp8Hist h = fp8_hist(scaling);
    void* scratch = grown(fp8_scratch_, cuda::matmul_fp8_scratch_bytes(d.N, d.C, d.OC, in.dtype));
    cuda::matmul_fp8_bwd(ctx_, scratch, fp8_kept(kept, d, in.dtype), din, dw, dbias, dout, in, w, layout,
                         in_pre_gelu, h);
}

void CudaBackend::matmul_q8_fwd(Tensor out, Tensor in, Tensor q, Tensor scale, WLayout layout, Tensor bias,
                                Tensor pre_gelu) {
    const MatDims d = check_matmul_q8(out, in, q, scale, layout, bias, pre_gelu);
    if (d.N > cuda::kDirectRows)
        return cuda::matmul_fwd(ctx_, out, in, dequantized(q, scale, layout, in.dtype), layout, bias,
                                pre_gelu);
    cuda::matmul_direct(ctx_, out, in, q, scale, layout, bias, pre_gelu);
}

void CudaBackend::matmul_q8_bwd(Tensor din, Tensor dout, Tensor q, Tensor scale, WLayout layout,
                                Tensor in_pre_gelu) {
    const MatDims d = check_matmul_bwd(din, {}, dout, din, q, layout);
    ANVIL_CHECK(q.dtype == DType::I8 && scale.numel() == d.OC,
                "int8 matmul backward: weight {} {}, {} scales", q.shape.str(), dtype_name(q.dtype),
                scale.numel());
    cuda::matmul_bwd(ctx_, din, {}, {}, dout, din, dequantized(q, scale, layout, din.dtype), layout,
                     in_pre_gelu);
}

// Three implementations: anvil's flash-style kernels (keep only the log-sum-exp), the cuBLASLt one (tensor
// cores; keeps the probabilities, B*NH*T*T elements) and, asked for by name, cuDNN's fused flash attention
// (the flash kernels' statistics and scratch; a call it cannot take is an error saying why). `auto` takes the
// flash kernels wherever they run on the tensor cores (bf16 and f16): on an H100 at GPT-2 124M (bf16, batch
// 16 x 1024) a step took 41.0 ms with them against 53.8 ms with cuBLASLt's, and 4.5 GiB less memory
// (bench/results/2026-11-27-h100.json). Elsewhere (f32) `auto` takes the cuBLASLt path where the
// probabilities take at most 1 GiB per layer. The saved tensor is sized at reserve time for the largest
// batch; a call decides from the tensor it is given, the forward and the backward alike.
bool CudaBackend::attention_gemm_planned(const AttnDims& d) const {
    return sizes::cuda_gemm_planned(attention_, d, cuda::attention_flash_tc_takes(ctx_, d),
                                    cuda::attention_gemm_fits(ctx_, d));
}

bool CudaBackend::attention_uses_gemm(const AttnDims& d, const Tensor& saved) const {
    return attention_gemm_planned(d) && size_t(saved.numel()) >= cuda::attention_gemm_saved_elems(d);
}

size_t CudaBackend::attention_saved_elems(const AttnDims& d) const {
    return sizes::cuda_attention_saved_elems(d, attention_gemm_planned(d));
}
size_t CudaBackend::attention_scratch_elems(const AttnDims& d) const {
    return sizes::cuda_attention_scratch_elems(d);
}

void CudaBackend::attention_fwd(Tensor out, Tensor saved, Tensor qkv, int NH, const AttnDropout& drop) {
    const AttnShape s = check_attention(qkv, out, NH);
    check_attention_dropout(drop);
    const AttnDims d{s.B, s.T, NH, s.C / NH, qkv.dtype};
    if (attention_uses_gemm(d, saved)) return cuda::attention_gemm_fwd(ctx_, s, out, saved, qkv, drop);
    ANVIL_CHECK(saved.nbytes() >= cuda::attention_flash_saved_bytes(d), "attention: saved too small");
    if (attention_ == AttentionImpl::Cudnn)
        return cuda::attention_cudnn_fwd(ctx_, s, out, static_cast<float*>(saved.data), qkv, drop);
    cuda::attention_flash_fwd(ctx_, s, out, saved, qkv, attention_ != AttentionImpl::FlashSimt, drop);
}

void CudaBackend::attention_bwd(Tensor dqkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor out,
                                Tensor saved, int NH, const AttnDropout& drop) {
    const AttnShape s = check_attention(qkv, dout, NH);
    expect_shape(dqkv, {s.B, s.T, 3 * s.C}, "attention dqkv");
    expect_shape(out, {s.B, s.T, s.C}, "attention out");
    check_attention_dropout(drop);
    const AttnDims d{s.B, s.T, NH, s.C / NH, qkv.dtype};
    if (attention_uses_gemm(d, saved)) return cuda::attention_gemm_bwd(ctx_, s, dqkv, dout, qkv, saved, drop);
    ANVIL_CHECK(scratch.nbytes() >= cuda::attention_flash_scratch_bytes(d), "attention: scratch too small");
    if (attention_ == AttentionImpl::Cudnn)
        return cuda::attention_cudnn_bwd(ctx_, s, dqkv, static_cast<float*>(scratch.data), dout, qkv, out,
                                         static_cast<const float*>(saved.data), drop);
    cuda::attention_flash_bwd(ctx_, s, dqkv, scratch, dout, qkv, out, saved,
                              attention_ != AttentionImpl::FlashSimt, drop);
}

void CudaBackend::token_logprobs(Tensor lp, Tensor top_ids, Tensor top_lp, Tensor logits, Tensor targets,
                                 int V) {
    const LogprobDims d = check_token_logprobs(lp, top_ids, top_lp, logits, targets, V);
    if (d.N > 0) cuda::token_logprobs(ctx_, lp, top_ids, top_lp, logits, targets, V, d.K);
}

// The listed ops' members (ops.def's ANVIL_OP): the op's rule, then its kernel.
#define ANVIL_CTX_ARGS(...) (ctx_, __VA_ARGS__)
#define ANVIL_OP(name, params, args, rule, label, bytes) \
    void CudaBackend::name params {                      \
        check_op_##name args;                            \
        cuda::name ANVIL_CTX_ARGS args;                  \
    }
#include "backend/ops.def"
#undef ANVIL_CTX_ARGS

}  // namespace anvil
