// Element types and conversions. bf16 and f16 are stored as raw 16-bit patterns; conversions round to
// nearest-even, keep NaN a NaN and saturate nothing (overflow becomes Inf, as the hardware does).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace anvil {

// I8: int8 weights (anvil quantize), one f32 scale per output channel beside them. F8E4M3, F8E5M2: the 8-bit
// float operands of FP8 products (core/fp8.h), each tensor with a power-of-two scale beside it.
enum class DType : uint8_t { F32, BF16, F16, I32, U16, U8, I8, F8E4M3, F8E5M2 };

constexpr size_t dtype_size(DType t) {
    switch (t) {
        case DType::F32:
            return 4;
        case DType::BF16:
            return 2;
        case DType::F16:
            return 2;
        case DType::I32:
            return 4;
        case DType::U16:
            return 2;
        case DType::U8:
        case DType::I8:
        case DType::F8E4M3:
        case DType::F8E5M2:
            return 1;
    }
    return 0;
}

// Names as safetensors writes them ("F32", "BF16", ...).
std::string_view dtype_name(DType t);
// Parses a safetensors dtype name; returns false for names anvil does not handle (F8_E4M3 and F8_E5M2 among
// them: FP8 checkpoints pair their tensors with scales, and reading the bytes alone would be wrong).
bool dtype_from_name(std::string_view name, DType* out);
// Parses a user-facing precision name ("fp32", "bf16", "fp16").
bool dtype_from_precision(std::string_view name, DType* out);
// The user-facing name of a float dtype: "fp32", "bf16", "fp16".
const char* precision_name(DType dt);

struct bf16 {
    uint16_t bits;
};
struct f16 {
    uint16_t bits;
};

inline uint32_t f32_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float f32_from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline bf16 to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40u)};  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);                                                // round to nearest even
    return bf16{uint16_t(u >> 16)};
}
inline float from_bf16(bf16 h) {
    return f32_from_bits(uint32_t(h.bits) << 16);
}

f16 to_f16(float f);
float from_f16(f16 h);

// Bulk conversions between a typed buffer and f32 (n elements). To I8: rounded to nearest, clamped to
// [-127, 127] (the symmetric range anvil's int8 weights use).
// To F8E4M3/F8E5M2: fp8_bits (no scaling).
void convert_to_f32(float* dst, const void* src, DType src_type, size_t n);
void convert_from_f32(void* dst, DType dst_type, const float* src, size_t n);

}  // namespace anvil
