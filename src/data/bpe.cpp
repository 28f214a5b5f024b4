#include "data/bpe.h"

#include <queue>
#include <tuple>

#include "core/error.h"
#include "data/pretokenize.h"
#include "data/utf8.h"

namespace anvil {

namespace {
uint64_t pair_key(int32_t a, int32_t b) {
    return uint64_t(uint32_t(a)) << 32 | uint32_t(b);
}
uint64_t mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return k;
}
constexpr uint64_t kEmpty = ~uint64_t(0);
}  // namespace

void BpeTokenizer::PairTable::build(const std::vector<std::pair<uint64_t, Merge>>& items) {
    size_t cap = 16;
    while (cap < items.size() * 2) cap <<= 1;
    keys.assign(cap, kEmpty);
    vals.assign(cap, Merge{0, 0});
    mask = cap - 1;
    for (const auto& [k, v] : items) {
        size_t h = mix(k) & mask;
        while (keys[h] != kEmpty && keys[h] != k) h = (h + 1) & mask;
        if (keys[h] == k && vals[h].rank <= v.rank) continue;  // a pair listed twice: the first rank wins
        keys[h] = k;
        vals[h] = v;
    }
}

const BpeTokenizer::Merge* BpeTokenizer::PairTable::find(int32_t a, int32_t b) const {
    const uint64_t k = pair_key(a, b);
    size_t h = mix(k) & mask;
    while (keys[h] != kEmpty) {
        if (keys[h] == k) return &vals[h];
        h = (h + 1) & mask;
    }
    return nullptr;
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
    std::vector<std::pair<uint64_t, Merge>> items;
    items.reserve(merges.size());
    for (size_t r = 0; r < merges.size(); r++) {
        const auto [a, b] = merges[r];
        const std::string merged = tokens_[size_t(a)] + tokens_[size_t(b)];
        const auto it = index_.find(merged);
        ANVIL_CHECK(it != index_.end(),
                    "{}: merge {} (\"{} {}\") makes a token that is not in the vocabulary", source_, r + 1,
                    bytes_to_vocab_string(tokens_[size_t(a)]), bytes_to_vocab_string(tokens_[size_t(b)]));
        items.push_back({pair_key(a, b), Merge{int32_t(r), it->second}});
        merges_.push_back({a, b});
    }
    pairs_.build(items);
}

// Merges within one piece: the lowest-rank adjacent pair first, leftmost on ties, until none applies.
// Short pieces scan; long ones (runs of one character, blobs without spaces) use a heap so the work stays
// O(n log n).
void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
    const size_t n = piece.size();
    if (n == 1) {
        out.push_back(byte_ids_[uint8_t(piece[0])]);
        return;
    }
    constexpr int32_t kNone = INT32_MAX;
    if (n <= 64) {
        int32_t ids[64], ranks[64];
        size_t m = n;
        for (size_t i = 0; i < n; i++) ids[i] = byte_ids_[uint8_t(piece[i])];
        auto rank_at = [&](size_t i) {
            const Merge* mg = pairs_.find(ids[i], ids[i + 1]);
            return mg ? mg->rank : kNone;
        };
        for (size_t i = 0; i + 1 < m; i++) ranks[i] = rank_at(i);
        while (m > 1) {
            size_t best = 0;
            for (size_t i = 1; i + 1 < m; i++)
                if (ranks[i] < ranks[best]) best = i;
            if (ranks[best] == kNone) break;
            ids[best] = pairs_.find(ids[best], ids[best + 1])->id;
            for (size_t i = best + 1; i + 1 < m; i++) {
                ids[i] = ids[i + 1];
                ranks[i] = ranks[i + 1];
            }
            m--;
            if (best + 1 < m) ranks[best] = rank_at(best);
            if (best > 0) ranks[best - 1] = rank_at(best - 1);
        }
        out.insert(out.end(), ids, ids + m);
        return;
    }
    // heap: (rank, position); entries go stale when either side changes (checked on pop)
    std::vector<int32_t> ids(n), prev(n), next(n);
    for (size_t i = 0; i < n; i++) {
        ids[i] = byte_ids_[uint8_t(piece[i])];
        prev[i] = int32_t(i) - 1;
        next[i] = i + 1 < n ? int32_t(i + 1) : -1;
    }
    using Item = std::tuple<int32_t, int32_t, int32_t, int32_t>;  // rank, pos, left id, right id
    std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap;
    auto push = [&](int32_t i) {
        if (i < 0 || next[size_t(i)] < 0) return;
        const int32_t j = next[size_t(i)];
        if (const Merge* mg = pairs_.find(ids[size_t(i)], ids[size_t(j)]))
            heap.push({mg->rank, i, ids[size_t(i)], ids[size_t(j)]});
    };
    for (size_t i = 0; i + 1 < n; i++) push(int32_t(i));
    while (!heap.empty()) {
        const auto [rank, i, a, b] = heap.top();
        heap.pop();
        const int32_t j = next[size_t(i)];
        if (ids[size_t(i)] != a || j < 0 || ids[size_t(j)] != b || ids[size_t(i)] < 0) continue;  // stale
        ids[size_t(i)] = pairs_.find(a, b)->id;
        ids[size_t(j)] = -1;
        next[size_t(i)] = next[size_t(j)];
        if (next[size_t(j)] >= 0) prev[size_t(next[size_t(j)])] = i;
        push(prev[size_t(i)]);
        push(i);
    }
    for (int32_t i = 0; i >= 0; i = next[size_t(i)]) out.push_back(ids[size_t(i)]);
}

void BpeTokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>& out) const {
    // Per-thread cache of piece -> ids (words repeat); cleared when it grows large.
    struct Cache {
        const BpeTokenizer* owner = nullptr;
        std::unordered_map<std::string, std::vector<int32_t>> map;
    };
    thread_local Cache cache;
    if (cache.owner != this) {
        cache.map.clear();
        cache.owner = this;
    }
    thread_local std::vector<uint32_t> ends;
    ends.clear();
    gpt2_pretokenize(text, ends);
    uint32_t start = 0;
    for (uint32_t end : ends) {
        const std::string_view piece = text.substr(start, end - start);
        start = end;
        if (piece.size() == 1) {
            out.push_back(byte_ids_[uint8_t(piece[0])]);
            continue;
        }
        if (piece.size() > 64) {
            encode_piece(piece, out);
            continue;
        }
        auto it = cache.map.find(std::string(piece));
        if (it == cache.map.end()) {
            if (cache.map.size() > (1u << 16)) cache.map.clear();
            std::vector<int32_t> ids;
            encode_piece(piece, ids);
            it = cache.map.emplace(std::string(piece), std::move(ids)).first;
        }
        out.insert(out.end(), it->second.begin(), it->second.end());
    }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    if (utf8::valid(text)) {
        encode_ordinary(text, out);
    } else {
        const std::string fixed = utf8::repair(text);
        encode_ordinary(fixed, out);
    }
    return out;
}

std::vector<int32_t> BpeTokenizer::encode_with_specials(std::string_view text) const {
    std::vector<int32_t> out;
    size_t pos = 0;
    while (pos <= text.size()) {
        // the earliest special token at or after pos
        size_t best = std::string_view::npos, best_len = 0;
        int32_t best_id = -1;
        for (const auto& [s, id] : specials_) {
            const size_t at = text.find(s, pos);
            if (at < best || (at == best && s.size() > best_len)) {
                best = at;
                best_len = s.size();
                best_id = id;
            }
        }
        const std::string_view chunk =
            text.substr(pos, best == std::string_view::npos ? std::string_view::npos : best - pos);
        const std::vector<int32_t> ids = encode(chunk);
        out.insert(out.end(), ids.begin(), ids.end());
        if (best == std::string_view::npos) break;
        out.push_back(best_id);
        pos = best + best_len;
    }
    return out;
}

std::string BpeTokenizer::decode(const int32_t* ids, size_t n) const {
    std::string s;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && size_t(ids[i]) < tokens_.size()) s += tokens_[size_t(ids[i])];
    return s;
}

}  // namespace anvil
