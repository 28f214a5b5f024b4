#include "core/dtype.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/fp8.h"

namespace anvil {

std::string_view dtype_name(DType t) {
    switch (t) {
        case DType::F32:
            return "F32";
        case DType::BF16:
            return "BF16";
        case DType::F16:
            return "F16";
        case DType::I32:
            return "I32";
        case DType::U16:
            return "U16";
        case DType::U8:
            return "U8";
        case DType::I8:
            return "I8";
        case DType::F8E4M3:
            return "F8_E4M3";
        case DType::F8E5M2:
            return "F8_E5M2";
    }
    return "?";
}

bool dtype_from_name(std::string_view name, DType* out) {
    static constexpr struct {
        std::string_view name;
        DType type;
    } table[] = {{"F32", DType::F32}, {"BF16", DType::BF16}, {"F16", DType::F16},
                 {"I32", DType::I32}, {"U16", DType::U16},   {"U8", DType::U8},
                 {"I8", DType::I8}};  // not F8_*: FP8 checkpoints carry scales anvil does not read
    for (const auto& e : table) {
        if (e.name == name) {
            *out = e.type;
            return true;
        }
    }
    return false;
}

const char* precision_name(DType dt) {
    switch (dt) {
        case DType::BF16:
            return "bf16";
        case DType::F16:
            return "fp16";
        default:
            return "fp32";
    }
}

bool dtype_from_precision(std::string_view name, DType* out) {
    if (name == "fp32" || name == "f32")
        *out = DType::F32;
    else if (name == "bf16")
        *out = DType::BF16;
    else if (name == "fp16" || name == "f16")
        *out = DType::F16;
    else
        return false;
    return true;
}

// f32 -> f16, round to nearest even. Subnormal results are produced by letting the FPU round: adding a
// magic constant whose exponent puts the f16 subnormal LSB at the f32 LSB.
f16 to_f16(float f) {
    uint32_t x = f32_bits(f);
    const uint32_t sign = x & 0x80000000u;
    x ^= sign;
    uint16_t o;
    constexpr uint32_t f32_inf = 255u << 23;
    constexpr uint32_t f16_overflow = (127u + 16u) << 23;  // 2^16: everything at or above rounds to Inf
    if (x >= f16_overflow) {
        o = x > f32_inf ? 0x7e00 : 0x7c00;
    } else if (x < (113u << 23)) {  // below 2^-14: f16 subnormal or zero
        constexpr uint32_t magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
        const float sum = f32_from_bits(x) + f32_from_bits(magic);
        o = uint16_t(f32_bits(sum) - magic);
    } else {
        const uint32_t odd = (x >> 13) & 1u;
        x += (uint32_t(15 - 127) << 23) + 0xfffu + odd;
        o = uint16_t(x >> 13);
    }
    return f16{uint16_t(o | (sign >> 16))};
}

float from_f16(f16 h) {
    const uint32_t sign = uint32_t(h.bits & 0x8000u) << 16;
    const uint32_t exp = (h.bits >> 10) & 0x1fu;
    const uint32_t mant = h.bits & 0x3ffu;
    if (exp == 0) {
        const float mag = std::ldexp(float(mant), -24);
        return f32_from_bits(sign | f32_bits(mag));
    }
    if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (mant << 13));
    return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

void convert_to_f32(float* dst, const void* src, DType src_type, size_t n) {
    switch (src_type) {
        case DType::F32:
            std::memcpy(dst, src, n * 4);
            return;
        case DType::BF16: {
            const auto* s = static_cast<const bf16*>(src);
            for (size_t i = 0; i < n; i++) dst[i] = from_bf16(s[i]);
            return;
        }
        case DType::F16: {
            const auto* s = static_cast<const f16*>(src);
            for (size_t i = 0; i < n; i++) dst[i] = from_f16(s[i]);
            return;
        }
        case DType::I8: {
            const auto* s = static_cast<const int8_t*>(src);
            for (size_t i = 0; i < n; i++) dst[i] = float(s[i]);
            return;
        }
        case DType::F8E4M3:
        case DType::F8E5M2: {
            const auto* s = static_cast<const uint8_t*>(src);
            for (size_t i = 0; i < n; i++) dst[i] = fp8_value(s[i], src_type);
            return;
        }
        default:
            fail("cannot convert {} tensor data to F32", dtype_name(src_type));
    }
}

void convert_from_f32(void* dst, DType dst_type, const float* src, size_t n) {
    switch (dst_type) {
        case DType::F32:
            std::memcpy(dst, src, n * 4);
            return;
        case DType::BF16: {
            auto* d = static_cast<bf16*>(dst);
            for (size_t i = 0; i < n; i++) d[i] = to_bf16(src[i]);
            return;
        }
        case DType::F16: {
            auto* d = static_cast<f16*>(dst);
            for (size_t i = 0; i < n; i++) d[i] = to_f16(src[i]);
            return;
        }
        case DType::I8: {
            auto* d = static_cast<int8_t*>(dst);
            for (size_t i = 0; i < n; i++) d[i] = int8_t(std::clamp(std::nearbyint(src[i]), -127.0f, 127.0f));
            return;
        }
        case DType::F8E4M3:
        case DType::F8E5M2: {
            auto* d = static_cast<uint8_t*>(dst);
            for (size_t i = 0; i < n; i++) d[i] = fp8_bits(src[i], dst_type);
            return;
        }
        default:
            fail("cannot convert F32 data to {}", dtype_name(dst_type));
    }
}

}  // namespace anvil
