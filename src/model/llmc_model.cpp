#include "model/llmc_model.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "io/fs.h"
#include "model/model_io.h"

namespace anvil {

namespace {

constexpr int32_t kLlmcLlama3Magic = 20240803;  // llm.c's Llama 3 model files: another layout
constexpr size_t kHeaderInts = 256;

// llm.c's order of the parameters: each kind, for every layer in turn where it is a block's. `linear`: a
// weight llm.c keeps as (out, in) and Hugging Face's GPT-2 as (in, out).
struct Kind {
    const char* name;
    bool per_layer, linear;
};
constexpr Kind kKinds[] = {{"transformer.wte.weight", false, false},
                           {"transformer.wpe.weight", false, false},
                           {"ln_1.weight", true, false},
                           {"ln_1.bias", true, false},
                           {"attn.c_attn.weight", true, true},
                           {"attn.c_attn.bias", true, false},
                           {"attn.c_proj.weight", true, true},
                           {"attn.c_proj.bias", true, false},
                           {"ln_2.weight", true, false},
                           {"ln_2.bias", true, false},
                           {"mlp.c_fc.weight", true, true},
                           {"mlp.c_fc.bias", true, false},
                           {"mlp.c_proj.weight", true, true},
                           {"mlp.c_proj.bias", true, false},
                           {"transformer.ln_f.weight", false, false},
                           {"transformer.ln_f.bias", false, false}};

// Every parameter in file order: its store index and whether the file holds it transposed.
struct Entry {
    size_t index;
    bool linear;
};
std::vector<Entry> file_order(const Model& model) {
    const ModelConfig& c = model.config();
    ANVIL_CHECK(c.model_type == "gpt2",
                "llm.c's model files hold GPT-2 (its Llama 3 files are another layout); this model is a {}",
                c.model_type);
    ANVIL_CHECK(!c.int8_weights, "llm.c's model files hold fp32 or bf16 weights; this model is int8");
    const ParamStore& store = model.params();
    std::vector<Entry> order;
    for (const Kind& k : kKinds)
        for (int l = 0; l < (k.per_layer ? c.n_layer : 1); l++) {
            const std::string name = k.per_layer ? fmt::format("transformer.h.{}.{}", l, k.name) : k.name;
            const size_t i = store.find(name);
            ANVIL_ASSERT(i != ParamStore::npos && !store.spec(i).shard.split());
            order.push_back({i, k.linear});
        }
    return order;
}

}  // namespace

ModelConfig read_llmc_header(const std::string& path, LlmcHeader* out) {
    std::ifstream f(path, std::ios::binary);
    ANVIL_CHECK(f && !dir_exists(path), "{}: cannot open (an llm.c model file was expected)", path);
    int32_t h[kHeaderInts] = {};
    ANVIL_CHECK(f.read(reinterpret_cast<char*>(h), sizeof h),
                "{}: shorter than llm.c's 1024-byte header; not an llm.c model file", path);
    ANVIL_CHECK(h[0] != kLlmcLlama3Magic,
                "{}: an llm.c Llama 3 model file (magic {}); anvil reads llm.c's GPT-2 files (magic {}) and "
                "Hugging Face Llama directories",
                path, kLlmcLlama3Magic, kLlmcModelMagic);
    ANVIL_CHECK(
        h[0] == kLlmcModelMagic,
        "{}: not an llm.c model file (it starts with {} where llm.c's GPT-2 files have the magic {}); give "
        "such a file or a model directory",
        path, h[0], kLlmcModelMagic);
    ANVIL_CHECK(
        h[1] == 3 || h[1] == 5,
        "{}: version {}; anvil reads llm.c's model versions 3 (fp32) and 5 (bf16), which train_gpt2.py "
        "and train_gpt2.cu write",
        path, h[1]);
    LlmcHeader hd{h[1], h[2], h[3], h[4], h[5], h[6], h[7]};
    const char* names[] = {"max_seq_len", "vocab_size", "num_layers",
                           "num_heads",   "channels",   "padded_vocab_size"};
    for (int k = 0; k < 6; k++)
        ANVIL_CHECK(h[2 + k] > 0, "{}: header field {} ({}) is {}; it must be positive", path, 2 + k,
                    names[k], h[2 + k]);
    ANVIL_CHECK(hd.padded_vocab >= hd.vocab, "{}: padded_vocab_size {} is below vocab_size {}", path,
                hd.padded_vocab, hd.vocab);
    ModelConfig c;
    c.model_type = "gpt2";
    c.n_layer = hd.layers;
    c.n_head = hd.heads;
    c.n_embd = hd.channels;
    c.n_ctx = hd.max_t;
    c.vocab_size = hd.padded_vocab;
    c.validate(path);
    const uint64_t want = sizeof h + uint64_t(c.num_params()) * dtype_size(llmc_dtype(hd.version)),
                   have = uint64_t(std::filesystem::file_size(path));
    ANVIL_CHECK(
        have == want,
        "{}: {} bytes, but its header (GPT-2 of {} layers, width {}, {} heads, context {}, {} rows, {}) "
        "makes {}; the file is cut short or not what its header says",
        path, have, c.n_layer, c.n_embd, c.n_head, c.n_ctx, c.vocab_size,
        precision_name(llmc_dtype(hd.version)), want);
    if (out) *out = hd;
    return c;
}

void load_llmc_weights(const std::string& path, Model& model) {
    LlmcHeader h;
    const ModelConfig c = read_llmc_header(path, &h);
    ANVIL_CHECK(c.same_shape(model.config()), "{}: holds a GPT-2 of {}, not of {}", path, c.str(),
                model.config().str());
    const MappedFile file(path);
    const DType dt = llmc_dtype(h.version);
    const uint8_t* at = file.data() + kHeaderInts * sizeof(int32_t);
    ParamStore& store = model.params();
    std::vector<float> v, t;
    for (const Entry& e : file_order(model)) {
        const Shape s = store.spec(e.index).full_shape();
        v.resize(size_t(s.numel()));
        convert_to_f32(v.data(), at, dt, v.size());
        at += v.size() * dtype_size(dt);
        if (e.linear) {  // the file's (out, in) into Hugging Face's (in, out)
            t.resize(v.size());
            transpose(v.data(), t.data(), s.dims[1], s.dims[0]);
            v.swap(t);
        }
        store.write_f32(e.index, v.data());
    }
}

void write_llmc_model(const std::string& path, const Model& model, int vocab, int version) {
    ANVIL_CHECK(version == 3 || version == 5, "llm.c model version {}: anvil writes 3 (fp32) and 5 (bf16)",
                version);
    const ModelConfig& c = model.config();
    ANVIL_CHECK(vocab > 0 && vocab <= c.vocab_size, "a vocabulary of {} ids does not fit the model's {} rows",
                vocab, c.vocab_size);
    const std::vector<Entry> order = file_order(model);  // checks the family first
    const int padded = c.vocab_size > vocab ? c.vocab_size : (vocab + 127) / 128 * 128;
    int32_t h[kHeaderInts] = {kLlmcModelMagic, version,  c.n_ctx,  vocab,
                              c.n_layer,       c.n_head, c.n_embd, padded};
    AtomicFile file(path);
    file.write(h, sizeof h);
    const DType dt = llmc_dtype(version);
    const ParamStore& store = model.params();
    std::vector<float> t;
    std::vector<uint8_t> bytes;
    for (const Entry& e : order) {
        std::vector<float> v = store.read_f32(e.index);
        const Shape s = store.spec(e.index).full_shape();
        if (e.linear) {  // Hugging Face's (in, out) into llm.c's (out, in)
            t.resize(v.size());
            transpose(v.data(), t.data(), s.dims[0], s.dims[1]);
            v.swap(t);
        }
        if (store.spec(e.index).name == "transformer.wte.weight")
            v.resize(size_t(padded) * size_t(c.n_embd), 0.0f);  // train_gpt2.py's zero rows
        bytes.resize(v.size() * dtype_size(dt));
        convert_from_f32(bytes.data(), dt, v.data(), v.size());
        file.write(bytes.data(), bytes.size());
    }
    file.commit();
}

}  // namespace anvil
