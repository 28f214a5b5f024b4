// Helpers for the CUDA tests: the same values on the CPU backend (the spec) and on the GPU in any float
// dtype, outputs poisoned with NaN before each run, and per-dtype tolerances.
#pragma once

#include <algorithm>
#include <cstring>

#include "../unit/harness.h"

namespace anvil::test {

// Both backends, created once per test.
struct Backends {
    std::unique_ptr<Backend> cpu = make_backend({Device::CPU, 0, 0});
    std::unique_ptr<Backend> gpu = make_backend({Device::CUDA, 0, 0});
};

// `v` as the GPU sees it after rounding to `dt`, back in f32: the CPU reference runs on exactly these values,
// so a comparison measures the kernel, not the input rounding.
inline std::vector<float> rounded(const std::vector<float>& v, DType dt) {
    std::vector<uint8_t> tmp(v.size() * dtype_size(dt));
    convert_from_f32(tmp.data(), dt, v.data(), v.size());
    std::vector<float> out(v.size());
    convert_to_f32(out.data(), tmp.data(), dt, v.size());
    return out;
}

// A device tensor of dtype `dt` holding `v` (rounded to dt).
inline DevTensor put(Backend& be, const std::vector<float>& v, Shape s, DType dt) {
    DevTensor d(be, s, dt);
    EXPECT_EQ(int64_t(v.size()), s.numel());
    std::vector<uint8_t> tmp(d.t.nbytes());
    convert_from_f32(tmp.data(), dt, v.data(), v.size());
    be.upload(d.t, tmp.data());
    return d;
}

// Every byte 0xFF: NaN in f32, bf16 and f16, so an element a kernel forgets to write fails the comparison.
inline void poison(Backend& be, const Tensor& t) {
    std::vector<uint8_t> ff(t.nbytes(), 0xFF);
    be.upload(t, ff.data());
}
inline DevTensor poisoned(Backend& be, Shape s, DType dt) {
    DevTensor d(be, s, dt);
    poison(be, d.t);
    return d;
}

// Any float tensor back to host f32.
inline std::vector<float> get(Backend& be, const Tensor& t) {
    std::vector<uint8_t> raw(t.nbytes());
    be.download(raw.data(), t);
    std::vector<float> out(size_t(t.numel()));
    convert_to_f32(out.data(), raw.data(), t.dtype, out.size());
    return out;
}
inline std::vector<uint8_t> bytes(Backend& be, const Tensor& t) {
    std::vector<uint8_t> raw(t.nbytes());
    be.download(raw.data(), t);
    return raw;
}

// |got - want| <= rtol * |want| + atol_frac * max|want| for every element; NaN never passes. The absolute
// part is relative to the tensor's scale so sums that cancel to near zero are judged fairly.
struct Tol {
    double rtol, atol_frac;
};
inline Tol tol_for(DType dt) {
    switch (dt) {
        case DType::BF16:
            return {1.6e-2, 8e-3};  // 8 mantissa bits: one rounding is 2^-9 relative
        case DType::F16:
            return {4e-3, 2e-3};  // 11 bits
        default:
            return {2e-5, 2e-6};  // f32: only the summation order differs
    }
}
inline ::testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& want, Tol t,
                                        const std::string& what) {
    double scale = 0.0;
    for (float x : want) scale = std::max(scale, double(std::abs(x)));
    return all_close(got, want, t.rtol, std::max(t.atol_frac * scale, 1e-30), what);
}

inline std::string dtype_param_name(const ::testing::TestParamInfo<DType>& p) {
    return std::string(dtype_name(p.param));
}

}  // namespace anvil::test
