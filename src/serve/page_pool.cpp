#include "serve/page_pool.h"

#include <algorithm>

#include "core/error.h"

namespace anvil::serve {

namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

}  // namespace

PagePool::PagePool(int pages, int page, bool prefix_caching)
    : n_(pages),
      page_(page),
      caching_(prefix_caching),
      in_lru_(size_t(pages)),
      refs_(size_t(pages), 0),
      key_(size_t(pages), 0),
      parent_(size_t(pages), -1),
      tokens_(prefix_caching ? size_t(pages) * size_t(page) : 0),
      children_(prefix_caching ? size_t(pages) : 0) {
    ANVIL_CHECK(pages > 0 && page > 0, "KV-cache pool: {} pages of {} positions", pages, page);
    for (int p = pages - 1; p >= 0; p--) free_.push_back(p);
}

uint64_t PagePool::key(uint64_t parent_key, std::span<const int32_t> tokens) const {
    uint64_t h = mix(parent_key ^ 0x9e3779b97f4a7c15ull);
    for (const int32_t t : tokens) h = mix(h ^ uint64_t(uint32_t(t)));
    return h == 0 ? 1 : h;  // 0 marks a page not published
}

bool PagePool::holds(int32_t page, int32_t parent, std::span<const int32_t> tokens) const {
    const auto first = tokens_.begin() + std::ptrdiff_t(size_t(page) * size_t(page_));
    return parent_[size_t(page)] == parent && std::equal(tokens.begin(), tokens.end(), first);
}

std::vector<int32_t> PagePool::match(std::span<const int32_t> tokens, int max_pages) const {
    std::vector<int32_t> found;
    if (!caching_) return found;
    uint64_t k = 0;
    for (size_t at = 0; int(found.size()) < max_pages && at + size_t(page_) <= tokens.size();
         at += size_t(page_)) {
        const std::span<const int32_t> piece = tokens.subspan(at, size_t(page_));
        k = key(k, piece);
        const auto it = by_key_.find(k);
        const int32_t parent = found.empty() ? -1 : found.back();
        if (it == by_key_.end() || !holds(it->second, parent, piece)) break;
        found.push_back(it->second);
    }
    return found;
}

int PagePool::unheld(std::span<const int32_t> pages) const {
    return int(std::count_if(pages.begin(), pages.end(), [&](int32_t p) { return refs_[size_t(p)] == 0; }));
}

void PagePool::hold(std::span<const int32_t> pages) {
    for (const int32_t p : pages) {
        ANVIL_CHECK(p >= 0 && p < n_ && key_[size_t(p)] != 0, "KV-cache pool: holding page {}, not published",
                    p);
        if (refs_[size_t(p)]++ == 0) lru_.erase(in_lru_[size_t(p)]);
    }
}

int32_t PagePool::take() {
    ANVIL_CHECK(available() > 0, "KV-cache pool: no page left to lend ({} held)", n_);
    if (free_.empty()) forget(lru_.front());
    const int32_t p = free_.back();
    free_.pop_back();
    refs_[size_t(p)] = 1;
    return p;
}

void PagePool::release(std::span<const int32_t> pages) {
    for (const int32_t p : pages) {
        ANVIL_CHECK(p >= 0 && p < n_ && refs_[size_t(p)] > 0, "KV-cache pool: releasing page {}, not held",
                    p);
        if (--refs_[size_t(p)] > 0) continue;
        if (key_[size_t(p)] != 0)
            in_lru_[size_t(p)] = lru_.insert(lru_.end(), p);
        else
            free_.push_back(p);
    }
}

void PagePool::forget(int32_t page) {
    std::vector<int32_t> gone = {page};  // it, then the pages published after it, and after those
    for (size_t k = 0; k < gone.size(); k++) {
        const size_t i = size_t(gone[k]);
        ANVIL_CHECK(refs_[i] == 0 && key_[i] != 0, "KV-cache pool: forgetting page {} (held {} times)",
                    gone[k], refs_[i]);
        gone.insert(gone.end(), children_[i].begin(), children_[i].end());
        children_[i].clear();
        by_key_.erase(key_[i]);
        key_[i] = 0;
        lru_.erase(in_lru_[i]);
    }
    if (parent_[size_t(page)] >= 0) {
        auto& siblings = children_[size_t(parent_[size_t(page)])];
        siblings.erase(std::find(siblings.begin(), siblings.end(), page));
    }
    for (const int32_t p : gone) parent_[size_t(p)] = -1;
    free_.insert(free_.end(), gone.rbegin(), gone.rend());  // `page` lent next
}

int32_t PagePool::publish(int32_t page, int32_t parent, std::span<const int32_t> tokens) {
    const size_t i = size_t(page);
    ANVIL_CHECK(page >= 0 && page < n_ && refs_[i] > 0 && int(tokens.size()) == page_,
                "KV-cache pool: publishing page {} (held {} times) of {} positions", page,
                page >= 0 && page < n_ ? refs_[i] : 0, tokens.size());
    if (!caching_ || key_[i] != 0 || (parent >= 0 && key_[size_t(parent)] == 0)) return page;
    const uint64_t k = key(parent >= 0 ? key_[size_t(parent)] : 0, tokens);
    if (const auto it = by_key_.find(k); it != by_key_.end()) {
        if (!holds(it->second, parent, tokens))
            return page;  // a collision: the earlier contents keep the key
        const int32_t twin = it->second;
        hold({&twin, 1});
        release({&page, 1});
        return twin;
    }
    key_[i] = k;
    parent_[i] = parent;
    std::copy(tokens.begin(), tokens.end(), tokens_.begin() + std::ptrdiff_t(i * size_t(page_)));
    if (parent >= 0) children_[size_t(parent)].push_back(page);
    by_key_.emplace(k, page);
    return page;
}

}  // namespace anvil::serve
