// The GPU tests' entry point: without a usable CUDA device it says so and exits 77, which ctest reports as
// a skip (visible in its output), never as a pass.
#include <gtest/gtest.h>

#include <cstdio>

#include "backend/backend.h"

int main(int argc, char** argv) {
    ::testing::InitGoogleTest(&argc, argv);
    if (!anvil::cuda_available() && !GTEST_FLAG_GET(list_tests)) {
        std::printf(
            "SKIPPED: no usable CUDA device (run `anvil doctor` to see why); the GPU tests need one\n");
        return 77;
    }
    return RUN_ALL_TESTS();
}
