// The keys and values of decoding, in pages (PagedAttention's layout, as vLLM keeps them): every layer's k
// and v are (pages, page, kv_dim), `page` positions a page (16 unless asked), and each cache slot (a
// sequence) has a page table naming, in order, the pages that hold its positions: position p of slot s is row
// p % page of page table[s][p / page]. One allocation holds the pages and the tables (the tables on the
// backend, where attention reads them; a host copy here).
//
// Built with pages = 0, the cache gives every slot its own run of pages, so a slot's positions are contiguous
// (k(layer, slot), what one sequence's generation reads). A pool (pages > 0) starts with every table empty,
// and its owner (the server's scheduler) lends pages to slots with set_pages and uploads the tables with
// sync().
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"

namespace anvil {

class KvCache {
public:
    static constexpr int kDefaultPage = 16;  // positions a page
    static int pages_for(int positions, int page = kDefaultPage) { return (positions + page - 1) / page; }

    KvCache(Backend& be, int layers, int slots, int max_T, int kv_dim, DType dtype, int pages = 0,
            int page = kDefaultPage);

    // (max_T, kv_dim): slot `slot` of a cache built with pages = 0
    Tensor k(int layer, int slot) const { return contiguous(k(layer), slot); }
    Tensor v(int layer, int slot) const { return contiguous(v(layer), slot); }
    Tensor k(int layer) const { return arena_[size_t(2 * layer)]; }  // (pages, page, kv_dim)
    Tensor v(int layer) const { return arena_[size_t(2 * layer + 1)]; }
    Tensor pages() const { return arena_[arena_.size() - 1]; }  // (slots, pages_per_slot) i32, the tables

    int slots() const { return slots_; }
    int max_T() const { return max_T_; }
    int n_pages() const { return n_pages_; }
    int page() const { return page_; }
    int pages_per_slot() const { return pps_; }

    // The pages holding slot's positions from 0 on (at most pages_per_slot, each below n_pages); the rest
    // of its table is emptied. A page may be in several slots' tables (a shared prefix, serve/page_pool.h),
    // written by none of them: the caller sees that a pass writes only pages one slot holds. On the backend
    // from the next sync().
    void set_pages(int slot, std::span<const int32_t> pages);
    void sync();  // uploads the tables if set_pages changed them

    static size_t page_bytes(int layers, int kv_dim, DType dtype, int page = kDefaultPage) {
        return 2 * size_t(layers) * size_t(page) * size_t(kv_dim) * dtype_size(dtype);
    }
    static size_t slot_bytes(int layers, int max_T, int kv_dim, DType dtype) {  // a whole context's pages
        return size_t(pages_for(max_T)) * page_bytes(layers, kv_dim, dtype);
    }

private:
    Tensor contiguous(Tensor layer, int slot) const;

    Backend* be_;
    Arena arena_;
    int slots_, max_T_, page_, n_pages_, pps_;
    bool contiguous_;             // pages = 0: slot s owns pages s pps_ .. (s + 1) pps_ - 1
    std::vector<int32_t> table_;  // host copy of pages(); -1: no page
    bool dirty_ = false;
};

}  // namespace anvil
