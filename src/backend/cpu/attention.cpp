// Causal self-attention on the CPU. Each (batch, head) pair is one task; inside it the two products run as
// single-threaded BLAS calls (OpenBLAS's OpenMP build does not nest) and the softmax is a plain loop.
// The forward keeps the softmax matrix att (B,NH,T,T) for the backward, as llm.c's CPU trainer does; with
// dropout on the probabilities, the kept and scaled copy that multiplies v is made per (batch, head) from
// the mask's hash, in the forward and again in the backward, never stored.
// Grouped-query attention reads each key/value head from every query head of its group in place (qkv holds
// KVH of them); the backward writes each query head's own share of its key/value head's gradient, which
// qkv_unpack sums.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/vec_math.h"
#include "backend/dropout_mask.h"

namespace anvil::cpu {

namespace {

// dst[j] = src[j] * the mask's factor for keys j <= t of query row t of sequence b in the head whose seed is
// head_seed; 0 past t
void drop_row(float* dst, const float* src, int t, int T, int b, const AttnDropMask& mask,
              uint64_t head_seed) {
    for (int j = 0; j <= t; j++) dst[j] = src[j] * mask.factor(head_seed, b, t, j, T);
    for (int j = t + 1; j < T; j++) dst[j] = 0.0f;
}

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH, int KVH,
                       const AttnDropout& drop) {
    const int HS = C / NH, KC = KVH * HS, group = NH / KVH;
    const float scale = 1.0f / std::sqrt(float(HS));
    const int ld = C + 2 * KC;
    const AttnDropMask mask(drop);
#pragma omp parallel
    {
        // with dropout: the (T,T) probabilities that multiply v, the kept ones scaled; att keeps the softmax
        std::vector<float> dropped(drop.on() ? size_t(T) * T : 0);
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const float* row = qkv + size_t(b) * T * ld;
                const float* q = row + h * HS;
                const float* k = row + C + (h / group) * HS;
                const float* v = k + KC;
                float* a = att + (size_t(b) * NH + h) * T * T;
                // a (T,T) = scale * q @ k^T
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS, scale, q, ld, k, ld, 0.0f, a,
                            T);
                for (int t = 0; t < T; t++) {
                    float* row = a + size_t(t) * T;
                    float mx = row[0];
                    for (int j = 1; j <= t; j++) mx = row[j] > mx ? row[j] : mx;
                    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
                    for (int j = 0; j <= t; j++) {
                        row[j] = vexp(row[j] - mx);
                        sum += row[j];
                    }
                    const float inv = 1.0f / sum;
#pragma omp simd
                    for (int j = 0; j <= t; j++) row[j] *= inv;
                    for (int j = t + 1; j < T; j++) row[j] = 0.0f;
                }
                const float* p = a;
                if (drop.on()) {
                    const uint64_t hs = drop.head_seed(h);
                    for (int t = 0; t < T; t++)
                        drop_row(dropped.data() + size_t(t) * T, a + size_t(t) * T, t, T, b, mask, hs);
                    p = dropped.data();
                }
                // out (T,HS) = p @ v
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, T, 1.0f, p, T, v, ld, 0.0f,
                            out + size_t(b) * T * C + h * HS, C);
            }
        }
    }
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att,
                        int B, int T, int C, int NH, int KVH, int threads, const AttnDropout& drop) {
    const int HS = C / NH, KC = KVH * HS, group = NH / KVH;
    const float scale = 1.0f / std::sqrt(float(HS));
    const int ld = C + 2 * KC, dld = 3 * C;
    const AttnDropMask mask(drop);
    // exactly `threads` threads: the scratch holds one (T,T) block per thread, whatever another backend set
    // as the process-wide OpenMP default
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            float* ds = scratch + size_t(omp_get_thread_num()) * T * T;  // (T,T)
            const float* row = qkv + size_t(b) * T * ld;
            const float* q = row + h * HS;
            const float* k = row + C + (h / group) * HS;
            const float* v = k + KC;
            const float* a = att + (size_t(b) * NH + h) * T * T;
            const float* dO = dout + size_t(b) * T * C + h * HS;
            float* dq = dqkv + size_t(b) * T * dld + h * HS;
            float* dk = dq + C;
            float* dv = dq + 2 * C;
            const uint64_t hs = drop.on() ? drop.head_seed(h) : 0;
            // dv (T,HS) = p^T @ dO, p the probabilities that multiplied v (the forward's mask again, in ds)
            const float* p = a;
            if (drop.on()) {
                for (int t = 0; t < T; t++)
                    drop_row(ds + size_t(t) * T, a + size_t(t) * T, t, T, b, mask, hs);
                p = ds;
            }
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T, 1.0f, p, T, dO, C, 0.0f, dv, dld);
            // dp (T,T) = dO @ v^T, then through the mask: da
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS, 1.0f, dO, C, v, ld, 0.0f, ds, T);
            if (drop.on())
                for (int t = 0; t < T; t++)
                    drop_row(ds + size_t(t) * T, ds + size_t(t) * T, t, T, b, mask, hs);
            // softmax backward: ds = a * (da - rowsum(a * da))
            for (int t = 0; t < T; t++) {
                const float* ar = a + size_t(t) * T;
                float* dr = ds + size_t(t) * T;
                float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (int j = 0; j <= t; j++) dot += ar[j] * dr[j];
#pragma omp simd
                for (int j = 0; j <= t; j++) dr[j] = ar[j] * (dr[j] - dot);
                for (int j = t + 1; j < T; j++) dr[j] = 0.0f;
            }
            // dq = scale * ds @ k ; dk = scale * ds^T @ q
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, T, scale, ds, T, k, ld, 0.0f, dq,
                        dld);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T, scale, ds, T, q, ld, 0.0f, dk,
                        dld);
        }
    }
}

namespace {

// One query head over cached positions 0..last: o (HS) = softmax(q . k_j * scale) . v_j, the keys and values
// of position j at kc/vc + row(j) * KC (row: the cache row holding position j). p: last + 1 floats of
// scratch.
template <typename Row>
void attend_cached(float* o, const float* q, const float* kc, const float* vc, int last, int KC, int HS,
                   float scale, float* p, Row row) {
    float mx = -INFINITY;
    for (int j = 0; j <= last; j++) {
        const float* k = kc + row(j) * KC;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int d = 0; d < HS; d++) s += q[d] * k[d];
        p[j] = s * scale;
        mx = p[j] > mx ? p[j] : mx;
    }
    float sum = 0.0f;
    for (int j = 0; j <= last; j++) {
        p[j] = std::exp(p[j] - mx);
        sum += p[j];
    }
    for (int d = 0; d < HS; d++) o[d] = 0.0f;
    for (int j = 0; j <= last; j++) {
        const float w = p[j] / sum;
        const float* v = vc + row(j) * KC;
#pragma omp simd
        for (int d = 0; d < HS; d++) o[d] += w * v[d];
    }
}

}  // namespace

void attention_cached(float* out, const float* qkv, float* kcache, float* vcache, int Tq, int pos0, int NH,
                      int KVH, int HS) {
    const int C = NH * HS, KC = KVH * HS, W = C + 2 * KC, group = NH / KVH;
    const float scale = 1.0f / std::sqrt(float(HS));
    for (int i = 0; i < Tq; i++) {
        const float* row = qkv + size_t(i) * W;
        for (int c = 0; c < KC; c++) {
            kcache[size_t(pos0 + i) * KC + c] = row[C + c];
            vcache[size_t(pos0 + i) * KC + c] = row[C + KC + c];
        }
    }
    const int Tk = pos0 + Tq;
#pragma omp parallel
    {
        std::vector<float> p(static_cast<size_t>(Tk));
#pragma omp for collapse(2) schedule(static)
        for (int i = 0; i < Tq; i++)
            for (int h = 0; h < NH; h++) {
                const size_t kv_off = size_t(h / group) * HS;
                attend_cached(out + size_t(i) * C + h * HS, qkv + size_t(i) * W + h * HS, kcache + kv_off,
                              vcache + kv_off, pos0 + i, KC, HS, scale, p.data(),
                              [](int j) { return size_t(j); });
            }
    }
}

void attention_cached_rows(float* out, const float* qkv, float* kcache, float* vcache, const int* pages,
                           int B, const int* slot, const int* pos, int page, int PPS, int NH, int KVH,
                           int HS) {
    const int C = NH * HS, KC = KVH * HS, W = C + 2 * KC, group = NH / KVH;
    const float scale = 1.0f / std::sqrt(float(HS));
    // the cache row of position j of slot s
    const auto cache_row = [=](int s, int j) {
        return size_t(pages[size_t(s) * PPS + size_t(j / page)]) * page + size_t(j % page);
    };
    int Tk = 0;
    for (int b = 0; b < B; b++) {
        const size_t at = cache_row(slot[b], pos[b]) * KC;
        const float* row = qkv + size_t(b) * W;
        for (int c = 0; c < KC; c++) {
            kcache[at + c] = row[C + c];
            vcache[at + c] = row[C + KC + c];
        }
        Tk = std::max(Tk, pos[b] + 1);
    }
#pragma omp parallel
    {
        std::vector<float> p(static_cast<size_t>(Tk));
#pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++) {
                const size_t kv_off = size_t(h / group) * HS;
                const int s = slot[b];
                attend_cached(out + size_t(b) * C + h * HS, qkv + size_t(b) * W + h * HS, kcache + kv_off,
                              vcache + kv_off, pos[b], KC, HS, scale, p.data(),
                              [&](int j) { return cache_row(s, j); });
            }
    }
}

}  // namespace anvil::cpu
