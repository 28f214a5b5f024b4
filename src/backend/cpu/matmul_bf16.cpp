// bf16 products through oneDNN's matmul primitive (matmul_bf16.h). The operands are rounded here, in their
// stored layout, and described to oneDNN with strides (a transposed operand is a strided view, not a copy);
// accumulation into C is oneDNN's sum post-op. oneDNN 2.x and 3.x differ only in how a primitive is made.
#include "backend/cpu/matmul_bf16.h"

#include <omp.h>

#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>

#include "core/dtype.h"
#include "core/error.h"

namespace anvil::cpu {

namespace {

// f32 -> bf16 bits (core/dtype.h's rounding: nearest even, NaN kept quiet): rows of `cols` from rows `ld`
// apart
void round_to_bf16(uint16_t* dst, const float* src, int rows, int cols, int ld) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        const float* s = src + size_t(r) * ld;
        uint16_t* d = dst + size_t(r) * cols;
#pragma omp simd
        for (int c = 0; c < cols; c++) d[c] = to_bf16(s[c]).bits;
    }
}

}  // namespace

struct Bf16Gemm::Impl {
    dnnl::engine eng{dnnl::engine::kind::cpu, 0};
    dnnl::stream stream{eng};
    struct Plan {
        dnnl::memory::desc a, b, c;
        dnnl::matmul prim;
    };
    using Key = std::tuple<bool, bool, int, int, int, int, bool>;
    std::map<Key, Plan> plans;

    Plan& plan(bool ta, bool tb, int M, int N, int K, int ldc, bool accumulate) {
        const Key key{ta, tb, M, N, K, ldc, accumulate};
        if (auto it = plans.find(key); it != plans.end()) return it->second;
        using dt = dnnl::memory::data_type;
        using dims = dnnl::memory::dims;
        Plan p;
        p.a = dnnl::memory::desc(dims{M, K}, dt::bf16, ta ? dims{1, M} : dims{K, 1});
        p.b = dnnl::memory::desc(dims{K, N}, dt::bf16, tb ? dims{1, K} : dims{N, 1});
        p.c = dnnl::memory::desc(dims{M, N}, dt::f32, dims{ldc, 1});
        dnnl::primitive_attr attr;
        if (accumulate) {
            dnnl::post_ops ops;
            ops.append_sum(1.0f);
            attr.set_post_ops(ops);
        }
#if DNNL_VERSION_MAJOR >= 3
        const dnnl::matmul::primitive_desc pd(eng, p.a, p.b, p.c, attr);
#else
        const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(p.a, p.b, p.c), attr, eng);
#endif
        p.prim = dnnl::matmul(pd);
        return plans.emplace(key, std::move(p)).first->second;
    }
};

Bf16Gemm::Bf16Gemm() : p_(std::make_unique<Impl>()) {}
Bf16Gemm::~Bf16Gemm() = default;

void Bf16Gemm::operator()(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B,
                          int ldb, bool accumulate, float* C, int ldc) {
    // the operands as stored: A (ta ? K : M) rows of (ta ? M : K), B (tb ? N : K) rows of (tb ? K : N)
    const int a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
    a_.resize(size_t(a_rows) * a_cols);
    b_.resize(size_t(b_rows) * b_cols);
    round_to_bf16(a_.data(), A, a_rows, a_cols, lda);
    round_to_bf16(b_.data(), B, b_rows, b_cols, ldb);
    try {
        Impl::Plan& p = p_->plan(ta, tb, M, N, K, ldc, accumulate);
        dnnl::memory am(p.a, p_->eng, a_.data()), bm(p.b, p_->eng, b_.data()), cm(p.c, p_->eng, C);
        p.prim.execute(p_->stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
        p_->stream.wait();
    } catch (const dnnl::error& e) {
        ::anvil::fail("bf16 product {}x{}x{}: oneDNN: {} (status {})", M, N, K, e.what(), int(e.status));
    }
}

std::unique_ptr<Gemm> make_bf16_gemm() {
    return std::make_unique<Bf16Gemm>();
}

}  // namespace anvil::cpu
