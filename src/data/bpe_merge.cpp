#include "data/bpe_merge.h"

#include <climits>
#include <cstddef>
#include <queue>
#include <tuple>

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
constexpr int32_t kNone = INT32_MAX;

void merge_scan(std::vector<int32_t>& ids, const PairTable& pairs) {
    size_t m = ids.size();
    int32_t ranks[64];
    auto rank_at = [&](size_t i) {
        const BpeMerge* mg = pairs.find(ids[i], ids[i + 1]);
        return mg ? mg->rank : kNone;
    };
    for (size_t i = 0; i + 1 < m; i++) ranks[i] = rank_at(i);
    while (m > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < m; i++)
            if (ranks[i] < ranks[best]) best = i;
        if (ranks[best] == kNone) break;
        ids[best] = pairs.find(ids[best], ids[best + 1])->id;
        for (size_t i = best + 1; i + 1 < m; i++) {
            ids[i] = ids[i + 1];
            ranks[i] = ranks[i + 1];
        }
        m--;
        if (best + 1 < m) ranks[best] = rank_at(best);
        if (best > 0) ranks[best - 1] = rank_at(best - 1);
    }
    ids.resize(m);
}

// heap: (rank, position); entries go stale when either side changes (checked on pop)
void merge_heap(std::vector<int32_t>& ids, const PairTable& pairs) {
    const size_t n = ids.size();
    std::vector<int32_t> prev(n), next(n);
    for (size_t i = 0; i < n; i++) {
        prev[i] = int32_t(i) - 1;
        next[i] = i + 1 < n ? int32_t(i + 1) : -1;
    }
    using Item = std::tuple<int32_t, int32_t, int32_t, int32_t>;  // rank, pos, left id, right id
    std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap;
    auto push = [&](int32_t i) {
        if (i < 0 || next[size_t(i)] < 0) return;
        const int32_t j = next[size_t(i)];
        if (const BpeMerge* mg = pairs.find(ids[size_t(i)], ids[size_t(j)]))
            heap.push({mg->rank, i, ids[size_t(i)], ids[size_t(j)]});
    };
    for (size_t i = 0; i + 1 < n; i++) push(int32_t(i));
    while (!heap.empty()) {
        const auto [rank, i, a, b] = heap.top();
        heap.pop();
        const int32_t j = next[size_t(i)];
        if (ids[size_t(i)] != a || j < 0 || ids[size_t(j)] != b || ids[size_t(i)] < 0) continue;  // stale
        ids[size_t(i)] = pairs.find(a, b)->id;
        ids[size_t(j)] = -1;
        next[size_t(i)] = next[size_t(j)];
        if (next[size_t(j)] >= 0) prev[size_t(next[size_t(j)])] = i;
        push(prev[size_t(i)]);
        push(i);
    }
    size_t k = 0;
    for (int32_t i = 0; i >= 0; i = next[size_t(i)]) ids[k++] = ids[size_t(i)];
    ids.resize(k);
}
}  // namespace

void PairTable::build(const std::vector<std::pair<std::pair<int32_t, int32_t>, BpeMerge>>& items) {
    size_t cap = 16;
    while (cap < items.size() * 2) cap <<= 1;
    keys_.assign(cap, kEmpty);
    vals_.assign(cap, BpeMerge{0, 0});
    mask_ = cap - 1;
    for (const auto& [ab, v] : items) {
        const uint64_t k = pair_key(ab.first, ab.second);
        size_t h = mix(k) & mask_;
        while (keys_[h] != kEmpty && keys_[h] != k) h = (h + 1) & mask_;
        if (keys_[h] == k && vals_[h].rank <= v.rank) continue;  // a pair listed twice: the first rank wins
        keys_[h] = k;
        vals_[h] = v;
    }
}

const BpeMerge* PairTable::find(int32_t a, int32_t b) const {
    const uint64_t k = pair_key(a, b);
    size_t h = mix(k) & mask_;
    while (keys_[h] != kEmpty) {
        if (keys_[h] == k) return &vals_[h];
        h = (h + 1) & mask_;
    }
    return nullptr;
}

void bpe_merge(std::vector<int32_t>& ids, const PairTable& pairs) {
    if (ids.size() < 2) return;
    if (ids.size() <= 64) return merge_scan(ids, pairs);
    merge_heap(ids, pairs);
}

}  // namespace anvil
