#include "core/fp8.h"

#include <algorithm>

namespace anvil {

namespace {

struct Format {
    int mbits, emin, bias;  // mantissa bits, smallest normal exponent, exponent bias
};
constexpr Format format(DType t) {
    return t == DType::F8E4M3 ? Format{3, -6, 7} : Format{2, -14, 15};
}

}  // namespace

float fp8_round(float x, DType t) {
    if (std::isnan(x)) return x;
    const Format f = format(t);
    const float a = std::fabs(x);
    float r = a;
    if (std::isfinite(a) && a > 0.0f) {
        int e = 0;
        std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1): its binade is 2^(e-1)
        // the spacing of the format's values in that binade (the subnormals' below the normal range); a / q
        // is exact (q a power of two), so nearbyint rounds a once, to nearest even
        const float q = std::ldexp(1.0f, std::max(e - 1, f.emin) - f.mbits);
        r = std::nearbyint(a / q) * q;
    }
    if (r > fp8_max(t)) r = t == DType::F8E4M3 ? std::nanf("") : INFINITY;
    return std::copysign(r, x);
}

uint8_t fp8_bits(float x, DType t) {
    const Format f = format(t);
    const float r = fp8_round(x, t);
    const uint8_t sign = std::signbit(r) ? 0x80 : 0x00;
    if (std::isnan(r)) return uint8_t(sign | (t == DType::F8E4M3 ? 0x7f : 0x7e));
    if (std::isinf(r)) return uint8_t(sign | 0x7c);  // E5M2 only: E4M3 overflow is NaN
    const float a = std::fabs(r);
    if (a == 0.0f) return sign;
    int e = 0;
    std::frexp(a, &e);
    const int exp = e - 1;
    if (exp < f.emin)  // subnormal: a = mant 2^(emin - mbits)
        return uint8_t(sign | int(a / std::ldexp(1.0f, f.emin - f.mbits)));
    const int mant = int((a / std::ldexp(1.0f, exp) - 1.0f) * float(1 << f.mbits));
    return uint8_t(sign | (exp + f.bias) << f.mbits | mant);
}

float fp8_value(uint8_t bits, DType t) {
    const Format f = format(t);
    const int ebits = 7 - f.mbits;
    const int exp = (bits >> f.mbits) & ((1 << ebits) - 1), mant = bits & ((1 << f.mbits) - 1);
    const float sign = bits & 0x80 ? -1.0f : 1.0f;
    if (t == DType::F8E4M3 && exp == 15 && mant == 7) return std::nanf("");
    if (t == DType::F8E5M2 && exp == 31) return mant == 0 ? sign * INFINITY : std::nanf("");
    if (exp == 0) return sign * std::ldexp(float(mant), f.emin - f.mbits);
    return sign * std::ldexp(1.0f + float(mant) / float(1 << f.mbits), exp - f.bias);
}

namespace {

float amax_of(const float* x, size_t n) {
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++) amax = std::fmax(amax, std::fabs(x[i]));
    return amax;
}

}  // namespace

float fp8_fake_quantize_scaled(float* dst, const float* src, size_t n, DType t, float scale, float dequant) {
    const float m = fp8_max(t);
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++) {
        amax = std::fmax(amax, std::fabs(src[i]));
        const float v = src[i] * scale;  // (may overflow to Inf where the scale is large: saturated too)
        dst[i] = fp8_round(std::isfinite(src[i]) ? std::clamp(v, -m, m) : v, t) * dequant;
    }
    return amax;
}

int fp8_fake_quantize(float* dst, const float* src, size_t n, DType t) {
    const int k = fp8_scale_exp(amax_of(src, n), t);
    fp8_fake_quantize_scaled(dst, src, n, t, std::ldexp(1.0f, k), std::ldexp(1.0f, -k));
    return k;
}

void fp8_history_init(float* st, int H) {
    std::fill(st, st + Fp8History::floats(H), 0.0f);
    st[Fp8History::kLength] = float(H);
}

int fp8_history_begin(float* st, const float* x, size_t n, DType t, bool record) {
    using S = Fp8History;
    const bool own = !fp8_history_recorded(st);
    fp8_history_push(st);
    const int H = int(st[S::kLength]);
    const float amax = own ? amax_of(x, n) : *std::max_element(st + S::kRing, st + S::kRing + H);
    return fp8_history_scale(st, amax, t, own, record);
}

void fp8_history_note(float* st, float amax) {
    st[Fp8History::kAmax] = std::fmax(st[Fp8History::kAmax], amax);
}

}  // namespace anvil
