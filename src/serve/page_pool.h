// The KV cache's pages as the scheduler lends them (vLLM's block manager, with automatic prefix caching). A
// page is held by the sequences whose page tables name it (a count); pages nobody holds are lent again. With
// prefix caching, a page a sequence has filled is published under its contents: the tokens at its positions
// and the page before it in the sequence (so the whole prefix up to its end). A later sequence whose context
// begins with the same tokens is given those pages instead of computing them again (match), and keeps them
// read-only: it writes only past them, into pages of its own. A published page outlives its holders, its
// keys and values kept until the pool needs the page for something else: unused pages are lent first, then
// the published ones released longest ago (least recently used), each taking with it the published pages
// that followed it (no holder can have them: whoever holds a page holds the pages before it).
//
// The key is a 64-bit hash of the page's tokens and the key of the page before; a match also compares the
// tokens and the page before, so a hash collision costs a miss, never a wrong page.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace anvil::serve {

class PagePool {
public:
    // `pages` pages of `page` positions; prefix_caching false: nothing is published, nothing matched.
    PagePool(int pages, int page, bool prefix_caching);

    int pages() const { return n_; }
    int page() const { return page_; }
    int available() const { return int(free_.size() + lru_.size()); }  // pages nobody holds
    int held() const { return n_ - available(); }
    int cached() const { return int(lru_.size()); }  // published pages nobody holds

    // The published pages holding tokens' first whole pages, in order, at most max_pages of them (not held
    // yet: hold() them to keep them).
    std::vector<int32_t> match(std::span<const int32_t> tokens, int max_pages) const;
    // How many of `pages` nobody holds (taking them leaves that many fewer available).
    int unheld(std::span<const int32_t> pages) const;
    void hold(std::span<const int32_t> pages);
    // A page nobody holds, now held once: an unused one, else the published one released longest ago
    // (forgotten, with the published pages after it). The caller checks available() first.
    int32_t take();
    // Each held once less; a page nobody holds any more is available again (a published one stays matchable
    // until taken).
    void release(std::span<const int32_t> pages);

    // `page` (held) now holds the keys and values of `tokens` (page positions) following `parent` (-1: the
    // context's first page), a published page. Returns the page that holds them from now on: `page`, now
    // published; an equal page published earlier, held in its place (`page` released); or `page`
    // unpublished when prefix caching is off or the key is taken by other contents.
    int32_t publish(int32_t page, int32_t parent, std::span<const int32_t> tokens);
    bool published(int32_t page) const { return key_[size_t(page)] != 0; }

private:
    uint64_t key(uint64_t parent_key, std::span<const int32_t> tokens) const;
    bool holds(int32_t page, int32_t parent, std::span<const int32_t> tokens) const;
    void forget(int32_t page);  // unpublish it and the pages published after it; all unheld, all made free

    int n_, page_;
    bool caching_;
    std::vector<int32_t> free_;  // unheld and unpublished, the next one last
    std::list<int32_t> lru_;     // unheld and published, released longest ago first
    std::vector<std::list<int32_t>::iterator> in_lru_;
    std::vector<int> refs_;
    // published pages: key (0: not published), the page before, its tokens (page_ a page), the pages after
    std::vector<uint64_t> key_;
    std::vector<int32_t> parent_;
    std::vector<int32_t> tokens_;
    std::vector<std::vector<int32_t>> children_;
    std::unordered_map<uint64_t, int32_t> by_key_;
};

}  // namespace anvil::serve
