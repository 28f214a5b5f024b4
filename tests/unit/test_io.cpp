// dtype conversions, safetensors (round trip and every way a file can lie), model directories.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "harness.h"
#include "io/fs.h"
#include "io/safetensors.h"
#include "model/model_io.h"

namespace anvil::test {
namespace {

namespace fsys = std::filesystem;

std::string tmpdir(const std::string& name) {
    return fresh_dir("test_" + name);
}

TEST(DType, Bf16RoundsToNearestEven) {
    EXPECT_EQ(to_bf16(1.0f).bits, 0x3f80);
    EXPECT_EQ(from_bf16(to_bf16(1.0f)), 1.0f);
    // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to even (1.0)
    EXPECT_EQ(from_bf16(to_bf16(1.0f + 0.00390625f)), 1.0f);
    EXPECT_EQ(from_bf16(to_bf16(1.0f + 3 * 0.00390625f)), 1.015625f);
    EXPECT_TRUE(std::isnan(from_bf16(to_bf16(NAN))));
    EXPECT_TRUE(std::isinf(from_bf16(to_bf16(INFINITY))));
    EXPECT_EQ(from_bf16(to_bf16(-2.5f)), -2.5f);
}

TEST(DType, F16RoundTripAndEdges) {
    for (float x : {0.0f, 1.0f, -2.0f, 0.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f})
        EXPECT_EQ(from_f16(to_f16(x)), x) << x;
    EXPECT_TRUE(std::isinf(from_f16(to_f16(70000.0f))));
    EXPECT_TRUE(std::isnan(from_f16(to_f16(NAN))));
    EXPECT_EQ(from_f16(to_f16(1.0f + 1.0f / 2048)), 1.0f);  // halfway: to even
    EXPECT_EQ(to_f16(-0.0f).bits, 0x8000);
    // every f16 bit pattern survives f16 -> f32 -> f16
    for (uint32_t b = 0; b < 0x10000; b++) {
        const f16 h{uint16_t(b)};
        const float f = from_f16(h);
        if (std::isnan(f)) continue;
        EXPECT_EQ(to_f16(f).bits, h.bits) << std::hex << b;
    }
}

TEST(Safetensors, RoundTrip) {
    const std::string d = tmpdir("st");
    const std::vector<float> a = {1, 2, 3, 4, 5, 6};
    const std::vector<uint16_t> b = {to_bf16(0.5f).bits, to_bf16(-1.0f).bits};
    write_safetensors(d + "/x.safetensors",
                      {{"a", DType::F32, {2, 3}, a.data()}, {"b", DType::BF16, {2}, b.data()}},
                      {{"format", "pt"}});
    SafetensorsReader r(d + "/x.safetensors");
    ASSERT_EQ(r.entries().size(), 2u);
    EXPECT_EQ(r.metadata().at("format"), "pt");
    const StEntry* ea = r.find("a");
    ASSERT_TRUE(ea);
    EXPECT_EQ(ea->shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(r.read_f32(*ea), a);
    EXPECT_EQ(r.read_f32(*r.find("b")), (std::vector<float>{0.5f, -1.0f}));
    fsys::remove_all(d);
}

// Writes raw bytes: 8-byte length, header, data.
void write_raw(const std::string& path, const std::string& header, size_t data_bytes, int64_t claim = -1) {
    std::string s;
    const uint64_t n = claim >= 0 ? uint64_t(claim) : header.size();
    for (int i = 0; i < 8; i++) s.push_back(char((n >> (8 * i)) & 0xff));
    s += header;
    s += std::string(data_bytes, '\0');
    std::ofstream(path, std::ios::binary) << s;
}

void expect_bad_file(const std::string& path, const std::string& needle) {
    expect_error([&] { SafetensorsReader r(path); }, needle, path);
}

TEST(Safetensors, RejectsBadFiles) {
    const std::string d = tmpdir("stbad");
    std::ofstream(d + "/empty.safetensors");
    expect_bad_file(d + "/empty.safetensors", "truncated");
    write_raw(d + "/len.safetensors", "{}", 0, 1000);
    expect_bad_file(d + "/len.safetensors", "header claims");
    write_raw(d + "/json.safetensors", "{not json", 0);
    expect_bad_file(d + "/json.safetensors", "not valid JSON");
    write_raw(d + "/short.safetensors", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
    expect_bad_file(d + "/short.safetensors", "truncated or its header lies");
    write_raw(d + "/lie.safetensors", R"({"a":{"dtype":"F32","shape":[5],"data_offsets":[0,16]}})", 16);
    expect_bad_file(d + "/lie.safetensors", "header lies about sizes");
    write_raw(d + "/neg.safetensors", R"({"a":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", 16);
    expect_bad_file(d + "/neg.safetensors", "negative");
    write_raw(d + "/bad.safetensors", R"({"a":{"dtype":"F32"}})", 0);
    expect_bad_file(d + "/bad.safetensors", "malformed");
    expect_bad_file(d + "/missing.safetensors", "cannot open");
    fsys::remove_all(d);
}

ModelConfig small() {
    ModelConfig c;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 8;
    c.n_ctx = 16;
    c.vocab_size = 20;
    return c;
}

std::vector<std::vector<float>> weights(const Model& m) {
    std::vector<std::vector<float>> v;
    for (size_t i = 0; i < m.params().size(); i++) v.push_back(m.params().read_f32(i));
    return v;
}

TEST(Checkpoint, ModelDirRoundTrip) {
    const std::string d = tmpdir("ckpt");
    auto be = make_backend({Device::CPU, 1, 0});
    auto a = make_model(*be, small());
    a->params().init(3);
    write_model_dir(d, *a, {{"anvil_tokenizer", "byte"}});
    nlohmann::json raw;
    const ModelConfig c = read_model_config(d, &raw);
    EXPECT_TRUE(c.same_shape(small()));
    EXPECT_EQ(raw["model_type"], "gpt2");
    EXPECT_EQ(raw["n_positions"], 16);
    EXPECT_EQ(raw["anvil_tokenizer"], "byte");
    auto b = make_model(*be, c);
    load_model_weights(d, *b);
    EXPECT_EQ(weights(*a), weights(*b));
    // HF names in the file, Conv1D layout
    SafetensorsReader st(d + "/model.safetensors");
    const StEntry* e = st.find("transformer.h.1.mlp.c_fc.weight");
    ASSERT_TRUE(e);
    EXPECT_EQ(e->shape, (std::vector<int64_t>{8, 32}));
    fsys::remove_all(d);
}

// A checkpoint sharded as Hugging Face writes large ones: model.safetensors.index.json maps each tensor to
// its file; names without "transformer." and BF16 tensors load too, converted straight into the parameters.
TEST(Checkpoint, ShardedBf16CheckpointLoads) {
    const std::string d = tmpdir("sharded");
    auto be = make_backend({Device::CPU, 1, 0});
    auto a = make_model(*be, small());
    a->params().init(4);
    const ParamStore& s = a->params();
    std::vector<std::vector<uint16_t>> bf(s.size());
    std::vector<StTensor> shard[2];
    nlohmann::json map = nlohmann::json::object();
    for (size_t i = 0; i < s.size(); i++) {
        const std::vector<float> v = s.read_f32(i);
        bf[i].resize(v.size());
        convert_from_f32(bf[i].data(), DType::BF16, v.data(), v.size());
        std::string name = s.spec(i).name;
        if (i % 3 == 0) name = name.substr(std::string("transformer.").size());  // HF's unprefixed form
        const int k = i < s.size() / 2 ? 0 : 1;
        shard[k].push_back({name, DType::BF16, {s.spec(i).shape.dims.begin(), s.spec(i).shape.dims.begin() +
                                                                                  s.spec(i).shape.ndim},
                            bf[i].data()});
        map[name] = fmt::format("model-0000{}-of-00002.safetensors", k + 1);
    }
    for (int k = 0; k < 2; k++) write_safetensors(fmt::format("{}/model-0000{}-of-00002.safetensors", d, k + 1), shard[k]);
    write_file_atomic(d + "/model.safetensors.index.json", nlohmann::json{{"weight_map", map}}.dump());
    write_file_atomic(d + "/config.json", config_to_hf_json(small(), {}).dump());
    auto b = make_model(*be, read_model_config(d));
    load_model_weights(d, *b);
    for (size_t i = 0; i < s.size(); i++) {
        std::vector<float> want(bf[i].size());
        convert_to_f32(want.data(), bf[i].data(), DType::BF16, want.size());
        EXPECT_EQ(b->params().read_f32(i), want) << s.spec(i).name;
    }
    // an index naming a shard that is not there is an error naming both
    write_file_atomic(d + "/model.safetensors.index.json",
                      nlohmann::json{{"weight_map", {{"x", "model-00009-of-00009.safetensors"}}}}.dump());
    expect_error([&] { load_model_weights(d, *b); }, "model-00009-of-00009");
    fsys::remove_all(d);
}

TEST(Checkpoint, ShapeMismatchIsAClearError) {
    const std::string d = tmpdir("ckptbad");
    auto be = make_backend({Device::CPU, 1, 0});
    auto a = make_model(*be, small());
    a->params().init(3);
    write_model_dir(d, *a, {});
    ModelConfig wider = small();
    wider.n_embd = 16;
    auto b = make_model(*be, wider);
    expect_error([&] { load_model_weights(d, *b); }, "has shape");
    fsys::remove_all(d);
}

TEST(Config, RejectsUnsupportedVariants) {
    nlohmann::json j = config_to_hf_json(small(), {});
    EXPECT_NO_THROW(config_from_hf_json(j, "c"));
    auto bad = j;
    bad["activation_function"] = "relu";
    EXPECT_THROW(config_from_hf_json(bad, "c"), Error);
    bad = j;
    bad["n_head"] = 3;  // 8 does not split into 3
    EXPECT_THROW(config_from_hf_json(bad, "c"), Error);
    bad = j;
    bad["n_layer"] = 0;
    EXPECT_THROW(config_from_hf_json(bad, "c"), Error);
    bad = j;
    bad.erase("vocab_size");
    EXPECT_THROW(config_from_hf_json(bad, "c"), Error);
}

TEST(Fs, AtomicWriteReplaces) {
    const std::string d = tmpdir("fs");
    write_file_atomic(d + "/f", "one");
    write_file_atomic(d + "/f", "two");
    EXPECT_EQ(read_file(d + "/f"), "two");
    for (const auto& e : fsys::directory_iterator(d))
        EXPECT_EQ(e.path().filename(), "f") << "no temporaries left";
    fsys::remove_all(d);
}

}  // namespace
}  // namespace anvil::test
