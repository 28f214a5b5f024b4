#include "runtime/gguf_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include "core/dtype.h"
#include "core/error.h"
#include "core/version.h"
#include "io/fs.h"
#include "io/gguf.h"
#include "io/json_text.h"
#include "model/gguf_layout.h"
#include "model/model_io.h"
#include "runtime/inference.h"

namespace anvil {

namespace {

using gguf::TensorType;
using gguf::Value;

// llama.cpp's token types
enum TokenType : int32_t {
    kNormal = 1,
    kUnknown = 2,
    kControl = 3,
    kUserDefined = 4,
    kUnused = 5,
    kByte = 6
};

// The Split patterns of the byte-level BPE tokenizers llama.cpp names (tokenizer.ggml.pre): Llama 3's numbers
// in runs of up to 3 digits, Qwen 2's one digit at a time.
const std::pair<const char*, const char*> kSplitPatterns[] = {
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     "llama-bpe"},
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     "qwen2"},
};

// The pre-tokenizer llama.cpp must use, from a tokenizer.json's: GPT-2's regex (none given, or ByteLevel's
// own), Llama 3's or Qwen 2's Split pattern.
std::string pre_tokenizer_name(const nlohmann::json& j) {
    const nlohmann::json& pre = j.value("pre_tokenizer", nlohmann::json());
    if (pre.is_null() || (pre.value("type", "") == "ByteLevel" && pre.value("use_regex", true)))
        return "gpt-2";
    std::string pattern;
    if (pre.value("type", "") == "Sequence")
        for (const nlohmann::json& p : pre.value("pretokenizers", nlohmann::json::array()))
            if (p.value("type", "") == "Split" && p.contains("pattern"))
                pattern = p["pattern"].value("Regex", std::string());
    for (const auto& [re, name] : kSplitPatterns)
        if (pattern == re) return name;
    fail(
        "the tokenizer's pre-tokenizer ({}) is not one llama.cpp names: anvil exports GPT-2's, Llama 3's and "
        "Qwen 2's",
        pattern.empty() ? pre.dump() : pattern);
}

// A fresh temporary directory, removed with what it holds when the scope ends (also on an error).
struct ScratchDir {
    std::string path = temp_dir_for(std::filesystem::temp_directory_path().string() + "/anvil-gguf-vocab");
    ScratchDir() { make_dirs(path); }
    ~ScratchDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
};

// tokenizer.json's ByteLevel step (pre-tokenizer with GPT-2's regex, or after a Split without it; decoder).
nlohmann::json byte_level(bool use_regex) {
    return {
        {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

// A tokenizer's own tokenizer.json (what it saves).
nlohmann::json tokenizer_json(const Tokenizer& tok) {
    ANVIL_CHECK(
        tok.kind() != "byte",
        "the model uses anvil's byte tokenizer, which GGUF has no form for: train with a BPE tokenizer "
        "(--tokenizer DIR: GPT-2's, Llama 3's, Qwen 2's, Llama 2's) to run the model in llama.cpp");
    const ScratchDir tmp;
    tok.save(tmp.path);
    ANVIL_CHECK(file_exists(tmp.path + "/tokenizer.json"), "the tokenizer saves no tokenizer.json");
    return read_json_file(tmp.path + "/tokenizer.json");
}

// Every id's text and llama.cpp token type, padded with unused entries to the model's rows: the vocabulary's
// tokens normal, added ones control (special) or user-defined.
struct TokenTable {
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
};
TokenTable token_table(const nlohmann::json& j, int model_vocab) {
    TokenTable t{std::vector<std::string>(static_cast<size_t>(model_vocab)),
                 std::vector<int32_t>(static_cast<size_t>(model_vocab), kUnused)};
    const auto place = [&](const std::string& text, int64_t id, int32_t type) {
        ANVIL_CHECK(id >= 0 && id < model_vocab, "tokenizer id {} ({}) is outside the model's {} rows", id,
                    text, model_vocab);
        t.tokens[size_t(id)] = text;
        t.types[size_t(id)] = type;
    };
    for (const auto& [text, id] : j.at("model").at("vocab").items()) place(text, id.get<int64_t>(), kNormal);
    for (const nlohmann::json& a : j.value("added_tokens", nlohmann::json::array()))
        place(a.at("content").get<std::string>(), a.at("id").get<int64_t>(),
              a.value("special", false) ? kControl : kUserDefined);
    for (size_t id = 0; id < t.tokens.size(); id++)
        if (t.types[id] == kUnused) t.tokens[id] = "[PAD" + std::to_string(id) + "]";
    return t;
}

std::vector<std::string> merge_strings(const nlohmann::json& model) {
    std::vector<std::string> merges;
    for (const nlohmann::json& m : model.at("merges"))
        merges.push_back(m.is_string() ? m.get<std::string>()
                                       : m.at(0).get<std::string>() + " " + m.at(1).get<std::string>());
    return merges;
}

// SentencePiece-style BPE (Llama 2, Mistral) as llama.cpp's "llama" vocabulary: pieces with scores that make
// its highest-score-first merging pick the merges in the tokenizer's rank order (a merged piece scores minus
// the rank of the first merge that makes it), <0xNN> pieces as bytes, the unknown piece as unknown.
void write_sentencepiece(const nlohmann::json& j, int model_vocab, gguf::Writer& w) {
    const nlohmann::json& model = j.at("model");
    TokenTable t = token_table(j, model_vocab);
    std::unordered_map<std::string, int32_t> id_of;
    for (size_t i = 0; i < t.tokens.size(); i++)
        if (t.types[i] == kNormal) id_of.emplace(t.tokens[i], int32_t(i));
    std::vector<float> scores(t.tokens.size(), 0.0f);
    std::vector<bool> scored(t.tokens.size(), false);
    const std::vector<std::string> merges = merge_strings(model);
    for (size_t r = 0; r < merges.size(); r++) {
        const size_t sp = merges[r].find(' ', 1);
        if (sp == std::string::npos) continue;
        const auto it = id_of.find(merges[r].substr(0, sp) + merges[r].substr(sp + 1));
        if (it == id_of.end() || scored[size_t(it->second)]) continue;
        scores[size_t(it->second)] = -float(r + 1);
        scored[size_t(it->second)] = true;
    }
    const std::string unk = model.value("unk_token", std::string());
    int64_t unk_id = -1;
    for (size_t i = 0; i < t.tokens.size(); i++) {
        const std::string& p = t.tokens[i];
        if (p.size() == 6 && p.starts_with("<0x") && p.back() == '>' && t.types[i] == kNormal)
            t.types[i] = kByte;
        if (!unk.empty() && p == unk) t.types[i] = kUnknown, unk_id = int64_t(i);
    }
    const nlohmann::json& norm = j.value("normalizer", nlohmann::json());
    const bool prepend =
        norm.dump().find("Prepend") != std::string::npos ||
        j.value("pre_tokenizer", nlohmann::json()).value("prepend_scheme", "never") != "never";
    w.set("tokenizer.ggml.model", Value::str("llama"));
    w.set("tokenizer.ggml.tokens", Value::strings(std::move(t.tokens)));
    w.set("tokenizer.ggml.scores", Value::f32s(scores));
    w.set("tokenizer.ggml.token_type", Value::i32s(t.types));
    if (unk_id >= 0) w.set("tokenizer.ggml.unknown_token_id", Value::u32(uint32_t(unk_id)));
    w.set("tokenizer.ggml.add_space_prefix", Value::boolean(prepend));
}

// tokenizer.ggml.*: byte-level BPE as llama.cpp's "gpt2" vocabulary (with the pre-tokenizer's name),
// SentencePiece-style BPE as its "llama" one; the special ids and the chat template.
void write_vocab(const Tokenizer& tok, int model_vocab, gguf::Writer& w) {
    const nlohmann::json j = tokenizer_json(tok);
    const nlohmann::json& model = j.at("model");
    ANVIL_CHECK(model.value("type", "") == "BPE", "the tokenizer's model is {}: anvil exports BPE tokenizers",
                model.value("type", ""));
    if (model.value("byte_fallback", false)) {
        write_sentencepiece(j, model_vocab, w);
    } else {
        TokenTable t = token_table(j, model_vocab);
        w.set("tokenizer.ggml.model", Value::str("gpt2"));
        w.set("tokenizer.ggml.pre", Value::str(pre_tokenizer_name(j)));
        w.set("tokenizer.ggml.tokens", Value::strings(std::move(t.tokens)));
        w.set("tokenizer.ggml.token_type", Value::i32s(t.types));
        w.set("tokenizer.ggml.merges", Value::strings(merge_strings(model)));
    }
    w.set("tokenizer.ggml.eos_token_id", Value::u32(uint32_t(tok.eot_id())));
    w.set("tokenizer.ggml.bos_token_id",
          Value::u32(uint32_t(tok.bos_id() >= 0 ? tok.bos_id() : tok.eot_id())));
    w.set("tokenizer.ggml.add_bos_token", Value::boolean(tok.bos_id() >= 0));
    w.set("tokenizer.ggml.add_eos_token", Value::boolean(false));
    if (!tok.chat_template().empty()) w.set("tokenizer.chat_template", Value::str(tok.chat_template()));
}

// The tensor type of a tensor in the export's dtype: 1-D tensors stay f32; q8_0 needs rows of whole blocks
// (others go f16, as llama.cpp's converter does).
TensorType tensor_type(const std::string& dtype, const std::vector<uint64_t>& ne) {
    if (dtype == "f32" || ne.size() == 1) return TensorType::F32;
    if (dtype == "f16") return TensorType::F16;
    if (dtype == "bf16") return TensorType::BF16;
    return ne[0] % gguf::kQ8Block == 0 ? TensorType::Q8_0 : TensorType::F16;
}

uint32_t file_type(const std::string& dtype) {  // llama.cpp's LLAMA_FTYPE_*
    if (dtype == "f32") return 0;
    if (dtype == "f16") return 1;
    if (dtype == "q8_0") return 7;
    return 32;  // bf16
}

// Fills dst with n values of `type` from f32.
void encode(TensorType type, const std::vector<float>& x, uint8_t* dst) {
    switch (type) {
        case TensorType::F32:
            std::memcpy(dst, x.data(), x.size() * 4);
            break;
        case TensorType::F16:
            convert_from_f32(dst, DType::F16, x.data(), x.size());
            break;
        case TensorType::BF16:
            convert_from_f32(dst, DType::BF16, x.data(), x.size());
            break;
        case TensorType::Q8_0:
            gguf::quantize_q8_0(x.data(), dst, x.size());
            break;
    }
}

// The model's parameters (lora: its LoRA entries alone; else all but them, merged into their base by the
// caller) as GGUF tensors in `dtype`. Each is read from the device when its turn to be written comes: one
// tensor in host memory at a time.
void add_params(gguf::Writer& w, const Model& model, const std::string& dtype, bool lora) {
    using Map = bool (*)(const ModelConfig&, const std::string&, const std::vector<int64_t>&,
                         std::vector<float>, GgufTensor*);
    const Map map = lora ? gguf_lora_from_hf : gguf_from_hf;
    const ModelConfig& c = model.config();
    const ParamStore& store = model.params();
    for (size_t i = 0; i < store.size(); i++) {
        const ParamSpec& s = store.spec(i);
        if ((s.name.find(".lora_") != std::string::npos) != lora) continue;
        const std::vector<int64_t> shape(s.shape.dims.begin(), s.shape.dims.begin() + s.shape.ndim);
        GgufTensor t;  // its name and dimensions (no values given: none computed)
        ANVIL_CHECK(map(c, s.name, shape, {}, &t), "parameter {} has no place in llama.cpp's {} layout",
                    s.name, gguf_arch(c));
        const TensorType type = tensor_type(dtype, t.ne);
        w.add_tensor(t.name, t.ne, type, [&store, &c, map, i, shape, type](uint8_t* dst) {
            GgufTensor v;
            map(c, store.spec(i).name, shape, store.read_f32(i), &v);
            encode(type, v.data, dst);
        });
    }
}

// ---- import

// tokenizer.json's pre-tokenizer and normalizer for llama.cpp's pre-tokenizer name.
void split_for(const gguf::Reader& r, const std::string& pre, nlohmann::json* pre_tok,
               nlohmann::json* normalizer) {
    *pre_tok = byte_level(true);
    *normalizer = nullptr;
    if (pre == "llama-bpe" || pre == "llama3" || pre == "qwen2") {
        const char* pattern = kSplitPatterns[pre == "qwen2" ? 1 : 0].first;
        *pre_tok = {{"type", "Sequence"},
                    {"pretokenizers",
                     {{{"type", "Split"},
                       {"pattern", {{"Regex", pattern}}},
                       {"behavior", "Isolated"},
                       {"invert", false}},
                      byte_level(false)}}};
        if (pre == "qwen2") *normalizer = {{"type", "NFC"}};
    } else {
        ANVIL_CHECK(pre == "gpt-2" || pre == "default",
                    "{}: tokenizer.ggml.pre is {}: anvil imports gpt-2, llama-bpe and qwen2", r.what(), pre);
    }
}

// SentencePiece's pieces and scores as BPE merges (how Hugging Face's converter derives a Llama
// tokenizer.json): every split of an ordinary piece into two ordinary pieces, at a character boundary, is a
// merge; merges apply highest-scoring piece first, a piece's own splits in the order of their ids.
std::vector<std::string> merges_from_scores(const std::vector<std::string>& tokens,
                                            const std::vector<int64_t>& types,
                                            const std::vector<double>& scores) {
    std::unordered_map<std::string_view, size_t> id_of;
    for (size_t i = 0; i < tokens.size(); i++)
        if (types[i] == kNormal) id_of.emplace(tokens[i], i);
    struct Merge {
        double score;
        size_t piece, left, right;
    };
    std::vector<Merge> merges;
    for (size_t i = 0; i < tokens.size(); i++) {
        if (types[i] != kNormal) continue;
        const std::string_view p = tokens[i];
        for (size_t k = 1; k < p.size(); k++) {
            if ((static_cast<unsigned char>(p[k]) & 0xC0) == 0x80) continue;  // inside a UTF-8 character
            const auto l = id_of.find(p.substr(0, k)), r = id_of.find(p.substr(k));
            if (l != id_of.end() && r != id_of.end()) merges.push_back({scores[i], i, l->second, r->second});
        }
    }
    std::sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
        if (a.score != b.score) return a.score > b.score;
        return std::tie(a.piece, a.left, a.right) < std::tie(b.piece, b.left, b.right);
    });
    std::vector<std::string> out;
    out.reserve(merges.size());
    for (const Merge& m : merges) out.push_back(tokens[m.left] + " " + tokens[m.right]);
    return out;
}

// tokenizer.json's normalizer, pre-tokenizer, decoder and BPE fields for the GGUF's vocabulary: byte-level
// BPE
// ("gpt2", with its pre-tokenizer's Split) or SentencePiece ("llama": Llama 2's normalizer and decoder,
// byte fallback, merges rebuilt from the scores).
void vocab_model(const gguf::Reader& r, const std::vector<std::string>& tokens,
                 const std::vector<int64_t>& types, nlohmann::json& tj) {
    const std::string model = r.get_string("tokenizer.ggml.model");
    nlohmann::json& m = tj["model"];
    if (model == "llama") {
        const std::vector<double>& scores = r.get_array("tokenizer.ggml.scores", gguf::Type::F32).floats;
        ANVIL_CHECK(scores.size() == tokens.size(), "{}: {} scores for {} tokens", r.what(), scores.size(),
                    tokens.size());
        const bool prepend =
            !r.find("tokenizer.ggml.add_space_prefix") || r.get_int("tokenizer.ggml.add_space_prefix") != 0;
        nlohmann::json norm = nlohmann::json::array();
        if (prepend) norm.push_back({{"type", "Prepend"}, {"prepend", "\u2581"}});
        norm.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}});
        tj["normalizer"] = {{"type", "Sequence"}, {"normalizers", norm}};
        tj["pre_tokenizer"] = nullptr;
        nlohmann::json dec = nlohmann::json::array(
            {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
             {{"type", "ByteFallback"}},
             {{"type", "Fuse"}}});
        if (prepend) dec.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
        tj["decoder"] = {{"type", "Sequence"}, {"decoders", dec}};
        for (size_t i = 0; i < tokens.size(); i++)
            if (types[i] == kUnknown) m["unk_token"] = tokens[i];
        m["fuse_unk"] = true;
        m["byte_fallback"] = true;
        m["merges"] = merges_from_scores(tokens, types, scores);
        return;
    }
    ANVIL_CHECK(
        model == "gpt2",
        "{}: tokenizer.ggml.model is {}: anvil imports byte-level BPE (gpt2) and SentencePiece (llama) "
        "tokenizers",
        r.what(), model);
    const std::string pre = r.find("tokenizer.ggml.pre") ? r.get_string("tokenizer.ggml.pre") : "gpt-2";
    split_for(r, pre, &tj["pre_tokenizer"], &tj["normalizer"]);
    tj["decoder"] = byte_level(true);
    m["ignore_merges"] = pre != "gpt-2" && pre != "default";
    m["merges"] = r.get_array("tokenizer.ggml.merges", gguf::Type::String).strs;
}

// tokenizer.json and tokenizer_config.json for the GGUF's vocabulary, written into `dir`.
void write_hf_tokenizer(const gguf::Reader& r, const std::string& dir) {
    const std::vector<std::string>& tokens = r.get_array("tokenizer.ggml.tokens", gguf::Type::String).strs;
    std::vector<int64_t> types(tokens.size(), kNormal);
    if (r.find("tokenizer.ggml.token_type"))
        types = r.get_array("tokenizer.ggml.token_type", gguf::Type::I32).ints;
    ANVIL_CHECK(types.size() == tokens.size(), "{}: {} token types for {} tokens", r.what(), types.size(),
                tokens.size());
    // the vocabulary is every id up to the last ordinary or byte token (ids without gaps); special, unknown
    // and user-defined tokens are added tokens too, unused padding after the vocabulary is left out
    size_t n_base = 0;
    for (size_t i = 0; i < tokens.size(); i++)
        if (types[i] == kNormal || types[i] == kByte) n_base = i + 1;
    nlohmann::json vocab = nlohmann::json::object(), added = nlohmann::json::array();
    for (size_t i = 0; i < tokens.size(); i++) {
        if (i < n_base) vocab[tokens[i]] = i;
        if (types[i] == kControl || types[i] == kUserDefined || types[i] == kUnknown)
            added.push_back({{"id", i},
                             {"content", tokens[i]},
                             {"single_word", false},
                             {"lstrip", false},
                             {"rstrip", false},
                             {"normalized", types[i] == kUserDefined},
                             {"special", types[i] != kUserDefined}});
    }
    nlohmann::json tj = {{"version", "1.0"},
                         {"truncation", nullptr},
                         {"padding", nullptr},
                         {"added_tokens", added},
                         {"normalizer", nullptr},
                         {"pre_tokenizer", nullptr},
                         {"post_processor", nullptr},
                         {"decoder", nullptr},
                         {"model",
                          {{"type", "BPE"},
                           {"dropout", nullptr},
                           {"unk_token", nullptr},
                           {"continuing_subword_prefix", nullptr},
                           {"end_of_word_suffix", nullptr},
                           {"fuse_unk", false},
                           {"byte_fallback", false},
                           {"vocab", vocab}}}};
    vocab_model(r, tokens, types, tj);
    const auto token = [&](const char* key) {
        if (!r.find(key)) return std::string();
        const int64_t id = r.get_int(key);
        ANVIL_CHECK(id >= 0 && size_t(id) < tokens.size(), "{}: {} {} is not a token", r.what(), key, id);
        return tokens[size_t(id)];
    };
    nlohmann::json cfg = {{"bos_token", token("tokenizer.ggml.bos_token_id")},
                          {"eos_token", token("tokenizer.ggml.eos_token_id")},
                          {"add_bos_token", r.find("tokenizer.ggml.add_bos_token") &&
                                                r.get_int("tokenizer.ggml.add_bos_token") != 0}};
    if (r.find("tokenizer.chat_template")) cfg["chat_template"] = r.get_string("tokenizer.chat_template");
    write_file_atomic(dir + "/tokenizer.json", tj.dump() + "\n");
    write_file_atomic(dir + "/tokenizer_config.json", cfg.dump(2) + "\n");
}

std::unique_ptr<Tokenizer> read_tokenizer(const gguf::Reader& r) {
    const ScratchDir tmp;
    write_hf_tokenizer(r, tmp.path);
    return make_tokenizer(tmp.path);
}

}  // namespace

bool is_gguf_file(const std::string& path) {
    if (!file_exists(path) || dir_exists(path)) return false;
    std::ifstream f(path, std::ios::binary);
    char head[4] = {};
    return f.read(head, 4) && std::string_view(head, 4) == "GGUF";
}

GgufModel import_gguf(const std::string& path, Backend& be) {
    const gguf::Reader r(path);
    ModelConfig c = gguf_read_hparams(r);
    c.validate(path);
    GgufModel g;
    g.tok = read_tokenizer(r);
    ANVIL_CHECK(g.tok->vocab_size() <= c.vocab_size, "{}: {} tokens for the model's {} rows", path,
                g.tok->vocab_size(), c.vocab_size);
    g.model = make_model(be, c);
    ParamStore& store = g.model->params();
    std::vector<bool> filled(store.size(), false);
    for (const gguf::TensorInfo& info : r.tensors()) {
        GgufTensor t{info.name, info.ne, r.read_f32(info)};
        std::string name;
        std::vector<int64_t> shape;
        std::vector<float> data;
        if (!hf_from_gguf(c, t, &name, &shape, &data)) {
            ANVIL_CHECK(info.name == "rope_freqs.weight", "{}: tensor {} has no place in anvil's {}", path,
                        info.name, c.model_type);
            continue;
        }
        const size_t i = store.find(g.model->canonical_name(name));
        ANVIL_CHECK(i != ParamStore::npos, "{}: tensor {} ({}) is not a parameter of this model", path,
                    info.name, name);
        const Shape& want = store.spec(i).shape;
        ANVIL_CHECK(int64_t(data.size()) == want.numel() && size_t(want.ndim) == shape.size(),
                    "{}: tensor {} is {}, the model's {} is {}", path, info.name, info.shape(), name,
                    want.str());
        store.write_f32(i, data.data());
        filled[i] = true;
    }
    for (size_t i = 0; i < store.size(); i++)
        ANVIL_CHECK(filled[i], "{}: no tensor for {}", path, store.spec(i).name);
    return g;
}

std::string gguf_model_dir(const std::string& path) {
    namespace fsys = std::filesystem;
    const fsys::path abs = fsys::absolute(path).lexically_normal();
    const auto stamp = fsys::last_write_time(abs).time_since_epoch().count();
    const std::string key = fmt::format("{}|{}|{}", abs.string(), fsys::file_size(abs), stamp);
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    const std::string root = xdg && *xdg     ? std::string(xdg) + "/anvil/gguf"
                             : home && *home ? std::string(home) + "/.cache/anvil/gguf"
                                             : fsys::temp_directory_path().string() + "/anvil-gguf";
    const std::string dir =
        fmt::format("{}/{}-{:016x}", root, abs.stem().string(), std::hash<std::string>{}(key));
    if (file_exists(dir + "/config.json")) return dir;
    make_dirs(root);
    const std::unique_ptr<Backend> be = make_run_backend("cpu", 0, "auto");
    const GgufModel g = import_gguf(path, *be);
    const std::string tmp = temp_dir_for(dir);
    make_dirs(tmp);
    write_model_dir(
        tmp, *g.model,
        {{"anvil_tokenizer", g.tok->kind()}, {"anvil_template", "auto"}, {"anvil_gguf", abs.string()}});
    g.tok->save(tmp);
    replace_dir(tmp, dir);
    std::fprintf(stderr, "anvil: %s read into the model directory %s\n", path.c_str(), dir.c_str());
    return dir;
}

void export_gguf_adapter(const Model& model, const LoraOptions& lora, const std::string& path,
                         const GgufExportOptions& o) {
    ANVIL_CHECK(model.has_adapters(), "the model carries no LoRA adapter to export");
    const ModelConfig& c = model.config();
    gguf::Writer w;
    w.set("general.architecture", Value::str(gguf_arch(c)));
    w.set("general.type", Value::str("adapter"));
    w.set("general.name", Value::str(o.name.empty() ? "anvil adapter" : o.name));
    if (!o.description.empty()) w.set("general.description", Value::str(o.description));
    w.set("adapter.type", Value::str("lora"));
    // llama.cpp scales B A by alpha / rank; rsLoRA's alpha / sqrt(rank) is that with alpha * sqrt(rank)
    const double alpha = lora.rslora ? lora.alpha * std::sqrt(double(lora.rank)) : lora.alpha;
    w.set("adapter.lora.alpha", Value::f32(float(alpha)));
    add_params(w, model, o.dtype, true);
    w.write(path);
}

void export_gguf(const Model& model, const Tokenizer& tok, const std::string& path,
                 const GgufExportOptions& o) {
    ANVIL_CHECK(o.dtype == "f32" || o.dtype == "f16" || o.dtype == "bf16" || o.dtype == "q8_0",
                "--dtype {}: use f32, f16, bf16 or q8_0", o.dtype);
    const ModelConfig& c = model.config();
    gguf::Writer w;
    const std::string arch = gguf_arch(c);
    w.set("general.architecture", Value::str(arch));
    w.set("general.name", Value::str(o.name.empty() ? "anvil model" : o.name));
    if (!o.description.empty()) w.set("general.description", Value::str(o.description));
    w.set("general.file_type", Value::u32(file_type(o.dtype)));
    if (o.dtype == "q8_0") {
        w.set("general.quantization_version", Value::u32(2));
        w.set("general.quantized_by", Value::str(std::string("anvil ") + version_string()));
    }
    w.set("general.tags", Value::strings({"anvil"}));
    gguf_write_hparams(c, w);
    write_vocab(tok, c.vocab_size, w);
    add_params(w, model, o.dtype, false);
    for (GgufTensor& t : gguf_extra_tensors(c)) {
        auto data = std::make_shared<std::vector<float>>(std::move(t.data));
        w.add_tensor(t.name, t.ne, TensorType::F32,
                     [data](uint8_t* dst) { encode(TensorType::F32, *data, dst); });
    }
    w.write(path);
}

}  // namespace anvil
