// Host code compiled by nvcc, run without a GPU (label unit): the `{}`-filling fail() that kernel files use
// instead of fmt, the dtype dispatch's error path, and the column sums' chunk count.
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

// The column sums' chunk count: 64 rows or more a chunk, at most 256 chunks, fewer where their partial sums
// would not fit the scratch (a vocabulary-wide bias), and nothing but the shape decides it.
TEST(NvccHost, ColumnSumChunksFitTheScratch) {
    const size_t mib64 = size_t(64) << 20;
    EXPECT_EQ(cuda::col_chunks(10, 32, mib64), 1);
    EXPECT_EQ(cuda::col_chunks(16 * 1024, 768, mib64), 256);
    EXPECT_EQ(cuda::col_chunks(1000, 2 * 768, mib64), 15);
    EXPECT_EQ(cuda::col_chunks(16 * 1024, 128256, mib64), 128);  // 128 x 128256 floats: 62.6 MiB
    EXPECT_EQ(cuda::col_chunks(16 * 1024, 2 * 128256, mib64), 64);
    EXPECT_EQ(cuda::col_chunks(16 * 1024, size_t(1) << 26, mib64), 1);  // the floor: one chunk
}

}  // namespace
}  // namespace anvil
