// BPE: training against a naive reference, save/load round trips in every vocabulary form, UTF-8 repair,
// the pre-tokenizer's rules, long pieces.
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "data/bpe.h"
#include "data/pretokenize.h"
#include "data/sp_bpe.h"
#include "data/tokenizer_json.h"
#include "data/utf8.h"
#include "harness.h"

namespace anvil::test {
namespace {

namespace fsys = std::filesystem;

std::vector<std::string> corpus() {
    return {"the cat sat on the mat. the cat's hat is red; the dog's hat is blue.",
            "low lower lowest newer newest wider widest", "aaaa aaaa aaa aa a bbbb abab ababab",
            "日本語 日本 テキスト 123 1234 12345", "  spaces   and\ttabs\n\nnewlines  "};
}

// Naive trainer: recount every pair from scratch each round; most frequent first, ties to the smaller pair.
std::vector<std::pair<int32_t, int32_t>> naive_merges(const std::vector<std::string>& texts, int n_merges) {
    std::map<std::vector<int32_t>, int64_t> words;
    std::vector<uint32_t> ends;
    for (const auto& t : texts) {
        ends.clear();
        gpt2_pretokenize(t, ends);
        uint32_t s = 0;
        for (uint32_t e : ends) {
            std::vector<int32_t> w;
            for (uint32_t i = s; i < e; i++) w.push_back(int32_t(uint8_t(t[i])));
            words[w]++;
            s = e;
        }
    }
    std::vector<std::pair<int32_t, int32_t>> merges;
    int32_t next = 256;
    for (int m = 0; m < n_merges; m++) {
        std::map<std::pair<int32_t, int32_t>, int64_t> counts;
        for (const auto& [w, c] : words)
            for (size_t i = 0; i + 1 < w.size(); i++) counts[{w[i], w[i + 1]}] += c;
        if (counts.empty()) break;
        auto best = counts.begin();
        for (auto it = counts.begin(); it != counts.end(); ++it)
            if (it->second > best->second) best = it;  // map order: ties keep the smaller pair
        const auto [a, b] = best->first;
        merges.push_back({a, b});
        std::map<std::vector<int32_t>, int64_t> next_words;
        for (const auto& [w, c] : words) {
            std::vector<int32_t> o;
            for (size_t i = 0; i < w.size();) {
                if (i + 1 < w.size() && w[i] == a && w[i + 1] == b) {
                    o.push_back(next);
                    i += 2;
                } else {
                    o.push_back(w[i++]);
                }
            }
            next_words[o] += c;
        }
        words = std::move(next_words);
        next++;
    }
    return merges;
}

TEST(Bpe, TrainingMatchesNaiveReference) {
    const auto texts = corpus();
    const BpeTokenizer t = train_bpe(texts, 256 + 40 + 1, false);
    const auto want = naive_merges(texts, 40);
    ASSERT_EQ(t.num_merges(), want.size());
    EXPECT_EQ(t.vocab_size(), 256 + int(want.size()) + 1);
    EXPECT_EQ(t.eot_id(), t.vocab_size() - 1);
    for (size_t i = 0; i < want.size(); i++) {
        const std::string expect = t.token_bytes(want[i].first) + t.token_bytes(want[i].second);
        EXPECT_EQ(t.token_bytes(int32_t(256 + i)), expect) << "merge " << i;
    }
}

TEST(Bpe, RoundTripsAndCompresses) {
    const BpeTokenizer t = train_bpe(corpus(), 320, false);
    for (const auto& s : corpus()) {
        const auto ids = t.encode(s);
        EXPECT_EQ(t.decode(ids), s);
        EXPECT_LT(ids.size(), s.size()) << "merges should shorten " << s;
    }
    const std::string long_piece(3000, 'a');  // one piece: the heap path
    EXPECT_EQ(t.decode(t.encode(long_piece)), long_piece);
    std::string mixed;
    for (int i = 0; i < 500; i++) mixed += "ab";
    const auto ids = t.encode(mixed);
    EXPECT_EQ(t.decode(ids), mixed);
    // the heap path and the short path agree: the same text cut into pieces of at most 64 bytes
    std::vector<int32_t> short_ids;
    for (size_t i = 0; i < 1000; i += 50) {
        const auto part = t.encode(mixed.substr(i, 50));
        short_ids.insert(short_ids.end(), part.begin(), part.end());
    }
    EXPECT_EQ(t.decode(short_ids), mixed);
}

TEST(Bpe, SpecialTokens) {
    const BpeTokenizer t = train_bpe(corpus(), 300, false);
    const auto plain = t.encode("a<|endoftext|>b");
    const auto special = t.encode_with_specials("a<|endoftext|>b");
    EXPECT_EQ(std::count(special.begin(), special.end(), t.eot_id()), 1);
    EXPECT_EQ(std::count(plain.begin(), plain.end(), t.eot_id()), 0)
        << "ordinary text never makes a special id";
    EXPECT_EQ(t.decode(special), "a<|endoftext|>b");
}

TEST(Bpe, SaveLoadEveryForm) {
    const BpeTokenizer t = train_bpe(corpus(), 330, false);
    const std::string d = fresh_dir("bpe");
    t.save(d);
    const std::string text = "the cat's newest hat, 日本語 12345  x";
    auto check = [&](const std::string& path) {
        const BpeTokenizer u = BpeTokenizer::load(path);
        EXPECT_EQ(u.vocab_size(), t.vocab_size()) << path;
        EXPECT_EQ(u.eot_id(), t.eot_id()) << path;
        EXPECT_EQ(u.encode(text), t.encode(text)) << path;
    };
    check(d);                      // tokenizer.json found first
    check(d + "/tokenizer.json");  // the file itself
    fsys::remove(d + "/tokenizer.json");
    check(d);  // vocab.json + merges.txt
    fsys::rename(d + "/vocab.json", d + "/encoder.json");
    fsys::rename(d + "/merges.txt", d + "/vocab.bpe");
    check(d);  // OpenAI's names
    // tokenizer.json with merges as pairs (newer tokenizers versions)
    t.save(d);
    nlohmann::json j = nlohmann::json::parse(std::ifstream(d + "/tokenizer.json"));
    nlohmann::json pairs = nlohmann::json::array();
    for (const auto& m : j["model"]["merges"]) {
        const std::string s = m.get<std::string>();
        pairs.push_back({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
    }
    j["model"]["merges"] = pairs;
    std::ofstream(d + "/tokenizer.json") << j.dump();
    check(d + "/tokenizer.json");
    fsys::remove_all(d);
}

TEST(Bpe, RejectsBrokenVocabularies) {
    const std::string d = fresh_dir("bpebad");
    auto expect = [&](const std::string& vocab, const std::string& merges, const std::string& needle) {
        std::ofstream(d + "/vocab.json") << vocab;
        std::ofstream(d + "/merges.txt") << merges;
        expect_error([&] { BpeTokenizer::load(d); }, needle);
    };
    expect("{\"a\": 0}", "", "needs all 256");
    expect("[1,2]", "", "non-empty JSON object");
    expect("{\"a\": 0, \"b\": 0}", "", "without gaps or repeats");
    expect("{not json", "", "not valid JSON");
    nlohmann::json full;
    for (int b = 0; b < 256; b++) full[bytes_to_vocab_string(std::string(1, char(b)))] = b;
    expect(full.dump(), "#version: 0.2\na b\n",
           "merge 1 (\"a b\") makes a token that is not in the vocabulary");
    expect(full.dump(), "#version: 0.2\nzz q\n",
           "merges.txt:2: merge \"zz q\" names a token that is not in the vocabulary");
    expect(full.dump(), "#version: 0.2\nabc\n", "merges.txt:2: a merge line is two tokens");
    fsys::remove(d + "/vocab.json");
    fsys::remove(d + "/merges.txt");
    // tokenizer.json's merges: the error names the file and the merge's place in the list
    auto expect_json = [&](const nlohmann::json& merges, const std::string& needle) {
        const nlohmann::json j = {{"model", {{"type", "BPE"}, {"vocab", full}, {"merges", merges}}}};
        std::ofstream(d + "/tokenizer.json") << j.dump();
        expect_error([&] { BpeTokenizer::load(d); }, needle);
    };
    full[bytes_to_vocab_string("ab")] = 256;
    expect_json({"a b", "zz q"},
                "tokenizer.json: merge 2 \"zz q\" names a token that is not in the vocabulary");
    expect_json({"a b", "c d", "abc"}, "tokenizer.json: merge 3: \"abc\" is not two tokens");
    expect_json({"a b", {"c"}}, "tokenizer.json: merge 2: a merge is");
    fsys::remove_all(d);
}

// tokenizer.json in two parts: model.vocab and model.merges as vectors (file order), the rest as a document
// without them; a "vocab" or "merges" member anywhere else stays in the document.
TEST(TokenizerJson, SplitsTheTablesFromTheRest) {
    const std::string text = R"({"added_tokens": [{"id": 3, "content": "<s>"}],
        "normalizer": {"vocab": 1, "merges": [2]},
        "model": {"type": "BPE", "vocab": {"b": 1, "a": 0, "ab": 2}, "merges": ["a b", ["ab", "c d"]],
                  "ignore_merges": true}})";
    const TokenizerJson t = parse_tokenizer_json(text, "tok.json");
    EXPECT_TRUE(t.has_vocab && t.vocab_object && t.has_merges);
    EXPECT_EQ(t.vocab, (std::vector<std::pair<std::string, int64_t>>{{"b", 1}, {"a", 0}, {"ab", 2}}));
    EXPECT_EQ(t.merges, (std::vector<std::pair<std::string, std::string>>{{"a", "b"}, {"ab", "c d"}}));
    EXPECT_TRUE(t.vocab_bad.empty() && t.merges_bad.empty());
    EXPECT_FALSE(t.doc["model"].contains("vocab") || t.doc["model"].contains("merges"));
    EXPECT_EQ(t.doc["model"]["type"], "BPE");
    EXPECT_EQ(t.doc["model"]["ignore_merges"], true);
    EXPECT_EQ(t.doc["normalizer"]["vocab"], 1);
    EXPECT_EQ(t.doc["normalizer"]["merges"][0], 2);
    EXPECT_EQ(t.doc["added_tokens"][0]["content"], "<s>");

    const TokenizerJson bad = parse_tokenizer_json(
        R"({"model": {"vocab": {"a": 0, "b": "one", "c": 1.5}, "merges": ["a b", "ab", ["a"], {"x": 1}]}})",
        "t");
    EXPECT_EQ(bad.vocab_bad, "b");
    EXPECT_EQ(bad.vocab.size(), 1u);
    EXPECT_EQ(bad.merges_bad, "merge 2: \"ab\" is not two tokens");
    EXPECT_EQ(bad.merges, (std::vector<std::pair<std::string, std::string>>{{"a", "b"}}));
    EXPECT_FALSE(parse_tokenizer_json(R"({"model": {"merges": {}}})", "t").has_merges);
    expect_error([] { parse_tokenizer_json(R"({"model": {"vocab": {"a": 0,}})", "t.json"); },
                 "t.json: not valid JSON");
}

TEST(Utf8, NormalizationForms) {
    std::string st;
    const std::string decomposed = "cafe\xcc\x81", composed = "caf\xc3\xa9";  // e + U+0301, U+00E9
    EXPECT_EQ(utf8::normalize(utf8::Form::NFC, decomposed, st), composed);
    EXPECT_EQ(utf8::normalize(utf8::Form::NFD, composed, st), decomposed);
    EXPECT_EQ(utf8::normalize(utf8::Form::NFKC, "\xef\xac\x81x\xc2\xb2", st),
              "fix2");  // U+FB01 ligature, superscript 2
    const std::string_view ascii = "plain ascii";
    EXPECT_EQ(utf8::normalize(utf8::Form::NFC, ascii, st).data(), ascii.data()) << "ASCII is returned as is";
    EXPECT_EQ(utf8::normalize(utf8::Form::NFC, composed, st).data(), composed.data())
        << "already NFC: no copy";
    EXPECT_EQ(utf8::form_from_name("NFKD"), utf8::Form::NFKD);
    EXPECT_EQ(utf8::form_from_name("Lowercase"), utf8::Form::None);
}

// A tokenizer.json's normalizer on a byte-level BPE: a Unicode form (Qwen's NFC) is applied to ordinary text
// (special tokens still match the raw text); any other is refused naming it.
TEST(Bpe, TokenizerJsonNormalizer) {
    const BpeTokenizer t = train_bpe(corpus(), 300, false);
    const std::string d = fresh_dir("bpenorm");
    t.save(d);
    nlohmann::json j = nlohmann::json::parse(std::ifstream(d + "/tokenizer.json"));
    const std::string decomposed = "cafe\xcc\x81 <|endoftext|>", composed = "caf\xc3\xa9 <|endoftext|>";
    const std::unique_ptr<Tokenizer> plain = load_tokenizer_json(d);
    EXPECT_NE(plain->encode(decomposed), plain->encode(composed)) << "without a normalizer the two differ";
    j["normalizer"] = {{"type", "NFC"}};
    std::ofstream(d + "/tokenizer.json") << j.dump();
    const std::unique_ptr<Tokenizer> nfc = load_tokenizer_json(d);
    EXPECT_EQ(nfc->kind(), "bpe") << "a Unicode form keeps the tokenizer byte-level";
    EXPECT_EQ(nfc->encode(decomposed), plain->encode(composed));
    EXPECT_EQ(nfc->encode_with_specials(decomposed), plain->encode_with_specials(composed));
    j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFKC"}}}}};
    std::ofstream(d + "/tokenizer.json") << j.dump();
    EXPECT_EQ(load_tokenizer_json(d)->encode(decomposed), plain->encode(composed));
    j["normalizer"] = {{"type", "Lowercase"}};
    j["model"]["byte_fallback"] = false;
    std::ofstream(d + "/tokenizer.json") << j.dump();
    expect_error([&] { load_tokenizer_json(d); }, "Lowercase");
    fsys::remove_all(d);
}

// tokenizer_config.json's chat_template: the system message a ChatML template writes when a conversation has
// none (Qwen2's and Qwen2.5's), read from its string literal; nothing from templates without one.
TEST(Bpe, ChatTemplateDefaultSystem) {
    const BpeTokenizer t = train_bpe(corpus(), 300, false);
    const std::string d = fresh_dir("bpesys");
    t.save(d);
    const auto with_template = [&](const nlohmann::json& tmpl) {
        std::ofstream(d + "/tokenizer_config.json") << nlohmann::json{{"chat_template", tmpl}}.dump();
        return load_tokenizer_json(d)->default_system();
    };
    const std::string qwen2 =
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
        "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor "
        "%}";
    EXPECT_EQ(with_template(qwen2), "You are a helpful assistant.");
    EXPECT_EQ(with_template(
                  {{{"name", "tool_use"}, {"template", "x"}}, {{"name", "default"}, {"template", qwen2}}}),
              "You are a helpful assistant.");
    EXPECT_EQ(with_template("{{ '<|im_start|>system\\nLine one\\nIt\\'s two<|im_end|>' }}"),
              "Line one\nIt's two");
    // the system text from the messages only, or no ChatML: none
    EXPECT_EQ(with_template("{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"), "");
    EXPECT_EQ(
        with_template("{{ bos_token }}{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"),
        "");
    std::ofstream(d + "/tokenizer_config.json")
        << nlohmann::json{{"chat_template", {{{"name", "default"}, {"template", qwen2}}}}}.dump();
    EXPECT_EQ(load_tokenizer_json(d)->chat_template(), qwen2) << "the template itself, for `auto` to read";
    fsys::remove(d + "/tokenizer_config.json");
    EXPECT_EQ(load_tokenizer_json(d)->default_system(), "");
    EXPECT_EQ(load_tokenizer_json(d)->chat_template(), "");
    fsys::remove_all(d);
}

// A piece of a longer text (a chat record's answer after its prompt) gets SentencePiece's "▁" only where the
// whole text would: never in the middle of a stretch, after a special token only when every stretch gets one.
TEST(SpBpe, ContinuationPrependsOnlyWhereTheWholeTextWould) {
    SpBpeTokenizer::Spec s;
    s.pieces = {"<unk>", "<s>", "</s>", "\u2581", "a", "b", "\u2581a"};  // ▁ = 3, a = 4, b = 5, ▁a = 6
    s.merges = {{"\u2581", "a"}};
    s.added = {{"<s>", 1}, {"</s>", 2}};
    s.added_special = {true, true};
    s.byte_fallback = false;
    s.unk = 0, s.bos = 1, s.eos = 2;
    const SpBpeTokenizer every(s);
    EXPECT_EQ(every.encode("a b"), (std::vector<int32_t>{6, 3, 5}));
    EXPECT_EQ(every.encode_continuation("a b", false), (std::vector<int32_t>{4, 3, 5})) << "after text";
    EXPECT_EQ(every.encode_continuation("a b", true), (std::vector<int32_t>{6, 3, 5}))
        << "after a special token, with the Prepend normalizer (every stretch)";
    s.prepend_every_stretch = false;  // Metaspace with prepend_scheme "first"
    const SpBpeTokenizer first(s);
    EXPECT_EQ(first.encode("a b"), (std::vector<int32_t>{6, 3, 5}));
    EXPECT_EQ(first.encode_continuation("a b", true), (std::vector<int32_t>{4, 3, 5}));
    ByteTokenizer bytes;
    EXPECT_EQ(bytes.encode_continuation(" a", true), bytes.encode(" a")) << "byte-level: no difference";
}

TEST(Utf8, RepairFollowsMaximalSubparts) {
    EXPECT_TRUE(utf8::valid("héllo 日本 😀"));
    EXPECT_FALSE(utf8::valid("\xff"));
    EXPECT_FALSE(utf8::valid("\xed\xa0\x80"));  // surrogate
    EXPECT_FALSE(utf8::valid("\xc0\xaf"));      // overlong
    const std::string r = "\xef\xbf\xbd";       // U+FFFD
    EXPECT_EQ(utf8::repair("a\xff"
                           "b"),
              "a" + r + "b");
    EXPECT_EQ(utf8::repair("\xe2\x82"), r);                      // truncated 3-byte: one subpart
    EXPECT_EQ(utf8::repair("\xed\xa0\x80"), r + r + r);          // surrogate: each byte
    EXPECT_EQ(utf8::repair("\xf0\x9f\x98"), r);                  // truncated 4-byte
    EXPECT_EQ(utf8::repair("\xc3\x28"), r + "(");                // bad continuation
    EXPECT_EQ(utf8::repair("\xf4\x90\x80\x80"), r + r + r + r);  // above U+10FFFF
}

TEST(Pretokenize, Gpt2Rules) {
    auto pieces = [](const std::string& s) {
        std::vector<uint32_t> ends;
        gpt2_pretokenize(s, ends);
        std::vector<std::string> out;
        uint32_t st = 0;
        for (uint32_t e : ends) out.push_back(s.substr(st, e - st)), st = e;
        return out;
    };
    using V = std::vector<std::string>;
    EXPECT_EQ(pieces("Hello world"), (V{"Hello", " world"}));
    EXPECT_EQ(pieces("it's they'll I'M"), (V{"it", "'s", " they", "'ll", " I", "'", "M"}));
    EXPECT_EQ(pieces("a  b"), (V{"a", " ", " b"}));  // \s+(?!\S) leaves one space for " b"
    EXPECT_EQ(pieces("a \n b"), (V{"a", " \n", " b"}));
    EXPECT_EQ(pieces("x\ty"), (V{"x", "\t", "y"}));
    EXPECT_EQ(pieces("end   "), (V{"end", "   "}));
    EXPECT_EQ(pieces("123abc!!?"), (V{"123", "abc", "!!?"}));
    EXPECT_EQ(pieces(" 42 !!"), (V{" 42", " !!"}));
    EXPECT_EQ(pieces("日本語テスト"), (V{"日本語テスト"}));
    EXPECT_EQ(pieces("½²"), (V{"½²"}));          // numbers (No)
    EXPECT_EQ(char_class(0x0085), kClassSpace);  // GPT-2's Python \s
    EXPECT_EQ(char_class(0xfeff), kClassOther);
    EXPECT_EQ(char_class(0x3000), kClassSpace);
    EXPECT_EQ(char_class(0x00e9), kClassLetter);
    EXPECT_EQ(char_class(0x0663), kClassNumber);
}

}  // namespace
}  // namespace anvil::test
