// Tensor: a non-owning view (pointer, shape, dtype, device). Storage is owned by an Arena or a Buffer.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace anvil {

enum class Device : uint8_t { CPU, CUDA };

inline const char* device_name(Device d) {
    return d == Device::CPU ? "cpu" : "cuda";
}

constexpr int kMaxDims = 4;

struct Shape {
    std::array<int64_t, kMaxDims> dims{};
    int ndim = 0;

    Shape() = default;
    Shape(std::initializer_list<int64_t> d) {
        ANVIL_ASSERT(d.size() <= size_t(kMaxDims));
        for (int64_t x : d) dims[size_t(ndim++)] = x;
    }
    int64_t operator[](int i) const { return dims[size_t(i)]; }
    int64_t numel() const {
        int64_t n = 1;
        for (int i = 0; i < ndim; i++) n *= dims[size_t(i)];
        return n;
    }
    bool operator==(const Shape& o) const {
        if (ndim != o.ndim) return false;
        for (int i = 0; i < ndim; i++)
            if (dims[size_t(i)] != o.dims[size_t(i)]) return false;
        return true;
    }
    std::string str() const;  // "(768, 2304)"
    // The dimensions as a file header lists them (safetensors).
    std::vector<int64_t> vec() const { return {dims.begin(), dims.begin() + ndim}; }
};

// Contiguous, row-major, unless `stride` is set: then a view of some columns of a wider tensor
// (Tensor::cols), its rows (every dimension but the last) `stride` elements apart. Only the ops ops.def marks
// as taking strided views read `stride` (through row0/ld); every other access (ptr, f32, view, slice0, range)
// checks that the tensor is contiguous, so a strided view cannot reach an op that would misread it.
struct Tensor {
    void* data = nullptr;
    Shape shape;
    DType dtype = DType::F32;
    Device device = Device::CPU;
    int64_t stride = 0;  // elements from a row's first element to the next row's; 0: contiguous

    bool empty() const { return data == nullptr; }
    int64_t numel() const { return shape.numel(); }
    size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }  // the elements seen
    int64_t dim(int i) const { return shape[i]; }
    int64_t cols() const { return shape.ndim ? shape[shape.ndim - 1] : 1; }
    int64_t rows() const { return cols() ? numel() / cols() : 0; }
    bool contiguous() const { return stride == 0 || stride == cols() || rows() <= 1; }
    // Elements from one row to the next (the leading dimension of a row-major matrix).
    int64_t ld() const { return stride ? stride : cols(); }

    template <typename T>
    T* ptr() const {
        ANVIL_ASSERT(contiguous());
        return static_cast<T*>(data);
    }
    // The first row of a tensor that may be a strided view; rows are ld() elements apart.
    template <typename T>
    T* row0() const {
        return static_cast<T*>(data);
    }
    // f32 data, checked: the CPU backend's ops work on these.
    float* f32() const {
        ANVIL_ASSERT(dtype == DType::F32);
        return ptr<float>();
    }
    // Columns [first, first + n) of every row: a strided view of the same storage (the QKV split).
    Tensor cols(int64_t first, int64_t n) const {
        ANVIL_ASSERT(shape.ndim >= 1 && first >= 0 && n > 0 && first + n <= cols());
        Tensor t = *this;
        t.data = static_cast<char*>(data) + size_t(first) * dtype_size(dtype);
        t.shape.dims[size_t(shape.ndim - 1)] = n;
        t.stride = ld();
        return t;
    }
    // Same storage seen with another shape of the same element count.
    Tensor view(Shape s) const {
        ANVIL_ASSERT(contiguous());
        ANVIL_ASSERT(s.numel() == numel());
        Tensor t = *this;
        t.shape = s;
        t.stride = 0;
        return t;
    }
    // The i-th slice along the first dimension.
    Tensor slice0(int64_t i) const;
    // Elements [first, first + n) of the storage, as a 1-d tensor.
    Tensor range(size_t first, size_t n) const {
        ANVIL_ASSERT(contiguous() && first + n <= size_t(numel()));
        Tensor t = *this;
        t.data = static_cast<char*>(data) + first * dtype_size(dtype);
        t.shape = Shape{int64_t(n)};
        t.stride = 0;
        return t;
    }
};

}  // namespace anvil
