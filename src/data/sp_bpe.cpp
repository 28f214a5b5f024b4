#include "data/sp_bpe.h"

#include "core/error.h"
#include "data/utf8.h"
#include "io/fs.h"

namespace anvil {

namespace {
constexpr std::string_view kSpace = "\u2581";  // 3 bytes: E2 96 81

bool is_space_at(std::string_view s, size_t i) {
    return s.compare(i, kSpace.size(), kSpace) == 0;
}
}  // namespace

SpBpeTokenizer::SpBpeTokenizer(Spec s) : spec_(std::move(s)) {
    for (auto& b : byte_ids_) b = -1;
    split_words_ = true;
    for (size_t id = 0; id < spec_.pieces.size(); id++) {
        const std::string& p = spec_.pieces[id];
        index_.emplace(p, int32_t(id));
        if (p.size() == 6 && p.starts_with("<0x") && p.back() == '>')
            byte_ids_[std::stoi(p.substr(3, 2), nullptr, 16)] = int32_t(id);
        for (size_t i = 1; i < p.size() && split_words_; i++)  // "▁" after another character
            if (is_space_at(p, i) && !(i >= kSpace.size() && is_space_at(p, i - kSpace.size()))) split_words_ = false;
    }
    if (spec_.byte_fallback)
        for (int b = 0; b < 256; b++)
            ANVIL_CHECK(byte_ids_[b] >= 0, "{}: byte_fallback is on but the vocabulary has no <0x{:02X}> token",
                        spec_.source, b);
    std::vector<std::pair<std::pair<int32_t, int32_t>, BpeMerge>> items;
    for (size_t r = 0; r < spec_.merges.size(); r++) {
        const auto& [a, b] = spec_.merges[r];
        const auto ia = index_.find(a), ib = index_.find(b), im = index_.find(a + b);
        ANVIL_CHECK(ia != index_.end() && ib != index_.end() && im != index_.end(),
                    "{}: merge {} (\"{} {}\") names or makes a token that is not in the vocabulary", spec_.source,
                    r + 1, a, b);
        items.push_back({{ia->second, ib->second}, BpeMerge{int32_t(r), im->second}});
    }
    pairs_.build(items);
    std::vector<std::pair<std::string, int32_t>> ordinary;
    for (size_t i = 0; i < spec_.added.size(); i++)
        if (!spec_.added_special[i]) ordinary.push_back(spec_.added[i]);
    all_ = SpecialMatcher(spec_.added);
    ordinary_ = SpecialMatcher(ordinary);
}

// Characters, or their bytes where the vocabulary lacks them, then the merges. Words repeat: a per-thread cache
// keeps short words' ids.
void SpBpeTokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
    cached_word(this, word, out, [this](std::string_view w, std::vector<int32_t>& o) { merge_word(w, o); });
}

void SpBpeTokenizer::merge_word(std::string_view word, std::vector<int32_t>& out) const {
    thread_local std::vector<int32_t> ids;
    ids.clear();
    uint32_t cp;
    for (size_t i = 0; i < word.size();) {
        const int n = utf8::decode(word, i, &cp);
        const size_t len = n > 0 ? size_t(n) : 1;
        const auto it = index_.find(std::string(word.substr(i, len)));
        if (it != index_.end()) {
            ids.push_back(it->second);
        } else if (spec_.byte_fallback) {
            for (size_t k = 0; k < len; k++) ids.push_back(byte_ids_[uint8_t(word[i + k])]);
        } else if (spec_.unk >= 0) {
            if (ids.empty() || ids.back() != spec_.unk) ids.push_back(spec_.unk);  // fuse_unk
        }
        i += len;
    }
    bpe_merge(ids, pairs_);
    out.insert(out.end(), ids.begin(), ids.end());
}

// One stretch of text between added tokens: "▁" prepended, spaces replaced, then words (each "▁" run with the
// characters after it) merged apart when the vocabulary allows it.
void SpBpeTokenizer::encode_text(std::string_view text, bool prepend, std::vector<int32_t>& out) const {
    if (text.empty()) return;
    std::string s = prepend ? spec_.prepend : std::string();
    s.reserve(text.size() * 2);
    for (char c : text) {
        if (c == ' ') s += kSpace;
        else s.push_back(c);
    }
    if (!split_words_) return encode_word(s, out);
    size_t start = 0;
    for (size_t i = 1; i < s.size(); i++)  // (a word may start with "▁": the split is before it)
        if (is_space_at(s, i) && !(i >= kSpace.size() && is_space_at(s, i - kSpace.size()))) {
            encode_word(std::string_view(s).substr(start, i - start), out);
            start = i;
        }
    encode_word(std::string_view(s).substr(start), out);
}

std::vector<int32_t> SpBpeTokenizer::encode_added(std::string_view text, const SpecialMatcher& m,
                                                  bool prepend_first) const {
    const std::string fixed = utf8::valid(text) ? std::string() : utf8::repair(text);
    if (!fixed.empty()) text = fixed;
    std::vector<int32_t> out;
    size_t pos = 0;
    while (pos <= text.size()) {
        size_t len = 0;
        int32_t id = -1;
        const size_t at = m.find(text, pos, &len, &id);
        encode_text(text.substr(pos, at == std::string_view::npos ? std::string_view::npos : at - pos),
                    pos == 0 ? prepend_first : spec_.prepend_every_stretch, out);
        if (at == std::string_view::npos) break;
        out.push_back(id);
        pos = at + len;
    }
    return out;
}

std::vector<int32_t> SpBpeTokenizer::encode(std::string_view text) const {
    return encode_added(text, ordinary_, true);
}

std::vector<int32_t> SpBpeTokenizer::encode_with_specials(std::string_view text) const {
    return encode_added(text, all_, true);
}

std::vector<int32_t> SpBpeTokenizer::encode_continuation(std::string_view text, bool after_special) const {
    return encode_added(text, ordinary_, after_special && spec_.prepend_every_stretch);
}

std::string SpBpeTokenizer::decode(const int32_t* ids, size_t n) const {
    std::string s;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || size_t(ids[i]) >= spec_.pieces.size()) continue;
        const std::string& p = spec_.pieces[size_t(ids[i])];
        if (p.size() == 6 && p.starts_with("<0x") && p.back() == '>' && byte_ids_[std::stoi(p.substr(3, 2), nullptr, 16)] == ids[i]) {
            s.push_back(char(std::stoi(p.substr(3, 2), nullptr, 16)));
            continue;
        }
        for (size_t k = 0; k < p.size();) {
            if (is_space_at(p, k)) {
                s.push_back(' ');
                k += kSpace.size();
            } else {
                s.push_back(p[k++]);
            }
        }
    }
    if (!spec_.prepend.empty() && !s.empty() && s[0] == ' ') s.erase(0, 1);  // the decoder's Strip(1, 0)
    return s;
}

void SpBpeTokenizer::save(const std::string& dir) const {
    for (const auto& [name, contents] : hf_files_) write_file_atomic(dir + "/" + name, contents);
}

}  // namespace anvil
