// Shared test helpers: host<->device tensors, seeded random fills, finite-difference gradient checks and
// tolerant comparisons. Every failure message carries the seed, so a failure can be replayed.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"

namespace anvil::test {

// A device tensor that owns its memory.
struct DevTensor {
    Buffer buf;
    Tensor t;
    DevTensor() = default;
    DevTensor(Backend& be, Shape shape, DType dtype = DType::F32) {
        buf = be.alloc(size_t(shape.numel()) * dtype_size(dtype));
        t.data = buf.data();
        t.shape = shape;
        t.dtype = dtype;
        t.device = be.device();
    }
    operator Tensor() const { return t; }
};

inline DevTensor upload(Backend& be, const std::vector<float>& host, Shape shape) {
    DevTensor d(be, shape);
    EXPECT_EQ(int64_t(host.size()), shape.numel());
    be.upload(d.t, host.data());
    return d;
}
inline DevTensor upload_i32(Backend& be, const std::vector<int32_t>& host, Shape shape) {
    DevTensor d(be, shape, DType::I32);
    be.upload(d.t, host.data());
    return d;
}
inline std::vector<float> download(Backend& be, const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    be.download(v.data(), t);
    return v;
}

// Seed for this test run: fresh each run unless ANVIL_TEST_SEED is set; printed on failure by callers.
uint64_t test_seed();

// An empty directory of this process under the system's temporary one: anvil_<name>_<pid>.
inline std::string fresh_dir(const std::string& name) {
    const std::filesystem::path d =
        std::filesystem::temp_directory_path() / ("anvil_" + name + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    return d.string();
}

// The message of the anvil::Error f throws, or "(no error)".
inline std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

// f throws an anvil::Error whose message holds `needle` (and `also`, where given: the file it names).
inline void expect_error(const std::function<void()>& f, const std::string& needle,
                         const std::string& also = {}) {
    const std::string what = error_of(f);
    EXPECT_NE(what.find(needle), std::string::npos)
        << "expected an error with \"" << needle << "\": " << what;
    if (!also.empty()) {
        EXPECT_NE(what.find(also), std::string::npos) << "expected it to name " << also << ": " << what;
    }
}

inline std::vector<float> randn(std::mt19937_64& g, size_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(g);
    return v;
}

// Largest |a-b| / (atol/rtol + |b|) style check: passes when every element satisfies
// |a - b| <= atol + rtol * |b|; NaN never passes.
::testing::AssertionResult all_close(const std::vector<float>& a, const std::vector<float>& b, double rtol,
                                     double atol, const std::string& what);

// Central finite differences of `loss` with respect to x[i] for the given indices (all if empty), steps eps
// and 2 eps combined by Richardson extrapolation (error O(eps^4) instead of O(eps^2)), compared
// with the analytic gradient `grad`. `loss` is evaluated after each perturbation of x in place.
::testing::AssertionResult check_grad(std::vector<float>& x, const std::vector<float>& grad,
                                      const std::function<double()>& loss, const std::string& what,
                                      double eps, double rtol, double atol, std::vector<size_t> indices = {});

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

// sum(out .* r) in double: the objective whose gradient wrt out is r.
inline double dot(const std::vector<float>& out, const std::vector<float>& r) {
    double s = 0.0;
    for (size_t i = 0; i < out.size(); i++) s += double(out[i]) * double(r[i]);
    return s;
}

}  // namespace anvil::test
