#include "backend/memory_account.h"

#include <algorithm>

namespace anvil {

size_t MemoryAccount::admit(size_t bytes) const {
    const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    if (limit_ && *in_use_ + rounded > limit_)
        throw OutOfMemory(fmt::format(
            "out of memory: {:.1f} MiB more would pass the {:.1f} MiB limit (--memory-limit); use a smaller "
            "model or batch, or --recompute full",
            double(rounded) / (1 << 20), double(limit_) / (1 << 20)));
    return rounded;
}

Buffer MemoryAccount::track(void* p, size_t bytes, size_t rounded, Device dev,
                            std::function<void(void*)> free) {
    *in_use_ += rounded;
    peak_ = std::max(peak_, *in_use_);
    return Buffer(p, bytes, dev, [counter = in_use_, rounded, free = std::move(free)](void* q) {
        free(q);
        *counter -= rounded;
    });
}

}  // namespace anvil
