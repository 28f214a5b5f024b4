// GGUF: the container round trip, Q8_0 against its definition, every prefix of a file refused with a message
// (never a crash), the layout's Hugging Face <-> llama.cpp tensor maps inverse to each other, and a
// SentencePiece-style vocabulary through llama.cpp's scores and back.
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "data/tokenizer.h"
#include "io/fs.h"
#include "io/gguf.h"
#include "model/gguf_layout.h"
#include "model_harness.h"
#include "runtime/gguf_model.h"

namespace anvil::test {
namespace {

std::string sample_file(const std::string& dir) {
    gguf::Writer w;
    w.set("general.architecture", gguf::Value::str("llama"));
    w.set("llama.block_count", gguf::Value::u32(2));
    w.set("llama.rope.freq_base", gguf::Value::f32(500000.0f));
    w.set("tokenizer.ggml.tokens", gguf::Value::strings({"a", "b", "ab"}));
    w.set("tokenizer.ggml.token_type", gguf::Value::i32s({1, 1, 3}));
    w.set("tokenizer.ggml.add_bos_token", gguf::Value::boolean(true));
    const std::vector<float> x = {1.0f, -2.5f, 3.25f, 0.0f, 7.0f, -1.0f};
    w.add_tensor("t.f32", {3, 2}, gguf::TensorType::F32, [x](uint8_t* d) { std::memcpy(d, x.data(), 24); });
    w.add_tensor("t.f16", {6}, gguf::TensorType::F16,
                 [x](uint8_t* d) { convert_from_f32(d, DType::F16, x.data(), 6); });
    std::vector<float> q(64);
    for (size_t i = 0; i < q.size(); i++) q[i] = std::sin(float(i)) * 3.0f;
    w.add_tensor("t.q8", {32, 2}, gguf::TensorType::Q8_0,
                 [q](uint8_t* d) { gguf::quantize_q8_0(q.data(), d, 64); });
    const std::string path = dir + "/sample.gguf";
    w.write(path);
    return path;
}

TEST(Gguf, RoundTrip) {
    const std::string path = sample_file(fresh_dir("gguf_rt"));
    gguf::Reader r(path);
    EXPECT_EQ(r.version(), 3u);
    EXPECT_EQ(r.get_string("general.architecture"), "llama");
    EXPECT_EQ(r.get_int("llama.block_count"), 2);
    EXPECT_EQ(r.get_float("llama.rope.freq_base"), 500000.0);
    EXPECT_EQ(r.get_array("tokenizer.ggml.tokens", gguf::Type::String).strs,
              (std::vector<std::string>{"a", "b", "ab"}));
    EXPECT_EQ(r.get_array("tokenizer.ggml.token_type", gguf::Type::I32).ints,
              (std::vector<int64_t>{1, 1, 3}));
    EXPECT_EQ(r.get_int("tokenizer.ggml.add_bos_token"), 1);
    ASSERT_EQ(r.tensors().size(), 3u);
    EXPECT_EQ(r.read_f32(*r.tensor("t.f32")), (std::vector<float>{1.0f, -2.5f, 3.25f, 0.0f, 7.0f, -1.0f}));
    EXPECT_EQ(r.read_f32(*r.tensor("t.f16")), (std::vector<float>{1.0f, -2.5f, 3.25f, 0.0f, 7.0f, -1.0f}));
    // every tensor starts on the 32-byte alignment
    for (const gguf::TensorInfo& t : r.tensors()) EXPECT_EQ(t.offset % 32, 0u) << t.name;
    // Q8_0 as ggml defines it: within half a step of the block's scale
    const std::vector<float> q = r.read_f32(*r.tensor("t.q8"));
    for (size_t b = 0; b < 2; b++) {
        float amax = 0.0f;
        for (size_t i = b * 32; i < b * 32 + 32; i++)
            amax = std::max(amax, std::fabs(std::sin(float(i)) * 3.0f));
        for (size_t i = b * 32; i < b * 32 + 32; i++)
            EXPECT_NEAR(q[i], std::sin(float(i)) * 3.0f, amax / 127.0f * 0.51f + 1e-3f) << i;
    }
    EXPECT_THROW(r.get_int("general.architecture"), InputError);
    EXPECT_THROW(r.get_string("missing.key"), InputError);
}

// A file cut anywhere is refused with its name in the message, unless only the last tensor's alignment
// padding went (then every tensor reads as in the whole file).
TEST(Gguf, EveryTruncationIsRefused) {
    const std::string path = sample_file(fresh_dir("gguf_trunc"));
    const std::string bytes = read_file(path);
    const gguf::Reader whole(path);
    const auto* d = reinterpret_cast<const uint8_t*>(bytes.data());
    for (size_t n = 0; n < bytes.size(); n += (n < 400 ? 1 : 7)) {
        try {
            const gguf::Reader r(d, n, "cut");
            for (const gguf::TensorInfo& t : whole.tensors())
                EXPECT_EQ(r.read_f32(*r.tensor(t.name)), whole.read_f32(t)) << "cut at " << n;
        } catch (const InputError& e) {
            EXPECT_NE(std::string(e.what()).find("cut"), std::string::npos);
        }
    }
}

TEST(Gguf, HostileCountsAreRefusedBeforeAllocating) {
    std::string b = read_file(sample_file(fresh_dir("gguf_hostile")));
    const uint64_t huge = uint64_t(1) << 60;
    std::string c = b;
    std::memcpy(c.data() + 16, &huge, 8);  // the metadata count
    EXPECT_THROW(gguf::Reader(reinterpret_cast<const uint8_t*>(c.data()), c.size(), "x"), InputError);
    c = b;
    std::memcpy(c.data() + 8, &huge, 8);  // the tensor count
    EXPECT_THROW(gguf::Reader(reinterpret_cast<const uint8_t*>(c.data()), c.size(), "x"), InputError);
    c = b;
    c[0] = 'X';
    EXPECT_THROW(gguf::Reader(reinterpret_cast<const uint8_t*>(c.data()), c.size(), "x"), InputError);
}

// gguf_from_hf then hf_from_gguf gives back the tensor, for a GPT-2 Conv1D weight and a Llama q projection
// (permuted by heads) and its bias.
TEST(GgufLayout, MapsAreInverse) {
    ModelConfig g2;
    g2.n_embd = 8;
    std::vector<float> w(8 * 24);
    for (size_t i = 0; i < w.size(); i++) w[i] = float(i);
    GgufTensor t;
    ASSERT_TRUE(gguf_from_hf(g2, "transformer.h.1.attn.c_attn.weight", {8, 24}, w, &t));
    EXPECT_EQ(t.name, "blk.1.attn_qkv.weight");
    EXPECT_EQ(t.ne, (std::vector<uint64_t>{8, 24}));
    EXPECT_EQ(t.data[1], w[24]);  // (out, in): row 0 of the GGUF tensor is column 0 of the Conv1D weight
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> back;
    ASSERT_TRUE(hf_from_gguf(g2, t, &name, &shape, &back));
    EXPECT_EQ(name, "transformer.h.1.attn.c_attn.weight");
    EXPECT_EQ(shape, (std::vector<int64_t>{8, 24}));
    EXPECT_EQ(back, w);

    ModelConfig ll;
    ll.model_type = "llama";
    ll.n_embd = 16;
    ll.n_head = 2;
    std::vector<float> q(16 * 16);
    for (size_t i = 0; i < q.size(); i++) q[i] = float(i);
    ASSERT_TRUE(gguf_from_hf(ll, "model.layers.0.self_attn.q_proj.weight", {16, 16}, q, &t));
    EXPECT_EQ(t.name, "blk.0.attn_q.weight");
    // head 0 (head size 8): GGUF row 1 is Hugging Face's row 4, the pair of row 0
    EXPECT_EQ(t.data[16], q[4 * 16]);
    ASSERT_TRUE(hf_from_gguf(ll, t, &name, &shape, &back));
    EXPECT_EQ(back, q);
    std::vector<float> bias(16);
    for (size_t i = 0; i < 16; i++) bias[i] = float(i);
    ASSERT_TRUE(gguf_from_hf(ll, "model.layers.0.self_attn.q_proj.bias", {16}, bias, &t));
    EXPECT_EQ(t.data[1], 4.0f);
    ASSERT_TRUE(hf_from_gguf(ll, t, &name, &shape, &back));
    EXPECT_EQ(back, bias);
    EXPECT_FALSE(gguf_from_hf(ll, "model.layers.0.something.weight", {16}, bias, &t));
}

// A SentencePiece-style vocabulary (byte fallback, "\u2581" for spaces) exported as llama.cpp's "llama"
// vocabulary (scores, no merges) and imported back: its merges rebuilt from the scores tokenize every text as
// the original does, bytes and unknown characters included, and the special ids survive.
TEST(GgufModel, SentencePieceVocabularyRoundTrips) {
    nlohmann::json vocab = nlohmann::json::object(), added = nlohmann::json::array();
    std::vector<std::string> pieces = {"<unk>", "<s>", "</s>"};
    for (int b = 0; b < 256; b++) pieces.push_back(fmt::format("<0x{:02X}>", b));
    for (const char* p :
         {"\u2581", "a", "b", "c", "\u2581a", "ab", "\u2581ab", "abc", "\u2581abc", "ca", "\u2581c"})
        pieces.push_back(p);
    for (size_t i = 0; i < pieces.size(); i++) vocab[pieces[i]] = i;
    for (int i = 0; i < 3; i++)
        added.push_back({{"id", i}, {"content", pieces[size_t(i)]}, {"special", true}});
    const nlohmann::json j = {
        {"added_tokens", added},
        {"normalizer",
         {{"type", "Sequence"},
          {"normalizers",
           {{{"type", "Prepend"}, {"prepend", "\u2581"}},
            {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}}}}},
        {"pre_tokenizer", nullptr},
        {"model",
         {{"type", "BPE"},
          {"unk_token", "<unk>"},
          {"byte_fallback", true},
          {"fuse_unk", true},
          {"vocab", vocab},
          {"merges", {"\u2581 a", "a b", "\u2581a b", "ab c", "\u2581ab c", "c a", "\u2581 c"}}}}};
    const std::string dir = fresh_dir("gguf_sp");
    write_file_atomic(dir + "/tokenizer.json", j.dump());
    write_file_atomic(
        dir + "/tokenizer_config.json",
        nlohmann::json{{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"add_bos_token", true}}.dump());
    const auto tok_ptr = make_tokenizer(dir);
    const Tokenizer& tok = *tok_ptr;
    ModelConfig c = tiny_llama();
    c.vocab_size = tok.vocab_size();
    CpuBackend be(1);
    const auto model = make_model(be, c);
    model->params().init(7);
    export_gguf(*model, tok, dir + "/sp.gguf", {"f32", "sp", ""});
    const GgufModel back = import_gguf(dir + "/sp.gguf", be);
    for (const char* text : {"abc ab a", "cab  abca\nc", "caf\u00e9 \U0001f999 b", " leading and trailing "})
        EXPECT_EQ(back.tok->encode(text), tok.encode(text)) << text;
    EXPECT_EQ(back.tok->bos_id(), 1);
    EXPECT_EQ(back.tok->eot_id(), 2);
    EXPECT_EQ(back.tok->decode(tok.encode("cab abc")), "cab abc");
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace anvil::test
