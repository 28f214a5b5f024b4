// Host code compiled by nvcc, run without a GPU (label unit): the `{}`-filling fail() that kernel files use
// instead of fmt, and the dtype dispatch's error path.
#include <gtest/gtest.h>

#include "backend/cuda/common.cuh"

namespace anvil {
namespace {

std::string message_of(void (*f)()) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

TEST(NvccHost, FailFillsFieldsInOrder) {
    EXPECT_EQ(message_of([] { fail("attention: head size {} is above {} ({})", 160, 128, "bf16"); }),
              "attention: head size 160 is above 128 (bf16)");
    EXPECT_EQ(message_of([] { fail("no fields"); }), "no fields");
    EXPECT_EQ(message_of([] { fail("more fields {} {} than arguments", 1); }), "more fields 1 {} than arguments");
    EXPECT_EQ(message_of([] { fail("{}{}", 2.5, 'x'); }), "2.5x");
}

TEST(NvccHost, DispatchRejectsNonFloatTypes) {
    EXPECT_EQ(message_of([] { cuda::dispatch(DType::I32, [](auto) {}); }),
              "cuda backend: dtype I32 is not a float type");
    int calls = 0;
    cuda::dispatch(DType::BF16, [&](auto tag) {
        calls += std::is_same_v<decltype(tag), cuda::bf16_t>;
    });
    EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace anvil
