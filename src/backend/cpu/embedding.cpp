// Token + position embedding (wpe null: tokens only). The backward is deterministic: each thread owns a range of channels and
// walks every token in order, so no two threads ever add into the same element.
#include <omp.h>

#include "backend/cpu/ops.h"

namespace anvil::cpu {

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                       int C, int V) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const int32_t tok = tokens[b * T + t];
            float* o = out + (size_t(b) * T + t) * C;
            if (tok < 0 || tok >= V) {  // never reached from the loaders, which validate ids
                for (int c = 0; c < C; c++) o[c] = __builtin_nanf("");
                continue;
            }
            const float* e = wte + size_t(tok) * C;
            if (!wpe) {  // no learned positions (rotary models)
                for (int c = 0; c < C; c++) o[c] = e[c];
                continue;
            }
            const float* p = wpe + size_t(t) * C;
#pragma omp simd
            for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
        }
    }
}

void embedding_rows_add(float* out, const float* table, const int* rows, int B, int C) {
    for (int b = 0; b < B; b++) {
        const float* p = table + size_t(rows[b]) * C;
        float* o = out + size_t(b) * C;
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] += p[c];
    }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                        int C) {
    constexpr int kBlock = 64;
    const int nblocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        const int c0 = blk * kBlock, c1 = c0 + kBlock < C ? c0 + kBlock : C;
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < T; t++) {
                const float* d = dout + (size_t(b) * T + t) * C;
                if (dwte) {
                    float* w = dwte + size_t(tokens[b * T + t]) * C;
#pragma omp simd
                    for (int c = c0; c < c1; c++) w[c] += d[c];
                }
                if (dwpe) {
                    float* p = dwpe + size_t(t) * C;
#pragma omp simd
                    for (int c = c0; c < c1; c++) p[c] += d[c];
                }
            }
        }
    }
}

}  // namespace anvil::cpu
