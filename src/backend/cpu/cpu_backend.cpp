#include "backend/cpu/cpu_backend.h"

#include <cblas.h>
#include <omp.h>
#include <pmmintrin.h>
#include <xmmintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "backend/cpu/ops.h"
#include "backend/device_sizes.h"
#include "backend/dropout_mask.h"
#include "backend/host_info.h"
#include "backend/logprobs.h"
#include "backend/op_checks.h"
#include "core/fp8.h"

extern "C" {
// OpenBLAS extensions (declared in its cblas.h on Debian, repeated here for other BLAS headers).
char* openblas_get_config(void);
}

namespace anvil {

namespace {

void expect_f32(const Tensor& t, const char* what) {
    ANVIL_CHECK(t.dtype == DType::F32, "cpu backend: {} is {}, the CPU backend computes in F32 only", what,
                dtype_name(t.dtype));
    ANVIL_CHECK(t.device == Device::CPU, "cpu backend: {} lives on {}, not the host", what,
                device_name(t.device));
}

// The first row of an f32 tensor that may be a strided view (its rows t.ld() apart).
float* rows_f32(const Tensor& t) {
    ANVIL_ASSERT(t.dtype == DType::F32);
    return t.row0<float>();
}

}  // namespace

CpuBackend::CpuBackend(int threads) : threads_(threads > 0 ? threads : omp_get_max_threads()) {
    omp_set_num_threads(threads_);
    openblas_set_num_threads(threads_);
    // Flush denormals to zero on every thread of the pool (the OpenMP threads persist, and OpenBLAS's
    // OpenMP build runs on them). Softmax tails and small gradients produce denormals, which cost x86
    // cores microcode assists: training ran its matrix products at a quarter of their speed without this.
#pragma omp parallel num_threads(threads_)
    {
        _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
        _MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);
    }
    _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
    _MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);
}

std::string CpuBackend::describe() const {
    return fmt::format("cpu ({} threads, {})", threads_, openblas_get_config());
}

std::string CpuBackend::device_name() const {
    return cpu_info().model;
}

Buffer CpuBackend::alloc(size_t bytes) {
    const size_t rounded = memory_.admit(bytes);
    void* p = std::aligned_alloc(kAlign, rounded);
    if (!p)
        throw OutOfMemory(fmt::format(
            "out of host memory allocating {:.1f} MiB; use a smaller model or batch, or --recompute full",
            double(bytes) / (1 << 20)));
    std::memset(p, 0, bytes);
    return memory_.track(p, bytes, rounded, Device::CPU, [](void* q) { std::free(q); });
}

void CpuBackend::zero(Tensor t) {
    std::memset(t.ptr<void>(), 0, t.nbytes());  // (ptr: contiguous tensors only, here and below)
}
void CpuBackend::upload(Tensor dst, const void* host) {
    std::memcpy(dst.ptr<void>(), host, dst.nbytes());
}
void CpuBackend::download(void* host, Tensor src) {
    std::memcpy(host, src.ptr<void>(), src.nbytes());
}

void CpuBackend::convert(Tensor dst, Tensor src) {
    ANVIL_CHECK(dst.numel() == src.numel(), "convert: {} elements into {}", src.numel(), dst.numel());
    if (dst.dtype == src.dtype) {
        std::memcpy(dst.ptr<void>(), src.ptr<void>(), src.nbytes());
    } else if (src.dtype == DType::F32) {
        convert_from_f32(dst.ptr<void>(), dst.dtype, src.f32(), size_t(src.numel()));
    } else {
        ANVIL_CHECK(dst.dtype == DType::F32, "convert: {} to {} is not supported", dtype_name(src.dtype),
                    dtype_name(dst.dtype));
        convert_to_f32(dst.f32(), src.ptr<void>(), src.dtype, size_t(src.numel()));
    }
}

void CpuBackend::embedding_fwd(Tensor out, Tensor tokens, Tensor wte, Tensor wpe) {
    expect_f32(out, "embedding out");
    const auto [B, T, C, V] = check_embedding(out, tokens, wte, wpe);
    const int32_t* tok = tokens.ptr<int32_t>();
    for (int64_t i = 0; i < tokens.numel(); i++)
        ANVIL_CHECK(tok[i] >= 0 && tok[i] < V,
                    "embedding: token id {} at position {} is outside the vocabulary "
                    "(0..{})",
                    tok[i], i, V - 1);
    cpu::embedding_forward(out.f32(), tok, wte.f32(), wpe.f32(), B, T, C, V);
}

void CpuBackend::embedding_bwd(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens) {
    const auto [B, T, C, V] = check_embedding_bwd(dwte, dwpe, dout, tokens);
    (void)V;
    cpu::embedding_backward(dwte.f32(), dwpe.f32(), dout.f32(), tokens.ptr<int32_t>(), B, T, C);
}

void CpuBackend::layernorm_fwd(Tensor out, Tensor mean, Tensor rstd, Tensor in, Tensor w, Tensor b) {
    const auto [N, C] = check_layernorm(out, mean, rstd, in, w, b);
    cpu::layernorm_forward(out.f32(), mean.f32(), rstd.f32(), in.f32(), w.f32(), b.f32(), N, C);
}

void CpuBackend::layernorm_bwd(Tensor din, Tensor dw, Tensor db, Tensor dout, Tensor in, Tensor w,
                               Tensor mean, Tensor rstd) {
    const auto [N, C] = check_layernorm_bwd(din, dw, db, dout, in);
    cpu::layernorm_backward(din.f32(), dw.empty() ? nullptr : dw.f32(), db.empty() ? nullptr : db.f32(),
                            dout.f32(), in.f32(), w.f32(), mean.f32(), rstd.f32(), N, C);
}

void CpuBackend::rmsnorm_fwd(Tensor out, Tensor rstd, Tensor in, Tensor w, float eps) {
    const auto [N, C] = check_rmsnorm(out, rstd, in, w);
    cpu::rmsnorm_forward(out.f32(), rstd.f32(), in.f32(), w.f32(), N, C, eps);
}

void CpuBackend::rmsnorm_bwd(Tensor din, Tensor dw, Tensor dout, Tensor in, Tensor w, Tensor rstd) {
    const auto [N, C] = check_rmsnorm_bwd(din, dw, dout, in, rstd);
    cpu::rmsnorm_backward(din.f32(), dw.empty() ? nullptr : dw.f32(), dout.f32(), in.f32(), w.f32(),
                          rstd.f32(), N, C);
}

void CpuBackend::rope(Tensor x, Tensor inv_freq, int H, int pos0, bool inverse) {
    const auto [B, T, h, HS] = check_rope(x, inv_freq, H);
    cpu::rope(rows_f32(x), x.ld(), inv_freq.f32(), B, T, h, HS, pos0, inverse);
}

void CpuBackend::rope_rows(Tensor x, Tensor inv_freq, int H, Tensor pos, bool inverse) {
    const auto [B, T, h, HS] = check_rope_rows(x, inv_freq, H, pos);
    cpu::rope(rows_f32(x), x.ld(), inv_freq.f32(), B, T, h, HS, 0, inverse, pos.ptr<int32_t>());
}

namespace {

// The row-wise loops' view of an elementwise argument (elementwise_shape)
template <typename T>
cpu::Rows<T> rows_of(const ElementShape& e, const Tensor& t) {
    return {rows_f32(t), e.ld(t)};
}

}  // namespace

void CpuBackend::swiglu_fwd(Tensor out, Tensor gate, Tensor up) {
    check_elementwise({&out, &gate, &up}, "swiglu");
    const ElementShape e = elementwise_shape({&out, &gate, &up});
    cpu::swiglu_forward(rows_of<float>(e, out), rows_of<const float>(e, gate), rows_of<const float>(e, up),
                        e.R, e.C);
}

void CpuBackend::swiglu_bwd(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) {
    check_elementwise({&dgate, &dup, &dout, &gate, &up}, "swiglu backward");
    const ElementShape e = elementwise_shape({&dgate, &dup, &dout, &gate, &up});
    cpu::swiglu_backward(rows_of<float>(e, dgate), rows_of<float>(e, dup), rows_of<const float>(e, dout),
                         rows_of<const float>(e, gate), rows_of<const float>(e, up), e.R, e.C);
}

void CpuBackend::qkv_unpack(Tensor dq, Tensor dk, Tensor dv, Tensor dqkv, int NH) {
    const HeadDims d = check_qkv_unpack(dq, dk, dv, dqkv, NH);
    const auto r = [](const Tensor& t) { return cpu::Rows<float>{rows_f32(t), t.ld()}; };
    cpu::qkv_unpack(r(dq), r(dk), r(dv), dqkv.f32(), d.N, d.NH, d.KVH, d.KH, d.HS);
}

#ifndef ANVIL_WITH_DNNL
std::unique_ptr<cpu::Gemm> cpu::make_bf16_gemm() {
    return nullptr;
}
#endif

CpuBackend::~CpuBackend() = default;

bool CpuBackend::set_autocast(DType products) {
    ANVIL_CHECK(products == DType::F32 || products == DType::BF16,
                "autocast: products in f32 or bf16, not {}", dtype_name(products));
    if (products == DType::F32) {
        gemm_ = nullptr;
        return true;
    }
    if (!bf16_) bf16_ = cpu::make_bf16_gemm();
    gemm_ = bf16_.get();
    return gemm_ != nullptr;
}

void CpuBackend::matmul_fwd(Tensor out, Tensor in, Tensor w, WLayout layout, Tensor bias, Tensor pre_gelu) {
    const auto [N, C, OC] = check_matmul_fwd(out, in, w, layout, bias, pre_gelu);
    const float* b = bias.empty() ? nullptr : bias.f32();
    if (pre_gelu.empty()) {
        cpu::matmul_forward(rows_f32(out), int(out.ld()), in.f32(), w.f32(), b, N, C, OC, layout, gemm_);
    } else {
        // A row-blocked fusion (each block's product and GELU on one core, in cache) measured 0-11% slower
        // than BLAS over all rows followed by one GELU pass: the small products lose more than the pass
        // costs.
        cpu::matmul_forward(pre_gelu.f32(), OC, in.f32(), w.f32(), b, N, C, OC, layout, gemm_);
        cpu::gelu_forward(out.f32(), pre_gelu.f32(), size_t(out.numel()));
    }
}

void CpuBackend::matmul_bwd(Tensor din, Tensor dw, Tensor dbias, Tensor dout, Tensor in, Tensor w,
                            WLayout layout, Tensor in_pre_gelu) {
    const auto [N, C, OC] = check_matmul_bwd(din, dw, dout, in, w, layout);
    cpu::matmul_backward(din.empty() ? nullptr : din.f32(), dw.empty() ? nullptr : dw.f32(),
                         dbias.empty() ? nullptr : dbias.f32(), dout.f32(), in.f32(), w.f32(), N, C, OC,
                         layout, gemm_);
    if (!in_pre_gelu.empty() && !din.empty())
        cpu::gelu_backward(din.f32(), din.f32(), in_pre_gelu.f32(), size_t(din.numel()));
}

// FP8: the operands rounded as the FP8 product sees them (f32 values on the format's grid, scaled back), then
// the f32 product: the specification of CUDA's FP8 tensor-core products, not a fast path.
// The CPU keeps nothing for the backward (fp8_kept_elems is 0): `kept` goes unused.
namespace {

// One operand rounded: under its own amax's scale, or (delayed scaling) under its history's, which the use
// begins first where `begin` and which notes the operand's amax where the use records.
void fp8_operand(float* dst, Tensor x, DType fmt, float* history, bool begin, bool record) {
    const size_t n = size_t(x.numel());
    if (!history) return void(fp8_fake_quantize(dst, x.f32(), n, fmt));
    if (begin) fp8_history_begin(history, x.f32(), n, fmt, record);
    const float amax = fp8_fake_quantize_scaled(dst, x.f32(), n, fmt, history[Fp8History::kScale],
                                                history[Fp8History::kDequant]);
    if (begin && record) fp8_history_note(history, amax);
}

// Operand i's history in the state (nullptr where scaling is off), checked against its own length.
float* fp8_history(const Fp8Scaling& s, int F, int i) {
    if (F == 0) return nullptr;
    float* h = s.state.f32() + size_t(i) * size_t(F);
    const float H = h[Fp8History::kLength];
    ANVIL_CHECK(H >= 1 && H <= Fp8History::kMaxLength && Fp8History::floats(int(H)) == F,
                "FP8 delayed scaling: history {} holds length {} in a row of {} floats; make the state with "
                "fp8_history_init",
                i, H, F);
    return h;
}

}  // namespace

void CpuBackend::matmul_fp8_fwd(Tensor out, Tensor in, Tensor w, WLayout layout, Tensor bias, Tensor pre_gelu,
                                Tensor /*kept*/, const Fp8Scaling& scaling) {
    const auto [N, C, OC] = check_matmul_fwd(out, in, w, layout, bias, pre_gelu);
    const int F = check_fp8_scaling(scaling);
    fp8_scratch_.resize(size_t(in.numel() + w.numel()));
    float *qin = fp8_scratch_.data(), *qw = qin + in.numel();
    fp8_operand(qin, in, DType::F8E4M3, fp8_history(scaling, F, 0), !scaling.again, scaling.record);
    fp8_operand(qw, w, DType::F8E4M3, fp8_history(scaling, F, 1), !scaling.again, scaling.record);
    const Tensor y = pre_gelu.empty() ? out : pre_gelu;
    cpu::matmul_forward(rows_f32(y), int(y.ld()), qin, qw, bias.empty() ? nullptr : bias.f32(), N, C, OC,
                        layout);
    if (!pre_gelu.empty()) cpu::gelu_forward(out.f32(), pre_gelu.f32(), size_t(out.numel()));
}

void CpuBackend::matmul_fp8_bwd(Tensor din, Tensor dw, Tensor dbias, Tensor dout, Tensor in, Tensor w,
                                WLayout layout, Tensor in_pre_gelu, Tensor /*kept*/,
                                const Fp8Scaling& scaling) {
    const auto [N, C, OC] = check_matmul_bwd(din, dw, dout, in, w, layout);
    const int F = check_fp8_scaling(scaling);
    fp8_scratch_.resize(size_t(dout.numel() + in.numel() + w.numel()));
    float *qdout = fp8_scratch_.data(), *qin = qdout + dout.numel(), *qw = qin + in.numel();
    fp8_operand(qdout, dout, DType::F8E5M2, fp8_history(scaling, F, 2), true, scaling.record);
    // in and W under their forward's scales
    if (!dw.empty()) fp8_operand(qin, in, DType::F8E4M3, fp8_history(scaling, F, 0), false, false);
    if (!din.empty()) fp8_operand(qw, w, DType::F8E4M3, fp8_history(scaling, F, 1), false, false);
    cpu::matmul_backward(din.empty() ? nullptr : din.f32(), dw.empty() ? nullptr : dw.f32(), nullptr, qdout,
                         qin, qw, N, C, OC, layout);
    if (!dbias.empty())  // from the unrounded gradient
        cpu::matmul_backward(nullptr, nullptr, dbias.f32(), dout.f32(), nullptr, nullptr, N, C, OC, layout);
    if (!in_pre_gelu.empty() && !din.empty())
        cpu::gelu_backward(din.f32(), din.f32(), in_pre_gelu.f32(), size_t(din.numel()));
}

void CpuBackend::matmul_q8_fwd(Tensor out, Tensor in, Tensor q, Tensor scale, WLayout layout, Tensor bias,
                               Tensor pre_gelu) {
    const auto [N, C, OC] = check_matmul_q8(out, in, q, scale, layout, bias, pre_gelu);
    const Tensor y = pre_gelu.empty() ? out : pre_gelu;
    cpu::matmul_q8_forward(rows_f32(y), int(y.ld()), in.f32(), q.ptr<int8_t>(), scale.f32(),
                           bias.empty() ? nullptr : bias.f32(), N, C, OC, layout, q8_panel_);
    if (!pre_gelu.empty()) cpu::gelu_forward(out.f32(), pre_gelu.f32(), size_t(out.numel()));
}

void CpuBackend::matmul_q8_bwd(Tensor din, Tensor dout, Tensor q, Tensor scale, WLayout layout,
                               Tensor in_pre_gelu) {
    const auto [N, C, OC] = check_matmul_bwd(din, {}, dout, din, q, layout);
    ANVIL_CHECK(q.dtype == DType::I8 && scale.numel() == OC, "int8 matmul backward: weight {} {}, {} scales",
                q.shape.str(), dtype_name(q.dtype), scale.numel());
    cpu::matmul_q8_backward(din.f32(), dout.f32(), q.ptr<int8_t>(), scale.f32(), N, C, OC, layout, q8_panel_);
    if (!in_pre_gelu.empty())
        cpu::gelu_backward(din.f32(), din.f32(), in_pre_gelu.f32(), size_t(din.numel()));
}

void CpuBackend::embedding_rows_add(Tensor out, Tensor table, Tensor rows) {
    const int C = check_embedding_rows_add(out, table, rows);
    cpu::embedding_rows_add(out.f32(), table.f32(), rows.ptr<int32_t>(), int(rows.numel()), C);
}

void CpuBackend::embedding_q8_fwd(Tensor out, Tensor tokens, Tensor q, Tensor scale, Tensor wpe) {
    expect_f32(out, "embedding out");
    const auto [B, T, C, V] = check_embedding_q8(out, tokens, q, scale, wpe);
    const int32_t* tok = tokens.ptr<int32_t>();
    for (int64_t i = 0; i < tokens.numel(); i++)
        ANVIL_CHECK(tok[i] >= 0 && tok[i] < V,
                    "embedding: token id {} at position {} is outside the vocabulary (0..{})", tok[i], i,
                    V - 1);
    cpu::embedding_q8_forward(out.f32(), tok, q.ptr<int8_t>(), scale.f32(), wpe.empty() ? nullptr : wpe.f32(),
                              B, T, C, V);
}

void CpuBackend::gelu_fwd(Tensor out, Tensor in) {
    expect_same_numel(out, in, "gelu");
    cpu::gelu_forward(out.f32(), in.f32(), size_t(in.numel()));
}

void CpuBackend::gelu_bwd(Tensor din, Tensor dout, Tensor in) {
    expect_same_numel(din, in, "gelu backward");
    expect_same_numel(dout, in, "gelu backward");
    cpu::gelu_backward(din.f32(), dout.f32(), in.f32(), size_t(in.numel()));
}

size_t CpuBackend::attention_saved_elems(const AttnDims& d) const {
    return sizes::cpu_attention_saved_elems(d);
}
size_t CpuBackend::attention_scratch_elems(const AttnDims& d) const {
    return sizes::cpu_attention_scratch_elems(d, threads_);
}

void CpuBackend::attention_fwd(Tensor out, Tensor saved, Tensor qkv, int NH, const AttnDropout& drop) {
    const auto [B, T, C, nh, KVH] = check_attention(qkv, out, NH);
    ANVIL_CHECK(size_t(saved.numel()) >= attention_saved_elems({B, T, NH, C / NH}),
                "attention: saved too small");
    check_attention_dropout(drop);
    cpu::attention_forward(out.f32(), saved.f32(), qkv.f32(), B, T, C, NH, KVH, drop);
}

void CpuBackend::attention_bwd(Tensor dqkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor /*out*/,
                               Tensor saved, int NH, const AttnDropout& drop) {
    const auto [B, T, C, nh, KVH] = check_attention(qkv, dout, NH);
    expect_shape(dqkv, {B, T, 3 * C}, "attention dqkv");
    ANVIL_CHECK(size_t(scratch.numel()) >= attention_scratch_elems({B, T, NH, C / NH}),
                "attention: scratch too small");
    check_attention_dropout(drop);
    cpu::attention_backward(dqkv.f32(), scratch.f32(), dout.f32(), qkv.f32(), saved.f32(), B, T, C, NH, KVH,
                            threads_, drop);
}

void CpuBackend::attention_cached(Tensor out, Tensor qkv, Tensor kcache, Tensor vcache, int pos0, int NH) {
    const CachedDims d = check_attention_cached(out, qkv, kcache, vcache, pos0, NH);
    cpu::attention_cached(out.f32(), qkv.f32(), kcache.f32(), vcache.f32(), d.Tq, pos0, NH, d.KVH, d.HS);
}

void CpuBackend::attention_cached_rows(Tensor out, Tensor qkv, Tensor kcache, Tensor vcache, Tensor pages,
                                       Tensor slot_t, Tensor pos_t, int NH, bool own_slots) {
    // own_slots changes nothing here: the spec writes every row's key and value, then attends
    const CachedRowsDims d =
        check_attention_cached_rows(out, qkv, kcache, vcache, pages, slot_t, pos_t, NH, own_slots);
    const int* table = static_cast<const int*>(pages.data);
    const int *slot = slot_t.ptr<int32_t>(), *pos = pos_t.ptr<int32_t>();
    for (int b = 0; b < d.B; b++)  // the spec checks every page a row reads or writes
        for (int i = 0; i <= pos[b] / d.page; i++) {
            const int pg = table[size_t(slot[b]) * d.PPS + size_t(i)];
            ANVIL_CHECK(pg >= 0 && pg < d.P, "attention_cached_rows: slot {} names page {} of {}", slot[b],
                        pg, d.P);
        }
    cpu::attention_cached_rows(out.f32(), qkv.f32(), kcache.f32(), vcache.f32(), table, d.B, slot, pos,
                               d.page, d.PPS, NH, d.KVH, d.HS);
}

void CpuBackend::residual_fwd(Tensor out, Tensor a, Tensor b) {
    check_elementwise({&out, &a, &b}, "residual");
    if (!out.contiguous() || !a.contiguous() || !b.contiguous()) {  // strided views: row by row
        const int64_t R = out.rows(), C = out.cols();
        float* o = rows_f32(out);
        const float *x = rows_f32(a), *y = rows_f32(b);
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < R; r++)
#pragma omp simd
            for (int64_t j = 0; j < C; j++) o[r * out.ld() + j] = x[r * a.ld() + j] + y[r * b.ld() + j];
        return;
    }
    float* o = out.f32();
    const float* x = a.f32();
    const float* y = b.f32();
    const int64_t n = out.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; i++) o[i] = x[i] + y[i];
}

void CpuBackend::scale(Tensor x, float s) {
    float* p = x.f32();
    const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; i++) p[i] *= s;
}

void CpuBackend::dropout(Tensor out, Tensor in, float p, uint64_t seed) {
    expect_same_numel(out, in, "dropout");
    ANVIL_CHECK(p >= 0.0f && p < 1.0f, "dropout: p must be in [0, 1), got {}", p);
    float* o = out.f32();
    const float* x = in.f32();
    const int64_t n = out.numel();
    const uint32_t threshold = dropout_threshold(p);
    const float keep_scale = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        o[i] = dropout_keep(seed, uint64_t(i), threshold) ? x[i] * keep_scale : 0.0f;
}

void CpuBackend::neftune_noise(Tensor out, Tensor lengths, float alpha, uint64_t seed) {
    const auto [N, C] = check_neftune(out, lengths, alpha);
    float* o = out.f32();
    const int32_t* len = static_cast<const int32_t*>(lengths.data);
    for (int64_t r = 0; r < N; r++)
        ANVIL_CHECK(len[r] >= 1, "neftune_noise: length {} at position {} must be at least 1", len[r], r);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < N; r++) {
        const float scale = alpha / std::sqrt(float(len[r]) * float(C));  // α / √(L d), the paper's
        for (int64_t i = r * C; i < (r + 1) * C; i++) o[i] += counter_uniform_pm1(seed, uint64_t(i)) * scale;
    }
}

void CpuBackend::token_logprobs(Tensor lp, Tensor top_ids, Tensor top_lp, Tensor logits, Tensor targets,
                                int V) {
    const auto [N, Vp, K] = check_token_logprobs(lp, top_ids, top_lp, logits, targets, V);
    const int32_t* tg = static_cast<const int32_t*>(targets.data);
    auto* ids = static_cast<int32_t*>(top_ids.data);
    for (int n = 0; n < N; n++)
        ANVIL_CHECK(tg[n] >= 0 && tg[n] < V,
                    "token_logprobs: target id {} at row {} is outside the vocabulary of {}", tg[n], n, V);
#pragma omp parallel for schedule(dynamic)
    for (int n = 0; n < N; n++)
        logprob_row({logits.f32() + size_t(n) * Vp, size_t(V)}, tg[n], K, lp.f32() + n, ids + size_t(n) * K,
                    top_lp.f32() + size_t(n) * K);
}

void CpuBackend::classifier(Tensor losses, Tensor logits, Tensor targets, float dloss, int vocab_real) {
    const auto [N, Vp] = check_classifier(losses, logits, targets, vocab_real);
    const int32_t* tg = targets.ptr<int32_t>();
    for (int i = 0; i < N; i++)
        ANVIL_CHECK(tg[i] >= -1 && tg[i] < vocab_real,
                    "classifier: target id {} at row {} is outside the "
                    "vocabulary (0..{}, or -1 to ignore)",
                    tg[i], i, vocab_real - 1);
    cpu::classifier(losses.f32(), logits.f32(), tg, dloss, N, Vp, vocab_real);
}

void CpuBackend::global_norm_sq(Tensor out, const std::vector<Tensor>& grads) {
    double s = 0.0;
    for (const Tensor& g : grads) s += cpu::sum_squares(g.f32(), size_t(g.numel()));
    out.f32()[0] = float(s);
}

void CpuBackend::adamw(const std::vector<ParamSlot>& slots, const AdamWArgs& a, Tensor norm_sq) {
    const float nsq = norm_sq.f32()[0];
    if (!std::isfinite(nsq)) return;  // the trainer reports the skipped step
    float scale = a.grad_scale;
    const float norm = std::sqrt(nsq) * a.grad_scale;
    if (a.max_grad_norm > 0.0f && norm > a.max_grad_norm) scale *= a.max_grad_norm / (norm + 1e-6f);
    for (const ParamSlot& s : slots) {
        ANVIL_CHECK(s.master.empty(), "cpu backend: f32 parameters need no master copy");
        cpu::adamw(s.param.f32(), s.grad.f32(), s.m.f32(), s.v.f32(), size_t(s.param.numel()), a.lr, a.beta1,
                   a.beta2, a.eps, s.weight_decay, a.step, scale);
    }
}

}  // namespace anvil
