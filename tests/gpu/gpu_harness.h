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

inline std::string dtype_param_name(const ::testing::TestParamInfo<DType>& p) {
    return std::string(dtype_name(p.param));
}

}  // namespace anvil::test
