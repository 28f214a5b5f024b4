#include "data/bpe.h"

#include <algorithm>

#include "core/error.h"
#include "data/pretokenize.h"
#include "data/utf8.h"

namespace anvil {

SpecialMatcher::SpecialMatcher(const std::vector<std::pair<std::string, int32_t>>& specials)
    : by_first_(256) {
    for (const auto& [text, id] : specials)
        if (!text.empty()) by_first_[uint8_t(text[0])].push_back({text, id});
    for (auto& v : by_first_)
        std::stable_sort(v.begin(), v.end(),
                         [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
}

size_t SpecialMatcher::find(std::string_view text, size_t pos, size_t* len, int32_t* id) const {
    if (by_first_.empty()) return std::string_view::npos;
    for (size_t i = pos; i < text.size(); i++) {
        const auto& cands = by_first_[uint8_t(text[i])];
        for (const auto& [s, sid] : cands)
            if (text.compare(i, s.size(), s) == 0) {
                *len = s.size();
                *id = sid;
                return i;
            }
    }
    return std::string_view::npos;
}

int32_t SpecialMatcher::id_of(std::string_view text) const {
    if (by_first_.empty() || text.empty()) return -1;
    for (const auto& [s, id] : by_first_[uint8_t(text[0])])
        if (s == text) return id;
    return -1;
}

BpeTokenizer::BpeTokenizer(std::vector<std::string> tokens,
                           const std::vector<std::pair<int32_t, int32_t>>& merges,
                           std::vector<std::pair<std::string, int32_t>> specials, std::string source)
    : tokens_(std::move(tokens)), specials_(std::move(specials)), source_(std::move(source)) {
    for (auto& b : byte_ids_) b = -1;
    std::vector<bool> is_special(tokens_.size(), false);
    for (const auto& [text, id] : specials_) {
        ANVIL_CHECK(id >= 0 && size_t(id) < tokens_.size(),
                    "{}: special token {} has id {} outside the vocabulary", source_, text, id);
        is_special[size_t(id)] = true;
        if (text == kEndOfText) eot_ = id;
    }
    index_.reserve(tokens_.size());
    for (size_t id = 0; id < tokens_.size(); id++) {
        if (is_special[id]) continue;
        index_.emplace(tokens_[id], int32_t(id));
        if (tokens_[id].size() == 1) byte_ids_[uint8_t(tokens_[id][0])] = int32_t(id);
    }
    for (int b = 0; b < 256; b++)
        ANVIL_CHECK(byte_ids_[b] >= 0,
                    "{}: the vocabulary has no token for byte {}; a byte-level BPE vocabulary "
                    "needs all 256",
                    source_, b);
    std::vector<std::pair<std::pair<int32_t, int32_t>, BpeMerge>> items;
    items.reserve(merges.size());
    merges_.reserve(merges.size());
    std::string merged;
    for (size_t r = 0; r < merges.size(); r++) {
        const auto [a, b] = merges[r];
        merged.assign(tokens_[size_t(a)]).append(tokens_[size_t(b)]);
        const auto it = index_.find(merged);
        ANVIL_CHECK(it != index_.end(),
                    "{}: merge {} (\"{} {}\") makes a token that is not in the vocabulary", source_, r + 1,
                    bytes_to_vocab_string(tokens_[size_t(a)]), bytes_to_vocab_string(tokens_[size_t(b)]));
        items.push_back({{a, b}, BpeMerge{int32_t(r), it->second}});
        merges_.push_back({a, b});
    }
    pairs_.build(items);
    matcher_ = SpecialMatcher(specials_);
}

// Merges within one piece (bpe_merge.h); with ignore_merges a piece that is itself a token is that token.
void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
    if (piece.size() == 1) {
        out.push_back(byte_ids_[uint8_t(piece[0])]);
        return;
    }
    if (ignore_merges_)
        if (const auto it = index_.find(std::string(piece)); it != index_.end()) {
            out.push_back(it->second);
            return;
        }
    thread_local std::vector<int32_t> ids;
    ids.resize(piece.size());
    for (size_t i = 0; i < piece.size(); i++) ids[i] = byte_ids_[uint8_t(piece[i])];
    bpe_merge(ids, pairs_);
    out.insert(out.end(), ids.begin(), ids.end());
}

void BpeTokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>& out) const {
    thread_local std::vector<uint32_t> ends;
    ends.clear();
    if (split_)
        split_->split(text, ends);
    else
        gpt2_pretokenize(text, ends);
    uint32_t start = 0;
    for (uint32_t end : ends) {
        const std::string_view piece = text.substr(start, end - start);
        start = end;
        if (piece.size() == 1) {
            out.push_back(byte_ids_[uint8_t(piece[0])]);
            continue;
        }
        cached_word(this, piece, out,
                    [this](std::string_view w, std::vector<int32_t>& o) { encode_piece(w, o); });
    }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    std::string fixed, normalized;
    if (!utf8::valid(text)) {
        fixed = utf8::repair(text);
        text = fixed;
    }
    encode_ordinary(utf8::normalize(norm_, text, normalized), out);
    return out;
}

std::vector<int32_t> BpeTokenizer::encode_with_specials(std::string_view text) const {
    std::vector<int32_t> out;
    size_t pos = 0;
    while (pos <= text.size()) {
        size_t len = 0;
        int32_t id = -1;
        const size_t at = matcher_.find(text, pos, &len, &id);
        const std::string_view chunk =
            text.substr(pos, at == std::string_view::npos ? std::string_view::npos : at - pos);
        const std::vector<int32_t> ids = encode(chunk);
        out.insert(out.end(), ids.begin(), ids.end());
        if (at == std::string_view::npos) break;
        out.push_back(id);
        pos = at + len;
    }
    return out;
}

int BpeTokenizer::special_id(std::string_view text) const {
    return matcher_.id_of(text);
}

std::string BpeTokenizer::decode(const int32_t* ids, size_t n) const {
    std::string s;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && size_t(ids[i]) < tokens_.size()) s += tokens_[size_t(ids[i])];
    return s;
}

}  // namespace anvil
