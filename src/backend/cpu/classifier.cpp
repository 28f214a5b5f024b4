// Fused softmax + cross-entropy: one pass finds the row's max, one its log-sum-exp, and, when a gradient
// is wanted, a last pass overwrites the logits with dloss * (softmax - onehot). Probabilities are never
// stored.
#include <cmath>

#include "backend/cpu/ops.h"
#include "backend/cpu/vec_math.h"

namespace anvil::cpu {

void classifier(float* losses, float* logits, const int32_t* targets, float dloss, int N, int Vp, int V) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float* row = logits + size_t(n) * Vp;
        const int32_t tgt = targets[n];
        if (tgt < 0) {
            losses[n] = 0.0f;
            if (dloss != 0.0f)
                for (int j = 0; j < Vp; j++) row[j] = 0.0f;
            continue;
        }
        float mx = row[0];
        for (int j = 1; j < V; j++) mx = row[j] > mx ? row[j] : mx;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < V; j++) sum += vexp(row[j] - mx);
        const float lse = mx + std::log(sum);
        losses[n] = lse - row[tgt];
        if (dloss != 0.0f) {
#pragma omp simd
            for (int j = 0; j < V; j++) row[j] = dloss * vexp(row[j] - lse);
            row[tgt] -= dloss;
            for (int j = V; j < Vp; j++) row[j] = 0.0f;
        }
    }
}

}  // namespace anvil::cpu
