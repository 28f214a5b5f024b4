// The merge loop every BPE shares (GPT-2's and Llama 3's byte-level BPE, SentencePiece-style BPE): symbols as
// ids, the lowest-rank adjacent pair merged first (leftmost on ties) until no pair has a merge.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace anvil {

struct BpeMerge {
    int32_t rank, id;  // the merge's priority and the id it makes
};

// (left id, right id) -> merge, open addressing on a power-of-two table.
class PairTable {
public:
    void build(const std::vector<std::pair<std::pair<int32_t, int32_t>, BpeMerge>>& items);
    const BpeMerge* find(int32_t a, int32_t b) const;

private:
    std::vector<uint64_t> keys_;
    std::vector<BpeMerge> vals_;
    uint64_t mask_ = 0;
};

// Merges `ids` in place. Short sequences scan; long ones (runs of one character, text without spaces) use a
// heap so the work stays O(n log n).
void bpe_merge(std::vector<int32_t>& ids, const PairTable& pairs);

// Appends the ids of `word` through a per-thread cache (words repeat): `encode(word, ids)` runs once per word of
// up to 64 bytes and tokenizer `owner`; longer words are encoded each time. The cache empties when it grows large.
template <class F>
void cached_word(const void* owner, std::string_view word, std::vector<int32_t>& out, F&& encode) {
    struct Cache {
        const void* owner = nullptr;
        std::unordered_map<std::string, std::vector<int32_t>> map;
    };
    thread_local Cache cache;
    if (word.size() > 64) return encode(word, out);
    if (cache.owner != owner) {
        cache.map.clear();
        cache.owner = owner;
    }
    auto it = cache.map.find(std::string(word));
    if (it == cache.map.end()) {
        if (cache.map.size() > (1u << 16)) cache.map.clear();
        std::vector<int32_t> ids;
        encode(word, ids);
        it = cache.map.emplace(std::string(word), std::move(ids)).first;
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
}

}  // namespace anvil
