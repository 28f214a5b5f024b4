// cuDNN's fused-attention graphs (--attention cudnn), built with the real library and no GPU (label unit):
// for every attention case of the op table that cuDNN takes (bf16 and f16, no dropout, head sizes that are
// multiples of 8) and GPT-2 124M's and a Llama's sizes, both graphs are made and finalized, which is where
// cuDNN checks every operand's shape, type and stride against its operation and every edge of the graph. What
// needs a device (an engine for the graph, the numbers) is the GPU tests' business, on a card and under
// cuemu.
#include <gtest/gtest.h>

#include "../ops/op_cases.h"
#include "backend/cuda/ops.h"

namespace anvil {
namespace {

TEST(CudnnAttentionGraphs, BuildForEveryAttentionCaseAndTrainingSize) {
    struct Case {
        std::string name;
        AttnShape s;
    };
    std::vector<Case> cases;
    for (const test::OpCase& c : test::op_cases()) {
        if (!c.attention || c.attn_dropout || c.attn.HS % 8 != 0) continue;
        cases.push_back({c.name, {c.attn.B, c.attn.T, c.attn.NH * c.attn.HS, c.attn.NH, c.attn_kvh}});
    }
    ASSERT_GE(cases.size(), 5u) << "the op table's attention cases were not found";
    cases.push_back({"GPT-2 124M, B=64 T=1024", {64, 1024, 768, 12, 12}});
    cases.push_back({"Llama 1B-class, B=8 T=2048, 32/8 heads of 64", {8, 2048, 2048, 32, 8}});
    for (const Case& c : cases)
        for (DType t : {DType::BF16, DType::F16}) {
            const std::string why = cuda::attention_cudnn_check_graphs(c.s, t);
            if (why.find("cannot be loaded") != std::string::npos ||
                why.find("no cuDNN") != std::string::npos)
                GTEST_SKIP() << why;
            EXPECT_EQ(why, "") << c.name << " " << dtype_name(t);
        }
}

}  // namespace
}  // namespace anvil
