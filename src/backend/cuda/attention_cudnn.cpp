// Causal self-attention through cuDNN's fused flash attention (--attention cudnn): the forward and backward
// graphs cuDNN's own frontend builds for scaled dot-product attention, written on the graph API
// (cudnn_graph.h), reading anvil's packed qkv (B, T, C + 2 KC) and writing its dqkv (B, T, 3C) through
// strides, so nothing is copied. The forward keeps the row statistics anvil's flash kernels keep (the
// log-sum-exp of the scaled scores, (B, NH, T) f32), so either direction can run on either implementation.
// The backward is cuDNN's deterministic form (dQ written directly, no atomic accumulation), and engines with
// a nondeterministic note are passed over: runs repeat bit for bit, as with anvil's kernels.
// ANVIL_CUDNN_NONDETERMINISTIC=1 in the environment takes such an engine where no deterministic one
// finalizes (PyTorch's default; said on stderr once a plan).
//
// Forward (S = Q K^T, per head): S * scale; keys after the query masked to -inf; M = rowmax, E = exp(S - M),
// Z = rowsum E; stats = M + log Z; P = E / Z (rounded to the activation dtype); O = P V.
// Backward: Dsum = rowsum(dO * O); P = exp(S * scale - stats) (masked); dV = P^T dO; dS = P (dO V^T - Dsum)
// * scale; dK = dS^T Q; dQ = dS K. Grouped-query attention (KVH < NH): K and V have KVH heads, query head h
// reading key/value head h / (NH / KVH); dK and dV are summed over each group by the graph, written into the
// first query head's share of dqkv, the group's other shares zeroed (qkv_unpack sums the shares).
//
// The plans are built on a shape's first call (the heuristic's engines in order, the first that finalizes)
// and kept. A call cuDNN cannot take (f32, dropout, a head size that is not a multiple of 8, no library, no
// engine) is an error that says why and names --attention auto: the flag asks for cuDNN by name.
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cudnn_graph.h"
#include "backend/cuda/ops.h"
#include "core/text.h"

namespace anvil::cuda {

#if ANVIL_HAVE_CUDNN_H

namespace {

// The non-virtual tensors of a graph, by role.
struct Io {
    CudnnTensor q, k, v, o, stats, dout, dq, dk, dv, dsum;
};

struct Plan {
    std::unique_ptr<CudnnGraph> graph;
    Io io;
    std::string refused;  // why there is no plan ("" when graph is usable)
};

cudnnDataType_t cudnn_type(DType t) {
    return t == DType::BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}

// The element strides of anvil's layouts, as cuDNN's (b, h, s, d) tensors.
struct Geometry {
    int64_t B, T, NH, KVH, HS, C, KC, W, group;
    explicit Geometry(const AttnShape& s)
        : B(s.B),
          T(s.T),
          NH(s.NH),
          KVH(s.KVH),
          HS(s.C / s.NH),
          C(s.C),
          KC(KVH * HS),
          W(C + 2 * KC),
          group(NH / KVH) {}
    using D = CudnnGraph::Dims;
    D q_dims() const { return {B, NH, T, HS}; }
    D q_strides() const { return {T * W, HS, W, 1}; }  // also K and V with KVH heads
    D kv_dims() const { return {B, KVH, T, HS}; }
    D kt_dims() const { return {B, KVH, HS, T}; }  // K^T, V^T: the same memory, the last two swapped
    D kt_strides() const { return {T * W, HS, 1, W}; }
    D o_strides() const { return {T * C, HS, C, 1}; }             // out, dout (B, T, C)
    D dqkv_strides() const { return {T * 3 * C, HS, 3 * C, 1}; }  // dq and (MHA) dk, dv
    // GQA: a key/value head's gradient into its group's first share
    D dkv_strides() const { return {T * 3 * C, group * HS, 3 * C, 1}; }
    D scores() const { return {B, NH, T, T}; }
    D scores_strides() const { return {NH * T * T, T * T, T, 1}; }
    D scores_t_strides() const { return {NH * T * T, T * T, 1, T}; }  // the same memory seen transposed
    D rows() const { return {B, NH, T, 1}; }
    D rows_strides() const { return {NH * T, T, 1, 1}; }
    D dense_strides() const { return {NH * T * HS, T * HS, HS, 1}; }  // a (B, NH, T, HS) product of its own
};

// The graph's intermediate tensors, all virtual: (B, NH, T, T) scores (seen transposed: the same memory),
// (B, NH, T, 1) row values in f32, (B, NH, T, HS) products
struct Virtual {
    CudnnGraph& g;
    const Geometry& G;
    CudnnTensor scores(cudnnDataType_t t) const { return g.tensor(t, G.scores(), G.scores_strides(), true); }
    CudnnTensor scores_t(cudnnDataType_t t) const {
        return g.tensor(t, G.scores(), G.scores_t_strides(), true);
    }
    CudnnTensor rows() const { return g.tensor(CUDNN_DATA_FLOAT, G.rows(), G.rows_strides(), true); }
    CudnnTensor heads(cudnnDataType_t t) const { return g.tensor(t, G.q_dims(), G.dense_strides(), true); }
};

float masked_value(const CudnnApi& api) {
    // older cuDNN prefers the lowest float to -inf for the masked scores (as its frontend does)
    return api.get_version() < 91000 ? std::numeric_limits<float>::lowest()
                                     : -std::numeric_limits<float>::infinity();
}

// s (scores, f32) masked causally: keys past the query to `masked`
CudnnTensor causal(CudnnGraph& g, const Geometry& G, CudnnTensor s, float masked) {
    const Virtual v{g, G};
    const CudnnTensor row = g.pointwise(CUDNN_POINTWISE_GEN_INDEX, s, v.scores(CUDNN_DATA_INT32), {}, {}, 2);
    const CudnnTensor col = g.pointwise(CUDNN_POINTWISE_GEN_INDEX, s, v.scores(CUDNN_DATA_INT32), {}, {}, 3);
    const CudnnTensor keep = g.pointwise(CUDNN_POINTWISE_CMP_GE, row, v.scores(CUDNN_DATA_BOOLEAN), col, {},
                                         -1, CUDNN_DATA_BOOLEAN);
    return g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, v.scores(CUDNN_DATA_FLOAT), g.scalar(masked), keep);
}

void build_fwd(CudnnGraph& g, Io& io, const Geometry& G, DType dt, float masked) {
    const cudnnDataType_t t = cudnn_type(dt), f32 = CUDNN_DATA_FLOAT;
    const Virtual v{g, G};
    io.q = g.tensor(t, G.q_dims(), G.q_strides(), false);
    io.k = g.tensor(t, G.kt_dims(), G.kt_strides(), false);
    io.v = g.tensor(t, G.kv_dims(), G.q_strides(), false);
    io.o = g.tensor(t, G.q_dims(), G.o_strides(), false);
    io.stats = g.tensor(f32, G.rows(), G.rows_strides(), false);
    CudnnTensor s = g.matmul(io.q, io.k, v.scores(f32));
    s = g.pointwise(CUDNN_POINTWISE_MUL, s, v.scores(f32), g.scalar(1.0f / std::sqrt(float(G.HS))));
    s = causal(g, G, s, masked);
    const CudnnTensor m = g.reduction(CUDNN_REDUCE_TENSOR_MAX, s, v.rows());
    const CudnnTensor e = g.pointwise(CUDNN_POINTWISE_EXP,
                                      g.pointwise(CUDNN_POINTWISE_SUB, s, v.scores(f32), m), v.scores(f32));
    const CudnnTensor z = g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, v.rows());
    g.pointwise(CUDNN_POINTWISE_ADD, m, io.stats, g.pointwise(CUDNN_POINTWISE_LOG, z, v.rows()));
    const CudnnTensor p =
        g.pointwise(CUDNN_POINTWISE_DIV, e, v.scores(t), z);  // rounded for the second product
    g.matmul(p, io.v, io.o);
}

void build_bwd(CudnnGraph& g, Io& io, const Geometry& G, DType dt, float masked) {
    const cudnnDataType_t t = cudnn_type(dt), f32 = CUDNN_DATA_FLOAT;
    const Virtual v{g, G};
    const bool mha = G.group == 1;
    io.q = g.tensor(t, G.q_dims(), G.q_strides(), false);
    io.k = g.tensor(t, G.kt_dims(), G.kt_strides(), false);
    io.v = g.tensor(t, G.kt_dims(), G.kt_strides(), false);  // V^T
    io.o = g.tensor(t, G.q_dims(), G.o_strides(), false);
    io.dout = g.tensor(t, G.q_dims(), G.o_strides(), false);
    io.stats = g.tensor(f32, G.rows(), G.rows_strides(), false);
    io.dq = g.tensor(t, G.q_dims(), G.dqkv_strides(), false);
    io.dk = g.tensor(t, mha ? G.q_dims() : G.kv_dims(), mha ? G.dqkv_strides() : G.dkv_strides(), false);
    io.dv = g.tensor(t, mha ? G.q_dims() : G.kv_dims(), mha ? G.dqkv_strides() : G.dkv_strides(), false);
    io.dsum = g.tensor(f32, G.rows(), G.rows_strides(), false);  // in the backend's scratch
    const CudnnTensor scale = g.scalar(1.0f / std::sqrt(float(G.HS)));
    // Dsum = rowsum(dO * O)
    const CudnnTensor doo = g.pointwise(CUDNN_POINTWISE_MUL, io.dout, v.heads(f32), io.o);
    g.pointwise(CUDNN_POINTWISE_MUL, g.reduction(CUDNN_REDUCE_TENSOR_ADD, doo, v.rows()), io.dsum,
                g.scalar(1.0f));
    // P = exp(S * scale - stats), masked
    CudnnTensor s = g.matmul(io.q, io.k, v.scores(f32));
    s = g.pointwise(CUDNN_POINTWISE_MUL, s, v.scores(f32), scale);
    s = g.pointwise(CUDNN_POINTWISE_SUB, s, v.scores(f32), io.stats);
    s = causal(g, G, s, masked);
    const CudnnTensor p = g.pointwise(CUDNN_POINTWISE_EXP, s, v.scores(f32));
    // a (B, NH, T, HS) product, summed over each group's heads where K and V are shared
    const auto per_query_head = [&](CudnnTensor a, CudnnTensor b, CudnnTensor out) {
        return mha ? g.matmul(a, b, out)
                   : g.reduction(CUDNN_REDUCE_TENSOR_ADD, g.matmul(a, b, v.heads(t)), out);
    };
    // dV = P^T dO
    per_query_head(g.reshape(p, v.scores_t(t)), io.dout, io.dv);
    // dS = P (dO V^T - Dsum) scale
    CudnnTensor ds = g.matmul(io.dout, io.v, v.scores(f32));
    ds = g.pointwise(CUDNN_POINTWISE_SUB, ds, v.scores(f32), io.dsum);
    ds = g.pointwise(CUDNN_POINTWISE_MUL, ds, v.scores(f32), p);
    ds = g.pointwise(CUDNN_POINTWISE_MUL, ds, v.scores(f32), scale);
    // dK = dS^T Q; dQ = dS K (K seen untransposed)
    per_query_head(g.reshape(ds, v.scores_t(t)), io.q, io.dk);
    const CudnnTensor k = g.reshape(io.k, g.tensor(t, G.kv_dims(), G.q_strides(), true));
    g.matmul(ds, k, io.dq);
}

bool aligned16(const void* p) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

// The library, the handle for this backend's device and stream, the plans, the workspace.
struct CudnnAttention {
    std::function<Buffer(size_t)> alloc;
    int sm = 0;  // compute capability, major * 10 + minor
    const CudnnApi* api = nullptr;
    std::string unusable;  // why the library cannot be used ("" before the first try and when it can)
    bool tried = false;
    cudnnHandle_t handle = nullptr;
    cudaStream_t stream = nullptr;
    std::map<std::tuple<bool, int, int, int, int, int, DType>, Plan> plans;
    Buffer workspace;

    ~CudnnAttention() {
        plans.clear();
        if (handle) (void)api->destroy(handle);
    }

    // The library and handle, on first use; false (and `unusable` says why) when there are none.
    bool ready(cudaStream_t s) {
        if (!tried) {
            tried = true;
            api = cudnn_api(&unusable);
            if (api) {
                const cudnnStatus_t st = api->create(&handle);
                if (st != CUDNN_STATUS_SUCCESS) {
                    unusable = std::string("cudnnCreate failed: ") + api->error_string(st);
                    handle = nullptr;
                }
            }
        }
        if (!handle) return false;
        if (stream != s) {
            api->check(api->set_stream(handle, s), "cudnnSetStream");
            stream = s;
        }
        return true;
    }

    Plan& plan_for(bool fwd, const AttnShape& s, DType dt) {
        Plan& p = plans[{fwd, s.B, s.T, s.NH, s.KVH, s.C, dt}];
        if (p.graph || !p.refused.empty()) return p;
        try {
            auto g = std::make_unique<CudnnGraph>(*api);
            const Geometry G(s);
            if (fwd)
                build_fwd(*g, p.io, G, dt, masked_value(*api));
            else
                build_bwd(*g, p.io, G, dt, masked_value(*api));
            g->finalize_graph(handle);
            p.refused = g->plan(handle, env_on("ANVIL_CUDNN_NONDETERMINISTIC"));
            if (p.refused.empty() && !g->deterministic())
                std::fprintf(
                    stderr,
                    "note: cuDNN's %s attention for B=%d T=%d NH=%d runs on a nondeterministic engine "
                    "(ANVIL_CUDNN_NONDETERMINISTIC=1): runs no longer repeat bit for bit\n",
                    fwd ? "forward" : "backward", s.B, s.T, s.NH);
            if (p.refused.empty()) p.graph = std::move(g);
        } catch (const Error& e) {
            p.refused = e.what();
        }
        if (!p.refused.empty())
            p.refused =
                fmt::format("no {} plan for B={} T={} NH={} KVH={} HS={} ({})", fwd ? "forward" : "backward",
                            s.B, s.T, s.NH, s.KVH, s.C / s.NH, p.refused);
        return p;
    }

    void* workspace_for(size_t bytes) {
        if (bytes == 0) return nullptr;
        if (workspace.bytes() < bytes) {
            CUDA_CHECK(cudaStreamSynchronize(stream));  // the old one may still be in use
            workspace.reset();
            workspace = alloc(bytes);
        }
        return workspace.data();
    }
};

std::shared_ptr<CudnnAttention> make_cudnn_attention(std::function<Buffer(size_t)> alloc, int sm) {
    auto a = std::make_shared<CudnnAttention>();
    a->alloc = std::move(alloc);
    a->sm = sm;
    return a;
}

namespace {

// Why this call cannot go to cuDNN ("" when it can).
std::string refusal_of(CudnnAttention& a, const Ctx& c, const AttnShape& s, DType dt, const AttnDropout& drop,
                       std::initializer_list<const void*> ptrs) {
    const int HS = s.C / s.NH;
    if (dt != DType::BF16 && dt != DType::F16) return "cuDNN's fused attention takes bf16 and fp16, not f32";
    if (drop.on()) return "attention dropout is anvil's own mask, which cuDNN does not draw";
    if (HS % 8 != 0 || HS > 128)
        return fmt::format("head size {} (cuDNN takes multiples of 8 up to 128)", HS);
    if (a.sm < 80) return "cuDNN's fused attention needs compute capability 8.0 or newer";
    for (const void* p : ptrs)
        if (!aligned16(p)) return "a tensor is not 16-byte aligned";
    if (!a.ready(c.stream)) return a.unusable;
    return "";
}

// Throws the refusal, if there is one.
void refuse(const std::string& why) {
    if (!why.empty())
        ::anvil::fail("--attention cudnn: {}; use --attention auto (anvil's flash kernels)", why);
}

// qkv's query, key and value parts, and dqkv's
char* at(const Tensor& t, int64_t elems) {
    return static_cast<char*>(t.data) + elems * int64_t(dtype_size(t.dtype));
}

}  // namespace

void attention_cudnn_fwd(const Ctx& c, const AttnShape& s, Tensor out, float* stats, const Tensor& qkv,
                         const AttnDropout& drop) {
    CudnnAttention& a = *c.cudnn;
    const Geometry G(s);
    refuse(
        refusal_of(a, c, s, qkv.dtype, drop, {qkv.data, at(qkv, G.C), at(qkv, G.C + G.KC), out.data, stats}));
    Plan& p = a.plan_for(true, s, qkv.dtype);
    refuse(p.refused);
    p.graph->execute(a.handle,
                     {{p.io.q.uid, qkv.data},
                      {p.io.k.uid, at(qkv, G.C)},
                      {p.io.v.uid, at(qkv, G.C + G.KC)},
                      {p.io.o.uid, out.data},
                      {p.io.stats.uid, stats}},
                     a.workspace_for(p.graph->workspace_bytes()));
}

void attention_cudnn_bwd(const Ctx& c, const AttnShape& s, Tensor dqkv, float* dsum, const Tensor& dout,
                         const Tensor& qkv, const Tensor& out, const float* stats, const AttnDropout& drop) {
    CudnnAttention& a = *c.cudnn;
    const Geometry G(s);
    refuse(refusal_of(a, c, s, qkv.dtype, drop,
                      {qkv.data, at(qkv, G.C), at(qkv, G.C + G.KC), out.data, dout.data, stats, dsum,
                       dqkv.data, at(dqkv, G.C), at(dqkv, 2 * G.C)}));
    Plan& p = a.plan_for(false, s, qkv.dtype);
    refuse(p.refused);
    if (G.group > 1) {
        // the shares past each group's first stay zero: qkv_unpack sums them with the first
        const size_t esz = dtype_size(dqkv.dtype), row = size_t(3 * G.C) * esz;
        const size_t width = size_t(G.group - 1) * size_t(G.HS) * esz;
        for (int64_t j = 0; j < G.KVH; j++)
            for (int64_t part = 1; part <= 2; part++)
                CUDA_CHECK(cudaMemset2DAsync(at(dqkv, part * G.C + (j * G.group + 1) * G.HS), row, 0, width,
                                             size_t(G.B * G.T), c.stream));
    }
    p.graph->execute(a.handle,
                     {{p.io.q.uid, qkv.data},
                      {p.io.k.uid, at(qkv, G.C)},
                      {p.io.v.uid, at(qkv, G.C + G.KC)},
                      {p.io.o.uid, out.data},
                      {p.io.dout.uid, dout.data},
                      {p.io.stats.uid, const_cast<float*>(stats)},
                      {p.io.dsum.uid, dsum},
                      {p.io.dq.uid, dqkv.data},
                      {p.io.dk.uid, at(dqkv, G.C)},
                      {p.io.dv.uid, at(dqkv, 2 * G.C)}},
                     a.workspace_for(p.graph->workspace_bytes()));
}

std::string attention_cudnn_check_graphs(const AttnShape& s, DType dt) {
    std::string why;
    const CudnnApi* api = cudnn_api(&why);
    if (!api) return why;
    try {
        for (bool fwd : {true, false}) {
            CudnnGraph g(*api);
            Io io;
            (fwd ? build_fwd : build_bwd)(g, io, Geometry(s), dt, masked_value(*api));
            g.finalize_graph(nullptr);
        }
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

#else  // no cuDNN headers at build time

struct CudnnAttention {};
std::shared_ptr<CudnnAttention> make_cudnn_attention(std::function<Buffer(size_t)>, int) {
    return std::make_shared<CudnnAttention>();
}
namespace {
[[noreturn]] void no_cudnn() {
    ::anvil::fail(
        "--attention cudnn: this build has no cuDNN (its headers were not found when it was built); use "
        "--attention auto (anvil's flash kernels)");
}
}  // namespace
void attention_cudnn_fwd(const Ctx&, const AttnShape&, Tensor, float*, const Tensor&, const AttnDropout&) {
    no_cudnn();
}
void attention_cudnn_bwd(const Ctx&, const AttnShape&, Tensor, float*, const Tensor&, const Tensor&,
                         const Tensor&, const float*, const AttnDropout&) {
    no_cudnn();
}
std::string attention_cudnn_check_graphs(const AttnShape&, DType) {
    return "this build has no cuDNN (its headers were not found)";
}

#endif

}  // namespace anvil::cuda
