// LoRA on the model seam: exact gradients of the adapters (with and without dropout), a frozen base that costs
// no gradient or optimizer memory, an adapter that starts as the base bit for bit, merging, PEFT's files in and
// out, and the errors a user meets.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "harness.h"
#include "io/fs.h"
#include "io/json_text.h"
#include "io/safetensors.h"
#include "model/lora.h"
#include "model/model_io.h"
#include "model_harness.h"
#include "train/optimizer.h"

namespace anvil::test {
namespace {

namespace fsys = std::filesystem;

ModelOptions lora(int rank, const std::vector<std::string>& targets, float dropout = 0.0f, bool rslora = false) {
    ModelOptions mo;
    mo.lora.rank = rank;
    mo.lora.alpha = 3.0f;
    mo.lora.targets = targets;
    mo.lora.dropout = dropout;
    mo.lora.rslora = rslora;
    return mo;
}

std::string tmpdir(const std::string& name) {
    return fresh_dir("lora_" + name);
}

// The adapters' gradients (A and B of every targeted layer, B made non-zero) against finite differences.
TEST(Lora, AdapterGradientsMatchFiniteDifferences) {
    for (float dropout : {0.0f, 0.25f}) {
        SCOPED_TRACE("dropout " + std::to_string(dropout));
        TinyRun run(test_seed(), lora(2, {"c_attn", "c_proj", "c_fc"}, dropout, dropout > 0));
        run.shake(test_seed() + 1, 0.2f);  // B = 0 at the start would leave A's gradient zero
        run.check_gradients(test_seed() + 2);
        const ParamStore& s = run.model->params();
        EXPECT_EQ(s.trainable().size(), size_t(2 * 2 * 4)) << "A and B on 4 layers (c_proj: attention and MLP) x 2";
    }
}

TEST(Lora, TheBaseIsFrozenAndCostsNoGradientOrOptimizerMemory) {
    TinyRun full(3), adapted(3, lora(2, {"c_attn"}));
    const ParamStore& s = adapted.model->params();
    int64_t adapter_elems = 0;
    for (size_t i = 0; i < s.size(); i++) {
        EXPECT_EQ(s.spec(i).trainable, s.spec(i).adapter) << s.spec(i).name;
        EXPECT_EQ(s.grad(i).empty(), !s.spec(i).adapter) << s.spec(i).name;
        if (!s.spec(i).adapter) continue;
        adapter_elems += s.spec(i).shape.numel();
        EXPECT_TRUE(s.spec(i).decay) << "weight decay applies to the adapter matrices";
    }
    EXPECT_EQ(adapter_elems, int64_t(2 * (2 * 8 + 24 * 2))) << "2 layers of A (2, 8) and B (24, 2)";
    EXPECT_LE(s.grad_bytes(), size_t(4 * kAlign) + size_t(adapter_elems) * 4);
    const size_t before = adapted.be->memory_in_use();
    AdamW opt(adapted.model->params(), 0.1f);
    EXPECT_LE(adapted.be->memory_in_use() - before, 2 * (size_t(4 * kAlign) + size_t(adapter_elems) * 4));
}

// B starts at zero: the adapted model computes exactly what the base does.
TEST(Lora, AStartingAdapterIsTheBaseBitForBit) {
    TinyRun base(5), adapted(5, lora(3, {"c_attn", "c_proj", "c_fc"}));
    set_all_params(base.model->params(), [&] {  // the same base weights (the store orders differ after the base)
        std::vector<std::vector<float>> v;
        for (size_t i = 0; i < base.model->params().size(); i++) v.push_back(adapted.model->params().read_f32(i));
        return v;
    }());
    EXPECT_EQ(base.loss(false), adapted.loss(false));
    EXPECT_EQ(download(*base.be, base.model->logits(base.B, base.T)),
              download(*adapted.be, adapted.model->logits(adapted.B, adapted.T)));
}

// Merging folds s (B A)^T into each weight: the plain model then gives the adapted model's loss.
TEST(Lora, MergedModelEqualsBasePlusAdapter) {
    for (bool rslora : {false, true}) {
        TinyRun adapted(7, lora(2, {"c_attn", "c_proj", "c_fc"}, 0.0f, rslora));
        adapted.shake(8, 0.2f);
        const double want = adapted.loss(false);
        merge_lora(*adapted.model);
        TinyRun plain(7);
        for (size_t i = 0; i < plain.model->params().size(); i++) {
            const std::vector<float> v = adapted.model->params().read_f32(i);
            plain.model->params().write_f32(i, v.data());
        }
        EXPECT_NEAR(plain.loss(false), want, 1e-5 * std::abs(want)) << "rslora " << rslora;
    }
}

TEST(Lora, PeftFilesRoundTrip) {
    const std::string d = tmpdir("peft");
    TinyRun a(9, lora(2, {"c_attn", "c_proj"}));
    a.shake(10, 0.2f);
    const ParamStore& s = a.model->params();
    write_peft_adapter(d, *a.model, "/some/base", [&](size_t i, float* dst) {
        const std::vector<float> v = s.read_f32(i);
        std::copy(v.begin(), v.end(), dst);
    });
    const nlohmann::json cfg = read_json_file(d + "/adapter_config.json");
    EXPECT_EQ(cfg["peft_type"], "LORA");
    EXPECT_EQ(cfg["task_type"], "CAUSAL_LM");
    EXPECT_EQ(cfg["r"], 2);
    EXPECT_EQ(cfg["fan_in_fan_out"], true);
    EXPECT_EQ(cfg["base_model_name_or_path"], "/some/base");
    SafetensorsReader st(d + "/adapter_model.safetensors");
    const StEntry* e = st.find("base_model.model.transformer.h.1.attn.c_attn.lora_A.weight");
    ASSERT_TRUE(e);
    EXPECT_EQ(e->shape, (std::vector<int64_t>{2, 8}));
    e = st.find("base_model.model.transformer.h.0.mlp.c_proj.lora_B.weight");
    ASSERT_TRUE(e);
    EXPECT_EQ(e->shape, (std::vector<int64_t>{8, 2}));
    EXPECT_EQ(st.entries().size(), size_t(2 * 2 * 3));
    const PeftAdapter back = read_peft_config(d, a.model.get());
    EXPECT_EQ(back.lora.rank, 2);
    EXPECT_EQ(back.lora.targets, (std::vector<std::string>{"c_attn", "c_proj"}));
    TinyRun b(9, lora(2, {"c_attn", "c_proj"}));  // the same batch; its weights come from a and the files
    b.shake(12, 0.5f);  // nothing of b's own draw may survive
    for (size_t i = 0; i < s.size(); i++)
        if (!s.spec(i).adapter) b.model->params().write_f32(i, s.read_f32(i).data());
    load_peft_weights(d, *b.model);
    EXPECT_EQ(b.loss(false), a.loss(false));
    fsys::remove_all(d);
}

TEST(Lora, ClearErrors) {
    auto be = make_backend({Device::CPU, 1, 0});
    // the error lists the layers there are
    expect_error([&] { make_model(*be, tiny(), lora(2, {"q_proj"})); }, "\"q_proj\" names no linear layer",
                 "transformer.h.0.attn.c_attn");
    expect_error([&] { make_model(*be, tiny(), lora(9, {"c_attn"})); }, "--lora-rank 9");

    const std::string d = tmpdir("bad");
    auto cfg = [&](const nlohmann::json& j) { write_file_atomic(d + "/adapter_config.json", j.dump()); };
    nlohmann::json good = {{"peft_type", "LORA"}, {"r", 2}, {"lora_alpha", 4}, {"target_modules", {"c_attn"}}};
    cfg(nlohmann::json{{"peft_type", "PREFIX_TUNING"}, {"r", 2}});
    expect_error([&] { read_peft_config(d); }, "peft_type");
    nlohmann::json no_r = good;
    no_r.erase("r");
    cfg(no_r);
    expect_error([&] { read_peft_config(d); }, "no \"r\"");
    nlohmann::json bias = good;
    bias["bias"] = "all";
    cfg(bias);
    expect_error([&] { read_peft_config(d); }, "bias");
    // an adapter of another base: shapes that do not fit
    cfg(good);
    std::vector<float> z(2 * 16, 0.0f);
    write_safetensors(d + "/adapter_model.safetensors",
                      {{"base_model.model.transformer.h.0.attn.c_attn.lora_A.weight", DType::F32, {2, 16}, z.data()}});
    auto m = make_model(*be, tiny(), lora(2, {"c_attn"}));
    expect_error([&] { load_peft_weights(d, *m); }, "another base model");
    // a truncated file
    const std::string bytes = read_file(d + "/adapter_model.safetensors");
    write_file_atomic(d + "/adapter_model.safetensors", bytes.substr(0, bytes.size() - 9));
    expect_error([&] { load_peft_weights(d, *m); }, "truncated");
    fsys::remove_all(d);
}

}  // namespace
}  // namespace anvil::test
