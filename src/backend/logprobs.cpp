#include "backend/logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace anvil {

void logprob_row(std::span<const float> logits, int32_t target, int k, float* lp, int32_t* ids,
                 float* top_lp) {
    ANVIL_CHECK(target >= 0 && size_t(target) < logits.size() && k >= 0 && size_t(k) <= logits.size(),
                "logprob of token {} (top {}) among {}", target, k, logits.size());
    const float mx = *std::max_element(logits.begin(), logits.end());
    double sum = 0.0;
    for (const float x : logits) sum += std::exp(double(x) - double(mx));
    const double lse = double(mx) + std::log(sum);
    *lp = float(double(logits[size_t(target)]) - lse);
    if (k == 0) return;
    std::vector<int32_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    const auto before = [&](int32_t a, int32_t b) {
        return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
    };
    std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
    for (int i = 0; i < k; i++) {
        ids[i] = order[size_t(i)];
        top_lp[i] = float(double(logits[size_t(order[size_t(i)])]) - lse);
    }
}

}  // namespace anvil
