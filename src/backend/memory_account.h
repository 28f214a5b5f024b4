// Memory accounting shared by the backends: the bytes handed out, the peak, and the --memory-limit budget
// (a pretend device size that makes allocations past it fail as if the device were full).
#pragma once

#include <functional>
#include <memory>

#include "core/arena.h"

namespace anvil {

class MemoryAccount {
public:
    size_t in_use() const { return *in_use_; }
    size_t peak() const { return peak_; }
    void set_limit(size_t bytes) { limit_ = bytes; }
    // `bytes` rounded up to kAlign; throws OutOfMemory when that would pass the limit.
    size_t admit(size_t bytes) const;
    // Counts a fresh allocation of admit()'s `rounded` bytes; the buffer uncounts it when it frees it.
    Buffer track(void* p, size_t bytes, size_t rounded, Device dev, std::function<void(void*)> free);

private:
    std::shared_ptr<size_t> in_use_ = std::make_shared<size_t>(0);  // shared with the buffers' deleters
    size_t peak_ = 0, limit_ = 0;
};

}  // namespace anvil
