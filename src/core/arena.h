// Arenas: one allocation carved into typed views from one table of shapes.
//
// A TensorTable lists (name, shape, dtype) entries and lays them out with kAlign-byte alignment. An Arena
// allocates the table's total once on a backend and hands out each entry as a Tensor view. Parameters,
// gradients, optimizer moments and activations each live in one Arena: nothing is allocated in a step.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace anvil {

constexpr size_t kAlign = 256;  // enough for 16-byte vector loads and cuBLASLt's preferred alignment

// Raw device memory with its deallocator. Owning, movable, not copyable.
class Buffer {
public:
    using Free = std::function<void(void*)>;
    Buffer() = default;
    Buffer(void* p, size_t bytes, Device dev, Free free)
        : p_(p), bytes_(bytes), dev_(dev), free_(std::move(free)) {}
    Buffer(Buffer&& o) noexcept { *this = std::move(o); }
    Buffer& operator=(Buffer&& o) noexcept;
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    ~Buffer() { reset(); }

    void reset();
    void* data() const { return p_; }
    size_t bytes() const { return bytes_; }
    Device device() const { return dev_; }

private:
    void* p_ = nullptr;
    size_t bytes_ = 0;
    Device dev_ = Device::CPU;
    Free free_;
};

struct TableEntry {
    std::string name;
    Shape shape;
    DType dtype = DType::F32;
    size_t offset = 0;  // bytes from the arena's start
};

class TensorTable {
public:
    // Appends an entry; returns its index. `joined`: right after the previous entry, no alignment gap, where
    // that keeps it 16-byte aligned (Llama's k projection after its q: one product over both, LinearGroup).
    size_t add(std::string name, Shape shape, DType dtype, bool joined = false);
    const std::vector<TableEntry>& entries() const { return entries_; }
    size_t size() const { return entries_.size(); }
    size_t total_bytes() const { return total_; }
    int64_t total_elements() const;

private:
    std::vector<TableEntry> entries_;
    size_t total_ = 0;
};

// Where arenas get their memory: a backend (device memory) or anything else that hands out Buffers.
class Allocator {
public:
    virtual ~Allocator() = default;
    virtual Buffer alloc(size_t bytes) = 0;  // zero-filled; throws OutOfMemory when it does not fit
    virtual Device device() const = 0;
};

class Arena {
public:
    Arena() = default;
    // One allocation of table.total_bytes() from `alloc`; views follow the table.
    Arena(Allocator& alloc, const TensorTable& table);

    Tensor operator[](size_t i) const { return views_[i]; }
    const std::vector<Tensor>& views() const { return views_; }
    size_t size() const { return views_.size(); }
    void* base() const { return buf_.data(); }
    size_t bytes() const { return buf_.bytes(); }
    // The whole arena as one flat tensor of `dtype` (all entries must share it and be packed).
    Tensor flat(DType dtype) const;

private:
    Buffer buf_;
    std::vector<Tensor> views_;
};

}  // namespace anvil
