#include "model/kv_cache.h"

#include <algorithm>

namespace anvil {

KvCache::KvCache(Backend& be, int layers, int slots, int max_T, int kv_dim, DType dtype, int pages, int page)
    : be_(&be),
      slots_(slots),
      max_T_(max_T),
      page_(page),
      n_pages_(pages > 0 ? pages : slots * pages_for(max_T, page)),
      pps_(pages_for(max_T, page)),
      contiguous_(pages == 0),
      table_(size_t(slots) * size_t(pages_for(max_T, page)), -1) {
    ANVIL_CHECK(slots > 0 && max_T > 0 && pages >= 0 && page > 0,
                "KV cache: {} slots of {} positions in {} pages of {}", slots, max_T, pages, page);
    TensorTable t;
    for (int l = 0; l < layers; l++) {
        t.add("k", {n_pages_, page, kv_dim}, dtype);
        t.add("v", {n_pages_, page, kv_dim}, dtype);
    }
    t.add("pages", {slots, pps_}, DType::I32);
    arena_ = Arena(be, t);
    if (contiguous_)
        for (size_t i = 0; i < table_.size(); i++) table_[i] = int32_t(i);
    be.upload(this->pages(), table_.data());
}

Tensor KvCache::contiguous(Tensor layer, int slot) const {
    ANVIL_CHECK(contiguous_ && slot >= 0 && slot < slots_, "KV cache: slot {} of a {} cache of {} slots",
                slot, contiguous_ ? "contiguous" : "paged", slots_);
    const int64_t width = layer.dim(2), rows = int64_t(page_) * pps_;
    return layer.range(size_t(slot) * size_t(rows * width), size_t(max_T_) * size_t(width))
        .view(Shape{max_T_, width});
}

void KvCache::set_pages(int slot, std::span<const int32_t> pages) {
    ANVIL_CHECK(!contiguous_ && slot >= 0 && slot < slots_ && pages.size() <= size_t(pps_),
                "KV cache: {} pages for slot {} (of {}; at most {} a slot)", pages.size(), slot, slots_,
                pps_);
    int32_t* row = table_.data() + size_t(slot) * size_t(pps_);
    for (size_t i = 0; i < size_t(pps_); i++) {
        row[i] = i < pages.size() ? pages[i] : -1;
        ANVIL_CHECK(i >= pages.size() || (row[i] >= 0 && row[i] < n_pages_), "KV cache: page {} of {}",
                    row[i], n_pages_);
    }
    dirty_ = true;
}

void KvCache::sync() {
    if (!dirty_) return;
    be_->upload(pages(), table_.data());
    dirty_ = false;
}

}  // namespace anvil
