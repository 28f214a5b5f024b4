// Weight-only int8 (anvil quantize) on the model seam: an int8 model computes what a float model holding its
// dequantized weights computes (loss, LoRA gradients, cached decoding), stays close to the float model it
// came from, and its directory round-trips with clear errors for what does not fit.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "harness.h"
#include "io/fs.h"
#include "io/json_text.h"
#include "io/safetensors.h"
#include "model/generate.h"
#include "model/lora.h"
#include "model/model_io.h"
#include "model/quantize.h"
#include "model_harness.h"

namespace anvil::test {
namespace {

namespace fsys = std::filesystem;

ModelConfig int8(ModelConfig c) {
    c.int8_weights = true;
    return c;
}

ModelOptions with_lora() {
    ModelOptions mo;
    mo.lora.rank = 2;
    mo.lora.alpha = 4.0f;
    return mo;
}

// A float model whose int8 entries hold q * scale of `q`'s, every other entry `q`'s own.
void set_dequantized(const Model& q, Model& d) {
    const ParamStore& from = q.params();
    ParamStore& to = d.params();
    for (size_t i = 0; i < to.size(); i++) {
        const size_t j = from.find(to.spec(i).name);
        ASSERT_NE(j, ParamStore::npos) << to.spec(i).name;
        std::vector<float> w = from.read_f32(j);
        if (from.spec(j).dtype == DType::I8) {
            const std::vector<float> s = from.read_f32(from.find(to.spec(i).name + "_scale"));
            const int64_t cols = from.spec(j).shape[1];
            for (size_t e = 0; e < w.size(); e++)
                w[e] *= s[from.spec(j).scale_dim == 0 ? e / size_t(cols) : e % size_t(cols)];
        }
        to.write_f32(i, w.data());
    }
}

std::vector<float> decode_logits(Model& m, const std::vector<int32_t>& ids) {
    auto acts = m.make_activations(1, int(ids.size()), ActMode::Decode);
    auto cache = m.make_cache();
    std::vector<float> all;
    for (size_t t = 0; t < ids.size(); t++) {  // one token at a time: the decoding kernels
        const std::vector<float> l = forward_cached(m, *acts, *cache, 0, &ids[t], 1, int(t));
        all.insert(all.end(), l.begin(), l.end());
    }
    return all;
}

TEST(Int8, ComputesWhatItsDequantizedWeightsComputeAndStaysCloseToTheFloatModel) {
    for (const ModelConfig& c : {tiny(), tiny_llama(false), tiny_llama(true)}) {
        SCOPED_TRACE(c.str());
        TinyRun f(test_seed(), with_lora(), c);
        f.shake(test_seed() + 1, 0.2f);  // non-zero LoRA B, so every adapter gradient carries signal
        TinyRun q(test_seed(), with_lora(), int8(c));
        const QuantizeReport r = quantize_model(*f.model, *q.model);
        EXPECT_EQ(r.tensors, c.n_layer * (c.model_type == "gpt2" ? 4 : 7) + (c.tie_embeddings ? 1 : 2));
        EXPECT_LT(r.max_rel_error, 0.02);
        TinyRun d(test_seed(), with_lora(), c);
        set_dequantized(*q.model, *d.model);

        const double lq = q.loss(true), ld = d.loss(true), lf = f.loss(false);
        EXPECT_NEAR(lq, ld, 1e-5 * std::abs(ld));
        EXPECT_NEAR(lq, lf, 0.01 * std::abs(lf)) << "int8 rounding moved the loss by more than 1%";
        const ParamStore& sq = q.model->params();
        const ParamStore& sd = d.model->params();
        ASSERT_EQ(sq.trainable().size(), sd.trainable().size());
        for (size_t k = 0; k < sq.trainable().size();
             k++) {  // QLoRA: the adapters' gradients on the int8 base
            const size_t i = sq.trainable()[k];
            EXPECT_TRUE(sq.spec(i).adapter) << sq.spec(i).name;
            EXPECT_TRUE(all_close(download(*q.be, sq.grad(i)), download(*d.be, sd.grad(sd.trainable()[k])),
                                  1e-4, 1e-6, sq.spec(i).name));
        }
        const std::vector<int32_t> ids = {3, 1, 4, 1, 5, 9};
        EXPECT_TRUE(
            all_close(decode_logits(*q.model, ids), decode_logits(*d.model, ids), 1e-4, 1e-5, "decoding"));
    }
}

TEST(Int8, DirectoryRoundTripsAndMismatchesAreClearErrors) {
    const std::string dir = fresh_dir("int8");
    TinyRun f(test_seed(), {}, tiny());
    TinyRun q(test_seed(), {}, int8(tiny()));
    quantize_model(*f.model, *q.model);
    write_model_dir(dir, *q.model, {});

    SafetensorsReader st(dir + "/model.safetensors");
    ASSERT_TRUE(st.find("transformer.h.0.attn.c_attn.weight"));
    EXPECT_EQ(st.find("transformer.h.0.attn.c_attn.weight")->dtype_name, "I8");
    EXPECT_EQ(st.find("transformer.h.0.attn.c_attn.weight_scale")->dtype_name, "F32");
    EXPECT_EQ(st.find("transformer.wte.weight")->dtype_name, "I8");
    EXPECT_EQ(st.find("transformer.ln_f.weight")->dtype_name, "F32");
    nlohmann::json raw;
    const ModelConfig back = read_model_config(dir, &raw);
    EXPECT_TRUE(back.int8_weights);
    EXPECT_EQ(raw["quantization_config"]["quant_method"], kInt8Method);
    auto m = make_model(*q.be, back);
    load_model_weights(dir, *m);
    for (size_t i = 0; i < m->params().size(); i++)
        EXPECT_EQ(m->params().read_f32(i), q.model->params().read_f32(i)) << m->params().spec(i).name;

    // int8 tensors under a float config
    auto plain = make_model(*q.be, tiny());
    expect_error([&] { load_model_weights(dir, *plain); }, "has no quantization_config");
    // another tool's quantization
    nlohmann::json other = raw;
    other["quantization_config"]["quant_method"] = "gptq";
    write_file_atomic(dir + "/config.json", other.dump());
    expect_error([&] { read_model_config(dir); }, "\"gptq\" is not supported");
    // float tensors under an int8 config
    write_model_dir(dir, *f.model, {});
    write_file_atomic(dir + "/config.json", raw.dump());
    auto qm = make_model(*q.be, back);
    expect_error([&] { load_model_weights(dir, *qm); }, "says the weights are int8");
    // an int8 model is quantized once, and takes no merged adapter
    expect_error([&] { quantize_model(*q.model, *qm); }, "int8 already");
    TinyRun ql(test_seed(), with_lora(), int8(tiny()));
    expect_error([&] { merge_lora(*ql.model); }, "merge into the float base");
    fsys::remove_all(dir);
}

TEST(Int8, QuantizeRoundsPerOutputChannel) {
    // W (in = 3, out = 2), channels along dimension 1: channel 0 spans [-1, 0.3], channel 1 [-0.015, 0.02]
    const float w[] = {-1.0f, 0.02f, 0.3f, -0.015f, 0.25f, 0.0f};
    int8_t q[6];
    float s[2];
    quantize_int8(w, 3, 2, 1, q, s);
    EXPECT_FLOAT_EQ(s[0], 1.0f / 127.0f);
    EXPECT_FLOAT_EQ(s[1], 0.02f / 127.0f);
    const int8_t want[] = {-127, 127, 38, -95, 32, 0};  // 38.1, -95.25, 31.75 rounded
    for (int i = 0; i < 6; i++) EXPECT_EQ(q[i], want[i]) << i;
    const float zeros[] = {0.0f, 0.0f};
    quantize_int8(zeros, 1, 2, 0, q, s);
    EXPECT_EQ(s[0], 0.0f);
    EXPECT_EQ(q[0], 0);
}

}  // namespace
}  // namespace anvil::test
