// One op-test harness for every backend (in the spirit of ggml's test-backend-ops). Each backend op is a case
// in one table (op_cases.cpp; the products' and attention's cases in op_cases_matmul.cpp and
// op_cases_attention.cpp): its tensors with shapes and how to draw them, its forward, its backward, and
// optionally a host reference. Every case runs in three modes from the same freshly drawn inputs:
//   gradients  on the CPU backend (the spec): the backward against central finite differences of the
//              forward, and the host reference where there is one            (tests/unit/test_ops.cpp)
//   compare    the CUDA backend against the CPU in f32, bf16 and f16, outputs poisoned with NaN first,
//              twice, bit for bit the same                                    (tests/gpu/test_cuda_ops.cpp)
//   perf       each op's time, GFLOP/s and GB/s on a backend                  (bench/op_bench.cpp, make bench)
// Adding an op to the Backend interface means adding a case here.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace anvil::test {

enum class Role : uint8_t {
    In,      // a float input: N(offset, scale) per element
    Int,     // an i32 input: uniform in [int_min, int_max)
    InOut,   // a float input the op updates in place (the optimizer's state)
    Out,     // written by the forward (or, when no forward output is read, by the backward)
    GradIn,  // written by the backward: the gradient of the input "x" is named "dx"
};

struct Arg {
    std::string name;
    Shape shape;
    Role role = Role::In;
    float scale = 1.0f, offset = 0.0f;
    int int_min = 0, int_max = 0;
    std::vector<int> fixed_ints;   // Int: these values instead of random ones (a page table)
    DType int_dtype = DType::I32;  // Int: I32 (ids) or I8 (int8 weights)
    bool f32 = false;              // f32 whatever dtype is under test (statistics, losses, the norm, ids)
    bool of_rounded = false;       // f32, but computed from values the op first rounds to the dtype under test
                                   // (add_norm's statistics of its stored sum): compared at that dtype's tolerance
    bool ints = false;             // Out: i32 values (token ids), compared exactly
    bool diff = false;             // In: checked against finite differences (its GradIn is "d" + name)
    bool accumulates = false;      // GradIn: the op adds into it; it starts from random values
    bool loss = true;              // Out: part of the objective sum(out * seed); "d" + name holds the seed
    float seed_const = 0.0f;       // Out: the seed is this constant (0: random), for ops that take one scalar
    bool positive = false;         // In/InOut: |N(offset, scale)| (second moments)
    bool compare = true;           // compared across backends (not: backend-defined scratch)
    // The shape depends on the backend (attention's saved statistics and scratch): elements from this.
    std::function<int64_t(const Backend&)> elems;
};

// Tensors of one run by name: the args, and the backward's seeds ("d" + output name).
class Args {
public:
    Tensor operator[](const std::string& name) const;
    std::map<std::string, Tensor> t;
};

using HostArgs = std::map<std::string, std::vector<float>>;

struct OpCase {
    std::string name;
    std::vector<Arg> args;
    std::function<void(Backend&, const Args&)> forward;
    std::function<void(Backend&, const Args&)> backward;  // empty: the op has no gradient
    // Expected outputs from the inputs (and the backward's seeds), computed on the host (empty: none): forward
    // outputs are checked after the forward, gradients (GradIn) after the backward.
    std::function<void(const HostArgs& in, HostArgs& expected)> reference;
    double reference_rtol = 1e-5, reference_atol = 1e-6;
    double flops = 0;                      // per forward + backward, for GFLOP/s (0: memory-bound)
    bool attention = false;                // compare mode runs every CUDA attention implementation
    AttnDims attn{};                       // an attention case's sizes (the dtype aside),
    int attn_kvh = 0;                      // its key/value heads
    bool attn_dropout = false;             // and whether it drops probabilities
    double fd_eps = 1e-2, fd_rtol = 2e-2, fd_atol = 2e-3;
    int product_rows = 0;            // a product's rows (N): up to 8 take the CUDA backend's direct kernels
    bool low_precision = true;       // compare mode runs bf16 and f16 too
    double low_precision_tol = 1.0;  // and scales those dtypes' tolerances (tol_for) by this
};

// An independent model of the 8-bit float formats (F8E4M3, F8E5M2) for FP8 products: every value decoded from
// its bit pattern, the nearest found by search (a tie to the even pattern), the scale's exponent searched for.
struct Fp8Grid {
    std::vector<double> values;  // by bit pattern; NaN for the NaN (and E5M2's Inf) patterns
    double max = 0;
    explicit Fp8Grid(DType t);
    int nearest_bits(double x) const;  // x within the format's range
    double nearest(double x) const { return values[size_t(nearest_bits(x))]; }
    int scale_exp(double amax) const;  // the largest k in [-126, 126] with amax 2^k <= max (0 for amax 0)
    // x as the FP8 product sees it: x 2^k rounded, scaled back, k from max |x|
    std::vector<float> quantize(const std::vector<float>& x) const;
};

// The sizes the table is built at: small for the tests, a model's for perf.
struct OpSizes {
    int B = 2, T = 12, C = 32, NH = 4, V = 70, Vp = 72;
    static OpSizes test() { return {}; }
    static OpSizes perf() { return {8, 128, 256, 4, 257, 320}; }  // `make bench`'s model, the byte vocabulary
    static OpSizes gpt2() { return {8, 1024, 768, 12, 50257, 50304}; }
};
// The table: every Backend op.
std::vector<OpCase> op_cases(const OpSizes& s = OpSizes::test());
// Whether c is a product over a few rows (up to 8: decoding) of a weight in the activations' dtype, which the
// CUDA backend runs in cuBLASLt or, with BackendOptions::direct_products, in its direct kernels.
bool few_row_float_product(const OpCase& c);

// ---- the modes ----------------------------------------------------------------------------------------

// Inputs for one run, drawn from `seed` (f32 on the host).
HostArgs draw_inputs(const OpCase& c, uint64_t seed);

// Gradients (and the reference) on `cpu`; returns "" when everything holds, else what failed.
std::string check_gradients(const OpCase& c, Backend& cpu, uint64_t seed);
// `gpu` against `cpu` in `dt`; returns "" or what failed.
std::string compare_backends(const OpCase& c, Backend& cpu, Backend& gpu, DType dt, uint64_t seed);

struct OpTiming {
    double fwd_ms = 0, bwd_ms = 0;
    double gflops = 0, gbps = 0;  // over forward + backward
    double fwd_gbps = 0;  // the forward's inputs and outputs over its time (a decode product: its weight)
};
OpTiming time_case(const OpCase& c, Backend& be, DType dt, int reps);

}  // namespace anvil::test
