#include "backend/op_checks.h"

#include <algorithm>
#include <cmath>

#include "core/fp8.h"

namespace anvil {

std::optional<int> repeated(const int* v, int n) {
    std::vector<int> s(v, v + n);
    std::sort(s.begin(), s.end());
    const auto twice = std::adjacent_find(s.begin(), s.end());
    if (twice == s.end()) return std::nullopt;
    return *twice;
}

void expect_shape(const Tensor& t, std::initializer_list<int64_t> dims, const char* what) {
    const Shape s(dims);
    ANVIL_CHECK(t.shape == s, "{} has shape {}, expected {}", what, t.shape.str(), s.str());
}

void expect_same_numel(const Tensor& a, const Tensor& b, const char* op) {
    ANVIL_CHECK(a.numel() == b.numel(), "{}: {} vs {}", op, a.shape.str(), b.shape.str());
}

void expect_contiguous(std::initializer_list<const Tensor*> ts, const char* op) {
    for (const Tensor* t : ts)
        ANVIL_CHECK(t->contiguous(),
                    "{}: a strided view {} (rows {} apart) where the op reads contiguous rows", op,
                    t->shape.str(), t->stride);
}

ElementShape elementwise_shape(std::initializer_list<const Tensor*> ts) {
    const Tensor& first = **ts.begin();
    if (std::all_of(ts.begin(), ts.end(), [](const Tensor* t) { return t->contiguous(); }))
        return {true, 1, first.numel()};
    return {false, rows(first), cols(first)};
}

void check_elementwise(std::initializer_list<const Tensor*> ts, const char* op) {
    const Tensor& first = **ts.begin();
    const bool flat = elementwise_shape(ts).flat;
    for (const Tensor* t : ts) {
        if (flat) {
            expect_same_numel(first, *t, op);
            continue;
        }
        ANVIL_CHECK(rows(*t) == rows(first) && cols(*t) == cols(first),
                    "{}: {} and {} (strided views among the arguments) must have one shape", op,
                    first.shape.str(), t->shape.str());
    }
}

EmbDims check_embedding(const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe) {
    ANVIL_CHECK(tokens.dtype == DType::I32 && tokens.shape.ndim == 2, "embedding: tokens must be I32 (B, T)");
    const EmbDims d{int(tokens.dim(0)), int(tokens.dim(1)), int(wte.dim(1)), int(wte.dim(0))};
    ANVIL_CHECK(wpe.empty() || d.T <= wpe.dim(0),
                "embedding: sequence length {} exceeds the model's context {}", d.T, wpe.dim(0));
    ANVIL_CHECK(wpe.empty() || wpe.dim(1) == d.C, "embedding: wpe {} for width {}", wpe.shape.str(), d.C);
    expect_shape(out, {d.B, d.T, d.C}, "embedding out");
    return d;
}

EmbDims check_embedding_bwd(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                            const Tensor& tokens) {
    ANVIL_CHECK(tokens.dtype == DType::I32 && tokens.shape.ndim == 2, "embedding: tokens must be I32 (B, T)");
    ANVIL_CHECK(dout.shape.ndim == 3, "embedding backward: dout must be (B, T, C), got {}", dout.shape.str());
    const EmbDims d{int(tokens.dim(0)), int(tokens.dim(1)), int(dout.dim(2)),
                    dwte.empty() ? 0 : int(dwte.dim(0))};
    expect_shape(dout, {d.B, d.T, d.C}, "embedding dout");
    ANVIL_CHECK(dwte.empty() || dwte.dim(1) == d.C, "embedding backward: dwte {} for width {}",
                dwte.shape.str(), d.C);
    ANVIL_CHECK(dwpe.empty() || (dwpe.dim(1) == d.C && dwpe.dim(0) >= d.T),
                "embedding backward: dwpe {} for ({}, {})", dwpe.shape.str(), d.T, d.C);
    return d;
}

RowDims check_layernorm(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& in,
                        const Tensor& w, const Tensor& b) {
    const RowDims d{int(rows(in)), int(cols(in))};
    ANVIL_CHECK(out.numel() == in.numel() && mean.numel() == d.N && rstd.numel() == d.N && w.numel() == d.C &&
                    b.numel() == d.C && mean.dtype == DType::F32 && rstd.dtype == DType::F32,
                "layernorm: shapes out {} mean {} in {} w {}", out.shape.str(), mean.shape.str(),
                in.shape.str(), w.shape.str());
    return d;
}

RowDims check_layernorm_bwd(const Tensor& din, const Tensor& dw, const Tensor& db, const Tensor& dout,
                            const Tensor& in) {
    const RowDims d{int(rows(in)), int(cols(in))};
    // a frozen gain or bias passes its gradient empty
    ANVIL_CHECK(din.numel() == in.numel() && dout.numel() == in.numel() &&
                    (dw.empty() || dw.numel() == d.C) && (db.empty() || db.numel() == d.C),
                "layernorm backward: shapes din {} dout {} in {} dw {} db {}", din.shape.str(),
                dout.shape.str(), in.shape.str(), dw.shape.str(), db.shape.str());
    return d;
}

namespace {
MatDims matmul_dims(const Tensor& in, const Tensor& w, WLayout layout) {
    ANVIL_CHECK(w.shape.ndim == 2, "matmul: weight must be 2-D, got {}", w.shape.str());
    const int C = int(cols(in));
    const int wc = int(layout == WLayout::InOut ? w.dim(0) : w.dim(1));
    const int OC = int(layout == WLayout::InOut ? w.dim(1) : w.dim(0));
    ANVIL_CHECK(wc == C, "matmul: input has {} channels, weight {} expects {}", C, w.shape.str(), wc);
    return {int(rows(in)), C, OC};
}
}  // namespace

MatDims check_matmul_fwd(const Tensor& out, const Tensor& in, const Tensor& w, WLayout layout,
                         const Tensor& bias, const Tensor& pre_gelu) {
    const MatDims d = matmul_dims(in, w, layout);
    ANVIL_CHECK(rows(out) == d.N && cols(out) == d.OC, "matmul: output {} for ({}, {})", out.shape.str(), d.N,
                d.OC);
    // the output alone may be a strided view (the QKV split), and only without the GELU
    expect_contiguous({&in, &w, &bias, &pre_gelu}, "matmul");
    if (!pre_gelu.empty()) expect_contiguous({&out}, "matmul with GELU");
    ANVIL_CHECK(bias.empty() || bias.numel() == d.OC, "matmul: bias {} for {} outputs", bias.shape.str(),
                d.OC);
    ANVIL_CHECK(pre_gelu.empty() || pre_gelu.numel() == out.numel(), "matmul: pre_gelu {} vs out {}",
                pre_gelu.shape.str(), out.shape.str());
    return d;
}

int check_fp8_scaling(const Fp8Scaling& s) {
    if (!s.on()) return 0;
    const int64_t F = s.state.shape.ndim == 2 ? s.state.shape[1] : 0;
    ANVIL_CHECK(s.state.dtype == DType::F32 && s.state.shape.ndim == 2 && s.state.shape[0] == 3 &&
                    F >= Fp8History::floats(1) && F <= Fp8History::floats(Fp8History::kMaxLength) &&
                    F % 64 == 0,
                "FP8 delayed scaling: the state {} {} must be F32 (3, Fp8History::floats(H)), 1 <= H <= {}",
                dtype_name(s.state.dtype), s.state.shape.str(), Fp8History::kMaxLength);
    expect_contiguous({&s.state}, "FP8 delayed scaling");
    return int(F);
}

MatDims check_matmul_bwd(const Tensor& din, const Tensor& dw, const Tensor& dout, const Tensor& in,
                         const Tensor& w, WLayout layout) {
    const MatDims d = matmul_dims(in, w, layout);
    ANVIL_CHECK(rows(dout) == d.N && cols(dout) == d.OC, "matmul backward: dout {} for ({}, {})",
                dout.shape.str(), d.N, d.OC);
    expect_contiguous({&din, &dw, &dout, &in, &w}, "matmul backward");
    ANVIL_CHECK(dw.empty() || dw.shape == w.shape, "matmul backward: dw {} vs w {}", dw.shape.str(),
                w.shape.str());
    ANVIL_CHECK(din.empty() || din.numel() == in.numel(), "matmul backward: din {} vs in {}", din.shape.str(),
                in.shape.str());
    return d;
}

MatDims check_matmul_q8(const Tensor& out, const Tensor& in, const Tensor& q, const Tensor& scale,
                        WLayout layout, const Tensor& bias, const Tensor& pre_gelu) {
    ANVIL_CHECK(q.dtype == DType::I8 && scale.dtype == DType::F32,
                "int8 matmul: weight {} must be I8, scale {} F32", dtype_name(q.dtype),
                dtype_name(scale.dtype));
    const MatDims d = check_matmul_fwd(out, in, q, layout, bias, pre_gelu);
    ANVIL_CHECK(scale.numel() == d.OC, "int8 matmul: {} scales for {} output channels", scale.numel(), d.OC);
    return d;
}

EmbDims check_embedding_q8(const Tensor& out, const Tensor& tokens, const Tensor& q, const Tensor& scale,
                           const Tensor& wpe) {
    ANVIL_CHECK(q.dtype == DType::I8 && scale.dtype == DType::F32 && q.shape.ndim == 2,
                "int8 embedding: table {} must be I8 (V, C), scale {} F32", q.shape.str(),
                dtype_name(scale.dtype));
    const EmbDims d = check_embedding(out, tokens, q, wpe);
    ANVIL_CHECK(scale.numel() == d.V, "int8 embedding: {} scales for {} rows", scale.numel(), d.V);
    return d;
}

void check_attention_dropout(const AttnDropout& drop) {
    ANVIL_CHECK(drop.p >= 0.0f && drop.p < 1.0f, "attention dropout: p must be in [0, 1), got {}", drop.p);
}

AttnShape check_attention(const Tensor& qkv, const Tensor& o, int NH) {
    ANVIL_CHECK(qkv.shape.ndim == 3 && o.shape.ndim == 3 && o.dim(0) == qkv.dim(0) && o.dim(1) == qkv.dim(1),
                "attention: qkv {} and output {} must be (B, T, (NH + 2 KVH) HS) and (B, T, NH HS)",
                qkv.shape.str(), o.shape.str());
    const int C = int(o.dim(2));
    ANVIL_CHECK(NH > 0 && C % NH == 0, "attention: {} channels do not split into {} heads", C, NH);
    const int HS = C / NH;
    const int64_t KC2 = qkv.dim(2) - C;
    ANVIL_CHECK(KC2 > 0 && KC2 % (2 * HS) == 0 && NH % (KC2 / (2 * HS)) == 0,
                "attention: qkv {} holds no whole number of key/value heads of size {} dividing the {} heads",
                qkv.shape.str(), HS, NH);
    return AttnShape{int(qkv.dim(0)), int(qkv.dim(1)), C, NH, int(KC2 / (2 * HS))};
}

RowDims check_rmsnorm(const Tensor& out, const Tensor& rstd, const Tensor& in, const Tensor& w) {
    const RowDims d{int(rows(in)), int(cols(in))};
    ANVIL_CHECK(
        out.numel() == in.numel() && rstd.numel() == d.N && w.numel() == d.C && rstd.dtype == DType::F32,
        "rmsnorm: shapes out {} rstd {} in {} w {}", out.shape.str(), rstd.shape.str(), in.shape.str(),
        w.shape.str());
    return d;
}

RowDims check_rmsnorm_bwd(const Tensor& din, const Tensor& dw, const Tensor& dout, const Tensor& in,
                          const Tensor& rstd) {
    const RowDims d{int(rows(in)), int(cols(in))};
    ANVIL_CHECK(din.numel() == in.numel() && dout.numel() == in.numel() && rstd.numel() == d.N &&
                    (dw.empty() || dw.numel() == d.C),
                "rmsnorm backward: shapes din {} dout {} in {} dw {}", din.shape.str(), dout.shape.str(),
                in.shape.str(), dw.shape.str());
    return d;
}

RopeDims check_rope(const Tensor& x, const Tensor& inv_freq, int H) {
    ANVIL_CHECK(x.shape.ndim >= 2 && H > 0 && cols(x) % H == 0, "rope: x {} does not split into {} heads",
                x.shape.str(), H);
    const int HS = int(cols(x) / H);
    ANVIL_CHECK(HS % 2 == 0 && inv_freq.numel() == HS / 2 && inv_freq.dtype == DType::F32,
                "rope: head size {} needs an even size and {} f32 frequencies, got {}", HS, HS / 2,
                inv_freq.shape.str());
    const int T = x.shape.ndim >= 3 ? int(x.dim(x.shape.ndim - 2)) : int(rows(x));
    return {int(rows(x) / T), T, H, HS};
}

HeadDims check_qkv_unpack(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dqkv, int NH) {
    const Tensor &q = dq, &k = dk, &v = dv, &qkv = dqkv;
    ANVIL_CHECK(NH > 0 && cols(q) % NH == 0, "qkv_unpack: q {} does not split into {} heads", q.shape.str(),
                NH);
    const int HS = int(cols(q) / NH);
    ANVIL_CHECK(k.shape == v.shape && cols(k) % HS == 0 && rows(k) == rows(q) && rows(qkv) == rows(q),
                "qkv_unpack: q {} k {} v {} qkv {}", q.shape.str(), k.shape.str(), v.shape.str(),
                qkv.shape.str());
    const int KVH = int(cols(k) / HS);
    const int64_t rest = cols(qkv) - cols(q);
    ANVIL_CHECK(KVH > 0 && NH % KVH == 0 && rest % (2 * HS) == 0,
                "qkv_unpack: {} heads and {} key/value heads", NH, KVH);
    const int KH = int(rest / (2 * HS));
    ANVIL_CHECK(KH == KVH || KH == NH, "qkv_unpack: qkv {} holds {} key/value heads; give {} or {}",
                qkv.shape.str(), KH, KVH, NH);
    return {int(rows(q)), NH, KVH, KH, HS};
}

CachedDims check_attention_cached(const Tensor& out, const Tensor& qkv, const Tensor& kcache,
                                  const Tensor& vcache, int pos0, int NH) {
    const int Tq = int(rows(qkv));
    const int64_t KC = cols(kcache), qc = cols(qkv) - 2 * KC;
    ANVIL_CHECK(NH > 0 && qc > 0 && qc % NH == 0 && kcache.shape == vcache.shape,
                "attention_cached: qkv {} and caches {} do not fit {} heads", qkv.shape.str(),
                kcache.shape.str(), NH);
    const int HS = int(qc / NH);
    ANVIL_CHECK(KC % HS == 0 && NH % (KC / HS) == 0, "attention_cached: cache width {} for head size {}", KC,
                HS);
    ANVIL_CHECK(rows(out) == Tq && cols(out) == qc, "attention_cached: out {} for ({}, {})", out.shape.str(),
                Tq, qc);
    ANVIL_CHECK(out.dtype == qkv.dtype && kcache.dtype == qkv.dtype && vcache.dtype == qkv.dtype,
                "attention_cached: out {}, qkv {} and caches {}/{} in one dtype", dtype_name(out.dtype),
                dtype_name(qkv.dtype), dtype_name(kcache.dtype), dtype_name(vcache.dtype));
    ANVIL_CHECK(pos0 >= 0 && pos0 + Tq <= kcache.dim(0),
                "generation: position {} is past the model's context {}", pos0 + Tq - 1, kcache.dim(0));
    return {Tq, int(KC / HS), HS};
}

namespace {

// A (B) i32 tensor of a decode step's row integers; their values where the host can read them (the CPU
// backend's memory), else null: a device's kernels guard them instead.
const int* row_ints(const Tensor& t, int64_t B, const char* op, const char* what) {
    ANVIL_CHECK(t.dtype == DType::I32 && t.numel() == B && t.contiguous(),
                "{}: {} {} ({}) for {} rows, want ({}) i32", op, what, t.shape.str(), dtype_name(t.dtype), B,
                B);
    return t.device == Device::CPU ? t.ptr<int32_t>() : nullptr;
}

}  // namespace

CachedRowsDims check_attention_cached_rows(const Tensor& out, const Tensor& qkv, const Tensor& kcache,
                                           const Tensor& vcache, const Tensor& pages, const Tensor& slot_t,
                                           const Tensor& pos_t, int NH, bool own_slots) {
    ANVIL_CHECK(kcache.shape.ndim == 3 && kcache.shape == vcache.shape,
                "attention_cached_rows: caches {} and {}, want (pages, positions, width)", kcache.shape.str(),
                vcache.shape.str());
    ANVIL_CHECK(pages.shape.ndim == 2 && pages.dtype == DType::I32,
                "attention_cached_rows: page table {} ({}), want (slots, pages) i32", pages.shape.str(),
                dtype_name(pages.dtype));
    const int B = int(rows(qkv)), P = int(kcache.dim(0)), page = int(kcache.dim(1));
    const int S = int(pages.dim(0)), PPS = int(pages.dim(1)), maxT = PPS * page;
    const int64_t KC = cols(kcache), qc = cols(qkv) - 2 * KC;
    ANVIL_CHECK(NH > 0 && qc > 0 && qc % NH == 0,
                "attention_cached_rows: qkv {} and caches {} do not fit {} heads", qkv.shape.str(),
                kcache.shape.str(), NH);
    const int HS = int(qc / NH);
    ANVIL_CHECK(KC % HS == 0 && NH % (KC / HS) == 0, "attention_cached_rows: cache width {} for head size {}",
                KC, HS);
    ANVIL_CHECK(rows(out) == B && cols(out) == qc, "attention_cached_rows: out {} for ({}, {})",
                out.shape.str(), B, qc);
    ANVIL_CHECK(out.dtype == qkv.dtype && kcache.dtype == qkv.dtype && vcache.dtype == qkv.dtype,
                "attention_cached_rows: out {}, qkv {} and caches {}/{} in one dtype", dtype_name(out.dtype),
                dtype_name(qkv.dtype), dtype_name(kcache.dtype), dtype_name(vcache.dtype));
    const int* slot = row_ints(slot_t, B, "attention_cached_rows", "slots");
    const int* pos = row_ints(pos_t, B, "attention_cached_rows", "positions");
    if (slot && pos) {
        std::vector<int64_t> at(static_cast<size_t>(B));
        for (int b = 0; b < B; b++) {
            ANVIL_CHECK(slot[b] >= 0 && slot[b] < S, "attention_cached_rows: row {} in slot {} of {}", b,
                        slot[b], S);
            ANVIL_CHECK(pos[b] >= 0 && pos[b] < maxT,
                        "generation: position {} is past the cache's {} positions a sequence", pos[b], maxT);
            at[size_t(b)] = int64_t(slot[b]) * maxT + pos[b];
        }
        std::sort(at.begin(), at.end());
        ANVIL_CHECK(std::adjacent_find(at.begin(), at.end()) == at.end(),
                    "attention_cached_rows: two rows at one position of one slot");
        if (own_slots) {
            const std::optional<int> twice = repeated(slot, B);
            ANVIL_CHECK(!twice, "attention_cached_rows: own_slots, but two rows are in slot {}",
                        twice.value_or(0));
        }
    }
    return {B, S, P, page, PPS, int(KC / HS), HS};
}

int check_embedding_rows_add(const Tensor& out, const Tensor& table, const Tensor& rows_t) {
    ANVIL_CHECK(table.shape.ndim == 2 && cols(out) == table.dim(1) && out.dtype == table.dtype,
                "embedding_rows_add: out {} ({}), table {} ({})", out.shape.str(), dtype_name(out.dtype),
                table.shape.str(), dtype_name(table.dtype));
    const int64_t B = rows(out);
    if (const int* r = row_ints(rows_t, B, "embedding_rows_add", "rows"))
        for (int64_t b = 0; b < B; b++)
            ANVIL_CHECK(r[b] >= 0 && r[b] < table.dim(0), "position {} is past the model's context {}", r[b],
                        table.dim(0));
    return int(cols(out));
}

std::pair<int64_t, int> check_neftune(const Tensor& out, const Tensor& lengths, float alpha) {
    ANVIL_CHECK(out.shape.ndim == 3 && lengths.dtype == DType::I32 && lengths.shape.ndim == 2 &&
                    lengths.dim(0) == out.dim(0) && lengths.dim(1) == out.dim(1),
                "neftune_noise: out {} must be (B, T, C) and lengths {} ({}) I32 (B, T)", out.shape.str(),
                lengths.shape.str(), dtype_name(lengths.dtype));
    ANVIL_CHECK(alpha >= 0.0f && std::isfinite(alpha), "neftune_noise: alpha must be finite and >= 0, got {}",
                alpha);
    return {lengths.numel(), int(out.dim(2))};
}

RopeDims check_rope_rows(const Tensor& x, const Tensor& inv_freq, int H, const Tensor& pos_t) {
    const RopeDims d = check_rope(x, inv_freq, H);
    if (const int* pos = row_ints(pos_t, d.B, "rope_rows", "positions"))
        for (int b = 0; b < d.B; b++) ANVIL_CHECK(pos[b] >= 0, "rope_rows: position {}", pos[b]);
    return d;
}

ClsDims check_classifier(const Tensor& losses, const Tensor& logits, const Tensor& targets, int vocab_real) {
    const ClsDims d{int(rows(logits)), int(cols(logits))};
    ANVIL_CHECK(losses.numel() == d.N && targets.numel() == d.N && targets.dtype == DType::I32 &&
                    losses.dtype == DType::F32,
                "classifier: losses {} targets {} for {} rows", losses.shape.str(), targets.shape.str(), d.N);
    ANVIL_CHECK(vocab_real > 0 && vocab_real <= d.Vp, "classifier: vocab {} of {}", vocab_real, d.Vp);
    return d;
}

LogprobDims check_token_logprobs(const Tensor& lp, const Tensor& top_ids, const Tensor& top_lp,
                                 const Tensor& logits, const Tensor& targets, int V) {
    const int N = int(rows(logits)), Vp = int(cols(logits));
    ANVIL_CHECK(
        lp.numel() == N && lp.dtype == DType::F32 && targets.numel() == N && targets.dtype == DType::I32,
        "token_logprobs: lp {} targets {} for {} rows", lp.shape.str(), targets.shape.str(), N);
    const int64_t K = N > 0 ? top_ids.numel() / N : 0;
    ANVIL_CHECK(top_ids.numel() == N * K && top_lp.numel() == N * K && top_ids.dtype == DType::I32 &&
                    top_lp.dtype == DType::F32 && V > 0 && V <= Vp && K <= V,
                "token_logprobs: top {} and {} for {} rows of {} logits, vocabulary {}", top_ids.shape.str(),
                top_lp.shape.str(), N, Vp, V);
    return {N, Vp, int(K)};
}

}  // namespace anvil
