// The op table's attention cases (op_case_parts.h): causal self-attention, grouped-query attention through
// qkv_unpack, and generation's cached and paged forms, against a reference in double.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "op_case_parts.h"

namespace anvil::test::cases {

namespace {

// Causal self-attention in double: qkv (B, T, 3C) -> (B, T, C); with dropout, probability (b, h, t, j)
// multiplies v_j by keep / (1 - p), keep from the mask's definition (dropout_mask.h) alone.
Vec ref_attention(const Vec& qkv, int B, int T, int C, int NH, const AttnDropout& drop) {
    const int HS = C / NH;
    Vec out(size_t(B) * T * C);
    std::vector<double> p(static_cast<size_t>(T));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float* q = &qkv[(size_t(b) * T + t) * 3 * C + size_t(h) * HS];
                double mx = -1e300, sum = 0;
                for (int j = 0; j <= t; j++) {
                    const float* k = &qkv[(size_t(b) * T + j) * 3 * C + C + size_t(h) * HS];
                    double s = 0;
                    for (int d = 0; d < HS; d++) s += double(q[d]) * k[d];
                    p[size_t(j)] = s / std::sqrt(double(HS));
                    mx = std::max(mx, p[size_t(j)]);
                }
                for (int j = 0; j <= t; j++) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
                if (drop.p > 0.0f) {
                    const uint64_t seed = dropout_site_seed(drop.seed, uint64_t(drop.head0 + h));
                    const uint64_t threshold = uint64_t(double(drop.p) * 16777216.0);
                    for (int j = 0; j <= t; j++) {
                        const uint64_t i = (uint64_t(b) * T + t) * T + j;
                        p[size_t(j)] *=
                            dropout_keep(seed, i, uint32_t(threshold)) ? 1.0 / (1.0 - drop.p) : 0.0;
                    }
                }
                for (int d = 0; d < HS; d++) {
                    double o = 0;
                    for (int j = 0; j <= t; j++)
                        o += p[size_t(j)] / sum *
                             qkv[(size_t(b) * T + j) * 3 * C + 2 * C + size_t(h) * HS + d];
                    out[(size_t(b) * T + t) * C + size_t(h) * HS + d] = float(o);
                }
            }
    return out;
}

// Grouped-query heads into attention's layout: NH query heads, KVH key/value heads, packed as KH heads.
// bf16/f16 tolerances for attention's gradients are twice the elementwise ops': the backward takes each row's
// D = sum(dout * out) from the output as stored, rounded to the dtype (as FlashAttention does, and the gemm
// path's P is rounded likewise), and D - dP cancels where a row attends to few positions: dq of a row's
// second position (two keys) was seen 0.83% of max|dq| off in bf16 (seed 68774450726167), past the 0.8%;
// at 0.6 times the tolerance 3 of 30 other seeds failed, at 1 time none of 40. With dropout the kept
// probabilities' scale 1/(1-p) must reach the output in f32: folded into P before its rounding (4/3 is
// 1.3359375 in bf16) it put dq of a row's first position (one key, exactly 0) 1.4 times past this tolerance
// (seed 180423204427791); since, at 1 time the tolerance, 1 of 16 seeds (101-116) failed the attention cases
// in bf16, by 1.29 times (seed 103: dq of a second position).
constexpr double kAttentionLowPrecisionTol = 2.0;

}  // namespace

// The grouped-query gradients out of the packed layout: dqkv (N, (NH + 2 KH) HS) into dq (N, NH HS), dk and
// dv (N, KVH HS), KH = NH (attention_bwd's shares, summed per key/value head) or KVH (a plain split).
OpCase qkv_unpack_case(const OpSizes& s, int NH, int KVH, bool shares, bool strided) {
    OpCase c;
    const int N = s.B * s.T, HS = s.C / s.NH, KH = shares ? NH : KVH, W = (NH + 2 * KH) * HS;
    const int QC = NH * HS, KC = KVH * HS, U = QC + 2 * KC;
    c.name = fmt::format("qkv_unpack NH={} KVH={}{}{}", NH, KVH, shares ? " (a share per query head)" : "",
                         strided ? " into column views of one (N, q + 2 kv) tensor" : "");
    c.args = {in("dqkv", {N, W}, 1.0f, false)};
    if (strided)
        c.args.push_back(out("drot", {N, U}));
    else
        c.args.insert(c.args.end(), {out("dq", {N, QC}), out("dk", {N, KC}), out("dv", {N, KC})});
    c.forward = [=](Backend& be, const Args& a) {
        if (!strided) return be.qkv_unpack(a["dq"], a["dk"], a["dv"], a["dqkv"], NH);
        const Tensor d = a["drot"];
        be.qkv_unpack(d.cols(0, QC), d.cols(QC, KC), d.cols(QC + KC, KC), a["dqkv"], NH);
    };
    c.reference = [=](const HostArgs& h, HostArgs& want) {
        const int group = KH / KVH;
        const Vec& g = h.at("dqkv");
        Vec dq(size_t(N) * QC), dk(size_t(N) * KC, 0.0f), dv = dk;
        for (int n = 0; n < N; n++)
            for (int hh = 0; hh < NH + 2 * KH; hh++)
                for (int d = 0; d < HS; d++) {
                    const float x = g[size_t(n) * W + size_t(hh) * HS + d];
                    if (hh < NH)
                        dq[(size_t(n) * NH + hh) * HS + d] = x;
                    else if (hh < NH + KH)
                        dk[(size_t(n) * KVH + (hh - NH) / group) * HS + d] += x;
                    else
                        dv[(size_t(n) * KVH + (hh - NH - KH) / group) * HS + d] += x;
                }
        if (!strided) {
            want["dq"] = dq, want["dk"] = dk, want["dv"] = dv;
            return;
        }
        Vec rot(size_t(N) * U);
        for (int n = 0; n < N; n++) {
            std::copy_n(dq.begin() + ptrdiff_t(n) * QC, QC, rot.begin() + ptrdiff_t(n) * U);
            std::copy_n(dk.begin() + ptrdiff_t(n) * KC, KC, rot.begin() + ptrdiff_t(n) * U + QC);
            std::copy_n(dv.begin() + ptrdiff_t(n) * KC, KC, rot.begin() + ptrdiff_t(n) * U + QC + KC);
        }
        want["drot"] = rot;
    };
    c.reference_rtol = 1e-6, c.reference_atol = 1e-6;  // the shares summed in another order
    return c;
}

// " dropout=p seed=s head0=h" for a case with dropout, else nothing
std::string drop_name(const AttnDropout& drop) {
    return drop.on() ? fmt::format(" dropout={} seed={} head0={}", drop.p, drop.seed, drop.head0) : "";
}

OpCase attention(const OpSizes& s, int B, int T, int NH, int HS, const AttnDropout& drop) {
    OpCase c;
    const int C = NH * HS;
    c.name = fmt::format("attention B={} T={} NH={} HS={}{}", B, T, NH, HS, drop_name(drop));
    const AttnDims d{B, T, NH, HS};
    Arg saved = out("saved", {1}, false), scratch = out("scratch", {1}, false);
    saved.elems = [d](const Backend& be) { return int64_t(be.attention_saved_elems(d)); };
    scratch.elems = [d](const Backend& be) { return int64_t(be.attention_scratch_elems(d)); };
    saved.compare = scratch.compare = false;  // each backend keeps its own statistics
    c.args = {in("qkv", {B, T, 3 * C}), out("out", {B, T, C}), saved, scratch,
              grad("dqkv", {B, T, 3 * C}, false)};
    c.forward = [NH, drop](Backend& be, const Args& a) {
        be.attention_fwd(a["out"], a["saved"], a["qkv"], NH, drop);
    };
    c.backward = [NH, drop](Backend& be, const Args& a) {
        be.attention_bwd(a["dqkv"], a["scratch"], a["dout"], a["qkv"], a["out"], a["saved"], NH, drop);
    };
    c.reference = [=](const HostArgs& h, HostArgs& want) {
        want["out"] = ref_attention(h.at("qkv"), B, T, C, NH, drop);
    };
    c.reference_rtol = 1e-4, c.reference_atol = 1e-5;
    c.flops = 12.0 * B * double(T) * T * C;
    c.attention = true;
    c.attn = d, c.attn_kvh = NH, c.attn_dropout = drop.on();
    c.low_precision_tol = kAttentionLowPrecisionTol;
    (void)s;
    return c;
}

// Grouped-query attention as Llama runs it: q (NH heads), k and v (KVH heads) once each in the packed qkv
// (here added into its zeroed column views, where the model's projections write them), attention over the
// packed qkv, then the backward's per-query-head shares (B, T, 3C) summed back into dk and dv (qkv_unpack).
// Checked against multi-head attention on the key/value heads repeated.
OpCase attention_gqa(int B, int T, int NH, int KVH, int HS, const AttnDropout& drop) {
    OpCase c;
    const int C = NH * HS, KC = KVH * HS, group = NH / KVH;
    c.name = fmt::format("attention_gqa B={} T={} NH={} KVH={} HS={}{}", B, T, NH, KVH, HS, drop_name(drop));
    const AttnDims d{B, T, NH, HS};
    Arg saved = out("saved", {1}, false), scratch = out("scratch", {1}, false);
    saved.elems = [d](const Backend& be) { return int64_t(be.attention_saved_elems(d)); };
    scratch.elems = [d](const Backend& be) { return int64_t(be.attention_scratch_elems(d)); };
    saved.compare = scratch.compare = false;  // each backend keeps its own statistics
    // how the shares split each group's gradient is the backend's (anvil's kernels: each query head its own
    // term; cuDNN: the whole in the first): their sums, dk and dv, are compared
    Arg shares = out("shares", {B, T, 3 * C}, false);
    shares.compare = false;
    c.args = {in("q", {B, T, C}),
              in("k", {B, T, KC}),
              in("v", {B, T, KC}),
              out("qkv", {B, T, C + 2 * KC}, false),
              out("out", {B, T, C}),
              saved,
              scratch,
              shares,
              grad("dq", {B, T, C}, false),
              grad("dk", {B, T, KC}, false),
              grad("dv", {B, T, KC}, false)};
    c.forward = [NH, C, KC, drop](Backend& be, const Args& a) {
        const Tensor qkv = a["qkv"];
        be.zero(qkv);
        const Tensor q = qkv.cols(0, C), k = qkv.cols(C, KC), v = qkv.cols(C + KC, KC);
        be.residual_fwd(q, q, a["q"]);
        be.residual_fwd(k, k, a["k"]);
        be.residual_fwd(v, v, a["v"]);
        be.attention_fwd(a["out"], a["saved"], qkv, NH, drop);
    };
    c.backward = [NH, drop](Backend& be, const Args& a) {
        be.attention_bwd(a["shares"], a["scratch"], a["dout"], a["qkv"], a["out"], a["saved"], NH, drop);
        be.qkv_unpack(a["dq"], a["dk"], a["dv"], a["shares"], NH);
    };
    c.reference = [=](const HostArgs& h, HostArgs& want) {
        Vec mha(size_t(B) * T * 3 * C);  // every query head with its own copy of its key/value head
        for (size_t r = 0; r < size_t(B) * T; r++)
            for (int hh = 0; hh < NH; hh++)
                for (int e = 0; e < HS; e++) {
                    const size_t at = r * 3 * C + size_t(hh) * HS + e,
                                 kv = r * KC + size_t(hh / group) * HS + e;
                    mha[at] = h.at("q")[r * C + size_t(hh) * HS + e];
                    mha[at + C] = h.at("k")[kv];
                    mha[at + 2 * C] = h.at("v")[kv];
                }
        want["out"] = ref_attention(mha, B, T, C, NH, drop);
    };
    c.reference_rtol = 1e-4, c.reference_atol = 1e-5;
    c.flops = 12.0 * B * double(T) * T * C;
    c.attention = true;
    c.attn = d, c.attn_kvh = KVH, c.attn_dropout = drop.on();
    c.low_precision_tol = kAttentionLowPrecisionTol;
    return c;
}

// Generation's incremental attention: a prompt, then one position at a time, appending to the caches. With
// KVH < NH, grouped-query: the caches hold KVH heads.
OpCase attention_cached(const OpSizes& s, int KVH, int T_) {
    OpCase c;
    const int T = T_ > 0 ? T_ : std::min(s.T, 40), NH = s.NH, C = s.C, prefill = T / 3, HS = C / NH,
              KC = KVH * HS;
    const int W = C + 2 * KC;
    c.name = fmt::format("attention_cached T={} NH={} KVH={} C={}", T, NH, KVH, C);
    c.args = {in("qkv", {1, T, W}, 1.0f, false), out("out", {T, C}), out("k", {T, KC}, false),
              out("v", {T, KC}, false)};
    c.forward = [=](Backend& be, const Args& a) {
        for (int pos = 0; pos < T;) {
            const int n = pos == 0 ? prefill : 1;
            Tensor q = a["qkv"], o = a["out"];
            q.data = static_cast<char*>(q.data) + size_t(pos) * W * dtype_size(q.dtype);
            q.shape = Shape{n, W};
            o.data = static_cast<char*>(o.data) + size_t(pos) * C * dtype_size(o.dtype);
            o.shape = Shape{n, C};
            be.attention_cached(o, q, a["k"], a["v"], pos, NH);
            pos += n;
        }
    };
    c.reference = [=](const HostArgs& h, HostArgs& want) {
        Vec mha(size_t(T) * 3 * C);  // each key/value head repeated for its query heads
        for (int t = 0; t < T; t++)
            for (int k = 0; k < 3 * C; k++) {
                const int part = k / C, hh = (k % C) / HS, d = k % HS;
                const size_t src =
                    part == 0 ? size_t(k) : size_t(C + (part - 1) * KC + (hh / (NH / KVH)) * HS + d);
                mha[size_t(t) * 3 * C + k] = h.at("qkv")[size_t(t) * W + src];
            }
        want["out"] = ref_attention(mha, 1, T, C, NH, {});
    };
    c.reference_rtol = 1e-4, c.reference_atol = 1e-5;
    return c;
}

// Continuous batching's decode step: B rows, each one new position in its own slot of the paged caches (P,
// page, KVH HS), in one call; slots out of order with one left idle, positions from 0 to the last. The slots'
// page tables are a shuffle of the pages (pages of 4 positions, so rows cross pages; some pages in no table).
// The caches' other positions hold earlier keys and values (drawn); the new ones must land at (slot, pos)'s
// page row and nowhere else. packed: a packed prefill beside decode rows: two pieces of prompts (rows of one
// slot at consecutive positions, one after cached positions, one from position 0) and two one-token rows.
// own (not packed): the op is told every row is in a slot of its own, where CUDA writes the keys and values
// in the attention kernel; the same results.
OpCase attention_cached_rows(const OpSizes& s, int KVH, int B, int maxT, bool packed, bool own) {
    own = own && !packed;
    OpCase c;
    std::vector<int> slot(static_cast<size_t>(B)), pos(static_cast<size_t>(B));
    for (int b = 0; b < B; b++) {
        slot[size_t(b)] = (B + 2 - b) % (B + 1);  // a permutation of B + 1 slots but one
        pos[size_t(b)] = b == 0 ? maxT - 1 : (b * 7) % maxT;
    }
    if (packed) {
        slot = {2, 2, 2, 2, 4, 3, 0, 0, 0};
        pos = {3, 4, 5, 6, maxT - 1, 2, 0, 1, 2};
        B = int(slot.size());
    }
    const int NH = s.NH, C = s.C, HS = C / NH, KC = KVH * HS, W = C + 2 * KC, group = NH / KVH;
    const int S = *std::max_element(slot.begin(), slot.end()) + 2;
    constexpr int page = 4;
    const int PPS = (maxT + page - 1) / page, P = S * PPS + 3;
    std::vector<int> table(static_cast<size_t>(P));
    std::iota(table.begin(), table.end(), 0);
    std::mt19937 shuffle{uint32_t(P)};
    std::shuffle(table.begin(), table.end(), shuffle);
    table.resize(size_t(S) * PPS);
    const auto row = [=](int sl, int p) {
        return size_t(table[size_t(sl) * PPS + size_t(p / page)]) * page + size_t(p % page);
    };
    c.name = fmt::format("attention_cached_rows{} B={} maxT={} NH={} KVH={} C={} pages={}x{}{}",
                         packed ? "_packed" : "", B, maxT, NH, KVH, C, P, page, own ? " own slots" : "");
    Arg pages = ids("pages", {S, PPS}, 0, P);
    pages.fixed_ints = table;
    Arg slots = ids("slot", {B}, 0, S), positions = ids("pos", {B}, 0, maxT);
    slots.fixed_ints = slot, positions.fixed_ints = pos;
    c.args = {in("qkv", {B, W}, 1.0f, false),
              out("out", {B, C}),
              arg("k", {P, page, KC}, Role::InOut),
              arg("v", {P, page, KC}, Role::InOut),
              pages,
              slots,
              positions};
    c.forward = [=](Backend& be, const Args& a) {
        be.attention_cached_rows(a["out"], a["qkv"], a["k"], a["v"], a["pages"], a["slot"], a["pos"], NH,
                                 own);
    };
    c.reference = [=](const HostArgs& h, HostArgs& want) {
        Vec k = h.at("k"), v = h.at("v"), out(size_t(B) * C);
        const Vec& qkv = h.at("qkv");
        for (int b = 0; b < B; b++)
            for (int j = 0; j < KC; j++) {
                const size_t at = row(slot[size_t(b)], pos[size_t(b)]) * KC + size_t(j);
                k[at] = qkv[size_t(b) * W + C + j];
                v[at] = qkv[size_t(b) * W + C + KC + j];
            }
        std::vector<double> p(static_cast<size_t>(maxT));
        for (int b = 0; b < B; b++)
            for (int hh = 0; hh < NH; hh++) {
                const size_t head = size_t(hh / group) * HS;
                const int last = pos[size_t(b)], sl = slot[size_t(b)];
                double mx = -1e300, sum = 0;
                for (int j = 0; j <= last; j++) {
                    double sc = 0;
                    for (int d = 0; d < HS; d++)
                        sc +=
                            double(qkv[size_t(b) * W + size_t(hh) * HS + d]) * k[row(sl, j) * KC + head + d];
                    p[size_t(j)] = sc / std::sqrt(double(HS));
                    mx = std::max(mx, p[size_t(j)]);
                }
                for (int j = 0; j <= last; j++) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
                for (int d = 0; d < HS; d++) {
                    double o = 0;
                    for (int j = 0; j <= last; j++) o += p[size_t(j)] / sum * v[row(sl, j) * KC + head + d];
                    out[size_t(b) * C + size_t(hh) * HS + d] = float(o);
                }
            }
        want["out"] = out, want["k"] = k, want["v"] = v;
    };
    c.reference_rtol = 1e-4, c.reference_atol = 1e-5;
    return c;
}

}  // namespace anvil::test::cases
