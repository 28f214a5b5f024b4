#include "core/arena.h"

namespace anvil {

std::string Shape::str() const {
    std::string s = "(";
    for (int i = 0; i < ndim; i++) s += (i ? ", " : "") + std::to_string(dims[size_t(i)]);
    return s + ")";
}

Tensor Tensor::slice0(int64_t i) const {
    ANVIL_ASSERT(contiguous() && shape.ndim >= 1 && i >= 0 && i < shape[0]);
    Tensor t = *this;
    t.shape.ndim = shape.ndim - 1;
    for (int d = 1; d < shape.ndim; d++) t.shape.dims[size_t(d - 1)] = shape.dims[size_t(d)];
    t.data = static_cast<char*>(data) + size_t(i) * t.nbytes();
    t.stride = 0;
    return t;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
    if (this != &o) {
        reset();
        p_ = o.p_;
        bytes_ = o.bytes_;
        dev_ = o.dev_;
        free_ = std::move(o.free_);
        o.p_ = nullptr;
        o.bytes_ = 0;
    }
    return *this;
}

void Buffer::reset() {
    if (p_ && free_) free_(p_);
    p_ = nullptr;
    bytes_ = 0;
}

size_t TensorTable::add(std::string name, Shape shape, DType dtype, bool joined) {
    ANVIL_ASSERT(shape.numel() >= 0);
    const size_t offset = joined && total_ % 16 == 0 ? total_ : (total_ + kAlign - 1) / kAlign * kAlign;
    entries_.push_back({std::move(name), shape, dtype, offset});
    total_ = offset + size_t(shape.numel()) * dtype_size(dtype);
    return entries_.size() - 1;
}

int64_t TensorTable::total_elements() const {
    int64_t n = 0;
    for (const auto& e : entries_) n += e.shape.numel();
    return n;
}

Arena::Arena(Allocator& backend, const TensorTable& table) {
    const size_t bytes = (table.total_bytes() + kAlign - 1) / kAlign * kAlign;
    buf_ = backend.alloc(bytes > 0 ? bytes : kAlign);
    views_.reserve(table.size());
    for (const auto& e : table.entries()) {
        Tensor t;
        t.data = static_cast<char*>(buf_.data()) + e.offset;
        t.shape = e.shape;
        t.dtype = e.dtype;
        t.device = backend.device();
        views_.push_back(t);
    }
}

Tensor Arena::flat(DType dtype) const {
    for (const auto& v : views_) ANVIL_ASSERT(v.dtype == dtype);
    Tensor t;
    t.data = buf_.data();
    t.dtype = dtype;
    t.device = buf_.device();
    t.shape = Shape{int64_t(buf_.bytes() / dtype_size(dtype))};
    return t;
}

}  // namespace anvil
