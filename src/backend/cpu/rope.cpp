// Rotary position embeddings in Hugging Face's rotate_half layout, and the grouped-query gradients out of the
// packed (q, k, v) layout attention takes.
#include <cmath>

#include "backend/cpu/ops.h"

namespace anvil::cpu {

// x (B, T, H, HS) in place (rows (b, t) ldx apart): for i < HS/2, (x_i, x_{i+HS/2}) rotated by angle (pos0 +
// t) * inv_freq[i]; the inverse rotation (the backward) turns the other way. The angle is formed in f32, as
// transformers does. With row_pos, row b starts at row_pos[b] instead of pos0.
void rope(float* x, int64_t ldx, const float* inv_freq, int B, int T, int H, int HS, int pos0, bool inverse,
          const int* row_pos) {
    const int half = HS / 2;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float pos = float((row_pos ? row_pos[b] : pos0) + t);
            for (int i = 0; i < half; i++) {
                const float a = pos * inv_freq[i];
                const float c = std::cos(a), s = inverse ? -std::sin(a) : std::sin(a);
                for (int h = 0; h < H; h++) {
                    float* v = x + (size_t(b) * T + t) * size_t(ldx) + size_t(h) * HS;
                    const float x1 = v[i], x2 = v[i + half];
                    v[i] = x1 * c - x2 * s;
                    v[i + half] = x2 * c + x1 * s;
                }
            }
        }
}

// dq, dk, dv overwritten from dqkv (N, (NH + 2 KH) HS); KH is KVH, or NH with one share per query head of
// each key/value head (transformers' repeat_kv), which sum into it.
void qkv_unpack(Rows<float> dq, Rows<float> dk, Rows<float> dv, const float* dqkv, int N, int NH, int KVH,
                int KH, int HS) {
    const int group = KH / KVH, W = (NH + 2 * KH) * HS;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* g = dqkv + size_t(n) * W;
        float* qr = dq.row(n);
        for (int i = 0; i < NH * HS; i++) qr[i] = g[i];
        for (int h = 0; h < KVH; h++) {
            float* kr = dk.row(n) + size_t(h) * HS;
            float* vr = dv.row(n) + size_t(h) * HS;
            for (int d = 0; d < HS; d++) kr[d] = vr[d] = 0.0f;
            for (int r = 0; r < group; r++) {
                const float* kg = g + size_t(NH + h * group + r) * HS;
                const float* vg = g + size_t(NH + KH + h * group + r) * HS;
                for (int d = 0; d < HS; d++) kr[d] += kg[d], vr[d] += vg[d];
            }
        }
    }
}

}  // namespace anvil::cpu
