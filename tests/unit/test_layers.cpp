// The layers' compositions on the model seam: Llama's projections that read one input run as one product
// (LinearGroup) where their weights lie together, with the loss and gradients the parts apart give.
#include <cmath>
#include <cstdlib>

#include "model/layers.h"
#include "model_harness.h"

namespace anvil::test {
namespace {

// ANVIL_FUSE_PROJECTIONS set for a scope (null: unset)
struct FuseProjections {
    explicit FuseProjections(const char* v) {
        if (v)
            setenv("ANVIL_FUSE_PROJECTIONS", v, 1);
        else
            unsetenv("ANVIL_FUSE_PROJECTIONS");
    }
    ~FuseProjections() { unsetenv("ANVIL_FUSE_PROJECTIONS"); }
};

// Layer 0's linear layers of m by the ends of their names, in that order
std::vector<const Linear*> layer0(Model& m, std::initializer_list<const char*> ends) {
    std::vector<const Linear*> out;
    for (const char* e : ends)
        for (const Linear* l : m.linears())
            if (l->name().find("layers.0.") != std::string::npos && l->name().ends_with(e)) out.push_back(l);
    EXPECT_EQ(out.size(), ends.size());
    return out;
}
LinearGroup qkv(Model& m) {
    const auto l = layer0(m, {"q_proj", "k_proj", "v_proj"});
    return LinearGroup{l[0], l[1], l[2]};
}
LinearGroup gate_up(Model& m) {
    const auto l = layer0(m, {"gate_proj", "up_proj"});
    return LinearGroup{l[0], l[1]};
}

// The tiny Llama's q (8 x 8 floats), k and v (4 x 8: 128 bytes, less than the arena's 256-byte alignment) and
// gate and up (12 x 8) lie together (ParamSpec::joined), so each group is one product; its loss and every
// gradient are those of the parts apart (ANVIL_FUSE_PROJECTIONS=0: the adds of rounded input gradients) to
// f32's rounding, for grouped-query and plain multi-head attention alike (the latter reads the attention's
// dqkv in place), and with Qwen2's q, k and v biases (registered after each weight, laid after the three
// weights by LinearGroup::join: one bias vector, its gradient the column sums of the joined output's).
TEST(LinearGroup, JoinedProjectionsGiveTheSeparateProductsGradients) {
    for (const auto& [kv, bias] : {std::pair{2, false}, {4, false}, {2, true}}) {
        ModelConfig c = tiny_llama(false);
        c.n_kv_head = kv;
        c.qkv_bias = bias;
        SCOPED_TRACE(fmt::format("{} key/value heads{}", kv, bias ? ", q/k/v biases" : ""));
        double loss[2];
        std::vector<std::vector<float>> grads[2];
        for (int apart = 0; apart < 2; apart++) {
            const FuseProjections env(apart ? "0" : nullptr);
            TinyRun run(test_seed(), {}, c);
            EXPECT_EQ(qkv(*run.model).fused(), !apart);
            EXPECT_EQ(gate_up(*run.model).fused(), !apart);
            run.shake(test_seed() + 1, 0.2f);
            loss[apart] = run.loss(true);
            const ParamStore& s = run.model->params();
            for (size_t i : s.trainable()) grads[apart].push_back(download(*run.be, s.grad(i)));
        }
        EXPECT_NEAR(loss[0], loss[1], 1e-6 * std::abs(loss[1]));
        ASSERT_EQ(grads[0].size(), grads[1].size());
        for (size_t i = 0; i < grads[0].size(); i++) {
            float scale = 0.0f;
            for (float g : grads[1][i]) scale = std::max(scale, std::abs(g));
            for (size_t j = 0; j < grads[0][i].size(); j++)
                ASSERT_NEAR(grads[0][i][j], grads[1][i][j], 1e-5f * scale + 1e-7f)
                    << "entry " << i << " [" << j << "]";
        }
    }
}

// What keeps a group apart: an adapter on one of its parts (LoRA's default q_proj and v_proj leave the MLP's
// pair joined), int8 weights, FP8 products. Qwen2's q, k and v biases do not: the weights are laid first.
TEST(LinearGroup, RunsApartWhereSomethingRidesOnAPart) {
    const FuseProjections env(nullptr);
    ModelOptions lora;
    lora.lora.rank = 2;
    lora.lora.alpha = 4.0f;
    lora.lora.targets = {"q_proj", "v_proj"};
    {
        TinyRun run(test_seed(), lora, tiny_llama(false));
        EXPECT_FALSE(qkv(*run.model).fused());
        EXPECT_TRUE(gate_up(*run.model).fused());
    }
    ModelConfig biased = tiny_llama(false);
    biased.qkv_bias = true;
    {
        TinyRun run(test_seed(), {}, biased);
        EXPECT_TRUE(qkv(*run.model).fused());
        EXPECT_TRUE(gate_up(*run.model).fused());
        const ParamStore& s = run.model->params();
        std::vector<std::string> names;
        for (size_t i = 0; i < s.size(); i++)
            if (s.spec(i).name.find("layers.0.self_attn.") != std::string::npos)
                names.push_back(s.spec(i).name);
        const std::string p = "model.layers.0.self_attn.";
        EXPECT_EQ(names, (std::vector<std::string>{p + "q_proj.weight", p + "k_proj.weight",
                                                   p + "v_proj.weight", p + "q_proj.bias", p + "k_proj.bias",
                                                   p + "v_proj.bias", p + "o_proj.weight"}));
    }

    ModelOptions fp8;
    fp8.fp8 = true;
    {
        TinyRun run(test_seed(), fp8, tiny_llama(false));
        EXPECT_FALSE(qkv(*run.model).fused());
        EXPECT_FALSE(gate_up(*run.model).fused());
    }
}

}  // namespace
}  // namespace anvil::test
