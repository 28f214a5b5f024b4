// Fp8Grid (op_cases.h): an independent model of the 8-bit float formats for the FP8 products' tests.
#include <algorithm>
#include <cmath>

#include "op_cases.h"

namespace anvil::test {

Fp8Grid::Fp8Grid(DType t) {
    const bool e4 = t == DType::F8E4M3;
    const int mbits = e4 ? 3 : 2, bias = e4 ? 7 : 15, emask = (1 << (7 - mbits)) - 1;
    for (int b = 0; b < 256; b++) {
        const int e = (b >> mbits) & emask, m = b & ((1 << mbits) - 1);
        const bool special = e4 ? (e == emask && m == (1 << mbits) - 1) : e == emask;
        const double v = special  ? NAN
                         : e == 0 ? std::ldexp(m, 1 - bias - mbits)
                                  : std::ldexp((1 << mbits) + m, e - bias - mbits);
        values.push_back(b & 0x80 ? -v : v);
        if (!std::isnan(v)) max = std::max(max, v);
    }
}

int Fp8Grid::nearest_bits(double x) const {
    int best = -1;
    for (int b = 0; b < 256; b++) {
        if (std::isnan(values[size_t(b)])) continue;
        const double d = std::abs(x - values[size_t(b)]);
        const double bd = best < 0 ? INFINITY : std::abs(x - values[size_t(best)]);
        // a tie between two values goes to the even pattern (+0 and -0 are one value: keep x's sign)
        if (d < bd || (d == bd && values[size_t(b)] != values[size_t(best)] && b % 2 == 0)) best = b;
    }
    if (values[size_t(best)] == 0.0) best = std::signbit(x) ? 0x80 : 0x00;
    return best;
}

int Fp8Grid::scale_exp(double amax) const {
    if (amax == 0) return 0;
    int k = 126;
    while (k > -126 && amax * std::ldexp(1.0, k) > max) k--;
    return k;
}

std::vector<float> Fp8Grid::quantize(const std::vector<float>& x) const {
    double amax = 0;
    for (float v : x) amax = std::max(amax, double(std::abs(v)));
    const int k = scale_exp(amax);
    std::vector<float> q(x.size());
    for (size_t i = 0; i < x.size(); i++)
        q[i] = float(nearest(double(x[i]) * std::ldexp(1.0, k)) * std::ldexp(1.0, -k));
    return q;
}

}  // namespace anvil::test
